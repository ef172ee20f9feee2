// y = x W^T with 4-bit weights and 8-bit activations, multiplied on the CPU's integer dot-product units: four products
// of an unsigned byte (a code) and a signed byte (an activation) summed into each 32-bit lane. One source, built at a
// vector level (w4a8.py): AVX-512 multiplies with AVX512-VNNI's vpdpbusd, on 512-bit registers two blocks at once;
// AVX2 with AVX-VNNI's vpdpbusd on 256-bit registers where the CPU has it, else with vpmaddubsw (pairs of products
// into 16 bits: at most 2 * 15 * 127, never saturated) and vpmaddwd (pairs of those into 32). The integer sums are
// exact either way, and each output's float operations are the same at both levels in the same order: the same
// products, bit for bit (a bf16 output below float32's normal range aside: AVX512-BF16 rounds it to zero).
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

inline void store8(float* y, __m256 v) { _mm256_storeu_ps(y, v); }
#ifdef __AVX512F__
inline void store8(uint16_t* y, __m256 v) {  // round to nearest even, as torch does
    _mm_storeu_si128((__m128i*)y, (__m128i)_mm256_cvtneps_pbh(v));
}
#else
inline void store8(uint16_t* y, __m256 v) { V::store(y, v); }  // (V: 8 lanes below AVX-512)
#endif

// a row's 8 inputs as floats
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}
inline float max8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}
inline int32_t sum8(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 1)));
}

// one row's activations in 8 bits per block of 32: a (as 32-bit quads), the block's scale xs, and xs * sum(a). The
// maximum, the rounding to integers and their sum are exact: any width gives these bits
template <typename T>
void quantize_row(const T* x, long k, int32_t* quads, float* xs, float* bsum) {
    int8_t* a = (int8_t*)quads;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (long g = 0; g < k / GROUP; g++) {
        __m256 v[4], m = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) {
            v[i] = load8(x + g * GROUP + 8 * i);
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[i]));
        }
        float amax = max8(m);
        float scale = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        __m256i q[4];
        for (int i = 0; i < 4; i++)  // to nearest even
            q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], _mm256_set1_ps(inv)));
        // to bytes with saturation (none happens: |a| <= 127), then the 32-bit quads back in input order
        __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        _mm256_storeu_si256((__m256i*)(a + g * GROUP),
                            _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
        xs[g] = scale;
        bsum[g] = scale * (float)sum8(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
    }
}

// sum + the four products of each lane's codes (unsigned, 0..15) and activations (signed), exactly
inline __m256i dot4(__m256i sum, __m256i codes, __m256i a) {
#if defined(__AVX512VNNI__)
    return _mm256_dpbusd_epi32(sum, codes, a);
#elif defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(sum, codes, a);
#else
    return _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(codes, a), _mm256_set1_epi16(1)));
#endif
}

// N rows (N <= 4) by B blocks of 8 outputs (B = 1 or 2, `blocks`; the outputs of block b at y[r] + 8b) over every
// group, on 256-bit registers: below AVX-512 every pair of blocks (two streams), at AVX-512 an odd last block
template <typename T, int N, int B>
void block_rows(const uint8_t* const* blocks, long groups, const int32_t* const* quads, const float* const* xs,
                const float* const* bsum, T* const* y, long prefetch) {
    const __m256i nibble = _mm256_set1_epi8(0x0F);
    const uint8_t* blk[B];
    __m256 acc[B][N];
    for (int b = 0; b < B; b++) {
        blk[b] = blocks[b];
        for (int r = 0; r < N; r++) acc[b][r] = _mm256_setzero_ps();
    }
    for (long g = 0; g < groups; g++)
        for (int b = 0; b < B; b++) {
            if (prefetch)  // the group's 160 bytes span at most three lines
                for (long line = 0; line < BLOCK_BYTES; line += 64)
                    _mm_prefetch((const char*)blk[b] + prefetch + line, _MM_HINT_T0);
            __m256i codes[8];
            for (int t = 0; t < 4; t++) {
                __m256i v = _mm256_loadu_si256((const __m256i*)(blk[b] + 32 * t));
                codes[2 * t] = _mm256_and_si256(v, nibble);
                codes[2 * t + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
            }
            __m256 scale = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(blk[b] + 128)));
            __m256 low = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(blk[b] + 144)));
            for (int r = 0; r < N; r++) {
                const int32_t* q = quads[r] + g * 8;  // the group's 8 quads of activations
                __m256i sum = _mm256_setzero_si256();
                for (int t = 0; t < 8; t++) sum = dot4(sum, codes[t], _mm256_set1_epi32(q[t]));
                __m256 a = acc[b][r];
                a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(scale, _mm256_set1_ps(xs[r][g])), a);
                acc[b][r] = _mm256_fmadd_ps(low, _mm256_set1_ps(bsum[r][g]), a);
            }
            blk[b] += BLOCK_BYTES;
        }
    for (int b = 0; b < B; b++)
        for (int r = 0; r < N; r++) store8(y[r] + OUTS * b, acc[b][r]);
}

// `rows` rows (up to 8) by B blocks on 256-bit registers, four rows at a time
template <typename T, int B>
void narrow(const uint8_t* const* blocks, long groups, int rows, const int32_t* const* q, const float* const* s,
            const float* const* bs, T* const* out, long prefetch) {
    for (int i = 0; i < rows; i += 4) {
        switch (rows - i < 4 ? rows - i : 4) {
            case 1: block_rows<T, 1, B>(blocks, groups, q + i, s + i, bs + i, out + i, prefetch); break;
            case 2: block_rows<T, 2, B>(blocks, groups, q + i, s + i, bs + i, out + i, prefetch); break;
            case 3: block_rows<T, 3, B>(blocks, groups, q + i, s + i, bs + i, out + i, prefetch); break;
            default: block_rows<T, 4, B>(blocks, groups, q + i, s + i, bs + i, out + i, prefetch);
        }
    }
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

// rows a pass over a pair of blocks takes: at AVX-512 at once (8 accumulators beside the 8 codes, scale, low and mask:
// 20 of the 32 registers), at AVX2 four at a time (`narrow`)
const int ROWS_AT_ONCE = 8;

#ifdef __AVX512F__
// ---- two blocks side by side in a 512-bit register (lanes 0-7 block b's 8 outputs, 8-15 block b + 1's: 16 outputs in
// a row), so each vpdpbusd does twice a 256-bit one's work, its row's quad broadcast straight from memory, in two
// chains of four (one of eight waited on its latency: 64 rows 1.3x faster than 256-bit registers with one chain, 1.7x
// with two, on a 2-core Xeon 6/207); a group's codes, unpacked once, serve ROWS_AT_ONCE rows. At every row count: the
// draft's 96 products at one row took 11.4 ms against 12.1 on 256-bit registers, at six rows 14.0 against 17.5 (same
// Xeon, from memory). Each lane's integer sum is exact and its float operations the 256-bit path's (`block_rows`, left
// for an odd last block) in its order: the same bits, row by row.

inline void store16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
inline void store16(uint16_t* p, __m512 v) { _mm256_storeu_si256((__m256i*)p, (__m256i)_mm512_cvtneps_pbh(v)); }

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

// `rows` rows (up to ROWS_AT_ONCE) by the pair of blocks `blocks` (two streams)
template <typename T>
void both_blocks(const uint8_t* const* blocks, long groups, int rows, const int32_t* const* q, const float* const* s,
                 const float* const* bs, T* const* out, long prefetch) {
    switch (rows) {
#define CASE(N) case N: two_blocks<T, N>(blocks[0], blocks[1], groups, q, s, bs, out, prefetch); break;
        CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
#undef CASE
    }
}
#else
// ---- below AVX-512: a pair of blocks on 256-bit registers, each block's 8 outputs in one, four rows at a time
template <typename T>
void both_blocks(const uint8_t* const* blocks, long groups, int rows, const int32_t* const* q, const float* const* s,
                 const float* const* bs, T* const* out, long prefetch) {
    narrow<T, 2>(blocks, groups, rows, q, s, bs, out, prefetch);
}
#endif

// every pair of blocks for n rows already quantized (an odd last block alone on 256-bit registers); an orphaned
// `omp for`: the caller's parallel region splits the pairs
template <typename T>
void pairs(const int32_t* quads, const float* xs, const float* bsum, const uint8_t* w, T* y, long n, long k, long o,
           long prefetch) {
    long groups = k / GROUP, nblocks = o / OUTS;
#pragma omp for schedule(static)
    for (long b = 0; b < nblocks; b += 2) {
        const uint8_t* blk = w + b * groups * BLOCK_BYTES;
        const uint8_t* blocks[2] = {blk, b + 1 < nblocks ? blk + groups * BLOCK_BYTES : nullptr};
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
            if (b + 1 == nblocks)
                narrow<T, 1>(blocks, groups, rows, q, s, bs, out, prefetch);
            else
                both_blocks<T>(blocks, groups, rows, q, s, bs, out, prefetch);
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
// heads split between the threads, the rest done by one). Its vectors are `V`'s (simd.h): a sum across lanes (a norm's,
// an attention score's) is summed per lane, then across in V::sum's tree, so the two levels differ there by rounding

void rms_norm(const float* x, const float* w, float* y, long n, float eps) {  // n a multiple of V::L
    V::R sum = V::zero();
    for (long i = 0; i < n; i += V::L) sum = V::fma(V::load(x + i), V::load(x + i), sum);
    V::R inv = V::set1(1.0f / sqrtf(V::sum(sum) / n + eps));
    for (long i = 0; i < n; i += V::L) V::store(y + i, V::mul(V::mul(V::load(x + i), inv), V::load(w + i)));
}

inline V::R divide(V::R a, V::R b) {
#ifdef __AVX512F__
    return _mm512_div_ps(a, b);
#else
    return _mm256_div_ps(a, b);
#endif
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
                V::R acc = V::zero();
                for (long c = 0; c < d; c += V::L) acc = V::fma(V::load(qr + c), V::load(kh + j * d + c), acc);
                sc[j] = V::sum(acc) * scale;
                m = sc[j] > m ? sc[j] : m;
            }
            float sum = 0.0f;
            for (long j = 0; j < len; j++) sum += (sc[j] = expf(sc[j] - m));
            float inv = 1.0f / sum;
            float* o = out + (r * heads + h) * d;
            for (long c = 0; c < d; c += V::L) {
                V::R acc = V::zero();
                for (long j = 0; j < len; j++) acc = V::fma(V::set1(sc[j]), V::load(vh + j * d + c), acc);
                V::store(o + c, V::mul(acc, V::set1(inv)));
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
#ifdef __AVX512F__
    const bool tiled = s.tiles && n >= s.tile_rows;
#else
    const bool tiled = false;  // (the tiles' kernel is AVX-512 code: below it, never called)
#endif
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
                for (long c = 0; c < s.d; c += V::L) {
                    V::store(keys[l] + (g * s.capacity + pos + r) * s.d + c, V::load(k + g * s.d + c));
                    V::store(values[l] + (g * s.capacity + pos + r) * s.d + c, V::load(v + g * s.d + c));
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
            for (long i = 0; i < s.ffn; i += V::L) {  // silu(gate) * up
                const float* row = gu.data() + r * 2 * s.ffn;
                V::R g = V::load(row + i);
                V::R sig = divide(g, V::add(V::set1(1.0f), vexp(V::sub(V::zero(), g))));
                V::store(&act[r * s.ffn + i], V::mul(sig, V::load(row + s.ffn + i)));
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
