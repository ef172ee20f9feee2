// Attention one query row at a time, each row's sums over its keys in one fixed order whatever the number of rows:
// a verify's row attends exactly as the one-token step at its position does, bit for bit.
//
// Row i of head h (keys and values of head h / group) sees, in increasing slot order, the keys a causal row sees
// (slots 0 .. offset + i) or those its mask allows (a tree's node: the prompt, the pending tokens, its ancestors).
// The r-th key it sees is scored s_r = scale * (q . k_r): the dot product a register of lanes at a time (16 with
// AVX-512, 8 with AVX2: `V`, simd.h) over the head's dimension in order, the lanes then summed by one fixed tree.
// m = max s_r; w_r = exp(s_r - m), one polynomial for every lane; l = the sum of w_r, a register of keys at a time by
// rank (the r-th key in lane r % lanes), then across the lanes; out = (sum over r in order of w_r v_r) / l.
// Everything in float32 (bf16 widened exactly), bf16 output rounded to nearest even. So a row's result depends on its
// query and the keys it sees, not on which slots hold them, how many rows came with it, or the threads: each
// (head, row) is computed whole by one thread of the OpenMP runtime torch loaded. Built at first use by
// specviz/kernels/rows.py (for AVX-512 or AVX2) and called through ctypes.
#include <math.h>
#include <stdint.h>
#include <vector>

#include "simd.h"

namespace {

const int LANES = V::L;  // 16 with AVX-512, 8 with AVX2 (simd.h): each build sums a row one way at every row count

template <typename T>
float dot(const T* q, const T* k, long d) {
    V::R acc = V::zero();
    for (long c = 0; c < d; c += LANES) acc = V::fma(V::load(q + c), V::load(k + c), acc);
    return V::sum(acc);
}

// one (head, row): `seen` the key slots it sees, in order; `w` room for them rounded up to the lanes; `acc` d floats
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
    V::R sum = V::zero(), mv = V::set1(m);
    for (long r = 0; r < padded; r += LANES) {
        V::R e = vexp(V::sub(V::load(&w[r]), mv));  // a padding lane: exp(-inf) = 0
        V::store(&w[r], e);
        sum = V::add(sum, e);
    }
    float inv = 1.0f / V::sum(sum);
    acc.assign(d, 0.0f);
    for (long r = 0; r < count; r++) {
        V::R wr = V::set1(w[r]);
        const T* vr = v + seen[r] * d;
        for (long c = 0; c < d; c += LANES) V::store(&acc[c], V::fma(wr, V::load(vr + c), V::load(&acc[c])));
    }
    for (long c = 0; c < d; c += LANES) V::store(out + c, V::mul(V::load(&acc[c]), V::set1(inv)));
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
