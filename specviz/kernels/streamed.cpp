// y = x W^T (+ bias), the weight read once from memory whatever the number of rows.
//
// The weight is laid out for it once (specviz/kernels/streamed.py `pack`): blocks of 16 outputs, and in each block
// the inputs in order, so one 64-byte load holds the next weight of 16 outputs (bf16: the next two, as AVX512-BF16's
// dot product takes pairs). Each row's input is broadcast against it: a register accumulates 16 outputs of one row,
// with no horizontal sums, and R blocks x N rows of them stay in registers while the weight streams past.
// Sums are float32 (bf16 products are exact in float32); bf16 outputs are rounded to nearest even, as torch does.
// Threads: the process's OpenMP runtime, torch's own (it loaded libgomp.so.1 before this library), so torch's
// thread count holds. Built at first use by specviz/kernels/streamed.py and called through ctypes.
#include <immintrin.h>
#include <stdint.h>

namespace {

const long LANES = 16;  // outputs in a block: one 512-bit register of float32

// as many blocks at a time as the 32 registers hold: R * N accumulators, R weights and one broadcast input
constexpr int blocks_at_once(int n) {
    return n <= 2 ? 8 : n <= 3 ? 6 : n <= 4 ? 5 : n <= 6 ? 4 : n <= 8 ? 3 : 2;
}

inline __m512 bf16_to_f32(const uint16_t* p) {  // 16 bf16 values as float32
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}

template <int N, int R>
void tile_bf16(const uint16_t* x, const uint16_t* w, const uint16_t* bias, uint16_t* y, long k, long o, long b) {
    __m512 acc[R][N];
    for (int r = 0; r < R; r++)
        for (int i = 0; i < N; i++) acc[r][i] = _mm512_setzero_ps();
    const uint16_t* blocks = w + b * k * LANES;  // R blocks one after another, k * 16 values each
    for (long p = 0; p < k / 2; p++) {
        __m512bh wv[R];
        for (int r = 0; r < R; r++) wv[r] = (__m512bh)_mm512_loadu_si512(blocks + r * k * LANES + p * 2 * LANES);
        for (int i = 0; i < N; i++) {
            __m512bh xv = (__m512bh)_mm512_set1_epi32(((const int32_t*)(x + i * k))[p]);
            for (int r = 0; r < R; r++) acc[r][i] = _mm512_dpbf16_ps(acc[r][i], xv, wv[r]);
        }
    }
    for (int r = 0; r < R; r++) {
        long j = (b + r) * LANES;
        __m512 add = bias ? bf16_to_f32(bias + j) : _mm512_setzero_ps();
        for (int i = 0; i < N; i++)
            _mm256_storeu_si256((__m256i*)(y + i * o + j), (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(acc[r][i], add)));
    }
}

template <int N, int R>
void tile_f32(const float* x, const float* w, const float* bias, float* y, long k, long o, long b) {
    __m512 acc[R][N];
    for (int r = 0; r < R; r++)
        for (int i = 0; i < N; i++) acc[r][i] = _mm512_setzero_ps();
    const float* blocks = w + b * k * LANES;
    for (long c = 0; c < k; c++) {
        __m512 wv[R];
        for (int r = 0; r < R; r++) wv[r] = _mm512_loadu_ps(blocks + r * k * LANES + c * LANES);
        for (int i = 0; i < N; i++) {
            __m512 xv = _mm512_set1_ps(x[i * k + c]);
            for (int r = 0; r < R; r++) acc[r][i] = _mm512_fmadd_ps(xv, wv[r], acc[r][i]);
        }
    }
    for (int r = 0; r < R; r++) {
        long j = (b + r) * LANES;
        __m512 add = bias ? _mm512_loadu_ps(bias + j) : _mm512_setzero_ps();
        for (int i = 0; i < N; i++) _mm512_storeu_ps(y + i * o + j, _mm512_add_ps(acc[r][i], add));
    }
}

template <typename T, int N, int R>
void tile(const T* x, const T* w, const T* bias, T* y, long k, long o, long b) {
    if constexpr (sizeof(T) == 2) tile_bf16<N, R>(x, w, bias, y, k, o, b);
    else tile_f32<N, R>(x, w, bias, y, k, o, b);
}

// up to 13 rows: one pass over the weight, the threads splitting its blocks, R at a time
template <typename T, int N>
void few(const T* x, const T* w, const T* bias, T* y, long k, long o) {
    constexpr int R = blocks_at_once(N);
    long blocks = o / LANES, groups = (blocks + R - 1) / R;
#pragma omp parallel for schedule(static)
    for (long g = 0; g < groups; g++) {
        long b = g * R;
        if (b + R <= blocks) tile<T, N, R>(x, w, bias, y, k, o, b);
        else for (; b < blocks; b++) tile<T, N, 1>(x, w, bias, y, k, o, b);  // where R does not divide the blocks
    }
}

template <typename T, int R>
void chunk(int rows, const T* x, const T* w, const T* bias, T* y, long k, long o, long b) {
    switch (rows) {
#define CASE(N) case N: tile<T, N, R>(x, w, bias, y, k, o, b); break;
        CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
#undef CASE
    }
}

// more rows (a prompt): each group of MANY_R blocks is read from memory once and kept in the core's caches
// while the rows go past it CHUNK at a time (MANY_R x CHUNK accumulators: few loads per multiply)
const int MANY_R = 3, CHUNK = 8;

template <typename T>
void many(const T* x, const T* w, const T* bias, T* y, long n, long k, long o) {
    long blocks = o / LANES, groups = (blocks + MANY_R - 1) / MANY_R;
#pragma omp parallel for schedule(static)
    for (long g = 0; g < groups; g++) {
        long b = g * MANY_R;
        for (long start = 0; start < n; start += CHUNK) {
            int rows = n - start < CHUNK ? (int)(n - start) : CHUNK;
            if (b + MANY_R <= blocks) chunk<T, MANY_R>(rows, x + start * k, w, bias, y + start * o, k, o, b);
            else for (long e = b; e < blocks; e++) chunk<T, 1>(rows, x + start * k, w, bias, y + start * o, k, o, e);
        }
    }
}

template <typename T>
void product(const T* x, const T* w, const T* bias, T* y, long n, long k, long o) {
    switch (n) {
#define CASE(N) case N: few<T, N>(x, w, bias, y, k, o); return;
        CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8) CASE(9)
        CASE(10) CASE(11) CASE(12) CASE(13)
#undef CASE
        default: many(x, w, bias, y, n, k, o);
    }
}

}  // namespace

extern "C" {
// x: n rows of k; w: the packed weight of o outputs (o a multiple of 16; bf16: k even); y: n rows of o
void linear_bf16(const uint16_t* x, const uint16_t* w, const uint16_t* bias, uint16_t* y, long n, long k, long o) {
    product(x, w, bias, y, n, k, o);
}

void linear_f32(const float* x, const float* w, const float* bias, float* y, long n, long k, long o) {
    product(x, w, bias, y, n, k, o);
}
}
