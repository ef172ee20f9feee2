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

// NB blocks (1-4) from block b: their C tiles summed over every step, then stored to `acc` (NB x 16 rows x 16)
template <int NB>
void sums(const uint16_t* x, long k, const uint16_t* w, long b, long ahead, float* acc) {
    _tile_zero(4);
    if constexpr (NB > 1) _tile_zero(5);
    if constexpr (NB > 2) _tile_zero(6);
    if constexpr (NB > 3) _tile_zero(7);
    const char* block = (const char*)(w + b * k * LANES);
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

// `nb` blocks from block b for `m` rows of x (k inputs a row): their outputs (+ bias), rounded to bf16 into y
void blocks_out(const uint16_t* x, long m, long k, const uint16_t* w, long b, int nb, const uint16_t* bias,
                uint16_t* y, long o, long ahead) {
    alignas(64) float acc[BLOCKS * MAX_ROWS * LANES];
    switch (nb) {
        case 4: sums<4>(x, k, w, b, ahead, acc); break;
        case 3: sums<3>(x, k, w, b, ahead, acc); break;
        case 2: sums<2>(x, k, w, b, ahead, acc); break;
        default: sums<1>(x, k, w, b, ahead, acc);
    }
    for (int r = 0; r < nb; r++) {
        long j = (b + r) * LANES;
        __m512 add = bias ? bf16_to_f32(bias + j) : _mm512_setzero_ps();
        for (long i = 0; i < m; i++) {
            __m512 v = _mm512_add_ps(_mm512_load_ps(acc + (r * MAX_ROWS + i) * LANES), add);
            _mm256_storeu_si256((__m256i*)(y + i * o + j), (__m256i)_mm512_cvtneps_pbh(v));
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
                blocks_out(x, n, k, w, b, nb, bias, y, o, ahead);
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
            for (long c = 0; c < full; c++)  // the first chunk reads the weight from memory, the others from caches
                blocks_out(x + c * MAX_ROWS * k, MAX_ROWS, k, w, b, nb, bias, y + c * MAX_ROWS * o, o,
                           c ? 0 : ahead);
            if (rest) blocks_out(tail.data(), rest, k, w, b, nb, bias, y + full * MAX_ROWS * o, o, 0);
        }
        _tile_release();
    }
}
}
