// Attention one query row at a time, each row's sums over its keys in one fixed order whatever the number of rows:
// a verify's row attends exactly as the one-token step at its position does, bit for bit.
//
// Row i of head h (keys and values of head h / group) sees, in increasing slot order, the keys a causal row sees
// (slots 0 .. offset + i) or those its mask allows (a tree's node: the prompt, the pending tokens, its ancestors).
// The r-th key it sees is scored s_r = scale * (q . k_r): the dot product 16 lanes at a time over the head's
// dimension in order, the lanes then summed by one fixed tree. m = max s_r; w_r = exp(s_r - m), one polynomial for
// every lane; l = the sum of w_r, 16 keys at a time by rank (the r-th key in lane r % 16), then across the lanes;
// out = (sum over r in order of w_r v_r) / l. Everything in float32 (bf16 widened exactly), bf16 output rounded to
// nearest even. So a row's result depends on its query and the keys it sees, not on which slots hold them, how many
// rows came with it, or the threads: each (head, row) is computed whole by one thread of the OpenMP runtime torch
// loaded. Built at first use by specviz/kernels/rows.py and called through ctypes.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <vector>

#include "simd.h"

namespace {

const int LANES = 16;

inline __m512 load(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load(const uint16_t* p) {  // 16 bf16 values as float32 (exact)
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}
inline void store(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
inline void store(uint16_t* p, __m512 v) { _mm256_storeu_si256((__m256i*)p, (__m256i)_mm512_cvtneps_pbh(v)); }


template <typename T>
float dot(const T* q, const T* k, long d) {
    __m512 acc = _mm512_setzero_ps();
    for (long c = 0; c < d; c += LANES) acc = _mm512_fmadd_ps(load(q + c), load(k + c), acc);
    return _mm512_reduce_add_ps(acc);
}

// one (head, row): `seen` the key slots it sees, in order; `w` room for them rounded up to 16; `acc` d floats
template <typename T>
void attend_row(const T* q, const T* k, const T* v, T* out, const std::vector<long>& seen, long d, float scale,
                std::vector<float>& w, std::vector<float>& acc) {
    long count = (long)seen.size(), padded = (count + LANES - 1) / LANES * LANES;
    w.assign(padded, -INFINITY);
    float m = -INFINITY;
    for (long r = 0; r < count; r++) {
        w[r] = scale * dot(q, k + seen[r] * d, d);
        m = w[r] > m ? w[r] : m;
    }
    __m512 sum = _mm512_setzero_ps(), mv = _mm512_set1_ps(m);
    for (long r = 0; r < padded; r += LANES) {
        __m512 e = exp16(_mm512_sub_ps(load(&w[r]), mv));  // a padding lane: exp(-inf) = 0
        store(&w[r], e);
        sum = _mm512_add_ps(sum, e);
    }
    float inv = 1.0f / _mm512_reduce_add_ps(sum);
    acc.assign(d, 0.0f);
    for (long r = 0; r < count; r++) {
        __m512 wr = _mm512_set1_ps(w[r]);
        const T* vr = v + seen[r] * d;
        for (long c = 0; c < d; c += LANES) store(&acc[c], _mm512_fmadd_ps(wr, load(vr + c), load(&acc[c])));
    }
    for (long c = 0; c < d; c += LANES) store(out + c, _mm512_mul_ps(load(&acc[c]), _mm512_set1_ps(inv)));
}

// q [heads, n, d]; k, v [kv_heads, slots, d]; allowed [n, slots] (1: seen) or null (causal: row i sees slots
// 0 .. slots - n + i); out [n, heads, d]
template <typename T>
void attend(const T* q, const T* k, const T* v, const uint8_t* allowed, T* out, long heads, long kv_heads, long n,
            long slots, long d, float scale) {
    long group = heads / kv_heads;
#pragma omp parallel
    {
        std::vector<long> seen;
        std::vector<float> w, acc;
        seen.reserve(slots);
#pragma omp for schedule(static)
        for (long job = 0; job < heads * n; job++) {
            long h = job / n, i = job % n, kv = h / group;
            seen.clear();
            for (long j = 0; j < slots; j++)
                if (allowed ? allowed[i * slots + j] != 0 : j <= slots - n + i) seen.push_back(j);
            attend_row(q + (h * n + i) * d, k + kv * slots * d, v + kv * slots * d, out + (i * heads + h) * d, seen,
                       d, scale, w, acc);
        }
    }
}

}  // namespace

extern "C" {
void attend_bf16(const uint16_t* q, const uint16_t* k, const uint16_t* v, const uint8_t* allowed, uint16_t* out,
                 long heads, long kv_heads, long n, long slots, long d, float scale) {
    attend(q, k, v, allowed, out, heads, kv_heads, n, slots, d, scale);
}

void attend_f32(const float* q, const float* k, const float* v, const uint8_t* allowed, float* out, long heads,
                long kv_heads, long n, long slots, long d, float scale) {
    attend(q, k, v, allowed, out, heads, kv_heads, n, slots, d, scale);
}
}
