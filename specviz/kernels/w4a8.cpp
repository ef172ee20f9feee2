// y = x W^T with 4-bit weights and 8-bit activations, multiplied on the CPU's integer dot-product units (AVX512-VNNI's
// vpdpbusd: unsigned bytes times signed bytes, four products summed into each 32-bit lane).
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
// pairs of blocks (`pairs`), two streams; the codes of a group are unpacked once for up to 8 rows. `prefetch`: how
// many bytes ahead of the group it reads each thread asks for its streams (0: the hardware's prefetchers alone); on
// some CPUs a few KB ahead lifts a core's share of the bandwidth, on others it costs: the draft's step is timed both
// ways (w4a8.py).
// Threads: the OpenMP runtime torch loaded, splitting the blocks. Built at first use by specviz/kernels/w4a8.py.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <vector>

#include "simd.h"

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
inline void store16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
inline void store16(uint16_t* p, __m512 v) { _mm256_storeu_si256((__m256i*)p, (__m256i)_mm512_cvtneps_pbh(v)); }

// one row's activations in 8 bits per block of 32: a (as 32-bit quads), the block's scale xs, and xs * sum(a)
inline __m512 widen16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 widen16(const uint16_t* p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}

template <typename T>
void quantize_row(const T* x, long k, int32_t* quads, float* xs, float* bsum) {
    int8_t* a = (int8_t*)quads;
    for (long g = 0; g < k / GROUP; g++) {
        __m512 lo = widen16(x + g * GROUP), hi = widen16(x + g * GROUP + 16);
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
        float scale = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        __m512i qlo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, _mm512_set1_ps(inv)));  // to nearest even
        __m512i qhi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, _mm512_set1_ps(inv)));
        _mm_storeu_si128((__m128i*)(a + g * GROUP), _mm512_cvtsepi32_epi8(qlo));
        _mm_storeu_si128((__m128i*)(a + g * GROUP + 16), _mm512_cvtsepi32_epi8(qhi));
        xs[g] = scale;
        bsum[g] = scale * (float)_mm512_reduce_add_epi32(_mm512_add_epi32(qlo, qhi));
    }
}

// N rows (N <= 4) by one block of 8 outputs over every group, on 256-bit registers (an odd last block)
template <typename T, int N>
void block_rows(const uint8_t* blk, long groups, const int32_t* const* quads, const float* const* xs,
                const float* const* bsum, T* const* y, long prefetch) {
    const __m256i nibble = _mm256_set1_epi8(0x0F);
    __m256 acc[N];
    for (int r = 0; r < N; r++) acc[r] = _mm256_setzero_ps();
    for (long g = 0; g < groups; g++, blk += BLOCK_BYTES) {
        if (prefetch)  // the group's 160 bytes span at most three lines
            for (long line = 0; line < BLOCK_BYTES; line += 64)
                _mm_prefetch((const char*)blk + prefetch + line, _MM_HINT_T0);
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

// room for n rows of k activations in 8 bits
struct Quantized {
    std::vector<int32_t> quads;
    std::vector<float> xs, bsum;
    Quantized(long n, long k) : quads(n * k / 4), xs(n * k / GROUP), bsum(n * k / GROUP) {}
    template <typename T>
    void rows(const T* x, long n, long k) {
        for (long r = 0; r < n; r++)
            quantize_row(x + r * k, k, &quads[r * k / 4], &xs[r * (k / GROUP)], &bsum[r * (k / GROUP)]);
    }
};

// ---- two blocks side by side in a 512-bit register (lanes 0-7 block b's 8 outputs, 8-15 block b + 1's: 16 outputs in
// a row), so each vpdpbusd does twice a 256-bit one's work, its row's quad broadcast straight from memory, in two
// chains of four (one of eight waited on its latency: 64 rows 1.3x faster than 256-bit registers with one chain, 1.7x
// with two, on a 2-core Xeon 6/207); a group's codes, unpacked once, serve ROWS_AT_ONCE rows. At every row count: the
// draft's 96 products at one row took 11.4 ms against 12.1 on 256-bit registers, at six rows 14.0 against 17.5 (same
// Xeon, from memory). Each lane's integer sum is exact and its float operations the 256-bit path's (`block_rows`, left
// for an odd last block) in its order: the same bits, row by row.

const int ROWS_AT_ONCE = 8;  // accumulators beside the 8 codes, scale, low and mask: 20 of the 32 registers

inline __m512i side_by_side(const uint8_t* a, const uint8_t* b) {  // 32 bytes from each
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)a)),
                              _mm256_loadu_si256((const __m256i*)b), 1);
}
inline __m512 halves_side_by_side(const uint8_t* a, const uint8_t* b) {  // 8 fp16 from each, as 16 floats
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i*)a)),
                                                   _mm_loadu_si128((const __m128i*)b), 1));
}

// N rows (N <= ROWS_AT_ONCE) by blocks b and b + 1 (`blk`, `next`) over every group
template <typename T, int N>
void two_blocks(const uint8_t* blk, const uint8_t* next, long groups, const int32_t* const* quads,
                const float* const* xs, const float* const* bsum, T* const* y, long prefetch) {
    const __m512i nibble = _mm512_set1_epi8(0x0F);
    __m512 acc[N];
    for (int r = 0; r < N; r++) acc[r] = _mm512_setzero_ps();
    for (long g = 0; g < groups; g++, blk += BLOCK_BYTES, next += BLOCK_BYTES) {
        if (prefetch)
            for (long line = 0; line < BLOCK_BYTES; line += 64) {
                _mm_prefetch((const char*)blk + prefetch + line, _MM_HINT_T0);
                _mm_prefetch((const char*)next + prefetch + line, _MM_HINT_T0);
            }
        __m512i codes[8];
        for (int t = 0; t < 4; t++) {
            __m512i v = side_by_side(blk + 32 * t, next + 32 * t);
            codes[2 * t] = _mm512_and_si512(v, nibble);
            codes[2 * t + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
        }
        __m512 scale = halves_side_by_side(blk + 128, next + 128), low = halves_side_by_side(blk + 144, next + 144);
        for (int r = 0; r < N; r++) {
            const int32_t* q = quads[r] + g * 8;
            __m512i even = _mm512_setzero_si512(), odd = _mm512_setzero_si512();  // two chains: the sum is exact
            for (int t = 0; t < 8; t += 2) {
                even = _mm512_dpbusd_epi32(even, codes[t], _mm512_set1_epi32(q[t]));
                odd = _mm512_dpbusd_epi32(odd, codes[t + 1], _mm512_set1_epi32(q[t + 1]));
            }
            __m512 sum = _mm512_cvtepi32_ps(_mm512_add_epi32(even, odd));
            acc[r] = _mm512_fmadd_ps(sum, _mm512_mul_ps(scale, _mm512_set1_ps(xs[r][g])), acc[r]);
            acc[r] = _mm512_fmadd_ps(low, _mm512_set1_ps(bsum[r][g]), acc[r]);
        }
    }
    for (int r = 0; r < N; r++) store16(y[r], acc[r]);
}

// every pair of blocks for n rows already quantized (an odd last block: `blocks`' own path); an orphaned `omp for`,
// as `blocks`
template <typename T>
void pairs(const int32_t* quads, const float* xs, const float* bsum, const uint8_t* w, T* y, long n, long k, long o,
           long prefetch) {
    long groups = k / GROUP, nblocks = o / OUTS;
#pragma omp for schedule(static)
    for (long b = 0; b < nblocks; b += 2) {
        const uint8_t* blk = w + b * groups * BLOCK_BYTES;
        for (long r0 = 0; r0 < n; r0 += ROWS_AT_ONCE) {
            const int32_t* q[ROWS_AT_ONCE];
            const float *s[ROWS_AT_ONCE], *bs[ROWS_AT_ONCE];
            T* out[ROWS_AT_ONCE];
            int rows = n - r0 < ROWS_AT_ONCE ? (int)(n - r0) : ROWS_AT_ONCE;
            for (int i = 0; i < rows; i++) {
                q[i] = quads + (r0 + i) * k / 4;
                s[i] = xs + (r0 + i) * groups;
                bs[i] = bsum + (r0 + i) * groups;
                out[i] = y + (r0 + i) * o + b * OUTS;
            }
            if (b + 1 == nblocks) {  // the odd one: four rows at a time on 256-bit registers
                for (int i = 0; i < rows; i += 4) {
                    int part = rows - i < 4 ? rows - i : 4;
                    switch (part) {
                        case 1: block_rows<T, 1>(blk, groups, q + i, s + i, bs + i, out + i, prefetch); break;
                        case 2: block_rows<T, 2>(blk, groups, q + i, s + i, bs + i, out + i, prefetch); break;
                        case 3: block_rows<T, 3>(blk, groups, q + i, s + i, bs + i, out + i, prefetch); break;
                        default: block_rows<T, 4>(blk, groups, q + i, s + i, bs + i, out + i, prefetch);
                    }
                }
                continue;
            }
            const uint8_t* next = blk + groups * BLOCK_BYTES;
            switch (rows) {
#define CASE(N) case N: two_blocks<T, N>(blk, next, groups, q, s, bs, out, prefetch); break;
                CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
#undef CASE
            }
        }
    }
}

template <typename T>
void product(const T* x, const uint8_t* w, T* y, long n, long k, long o, long prefetch) {
    Quantized a(n, k);
    a.rows(x, n, k);
#pragma omp parallel
    pairs(a.quads.data(), a.xs.data(), a.bsum.data(), w, y, n, k, o, prefetch);
}

// ---- the draft's step over new tokens (one, a round's last draft and its bonus, a short prompt), layer after layer,
// in one call: its glue in C++ (not ~30 Python ops a layer), in one parallel region (the products' blocks and the
// heads split between the threads, the rest done by one)

inline float load_f(const float* p, long i) { return p[i]; }
inline float load_f(const uint16_t* p, long i) { return to_f32(p[i]); }


void rms_norm(const float* x, const float* w, float* y, long n, float eps) {  // n a multiple of 16
    __m512 sum = _mm512_setzero_ps();
    for (long i = 0; i < n; i += 16) sum = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(x + i), sum);
    __m512 inv = _mm512_set1_ps(1.0f / sqrtf(_mm512_reduce_add_ps(sum) / n + eps));
    for (long i = 0; i < n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), inv), _mm512_loadu_ps(w + i)));
}

void rope(float* x, long heads, long d, const float* cos, const float* sin) {  // rotate_half, as Llama/Qwen2
    long half = d / 2;
    for (long h = 0; h < heads; h++) {
        float* v = x + h * d;
        for (long i = 0; i < half; i++) {
            float a = v[i], b = v[i + half];
            v[i] = a * cos[i] - b * sin[i];
            v[i + half] = b * cos[i + half] + a * sin[i + half];
        }
    }
}

// each head's query rows (row r at position first + r) over the cache's slots up to their own, causally: head h reads
// kv head h / group; `omp for` over heads. q: row r at q + r * stride; out: row r at out + r * heads * d
template <typename C>
void attend(const float* q, long stride, const C* k, const C* v, float* out, long rows, long heads, long kv_heads,
            long first, long capacity, long d, float scale, float* scores) {
    long group = heads / kv_heads;
#pragma omp for schedule(static)
    for (long h = 0; h < heads; h++) {
        const C* kh = k + (h / group) * capacity * d;
        const C* vh = v + (h / group) * capacity * d;
        float* sc = scores + h * (first + rows);
        for (long r = 0; r < rows; r++) {
            const float* qr = q + r * stride + h * d;
            long len = first + r + 1;
            float m = -INFINITY;
            for (long j = 0; j < len; j++) {
                __m512 acc = _mm512_setzero_ps();
                for (long c = 0; c < d; c += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(qr + c), widen16(kh + j * d + c), acc);
                sc[j] = _mm512_reduce_add_ps(acc) * scale;
                m = sc[j] > m ? sc[j] : m;
            }
            float sum = 0.0f;
            for (long j = 0; j < len; j++) sum += (sc[j] = expf(sc[j] - m));
            float inv = 1.0f / sum;
            float* o = out + (r * heads + h) * d;
            for (long c = 0; c < d; c += 16) {
                __m512 acc = _mm512_setzero_ps();
                for (long j = 0; j < len; j++) acc = _mm512_fmadd_ps(_mm512_set1_ps(sc[j]), widen16(vh + j * d + c), acc);
                _mm512_storeu_ps(o + c, _mm512_mul_ps(acc, _mm512_set1_ps(inv)));
            }
        }
    }
}

// `tiles`: where the process may use AMX, amx.cpp's `w4_rows` (the products of `tile_rows` rows or more on the
// tiles: a prompt), else null
typedef void (*Tiles)(const float* x, uint16_t* xb, const uint8_t* w, float* y, long n, long k, long o);

struct Shape {
    long hidden, heads, kv_heads, d, ffn, capacity, prefetch;
    float eps, scale;
    Tiles tiles;
    long tile_rows;
};

// n new tokens at positions pos.., their hidden states h (n rows of `hidden`) in and the last layer's out; cos and
// sin: n rows of d. Per layer, 7 pointers: norm1 (float), qkv codes, qkv bias (float or null), o codes, norm2
// (float), gate/up codes, down codes; the cache: per layer its K and V, [kv_heads, capacity, d] in the model's dtype
template <typename C>
void lean_step(float* h, long n, long layers, void* const* params, C* const* keys, C* const* values, long pos,
               const float* cos, const float* sin, const Shape& s) {
    long q_size = s.heads * s.d, kv_size = s.kv_heads * s.d, width = q_size + 2 * kv_size;
    std::vector<float> x(n * s.hidden), qkv(n * width), a(n * q_size), gu(n * 2 * s.ffn), act(n * s.ffn),
        proj(n * s.hidden), scores(s.heads * (pos + n));
    long widest = s.hidden > s.ffn ? s.hidden : s.ffn;
    if (q_size > widest) widest = q_size;
    const bool tiled = s.tiles && n >= s.tile_rows;
    Quantized qa(n, widest);  // room for every product's input
    // the tiles' input rows in bf16, whole tiles of them (rows past n are multiplied too and their outputs dropped)
    std::vector<uint16_t> xb(tiled ? (n + 15) / 16 * 16 * widest : 0, 0);
    // every product of the step: all threads call it (its `omp for` splits the outputs)
    auto product = [&](const float* in, long k, const void* w, float* out, long o) {
        if (tiled && o % 16 == 0) return s.tiles(in, xb.data(), (const uint8_t*)w, out, n, k, o);
#pragma omp single
        qa.rows(in, n, k);
        pairs<float>(qa.quads.data(), qa.xs.data(), qa.bsum.data(), (const uint8_t*)w, out, n, k, o, s.prefetch);
    };
    auto norms = [&](const float* w) {  // each row's norm into x
        for (long r = 0; r < n; r++) rms_norm(h + r * s.hidden, w, x.data() + r * s.hidden, s.hidden, s.eps);
    };
#pragma omp parallel
    for (long l = 0; l < layers; l++) {
        void* const* p = params + 7 * l;
#pragma omp single
        norms((const float*)p[0]);
        product(x.data(), s.hidden, p[1], qkv.data(), width);
#pragma omp single
        for (long r = 0; r < n; r++) {
            float* row = qkv.data() + r * width;
            if (p[2]) for (long i = 0; i < width; i++) row[i] += ((const float*)p[2])[i];
            float *k = row + q_size, *v = k + kv_size;
            rope(row, s.heads, s.d, cos + r * s.d, sin + r * s.d);
            rope(k, s.kv_heads, s.d, cos + r * s.d, sin + r * s.d);
            for (long g = 0; g < s.kv_heads; g++)
                for (long c = 0; c < s.d; c += 16) {
                    store16(keys[l] + (g * s.capacity + pos + r) * s.d + c, _mm512_loadu_ps(k + g * s.d + c));
                    store16(values[l] + (g * s.capacity + pos + r) * s.d + c, _mm512_loadu_ps(v + g * s.d + c));
                }
        }
        attend(qkv.data(), width, keys[l], values[l], a.data(), n, s.heads, s.kv_heads, pos, s.capacity, s.d, s.scale,
               scores.data());
        product(a.data(), q_size, p[3], proj.data(), s.hidden);
#pragma omp single
        {
            for (long i = 0; i < n * s.hidden; i++) h[i] += proj[i];
            norms((const float*)p[4]);
        }
        product(x.data(), s.hidden, p[5], gu.data(), 2 * s.ffn);
#pragma omp single
        for (long r = 0; r < n; r++)
            for (long i = 0; i < s.ffn; i += 16) {  // silu(gate) * up
                const float* row = gu.data() + r * 2 * s.ffn;
                __m512 g = _mm512_loadu_ps(row + i);
                __m512 sig = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), exp16(_mm512_sub_ps(_mm512_setzero_ps(), g))));
                _mm512_storeu_ps(&act[r * s.ffn + i], _mm512_mul_ps(sig, _mm512_loadu_ps(row + s.ffn + i)));
            }
        product(act.data(), s.ffn, p[6], proj.data(), s.hidden);
#pragma omp single
        for (long i = 0; i < n * s.hidden; i++) h[i] += proj[i];
    }
}

}  // namespace

extern "C" {
// the draft's step over every layer for n new tokens: h (float, their embeddings) in, the last layer's output out
void lean_step_bf16(float* h, long n, long layers, void* const* params, uint16_t* const* keys, uint16_t* const* values,
                    long pos, const float* cos, const float* sin, long hidden, long heads, long kv_heads, long d,
                    long ffn, long capacity, float eps, float scale, long prefetch, void* tiles, long tile_rows) {
    lean_step(h, n, layers, params, keys, values, pos, cos, sin,
              Shape{hidden, heads, kv_heads, d, ffn, capacity, prefetch, eps, scale, (Tiles)tiles, tile_rows});
}
void lean_step_f32(float* h, long n, long layers, void* const* params, float* const* keys, float* const* values, long pos,
                   const float* cos, const float* sin, long hidden, long heads, long kv_heads, long d, long ffn,
                   long capacity, float eps, float scale, long prefetch, void* tiles, long tile_rows) {
    lean_step(h, n, layers, params, keys, values, pos, cos, sin,
              Shape{hidden, heads, kv_heads, d, ffn, capacity, prefetch, eps, scale, (Tiles)tiles, tile_rows});
}
// x: n rows of k (k a multiple of 32); w: o outputs packed (o a multiple of 8); y: n rows of o
void w4a8_bf16(const uint16_t* x, const uint8_t* w, uint16_t* y, long n, long k, long o, long prefetch) {
    product(x, w, y, n, k, o, prefetch);
}
void w4a8_f32(const float* x, const uint8_t* w, float* y, long n, long k, long o, long prefetch) {
    product(x, w, y, n, k, o, prefetch);
}
}
