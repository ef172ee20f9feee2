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
// Threads: the process's OpenMP runtime, torch's own (it loaded libgomp.so.1 before this library), so torch's
// thread count holds. Built at first use by specviz/kernels/streamed.py and called through ctypes.
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <vector>

namespace {

const long LANES = 16;  // outputs in a block: one 512-bit register of float32

inline __m512 bf16_to_f32(const uint16_t* p) {  // 16 bf16 values as float32
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}
inline void store(uint16_t* p, __m512 v) { _mm256_storeu_si256((__m256i*)p, (__m256i)_mm512_cvtneps_pbh(v)); }
inline void store(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
inline __m512 load_bias(const uint16_t* p) { return bf16_to_f32(p); }
inline __m512 load_bias(const float* p) { return _mm512_loadu_ps(p); }

// The three ways: X the rows' type as the kernel reads them, W the weight's, STEP the inputs one load covers,
// WEIGHTS the registers a block's loaded weights take, and `step`: the sums of input pair/element p into acc[r][i]
struct F32 {
    using X = float; using W = float; static const int STEP = 1, WEIGHTS = 1;
    template <int N, int R>
    static void step(__m512 (&acc)[R][N], const float* x, const float* const* w, long k, long p) {
        __m512 wv[R];
        for (int r = 0; r < R; r++) wv[r] = _mm512_loadu_ps(w[r] + p * LANES);
        for (int i = 0; i < N; i++) {
            __m512 xv = _mm512_set1_ps(x[i * k + p]);
            for (int r = 0; r < R; r++) acc[r][i] = _mm512_fmadd_ps(xv, wv[r], acc[r][i]);
        }
    }
};

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

struct Wide {  // the rows widened to float32 once per call (`product`), the weights in registers
    using X = float; using W = uint16_t; static const int STEP = 2, WEIGHTS = 2;
    template <int N, int R>
    static void step(__m512 (&acc)[R][N], const float* x, const uint16_t* const* w, long k, long p) {
        __m512 second[R], first[R];
        const __m512i high = _mm512_set1_epi32((int)0xFFFF0000u);
        for (int r = 0; r < R; r++) {
            __m512i v = _mm512_loadu_si512(w[r] + p * 2 * LANES);  // lane j: input 2p+1 (high half), 2p (low)
            second[r] = _mm512_castsi512_ps(_mm512_and_si512(v, high));
            first[r] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
        }
        for (int i = 0; i < N; i++) {
            __m512 xv = _mm512_set1_ps(x[i * k + 2 * p + 1]);
            for (int r = 0; r < R; r++) acc[r][i] = _mm512_fmadd_ps(xv, second[r], acc[r][i]);
            xv = _mm512_set1_ps(x[i * k + 2 * p]);
            for (int r = 0; r < R; r++) acc[r][i] = _mm512_fmadd_ps(xv, first[r], acc[r][i]);
        }
    }
};

// as many blocks at a time as the 32 registers hold: R * N accumulators, R * WEIGHTS weights and a broadcast input
template <class Op>
constexpr int blocks_at_once(int n) {
    if (Op::WEIGHTS == 2) return 30 / (n + 2) > 8 ? 8 : 30 / (n + 2);
    return n <= 2 ? 8 : n <= 3 ? 6 : n <= 4 ? 5 : n <= 6 ? 4 : n <= 8 ? 3 : 2;
}

template <class Op, int N, int R, typename Y>
void tile(const typename Op::X* x, const typename Op::W* w, const Y* bias, Y* y, long k, long o, long b, long ahead) {
    __m512 acc[R][N];
    for (int r = 0; r < R; r++)
        for (int i = 0; i < N; i++) acc[r][i] = _mm512_setzero_ps();
    const typename Op::W* blocks[R];  // R blocks one after another, k * 16 values each
    for (int r = 0; r < R; r++) blocks[r] = w + (b + r) * k * LANES;
    for (long p = 0; p < k / Op::STEP; p++) {
        if (ahead)  // each block's stream asked for `ahead` bytes on: a hint (the bits do not change)
            for (int r = 0; r < R; r++)
                _mm_prefetch((const char*)(blocks[r] + p * Op::STEP * LANES) + ahead, _MM_HINT_T0);
        Op::template step<N, R>(acc, x, blocks, k, p);
    }
    for (int r = 0; r < R; r++) {
        long j = (b + r) * LANES;
        __m512 add = bias ? load_bias(bias + j) : _mm512_setzero_ps();
        for (int i = 0; i < N; i++) store(y + i * o + j, _mm512_add_ps(acc[r][i], add));
    }
}

// up to 13 rows: one pass over the weight, the threads splitting its blocks, R at a time
template <class Op, int N, typename Y>
void few(const typename Op::X* x, const typename Op::W* w, const Y* bias, Y* y, long k, long o, long ahead) {
    constexpr int R = blocks_at_once<Op>(N);
    long blocks = o / LANES, groups = (blocks + R - 1) / R;
#pragma omp parallel for schedule(static)
    for (long g = 0; g < groups; g++) {
        long b = g * R;
        if (b + R <= blocks) tile<Op, N, R>(x, w, bias, y, k, o, b, ahead);
        else  // where R does not divide the blocks
            for (; b < blocks; b++) tile<Op, N, 1>(x, w, bias, y, k, o, b, ahead);
    }
}

template <class Op, int R, typename Y>
void chunk(int rows, const typename Op::X* x, const typename Op::W* w, const Y* bias, Y* y, long k, long o, long b,
           long ahead) {
    switch (rows) {
#define CASE(N) case N: tile<Op, N, R>(x, w, bias, y, k, o, b, ahead); break;
        CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
#undef CASE
    }
}

// more rows (a prompt): each group of MANY_R blocks is read from memory once and kept in the core's caches
// while the rows go past it CHUNK at a time (MANY_R x CHUNK accumulators: few loads per multiply)
const int MANY_R = 3, CHUNK = 8;

template <class Op, typename Y>
void many(const typename Op::X* x, const typename Op::W* w, const Y* bias, Y* y, long n, long k, long o,
          long ahead) {
    constexpr int R = blocks_at_once<Op>(CHUNK) < MANY_R ? blocks_at_once<Op>(CHUNK) : MANY_R;
    long blocks = o / LANES, groups = (blocks + R - 1) / R;
#pragma omp parallel for schedule(static)
    for (long g = 0; g < groups; g++) {
        long b = g * R;
        for (long start = 0; start < n; start += CHUNK) {
            int rows = n - start < CHUNK ? (int)(n - start) : CHUNK;
            long on = start ? 0 : ahead;  // the first chunk reads the blocks from memory, the others from the caches
            const typename Op::X* part = x + start * k;
            if (b + R <= blocks) chunk<Op, R>(rows, part, w, bias, y + start * o, k, o, b, on);
            else
                for (long e = b; e < blocks; e++) chunk<Op, 1>(rows, part, w, bias, y + start * o, k, o, e, on);
        }
    }
}

template <class Op, typename Y>
void product(const typename Op::X* x, const typename Op::W* w, const Y* bias, Y* y, long n, long k, long o,
             long ahead) {
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
void linear_bf16(const uint16_t* x, const uint16_t* w, const uint16_t* bias, uint16_t* y, long n, long k, long o,
                 long ahead) {
    product<Dot>(x, w, bias, y, n, k, o, ahead);
}

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
