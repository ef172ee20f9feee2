// Vector helpers the kernels share (included by each source; kernels/build.py counts this file in a library's
// digest, so a change here builds them afresh).
//
// `V` is one register of float32 lanes at the level a source is built for (build.py's LEVEL_FLAGS): 16 lanes with
// AVX-512, 8 with AVX2. A kernel written on `V` computes each lane alike at either level; what a level changes is
// how lanes are summed across (`V::sum`, a fixed tree per level) and how many registers a kernel may hold.
#pragma once
#include <immintrin.h>
#include <stdint.h>

#ifdef __AVX512F__
struct V {
    using R = __m512;
    static const int L = 16, REGISTERS = 32;
    static R zero() { return _mm512_setzero_ps(); }
    static R set1(float v) { return _mm512_set1_ps(v); }
    static R load(const float* p) { return _mm512_loadu_ps(p); }
    static R load(const uint16_t* p) {  // bf16, widened exactly
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
    }
    static void store(float* p, R v) { _mm512_storeu_ps(p, v); }
#ifdef __AVX512BF16__
    // to nearest even (the instruction takes inputs below float32's normal range as zero)
    static void store(uint16_t* p, R v) { _mm256_storeu_si256((__m256i*)p, (__m256i)_mm512_cvtneps_pbh(v)); }
#endif
    static R fma(R a, R b, R c) { return _mm512_fmadd_ps(a, b, c); }
    static R fnma(R a, R b, R c) { return _mm512_fnmadd_ps(a, b, c); }  // c - a * b, one rounding
    static R add(R a, R b) { return _mm512_add_ps(a, b); }
    static R sub(R a, R b) { return _mm512_sub_ps(a, b); }
    static R mul(R a, R b) { return _mm512_mul_ps(a, b); }
    static float sum(R v) { return _mm512_reduce_add_ps(v); }
    static R round(R v) { return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT); }
    static R pow2(R v, R n) { return _mm512_scalef_ps(v, n); }  // v * 2^n
    static R clamp(R v, float lo, float hi) { return _mm512_min_ps(_mm512_max_ps(v, set1(lo)), set1(hi)); }
    // lanes of bf16 pairs (32 bits each) widened in place: `second` the high halves, `first` the low halves
    static void pairs(const uint16_t* p, R& second, R& first) {
        __m512i v = _mm512_loadu_si512(p);
        second = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32((int)0xFFFF0000u)));
        first = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    }
};
#else
struct V {
    using R = __m256;
    static const int L = 8, REGISTERS = 16;
    static R zero() { return _mm256_setzero_ps(); }
    static R set1(float v) { return _mm256_set1_ps(v); }
    static R load(const float* p) { return _mm256_loadu_ps(p); }
    static R load(const uint16_t* p) {  // bf16, widened exactly
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
    }
    static void store(float* p, R v) { _mm256_storeu_ps(p, v); }
    static void store(uint16_t* p, R v) {  // to nearest even, as torch rounds (a NaN stays a quiet NaN)
        __m256i b = _mm256_castps_si256(v);
        __m256i odd = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
        __m256i r = _mm256_add_epi32(b, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF)));
        __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        r = _mm256_srli_epi32(_mm256_blendv_epi8(r, _mm256_or_si256(b, _mm256_set1_epi32(0x400000)), nan), 16);
        _mm_storeu_si128((__m128i*)p, _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
    }
    static R fma(R a, R b, R c) { return _mm256_fmadd_ps(a, b, c); }
    static R fnma(R a, R b, R c) { return _mm256_fnmadd_ps(a, b, c); }  // c - a * b, one rounding
    static R add(R a, R b) { return _mm256_add_ps(a, b); }
    static R sub(R a, R b) { return _mm256_sub_ps(a, b); }
    static R mul(R a, R b) { return _mm256_mul_ps(a, b); }
    static float sum(R v) {  // halves, then quarters, then the last pair
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
    }
    static R round(R v) { return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
    static R pow2(R v, R n) {  // v * 2^n for whole n in [-126, 127]: n placed in a float's exponent
        __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
        return _mm256_mul_ps(v, _mm256_castsi256_ps(e));
    }
    static R clamp(R v, float lo, float hi) { return _mm256_min_ps(_mm256_max_ps(v, set1(lo)), set1(hi)); }
    static void pairs(const uint16_t* p, R& second, R& first) {  // as AVX-512's
        __m256i v = _mm256_loadu_si256((const __m256i*)p);
        second = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xFFFF0000u)));
        first = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    }
};
#endif

// e^x on every lane: 2^n * p(r), r = x - n ln 2, p a degree-6 polynomial (Cephes' coefficients); x clamped to
// [-87, 88] (below, 0's neighbour: a masked score's exp(-inf); above, float's largest power of two)
inline V::R vexp(V::R x) {
    x = V::clamp(x, -87.0f, 88.0f);
    V::R n = V::round(V::mul(x, V::set1(1.44269504088896341f)));
    V::R r = V::fnma(n, V::set1(0.693359375f), x);
    r = V::fnma(n, V::set1(-2.12194440e-4f), r);
    V::R p = V::set1(1.9875691500e-4f);
    p = V::fma(p, r, V::set1(1.3981999507e-3f));
    p = V::fma(p, r, V::set1(8.3334519073e-3f));
    p = V::fma(p, r, V::set1(4.1665795894e-2f));
    p = V::fma(p, r, V::set1(1.6666665459e-1f));
    p = V::fma(p, r, V::set1(5.0000001201e-1f));
    p = V::fma(V::mul(p, r), r, V::add(r, V::set1(1.0f)));
    return V::pow2(p, n);
}

#ifdef __AVX512F__
inline __m512 exp16(__m512 x) { return vexp(x); }
#endif
