// dense_matmul on AMX tiles (Intel Sapphire Rapids and later), from the same packed panels as the vdpbf16ps path.
//
// A panel's layout ([K/2][64][2]: each pair of K's two values side by side, 64 columns) is AMX's layout for the
// second operand: 16 pairs x 16 columns of it are one tile, read with a 256-byte stride. The input's rows are the
// first operand as they lie (16 rows x 32 values of K). A block is 32 rows x 32 columns: two row tiles x two
// column tiles accumulate in four float32 tiles over the full tiles of K, in order; the pairs past the last full
// tile (K not a multiple of 32) are added after with vdpbf16ps, then the bias, then one rounding to bfloat16.
// Every row goes through the same instructions whatever T, the block or the thread count (a tile's rows do not
// mix, and a partial block of rows is computed from zero-padded rows), so a row's bits do not depend on the
// batch: the model layer calls it on the batch as it is, where oneDNN's AMX kernels had to be called in padded
// 32-row blocks and re-read the whole weight every 32 rows of a prefill.
//
// `Emulated` computes each tile instruction with scalar code, as the instruction set reference defines it, so the
// blocking, addressing and tails are tested on CPUs without AMX (LLMP_NATIVE_AMX=emulate, or the op's path).
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

// GCC 11 and clang 14 know the AMX intrinsics and CPU feature names (64-bit only); an older compiler builds the
// library without the tile path
#if defined(__x86_64__) && \
    ((defined(__clang__) && __clang_major__ >= 14) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11))
#define LLMP_AMX_BUILT 1
#define LLMP_TILES __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")))
#else
#define LLMP_AMX_BUILT 0
#endif

namespace llmp_native {
namespace tiles {

constexpr int64_t kRows = 16;       // input rows of a tile (and output rows of an accumulator)
constexpr int64_t kPairs = 16;      // pairs of K a tile multiplies: 32 bfloat16 values, one 64-byte row
constexpr int64_t kCols = 16;       // output columns of a tile: four make a 64-column panel
constexpr int64_t kPanelCols = 64;  // as dense_matmul.cpp's kPanel
constexpr int64_t kL2Budget = 1 << 20;  // bytes of input rows kept in L2 while every panel passes by

// Why the tile instructions cannot run here: "" where they can (the CPU has AMX-BF16 and Linux let this process
// use the tile state, which it must ask for first: arch_prctl); "no AMX" where the CPU has none
inline const std::string& unusable() {
    static const std::string why = []() -> std::string {
#if LLMP_AMX_BUILT
        __builtin_cpu_init();
        if (!__builtin_cpu_supports("amx-tile") || !__builtin_cpu_supports("amx-bf16") ||
            !__builtin_cpu_supports("avx512bf16"))
            return "no AMX";
        constexpr long kGetPermission = 0x1022, kRequestPermission = 0x1023, kTileData = 18;
        // refused (ENOSPC) where a thread's alternate signal stack is too small for the tile state
        if (syscall(SYS_arch_prctl, kRequestPermission, kTileData) != 0)
            return std::string("Linux refused the tile state: ") + std::strerror(errno);
        unsigned long features = 0;
        if (syscall(SYS_arch_prctl, kGetPermission, &features) != 0 || !(features & (1ul << kTileData)))
            return "Linux did not grant the tile state";
        return "";
#else
        return "no AMX";
#endif
    }();
    return why;
}

inline bool hardware_ready() { return unusable().empty(); }

#if LLMP_AMX_BUILT
struct alignas(64) Config {
    uint8_t palette = 1;
    uint8_t start_row = 0;
    uint8_t reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
};

// Tiles 0-3 accumulate (row tile r, column tile c: 2r + c), 4-5 hold input rows, 6-7 weight columns; all 16 x 64 B.
// The intrinsics take their tile's number as a literal, hence one branch a tile.
struct Hardware {
    LLMP_TILES void configure() {
        Config config;
        for (int i = 0; i < 8; ++i) config.colsb[i] = 64, config.rows[i] = kRows;
        _tile_loadconfig(&config);
    }
    LLMP_TILES void release() { _tile_release(); }
    template <int C>
    LLMP_TILES void zero() {
        if constexpr (C == 0) _tile_zero(0);
        else if constexpr (C == 1) _tile_zero(1);
        else if constexpr (C == 2) _tile_zero(2);
        else _tile_zero(3);
    }
    template <int T>
    LLMP_TILES void load(const void* p, int64_t stride) {
        if constexpr (T == 4) _tile_loadd(4, p, stride);
        else if constexpr (T == 5) _tile_loadd(5, p, stride);
        else if constexpr (T == 6) _tile_loadd(6, p, stride);
        else _tile_loadd(7, p, stride);
    }
    template <int C, int A, int B>
    LLMP_TILES void multiply() {
        static_assert(C % 2 == B - 6 && (A == 4 + C / 2 || A == 4), "the blocks' combinations (block, wide_block)");
        if constexpr (C == 0) _tile_dpbf16ps(0, 4, 6);
        else if constexpr (C == 1) _tile_dpbf16ps(1, 4, 7);
        else if constexpr (C == 2 && A == 5) _tile_dpbf16ps(2, 5, 6);
        else if constexpr (C == 2) _tile_dpbf16ps(2, 4, 6);
        else if constexpr (A == 5) _tile_dpbf16ps(3, 5, 7);
        else _tile_dpbf16ps(3, 4, 7);
    }
    template <int C>
    LLMP_TILES void store(float* p, int64_t stride) {
        if constexpr (C == 0) _tile_stored(0, p, stride);
        else if constexpr (C == 1) _tile_stored(1, p, stride);
        else if constexpr (C == 2) _tile_stored(2, p, stride);
        else _tile_stored(3, p, stride);
    }
};

// The same instructions in scalar code: C[m][n] += a[m][2k] * b[k][2n] + a[m][2k + 1] * b[k][2n + 1], k in order,
// denormal inputs read as zero and denormal results flushed to zero, as the instruction set reference says
struct Emulated {
    float acc[4][kRows][kCols];
    uint16_t data[8][kRows][2 * kPairs];

    void configure() {}
    void release() {}
    template <int C>
    void zero() { std::memset(acc[C], 0, sizeof(acc[C])); }
    template <int T>
    void load(const void* p, int64_t stride) {
        for (int64_t r = 0; r < kRows; ++r) std::memcpy(data[T][r], static_cast<const char*>(p) + r * stride, 64);
    }
    template <int C, int A, int B>
    void multiply() {
        for (int64_t m = 0; m < kRows; ++m)
            for (int64_t n = 0; n < kCols; ++n) {
                float sum = acc[C][m][n];
                for (int64_t k = 0; k < kPairs; ++k) {
                    sum += widen(data[A][m][2 * k]) * widen(data[B][k][2 * n]);
                    sum += widen(data[A][m][2 * k + 1]) * widen(data[B][k][2 * n + 1]);
                }
                acc[C][m][n] = std::fpclassify(sum) == FP_SUBNORMAL ? std::copysign(0.0f, sum) : sum;
            }
    }
    template <int C>
    void store(float* p, int64_t stride) {
        for (int64_t r = 0; r < kRows; ++r) std::memcpy(reinterpret_cast<char*>(p) + r * stride, acc[C][r], 64);
    }
    static float widen(uint16_t bits) {
        const uint32_t wide = (bits & 0x7f80) == 0 ? uint32_t(bits & 0x8000) << 16 : uint32_t(bits) << 16;  // DAZ
        float value;
        std::memcpy(&value, &wide, 4);
        return value;
    }
};

// One call's operands: x's rows (a partial last tile of rows from `tail`, zero-padded), the panels, the output
struct Operands {
    const uint16_t* x;     // [T, stride] bfloat16 bits (stride = K, or K + 1 zero-padded where K is odd)
    const uint16_t* tail;  // [16, stride]: rows full_rows..T-1 of x, then zeros (null where T = full_rows)
    int64_t stride, T, K, full_rows, pairs;
    const uint16_t* panels;  // [P][pairs][64][2]
    const float* bias;       // [N] or null
    c10::BFloat16* y;        // [T, N]
    int64_t N;

    const uint16_t* row(int64_t t) const { return t < full_rows ? x + t * stride : tail + (t - full_rows) * stride; }
};

// Rows g..g+rows of the panel's columns c0..c0+16*tiles from the accumulators stored in scratch (a line of `line`
// floats a row): the pairs of K no full tile took (in order, vdpbf16ps), the bias, one rounding to bfloat16
LLMP_TILES inline void finish(const Operands& op, const uint16_t* panel, int64_t n0, int64_t cols, int64_t g,
                              int64_t rows, int64_t c0, int64_t column_tiles, const float* scratch, int64_t line) {
    const int64_t full = op.pairs / kPairs;
    for (int64_t r = 0; r < rows; ++r) {
        const uint16_t* xr = op.row(g + r);
        for (int64_t j = 0; j < column_tiles; ++j) {
            const int64_t c = c0 + j * kCols;
            if (c >= cols) break;
            __m512 acc = _mm512_loadu_ps(scratch + r * line + j * kCols);
            for (int64_t p = full * kPairs; p < op.pairs; ++p) {
                int32_t pair = 0;
                std::memcpy(&pair, xr + 2 * p, 2 * p + 1 < op.K ? 4 : 2);  // an odd K's last value pairs with 0
                const __m512bh w = (__m512bh)_mm512_loadu_si512(panel + (p * kPanelCols + c) * 2);
                acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_set1_epi32(pair), w);
            }
            const __mmask16 mask = cols - c >= kCols ? __mmask16(0xffff) : __mmask16((1u << (cols - c)) - 1);
            if (op.bias) acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(mask, op.bias + n0 + c));
            _mm256_mask_storeu_epi16(op.y + (g + r) * op.N + n0 + c, mask, (__m256i)_mm512_cvtneps_pbh(acc));
        }
    }
}

template <class Tiles>
LLMP_TILES void zero_accumulators(Tiles& tiles) {
    tiles.template zero<0>();
    tiles.template zero<1>();
    tiles.template zero<2>();
    tiles.template zero<3>();
}

// Rows g..g+rows (17 to 32) x columns c0..c0+32 of one panel: two row tiles x two column tiles
template <class Tiles>
LLMP_TILES void block(Tiles& tiles, const Operands& op, const uint16_t* panel, int64_t n0, int64_t cols, int64_t g,
                      int64_t rows, int64_t c0, float* scratch) {
    const int64_t full = op.pairs / kPairs, x_bytes = op.stride * 2, w_bytes = kPanelCols * 4;
    zero_accumulators(tiles);
    const uint16_t* a0 = op.row(g);
    const uint16_t* a1 = op.row(g + kRows);
    for (int64_t c = 0; c < full; ++c) {
        const uint16_t* w = panel + c * kPairs * kPanelCols * 2 + c0 * 2;
        tiles.template load<6>(w, w_bytes);
        tiles.template load<7>(w + kCols * 2, w_bytes);
        tiles.template load<4>(a0 + c * 2 * kPairs, x_bytes);
        tiles.template multiply<0, 4, 6>();
        tiles.template multiply<1, 4, 7>();
        tiles.template load<5>(a1 + c * 2 * kPairs, x_bytes);
        tiles.template multiply<2, 5, 6>();
        tiles.template multiply<3, 5, 7>();
    }
    constexpr int64_t kLine = 2 * kCols;  // scratch: 32 rows x 32 columns of float32
    tiles.template store<0>(scratch, kLine * 4);
    tiles.template store<1>(scratch + kCols, kLine * 4);
    tiles.template store<2>(scratch + kRows * kLine, kLine * 4);
    tiles.template store<3>(scratch + kRows * kLine + kCols, kLine * 4);
    finish(op, panel, n0, cols, g, rows, c0, 2, scratch, kLine);
}

// Rows g..g+rows (up to 16) x the whole panel: one row tile, four accumulators across the panel's 64 columns, so
// the row tile is loaded once a step of K and the panel is read in one pass (a decode step). Each output gets
// the same instructions in the same order as in `block`: the same bits.
template <class Tiles>
LLMP_TILES void wide_block(Tiles& tiles, const Operands& op, const uint16_t* panel, int64_t n0, int64_t cols,
                           int64_t g, int64_t rows, float* scratch) {
    const int64_t full = op.pairs / kPairs, x_bytes = op.stride * 2, w_bytes = kPanelCols * 4;
    zero_accumulators(tiles);
    const uint16_t* a = op.row(g);
    for (int64_t c = 0; c < full; ++c) {
        const uint16_t* w = panel + c * kPairs * kPanelCols * 2;
        tiles.template load<4>(a + c * 2 * kPairs, x_bytes);
        tiles.template load<6>(w, w_bytes);
        tiles.template multiply<0, 4, 6>();
        tiles.template load<7>(w + kCols * 2, w_bytes);
        tiles.template multiply<1, 4, 7>();
        tiles.template load<6>(w + 2 * kCols * 2, w_bytes);
        tiles.template multiply<2, 4, 6>();
        tiles.template load<7>(w + 3 * kCols * 2, w_bytes);
        tiles.template multiply<3, 4, 7>();
    }
    constexpr int64_t kLine = kPanelCols;  // scratch: 16 rows x 64 columns of float32
    tiles.template store<0>(scratch, kLine * 4);
    tiles.template store<1>(scratch + kCols, kLine * 4);
    tiles.template store<2>(scratch + 2 * kCols, kLine * 4);
    tiles.template store<3>(scratch + 3 * kCols, kLine * 4);
    finish(op, panel, n0, cols, g, rows, 0, 4, scratch, kLine);
}

// Panels begin..end for every row: rows in chunks that stay in L2 while the panels stream past
template <class Tiles>
LLMP_TILES void panels(const Operands& op, int64_t begin, int64_t end) {
    Tiles tiles;
    tiles.configure();
    alignas(64) float scratch[2 * kRows * 2 * kCols];
    const int64_t chunk = std::clamp<int64_t>(kL2Budget / (op.stride * 2) / 32 * 32, 32, 512);
    for (int64_t t0 = 0; t0 < op.T; t0 += chunk) {
        const int64_t t1 = std::min(op.T, t0 + chunk);
        for (int64_t p = begin; p < end; ++p) {
            const uint16_t* panel = op.panels + p * op.pairs * kPanelCols * 2;
            const int64_t n0 = p * kPanelCols, cols = std::min(kPanelCols, op.N - n0);
            for (int64_t g = t0; g < t1; g += 2 * kRows) {
                const int64_t rows = std::min<int64_t>(2 * kRows, t1 - g);
                if (rows <= kRows) {
                    wide_block(tiles, op, panel, n0, cols, g, rows, scratch);
                    continue;
                }
                for (int64_t c0 = 0; c0 < cols; c0 += 2 * kCols) block(tiles, op, panel, n0, cols, g, rows, c0, scratch);
            }
        }
    }
    tiles.release();
}
#endif

}  // namespace tiles
}  // namespace llmp_native
