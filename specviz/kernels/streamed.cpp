// y = x W^T (+ bias), the weight read once from memory whatever the number of rows.
//
// The weight is laid out for it once (specviz/kernels/streamed.py `pack`): blocks of 16 outputs, and in each block
// the inputs in order, so one 64-byte load holds the next weight of 16 outputs (bf16: the next two, as AVX512-BF16's
// dot product takes pairs). Each row's input is broadcast against it: a register accumulates 16 outputs of one row,
// with no horizontal sums, and R blocks x N rows of them stay in registers while the weight streams past.
// Sums are float32 (bf16 products are exact in float32); bf16 outputs are rounded to nearest even, as torch does.
// bf16 weights are multiplied one of two ways, each a kernel of its own (a row's sums in one order whatever the
// number of rows, either way): `Dot`, AVX512-BF16's dot product of pairs; `Wide`, each pair widened to two float32
// registers in place (a shift and a mask) and float32 FMAs, the pair's second input first as the dot product adds
// them. Which is faster is the CPU's: on one 2-core Xeon (6/207) a core ran 1.4 G dot products a second and 5.9 G
// FMAs, so from four rows on `Wide` did the same sums in less time; the dispatcher times both.
// Built for AVX-512 or for AVX2 (a CPU without AVX-512: `V` in simd.h, 8 lanes, 16 registers): `Wide` and `F32` do
// each output's sums in the same order at either level, so their results are the same bits; `Dot` is AVX-512's alone.
// Threads: the process's OpenMP runtime, torch's own (it loaded libgomp.so.1 before this library), so torch's
// thread count holds. Built at first use by specviz/kernels/streamed.py and called through ctypes.
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "simd.h"

namespace {

const long LANES = 16;  // outputs in a block of the layout (streamed.py)
// A register holds V::L outputs (simd.h): a block is one register with AVX-512, two with AVX2. The kernel walks
// "units" of one register's outputs: unit u is part u % PARTS of block u / PARTS.
const long PARTS = LANES / V::L;

// The three ways: X the rows' type as the kernel reads them, W the weight's, STEP the inputs one load covers,
// WEIGHTS the registers a unit's loaded weights take, and `step`: the sums of input pair/element p into acc[r][i]
struct F32 {
    using X = float; using W = float; static const int STEP = 1, WEIGHTS = 1;
    template <int N, int R>
    static void step(V::R (&acc)[R][N], const float* x, const float* const* w, long k, long p) {
        V::R wv[R];
        for (int r = 0; r < R; r++) wv[r] = V::load(w[r] + p * LANES);
        for (int i = 0; i < N; i++) {
            V::R xv = V::set1(x[i * k + p]);
            for (int r = 0; r < R; r++) acc[r][i] = V::fma(xv, wv[r], acc[r][i]);
        }
    }
};

#ifdef __AVX512BF16__
struct Dot {
    using X = uint16_t; using W = uint16_t; static const int STEP = 2, WEIGHTS = 1;
    template <int N, int R>
    static void step(__m512 (&acc)[R][N], const uint16_t* x, const uint16_t* const* w, long k, long p) {
        __m512bh wv[R];
        for (int r = 0; r < R; r++) wv[r] = (__m512bh)_mm512_loadu_si512(w[r] + p * 2 * LANES);
        for (int i = 0; i < N; i++) {
            __m512bh xv = (__m512bh)_mm512_set1_epi32(((const int32_t*)(x + i * k))[p]);
            for (int r = 0; r < R; r++) acc[r][i] = _mm512_dpbf16_ps(acc[r][i], xv, wv[r]);
        }
    }
};
#endif

struct Wide {  // the rows widened to float32 once per call (`product`), the weights in registers
    using X = float; using W = uint16_t; static const int STEP = 2, WEIGHTS = 2;
    template <int N, int R>
    static void step(V::R (&acc)[R][N], const float* x, const uint16_t* const* w, long k, long p) {
        V::R second[R], first[R];  // lane j: input 2p + 1 (the pair's high half), then 2p (low)
        for (int r = 0; r < R; r++) V::pairs(w[r] + p * 2 * LANES, second[r], first[r]);
        for (int i = 0; i < N; i++) {
            V::R xv = V::set1(x[i * k + 2 * p + 1]);
            for (int r = 0; r < R; r++) acc[r][i] = V::fma(xv, second[r], acc[r][i]);
            xv = V::set1(x[i * k + 2 * p]);
            for (int r = 0; r < R; r++) acc[r][i] = V::fma(xv, first[r], acc[r][i]);
        }
    }
};

// as many units at a time as the registers hold: R * N accumulators, R * WEIGHTS weights and a broadcast input
// (AVX-512's counts for the dot product as measured). With AVX2's 16 registers, R * (N + 1) + 1 <= 16: the compiler
// keeps one of a unit's two widened weights at a time. That lets 6 rows take two units (12 independent sums for the
// FMAs' latency, a broadcast input feeding both): on a 2-core Xeon under the cap (model 167) 6 rows cost 1.30-1.51
// one-row products against 1.87-2.00 with one unit; from 7 rows on the FMAs themselves bound it either way.
template <class Op>
constexpr int units_at_once(int n) {
    if (V::REGISTERS == 16) return 15 / (n + 1) < 1 ? 1 : 15 / (n + 1) > 8 ? 8 : 15 / (n + 1);
    if (Op::WEIGHTS == 2) return 30 / (n + 2) > 8 ? 8 : 30 / (n + 2);
    return n <= 2 ? 8 : n <= 3 ? 6 : n <= 4 ? 5 : n <= 6 ? 4 : n <= 8 ? 3 : 2;
}

inline long unit_start(long u, long k, int step) { return (u / PARTS) * k * LANES + (u % PARTS) * V::L * step; }

template <class Op, int N, int R, typename Y>
void tile(const typename Op::X* x, const typename Op::W* w, const Y* bias, Y* y, long k, long o, long u, long ahead) {
    V::R acc[R][N];
    for (int r = 0; r < R; r++)
        for (int i = 0; i < N; i++) acc[r][i] = V::zero();
    const typename Op::W* units[R];  // R units one after another, each a stream of k / STEP loads LANES * STEP apart
    for (int r = 0; r < R; r++) units[r] = w + unit_start(u + r, k, Op::STEP);
    for (long p = 0; p < k / Op::STEP; p++) {
        if (ahead)  // each unit's stream asked for `ahead` bytes on: a hint (the bits do not change)
            for (int r = 0; r < R; r++)
                _mm_prefetch((const char*)(units[r] + p * Op::STEP * LANES) + ahead, _MM_HINT_T0);
        Op::template step<N, R>(acc, x, units, k, p);
    }
    for (int r = 0; r < R; r++) {
        long j = (u + r) * V::L;
        V::R add = bias ? V::load(bias + j) : V::zero();
        for (int i = 0; i < N; i++) V::store(y + i * o + j, V::add(acc[r][i], add));
    }
}

// up to 13 rows: one pass over the weight, the threads splitting its units, R at a time
template <class Op, int N, typename Y>
void few(const typename Op::X* x, const typename Op::W* w, const Y* bias, Y* y, long k, long o, long ahead) {
    constexpr int R = units_at_once<Op>(N);
    long units = o / V::L, groups = (units + R - 1) / R;
#pragma omp parallel for schedule(static)
    for (long g = 0; g < groups; g++) {
        long u = g * R;
        if (u + R <= units) tile<Op, N, R>(x, w, bias, y, k, o, u, ahead);
        else  // where R does not divide the units
            for (; u < units; u++) tile<Op, N, 1>(x, w, bias, y, k, o, u, ahead);
    }
}

template <class Op, int R, typename Y>
void chunk(int rows, const typename Op::X* x, const typename Op::W* w, const Y* bias, Y* y, long k, long o, long u,
           long ahead) {
    switch (rows) {
#define CASE(N) case N: tile<Op, N, R>(x, w, bias, y, k, o, u, ahead); break;
        CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
#undef CASE
    }
}

// more rows (a prompt): each group of MANY_R units is read from memory once and kept in the core's caches
// while the rows go past it CHUNK at a time (MANY_R x CHUNK accumulators: few loads per multiply)
const int MANY_R = 3, CHUNK = 8;

template <class Op, typename Y>
void many(const typename Op::X* x, const typename Op::W* w, const Y* bias, Y* y, long n, long k, long o,
          long ahead) {
    constexpr int R = units_at_once<Op>(CHUNK) < MANY_R ? units_at_once<Op>(CHUNK) : MANY_R;
    long units = o / V::L, groups = (units + R - 1) / R;
#pragma omp parallel for schedule(static)
    for (long g = 0; g < groups; g++) {
        long u = g * R;
        for (long start = 0; start < n; start += CHUNK) {
            int rows = n - start < CHUNK ? (int)(n - start) : CHUNK;
            long on = start ? 0 : ahead;  // the first chunk reads the units from memory, the others from the caches
            const typename Op::X* part = x + start * k;
            if (u + R <= units) chunk<Op, R>(rows, part, w, bias, y + start * o, k, o, u, on);
            else
                for (long e = u; e < units; e++) chunk<Op, 1>(rows, part, w, bias, y + start * o, k, o, e, on);
        }
    }
}

// AVX2 from 7 rows on: 16 registers hold two units' sums (one block) for at most `chunk_rows` rows, so with more
// rows `few` could take one unit at a time, a broadcast input per FMA, and read each 64-byte line of a block twice.
// Instead each block goes SLICE input pairs at a time, the rows a chunk at a time over each slice, all from the
// first-level cache, and each chunk's sums wait in memory between slices (float32, stored and loaded back exactly:
// every sum runs in `tile`'s order, so a row's result is the same bits at every row count). While a slice's chunks
// multiply, they ask for the next slice (one 64-byte line of it every few pairs, each chunk its share): memory stays
// busy through all the chunks, not only the first (`ahead` is not used here). On a 2-core AMD EPYC (Zen 3, family
// 25 model 1), the embedded target's FFN shapes past its caches: 7-13 rows 9-18% less time than one unit at a time,
// 17 rows 26-33% less, a 64-row prompt chunk 13-16%; asking for the next slice then took 8-22% off 7-17 rows (7
// rows the most) and 8% off 64, against the first chunk asking `ahead` in its own slice.
const long SLICE = 128;
const long LINE = 64;  // bytes: one pair (bf16) or input (float32) of a whole block
const long SLICED_FROM = 7;  // at 6 rows two units at once (`few`) measured faster than chunks of 3 (Wide)

template <class Op>
constexpr int chunk_rows() { return (15 - 2 * Op::WEIGHTS) / 2; }  // 2 * (N + WEIGHTS) + 1 <= 16 registers

// `next`: the first of `lines` lines (of the next slice) this part asks for, spread over its pairs (a countdown,
// not a division per pair: that cost more than the prefetch saved)
template <class Op, int N>
void slice_part(const typename Op::X* x, const typename Op::W* const* units, float* sums, long k, long p0, long p1,
                const char* next, long lines) {
    V::R acc[2][N];
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < N; i++) acc[r][i] = V::load(sums + (i * 2 + r) * V::L);
    long every = lines ? (p1 - p0 + lines - 1) / lines : p1 - p0 + 1, wait = 0;
    for (long p = p0; p < p1; p++) {
        if (--wait <= 0) {
            if (lines-- > 0) _mm_prefetch(next, _MM_HINT_T0);  // past the weight's end: a hint, never a fault
            next += LINE;
            wait = every;
        }
        Op::template step<N, 2>(acc, x, units, k, p);
    }
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < N; i++) V::store(sums + (i * 2 + r) * V::L, acc[r][i]);
}

template <class Op, typename Y>
void sliced(const typename Op::X* x, const typename Op::W* w, const Y* bias, Y* y, long n, long k, long o) {
    long blocks = o / LANES, pairs = k / Op::STEP;
    long chunks = (n + chunk_rows<Op>() - 1) / chunk_rows<Op>();
#pragma omp parallel
    {
        std::vector<float> sums(n * LANES);  // each row's 16 sums of the block in hand
#pragma omp for schedule(static)
        for (long b = 0; b < blocks; b++) {
            const typename Op::W* units[2] = {w + unit_start(2 * b, k, Op::STEP),
                                              w + unit_start(2 * b + 1, k, Op::STEP)};
            std::fill(sums.begin(), sums.end(), 0.0f);
            for (long p0 = 0; p0 < pairs; p0 += SLICE) {
                long p1 = p0 + SLICE < pairs ? p0 + SLICE : pairs;
                for (long c = 0; c < chunks; c++) {  // rows [start, end): chunks of near-equal size
                    long start = n * c / chunks, end = n * (c + 1) / chunks;
                    const typename Op::X* part = x + start * k;
                    float* s = sums.data() + start * LANES;
                    // the next slice follows this one in memory (after a block's last: the thread's next block)
                    long first = SLICE * c / chunks, last = SLICE * (c + 1) / chunks;
                    const char* next = (const char*)(units[0] + p1 * Op::STEP * LANES) + first * LINE;
                    switch (end - start) {
#define CASE(N) case N: if constexpr (N <= chunk_rows<Op>()) slice_part<Op, N>(part, units, s, k, p0, p1, next, \
                                                                                last - first); break;
                        CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6)
#undef CASE
                    }
                }
            }
            for (long i = 0; i < n; i++)
                for (int r = 0; r < 2; r++) {
                    long j = (2 * b + r) * V::L;
                    V::R add = bias ? V::load(bias + j) : V::zero();
                    V::store(y + i * o + j, V::add(V::load(sums.data() + (i * 2 + r) * V::L), add));
                }
        }
    }
}

template <class Op, typename Y>
void product(const typename Op::X* x, const typename Op::W* w, const Y* bias, Y* y, long n, long k, long o,
             long ahead) {
    if (V::REGISTERS == 16 && n >= SLICED_FROM) return sliced<Op>(x, w, bias, y, n, k, o);
    switch (n) {
#define CASE(N) case N: few<Op, N>(x, w, bias, y, k, o, ahead); return;
        CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8) CASE(9)
        CASE(10) CASE(11) CASE(12) CASE(13)
#undef CASE
        default: many<Op>(x, w, bias, y, n, k, o, ahead);
    }
}

}  // namespace

extern "C" {
// x: n rows of k; w: the packed weight of o outputs (o a multiple of 16; bf16: k even); y: n rows of o; ahead: how
// far on (bytes) each thread asks for the weight it will read next, 0 for nothing (left to the CPU's prefetchers)
#ifdef __AVX512BF16__
void linear_bf16(const uint16_t* x, const uint16_t* w, const uint16_t* bias, uint16_t* y, long n, long k, long o,
                 long ahead) {
    product<Dot>(x, w, bias, y, n, k, o, ahead);
}
#endif

void linear_bf16_wide(const uint16_t* x, const uint16_t* w, const uint16_t* bias, uint16_t* y, long n, long k, long o,
                      long ahead) {
    std::vector<float> rows(n * k);  // the rows widened once (exactly), not once per block of outputs
#pragma omp parallel for schedule(static) if (n * k >= 65536)
    for (long c = 0; c < n * k; c++) {
        uint32_t bits = (uint32_t)x[c] << 16;
        memcpy(&rows[c], &bits, 4);
    }
    product<Wide>(rows.data(), w, bias, y, n, k, o, ahead);
}

void linear_f32(const float* x, const float* w, const float* bias, float* y, long n, long k, long o, long ahead) {
    product<F32>(x, w, bias, y, n, k, o, ahead);
}
}
