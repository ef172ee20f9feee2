// y = x W^T with 4-bit weights and 8-bit activations, multiplied on the CPU's integer dot-product units (AVX512-VNNI's
// vpdpbusd on 256-bit registers: unsigned bytes times signed bytes, four products summed into each 32-bit lane).
//
// Weights: per output and group of 32 inputs, codes 0..15 with w = code * scale + low (scale and low half precision).
// Activations: each row quantized here per block of 32 inputs, x = a * xs (a in -127..127, xs = max |x| / 127).
// Then per group g: y += (scale * xs_g) * sum(code * a) + low * (xs_g * sum(a)): the integer sum exact, the rest in
// float32 in the order of the groups. This is the draft's kernel: exactness never depends on the draft's arithmetic,
// only its acceptance does (the bench measures it).
//
// Layout (w4a8.py `pack`): blocks of 8 outputs, one after another; in a block, per group, 160 bytes: four 32-byte
// vectors of codes (vector t: byte 4 * o + j holds in its low nibble output o's code for input 8t + j, in its high
// nibble the code for input 8t + 4 + j), then the 8 outputs' scales, then their lows (fp16). A thread reads whole
// blocks, one stream each; the codes of a group are unpacked once for up to 4 rows.
// Threads: the OpenMP runtime torch loaded, splitting the blocks. Built at first use by specviz/kernels/w4a8.py.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <vector>

namespace {

const long OUTS = 8, GROUP = 32, BLOCK_BYTES = 160;  // outputs in a block; inputs in a group; bytes a group in a block

inline float to_f32(float v) { return v; }
inline float to_f32(uint16_t v) {
    uint32_t bits = (uint32_t)v << 16;
    float f;
    __builtin_memcpy(&f, &bits, 4);
    return f;
}
inline void store8(float* y, __m256 v) { _mm256_storeu_ps(y, v); }
inline void store8(uint16_t* y, __m256 v) {  // round to nearest even, as torch does
    _mm_storeu_si128((__m128i*)y, (__m128i)_mm256_cvtneps_pbh(v));
}

// one row's activations in 8 bits per block of 32: a (as 32-bit quads), the block's scale xs, and xs * sum(a)
template <typename T>
void quantize_row(const T* x, long k, int32_t* quads, float* xs, float* bsum) {
    int8_t* a = (int8_t*)quads;
    for (long g = 0; g < k / GROUP; g++) {
        float amax = 0.0f;
        for (long j = 0; j < GROUP; j++) amax = fmaxf(amax, fabsf(to_f32(x[g * GROUP + j])));
        float scale = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        int sum = 0;
        for (long j = 0; j < GROUP; j++) {
            int q = (int)nearbyintf(to_f32(x[g * GROUP + j]) * inv);
            a[g * GROUP + j] = (int8_t)q;
            sum += q;
        }
        xs[g] = scale;
        bsum[g] = scale * (float)sum;
    }
}

// N rows (N <= 4) by one block of 8 outputs over every group
template <typename T, int N>
void block_rows(const uint8_t* blk, long groups, const int32_t* const* quads, const float* const* xs,
                const float* const* bsum, T* const* y) {
    const __m256i nibble = _mm256_set1_epi8(0x0F);
    __m256 acc[N];
    for (int r = 0; r < N; r++) acc[r] = _mm256_setzero_ps();
    for (long g = 0; g < groups; g++, blk += BLOCK_BYTES) {
        __m256i codes[8];
        for (int t = 0; t < 4; t++) {
            __m256i v = _mm256_loadu_si256((const __m256i*)(blk + 32 * t));
            codes[2 * t] = _mm256_and_si256(v, nibble);
            codes[2 * t + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
        }
        __m256 scale = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(blk + 128)));
        __m256 low = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(blk + 144)));
        for (int r = 0; r < N; r++) {
            const int32_t* q = quads[r] + g * 8;  // the group's 8 quads of activations
            __m256i sum = _mm256_setzero_si256();
            for (int t = 0; t < 4; t++) {
                sum = _mm256_dpbusd_epi32(sum, codes[2 * t], _mm256_set1_epi32(q[2 * t]));
                sum = _mm256_dpbusd_epi32(sum, codes[2 * t + 1], _mm256_set1_epi32(q[2 * t + 1]));
            }
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(scale, _mm256_set1_ps(xs[r][g])), acc[r]);
            acc[r] = _mm256_fmadd_ps(low, _mm256_set1_ps(bsum[r][g]), acc[r]);
        }
    }
    for (int r = 0; r < N; r++) store8(y[r], acc[r]);
}

template <typename T>
void product(const T* x, const uint8_t* w, T* y, long n, long k, long o) {
    long groups = k / GROUP, blocks = o / OUTS;
    std::vector<int32_t> quads(n * k / 4);
    std::vector<float> xs(n * groups), bsum(n * groups);
    for (long r = 0; r < n; r++) quantize_row(x + r * k, k, &quads[r * k / 4], &xs[r * groups], &bsum[r * groups]);
#pragma omp parallel for schedule(static)
    for (long b = 0; b < blocks; b++) {
        const uint8_t* blk = w + b * groups * BLOCK_BYTES;
        for (long r0 = 0; r0 < n; r0 += 4) {
            const int32_t* q[4];
            const float *s[4], *bs[4];
            T* out[4];
            int rows = n - r0 < 4 ? (int)(n - r0) : 4;
            for (int i = 0; i < rows; i++) {
                q[i] = &quads[(r0 + i) * k / 4];
                s[i] = &xs[(r0 + i) * groups];
                bs[i] = &bsum[(r0 + i) * groups];
                out[i] = y + (r0 + i) * o + b * OUTS;
            }
            switch (rows) {
                case 1: block_rows<T, 1>(blk, groups, q, s, bs, out); break;
                case 2: block_rows<T, 2>(blk, groups, q, s, bs, out); break;
                case 3: block_rows<T, 3>(blk, groups, q, s, bs, out); break;
                default: block_rows<T, 4>(blk, groups, q, s, bs, out);
            }
        }
    }
}

}  // namespace

extern "C" {
// x: n rows of k (k a multiple of 32); w: o outputs packed (o a multiple of 8); y: n rows of o
void w4a8_bf16(const uint16_t* x, const uint8_t* w, uint16_t* y, long n, long k, long o) { product(x, w, y, n, k, o); }
void w4a8_f32(const float* x, const uint8_t* w, float* y, long n, long k, long o) { product(x, w, y, n, k, o); }
}
