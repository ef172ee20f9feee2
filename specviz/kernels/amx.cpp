// y = x W^T (+ bias) in bf16 on AMX tiles, reading the weight as streamed.cpp lays it out (specviz/kernels/streamed.py
// `pack`): blocks of 16 outputs, in each block the inputs in pairs, so 16 pairs of one block are 1 KB in a row,
// exactly a B tile (16 rows of 64 bytes, pairs side by side) as it lies: the tiles read the one copy as it is.
//
// The order of the sums, the same at every number of rows: output j of row i is its block's C tile, zeroed, then
// one TDPBF16PS per step of 32 inputs, the steps in order. A tile's rows are independent of each other (row i's
// bits depend on row i of A alone, not on how many rows the tile has), and which C tile or thread holds a block does
// not change its sums: 1 row or 17 sum alike by construction. These are not streamed.cpp's sums (another way,
// `SUMS`): the one-token step runs here too where a plan chooses this kernel.
//
// Few rows (<= 16): one pass over the weight, the threads splitting its blocks 4 at a time, each thread asking for
// the weight `ahead` bytes before its tiles load it; the rows are one A tile of n rows. More rows (a prompt): each
// group of 4 blocks is read from memory once and kept in the core's caches while the rows go past it 16 at a time
// (the last few copied into a zeroed 16-row tile, their outputs dropped).
// Linux gives a process the tile state only on request (`amx_permit`, once per process, before any call); each
// thread loads its tile configuration at the start of a call and releases the tiles at its end.
#include <immintrin.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <memory>
#include <vector>

namespace {

const long LANES = 16;  // outputs in a block: a C tile's 16 float32 columns
const long STEP = 32;   // inputs a tile step covers: 16 pairs, a B tile's 16 rows
const long TILE = 1024;  // bytes of one B tile
const int MAX_ROWS = 16;  // rows a tile holds
const int BLOCKS = 4;  // blocks at once: C tiles 4-7; A tile 0; B tiles 1-3

struct Config {  // LDTILECFG's 64 bytes, palette 1
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

void configure(int m) {
    Config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    c.rows[0] = m, c.colsb[0] = 64;  // A: m rows of 32 bf16
    for (int t = 1; t <= 3; t++) c.rows[t] = 16, c.colsb[t] = 64;  // B: 16 pairs of inputs x 16 outputs
    for (int t = 4; t <= 7; t++) c.rows[t] = m, c.colsb[t] = 64;  // C: m rows x 16 float32
    _tile_loadconfig(&c);
}

inline void ask(const char* p, long ahead) {  // the 16 lines of a B tile `ahead` bytes on: a hint (the same bits)
    for (int line = 0; line < 16; line++) _mm_prefetch(p + ahead + line * 64, _MM_HINT_T0);
}

// NB blocks (1-4) one after another from `block`: their C tiles summed over every step, then stored to `acc` (NB x 16
// rows x 16)
template <int NB>
void sums(const uint16_t* x, long k, const uint16_t* w_block, long ahead, float* acc) {
    _tile_zero(4);
    if constexpr (NB > 1) _tile_zero(5);
    if constexpr (NB > 2) _tile_zero(6);
    if constexpr (NB > 3) _tile_zero(7);
    const char* block = (const char*)w_block;
    const long bytes = k * LANES * 2;  // one block's weight
    for (long s = 0; s < k / STEP; s++) {
        const char* at = block + s * TILE;
        if (ahead) {
            ask(at, ahead);
            if constexpr (NB > 1) ask(at + bytes, ahead);
            if constexpr (NB > 2) ask(at + 2 * bytes, ahead);
            if constexpr (NB > 3) ask(at + 3 * bytes, ahead);
        }
        _tile_loadd(0, x + s * STEP, k * 2);
        _tile_loadd(1, at, 64);
        _tile_dpbf16ps(4, 0, 1);
        if constexpr (NB > 1) { _tile_loadd(2, at + bytes, 64); _tile_dpbf16ps(5, 0, 2); }
        if constexpr (NB > 2) { _tile_loadd(3, at + 2 * bytes, 64); _tile_dpbf16ps(6, 0, 3); }
        if constexpr (NB > 3) { _tile_loadd(1, at + 3 * bytes, 64); _tile_dpbf16ps(7, 0, 1); }
    }
    const long c = MAX_ROWS * LANES;
    _tile_stored(4, acc, 64);
    if constexpr (NB > 1) _tile_stored(5, acc + c, 64);
    if constexpr (NB > 2) _tile_stored(6, acc + 2 * c, 64);
    if constexpr (NB > 3) _tile_stored(7, acc + 3 * c, 64);
}

inline __m512 bf16_to_f32(const uint16_t* p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}

inline void put(uint16_t* p, __m512 v) { _mm256_storeu_si256((__m256i*)p, (__m256i)_mm512_cvtneps_pbh(v)); }
inline void put(float* p, __m512 v) { _mm512_storeu_ps(p, v); }

// `nb` blocks one after another from `w_block` for `m` rows of x (k inputs a row): their outputs (+ bias) into the
// columns of y (o a row) from `j0` on, rounded to Y
template <typename Y>
void blocks_out(const uint16_t* x, long m, long k, const uint16_t* w_block, int nb, const uint16_t* bias, Y* y,
                long j0, long o, long ahead) {
    alignas(64) float acc[BLOCKS * MAX_ROWS * LANES];
    switch (nb) {
        case 4: sums<4>(x, k, w_block, ahead, acc); break;
        case 3: sums<3>(x, k, w_block, ahead, acc); break;
        case 2: sums<2>(x, k, w_block, ahead, acc); break;
        default: sums<1>(x, k, w_block, ahead, acc);
    }
    for (int r = 0; r < nb; r++) {
        long j = j0 + r * LANES;
        __m512 add = bias ? bf16_to_f32(bias + j) : _mm512_setzero_ps();
        for (long i = 0; i < m; i++)
            put(y + i * o + j, _mm512_add_ps(_mm512_load_ps(acc + (r * MAX_ROWS + i) * LANES), add));
    }
}

// ---- a 4-bit weight (w4a8.cpp's layout: the draft's) over many rows (a prompt). The vector kernel unpacks a group's
// codes for every 8 rows and multiplies them on 8-bit units: its products over a prompt cost the draft about a step
// per 11 tokens (2-core Xeon with AMX, family 6 model 167). Here each thread widens a panel of BLOCKS blocks of 16
// outputs once to bf16 (code * scale + low, rounded once), in the tiles' layout, and every row goes past it 16 at a
// time: the rows cost tile steps, not a step each.
// The activations go in as bf16, not 8 bits: the draft's arithmetic rounds otherwise (exactness never depends on it).
const long W4_GROUP = 160;  // bytes of a w4a8 block of 8 outputs for a group of 32 inputs: codes, 8 scales, 8 lows

inline __m512 doubled(const uint8_t* p) {  // 8 fp16 as 16 floats, each twice: once per input of a pair
    const __m512i twice = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    return _mm512_permutexvar_ps(twice, _mm512_cvtph_ps(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i*)p))));
}

// one B-tile row (16 outputs x an input pair) from codes: outputs 0-7's 16 bytes, then outputs 8-15's
inline void widen_row(uint16_t* row, __m128i first, __m128i second, __m512 s0, __m512 l0, __m512 s1, __m512 l1) {
    __m512 w0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(first)), s0, l0);
    __m512 w1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(second)), s1, l1);
    _mm512_storeu_si512(row, (__m512i)_mm512_cvtne2ps_pbh(w1, w0));
}

// w4a8 blocks b and b + 1 (8 outputs each) as one block of 16 in the tiles' layout: per group, 16 rows of input pairs.
// A w4a8 code vector t holds, at byte 4 * o + j, output o's codes for inputs 8t + j (low nibble) and 8t + 4 + j
// (high): `pick` gathers each nibble plane's two pair rows, (j = 0, 1) and (j = 2, 3), as bytes 2 * o + input
__attribute__((target("avx512vbmi"))) void widen(const uint8_t* first, const uint8_t* second, long groups,
                                                  uint16_t* out) {
    alignas(64) uint8_t order[64];
    for (int e = 0; e < 64; e++) order[e] = (uint8_t)(4 * (e % 32 / 2) + 2 * (e / 32) + e % 2);
    const __m512i pick = _mm512_load_si512(order), nibble = _mm512_set1_epi8(0x0F);
    for (long g = 0; g < groups; g++) {
        const uint8_t *a = first + g * W4_GROUP, *c = second + g * W4_GROUP;
        const __m512 s0 = doubled(a + 128), l0 = doubled(a + 144), s1 = doubled(c + 128), l1 = doubled(c + 144);
        uint16_t* tile = out + g * TILE / 2;
        for (int t = 0; t < 4; t++) {
            __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)(a + 32 * t))),
                                           _mm256_loadu_si256((const __m256i*)(c + 32 * t)), 1);
            const __m512i planes[2] = {_mm512_and_si512(v, nibble), _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble)};
            for (int half = 0; half < 2; half++) {
                __m512i two = _mm512_permutexvar_epi8(pick, planes[half]);
                uint16_t* row = tile + (4 * t + 2 * half) * 2 * LANES;
                widen_row(row, _mm512_extracti32x4_epi32(two, 0), _mm512_extracti32x4_epi32(two, 1), s0, l0, s1, l1);
                widen_row(row + 2 * LANES, _mm512_extracti32x4_epi32(two, 2), _mm512_extracti32x4_epi32(two, 3), s0,
                          l0, s1, l1);
            }
        }
    }
}

}  // namespace

extern "C" {
// 0 where this process may use the tiles (Linux grants the tile state on request: ARCH_REQ_XCOMP_PERM for
// XFEATURE_XTILEDATA), else the errno of the refusal
int amx_permit() {
    const long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 ? 0 : errno;
}

// x: n rows of k bf16 (k a multiple of 32); w: the packed weight of o outputs (a multiple of 16); bias: o or null;
// y: n rows of o; ahead: how far on (bytes) each thread asks for the weight it will read next, 0 for nothing
void linear_amx(const uint16_t* x, const uint16_t* w, const uint16_t* bias, uint16_t* y, long n, long k, long o,
                long ahead) {
    long blocks = o / LANES, groups = (blocks + BLOCKS - 1) / BLOCKS;
    if (n <= MAX_ROWS) {
#pragma omp parallel
        {
            configure((int)n);
#pragma omp for schedule(static)
            for (long g = 0; g < groups; g++) {
                long b = g * BLOCKS;
                int nb = blocks - b < BLOCKS ? (int)(blocks - b) : BLOCKS;
                blocks_out(x, n, k, w + b * k * LANES, nb, bias, y, b * LANES, o, ahead);
            }
            _tile_release();
        }
        return;
    }
    long full = n / MAX_ROWS, rest = n % MAX_ROWS;
    std::vector<uint16_t> tail(rest ? MAX_ROWS * k : 0, 0);  // the last few rows in a zeroed tile's worth
    if (rest) memcpy(tail.data(), x + full * MAX_ROWS * k, rest * k * 2);
#pragma omp parallel
    {
        configure(MAX_ROWS);
#pragma omp for schedule(static)
        for (long g = 0; g < groups; g++) {
            long b = g * BLOCKS;
            int nb = blocks - b < BLOCKS ? (int)(blocks - b) : BLOCKS;
            const uint16_t* wb = w + b * k * LANES;
            for (long c = 0; c < full; c++)  // the first chunk reads the weight from memory, the others from caches
                blocks_out(x + c * MAX_ROWS * k, MAX_ROWS, k, wb, nb, bias, y + c * MAX_ROWS * o, b * LANES, o,
                           c ? 0 : ahead);
            if (rest) blocks_out(tail.data(), rest, k, wb, nb, bias, y + full * MAX_ROWS * o, b * LANES, o, 0);
        }
        _tile_release();
    }
}
}

extern "C" {
// Inside the caller's parallel region (every thread calls it; lean_step in w4a8.cpp): n rows of x (float, k a row, k a
// multiple of 32) by a 4-bit weight of o outputs (a multiple of 16) in w4a8.cpp's layout into y (float, o a row).
// xb: room for the rows in bf16, rounded up to whole tiles of 16 rows (the rows past n are multiplied, their outputs
// dropped: a tile's rows never mix)
void w4_rows(const float* x, uint16_t* xb, const uint8_t* w, float* y, long n, long k, long o) {
    const long groups = k / STEP, blocks = o / LANES, panels = (blocks + BLOCKS - 1) / BLOCKS;
#pragma omp for schedule(static)
    for (long i = 0; i < n; i++)
        for (long c = 0; c < k; c += LANES) put(xb + i * k + c, _mm512_loadu_ps(x + i * k + c));
    std::unique_ptr<uint16_t[]> panel(new uint16_t[BLOCKS * k * LANES]);  // (not zeroed: widened whole before use)
    configure(n < MAX_ROWS ? (int)n : MAX_ROWS);
#pragma omp for schedule(static)
    for (long p = 0; p < panels; p++) {
        long b = p * BLOCKS;
        int nb = blocks - b < BLOCKS ? (int)(blocks - b) : BLOCKS;
        for (int r = 0; r < nb; r++) {
            const uint8_t* first = w + 2 * (b + r) * groups * W4_GROUP;
            widen(first, first + groups * W4_GROUP, groups, panel.get() + r * k * LANES);
        }
        for (long c = 0; c < n; c += MAX_ROWS)
            blocks_out(xb + c * k, n - c < MAX_ROWS ? n - c : MAX_ROWS, k, panel.get(), nb, (const uint16_t*)nullptr,
                       y + c * o, b * LANES, o, 0);
    }
    _tile_release();
}
}

extern "C" {
// `w4_rows` in a parallel region of its own: one product alone (its tests; timing it)
void linear_w4(const float* x, uint16_t* xb, const uint8_t* w, float* y, long n, long k, long o) {
#pragma omp parallel
    w4_rows(x, xb, w, y, n, k, o);
}
}
