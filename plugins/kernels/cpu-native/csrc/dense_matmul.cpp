// dense_matmul: x @ W.T (+ bias) for bfloat16 x [T, K] and W [N, K] (llmp_native::dense_pack,
// llmp_native::dense_matmul): vdpbf16ps pairs on CPUs with AVX-512 BF16 (AMD Zen 4 and 5), AMX tiles where the CPU
// has them (Intel Sapphire Rapids and later: dense_matmul_tiles.h), or the pairs widened to float32 in AVX2
// registers on other x86-64 CPUs with AVX2 (dense_matmul_avx2.h), all from the same packed weight.
//
// The weight is packed once, in panels of 64 output columns: panel p holds, for each pair of K (k, k+1), the 64
// columns' two bfloat16 values side by side ([P][K/2][64][2], zero-padded), so one vdpbf16ps with an input row's
// pair broadcast adds x[k] * w[n][k] + x[k+1] * w[n][k+1] to 16 columns' float32 accumulators. A tile is up to 6
// input rows x one panel (24 accumulators, 4 weight vectors, the broadcast). Each output (t, n) is one lane
// accumulated over the pairs of K in order, then the bias, then one rounding to bfloat16: the same operations
// whatever T, the tile or the thread count. So a row's result never depends on the other rows, and the model layer
// calls it on the batch as it is, where oneDNN must be called in padded 32-row blocks for the same guarantee (a
// decode step of one sequence then multiplies 32 rows, and a prefill re-reads the whole weight every 32 rows).
// No lane reduction at the end: an earlier dot-product form spent a third of a 896-long row reducing lanes.
// Threads own whole panels, and a thread done with its own takes the others' last (unit_range.h); every thread
// walks the input in chunks of rows that stay in L2.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "decoder_parts.h"
#include "dense_matmul_tiles.h"
#include "exp_fma.h"
#include "huge_pages.h"
#include "isa.h"
#include "unit_range.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LLMP_X86 1
#endif

// GCC 12's AVX-512 headers initialise their undefined vectors from themselves (__Y = __Y), which its own
// -Wuninitialized reports wherever they are inlined (here, the gated epilogue's widening once the tiles are inlined
// into the call's units): a false positive, as in paged_attention_pairs.h, silenced for this file
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#if LLMP_AMX_BUILT
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#endif

namespace llmp_native {
namespace {

constexpr int64_t kPanel = 64;  // output columns of a panel: four 16-lane vectors
constexpr int64_t kMaxRows = 6;  // input rows of a tile
constexpr int64_t kChunkRows = 96;  // input rows a thread takes through all its panels at a time (best of 48-192)
constexpr int64_t kMinBytesPerThread = 64 << 10;  // as quant_matmul: less work than this a thread costs more than it saves

// The AVX-512 level is selected (LLMP_NATIVE_ISA lowers it for every kernel, this one too) and the CPU has BF16
bool bf16_pairs() {
#ifdef LLMP_X86
    __builtin_cpu_init();
    return selected_isa() == Isa::avx512 && __builtin_cpu_supports("avx512bf16");
#else
    return false;
#endif
}

// AVX2 at least is selected: the vdpbf16ps pairs, or their AVX2 form (dense_matmul_avx2.h)
bool supported() {
#ifdef LLMP_X86
    return selected_isa() != Isa::scalar;
#else
    return false;
#endif
}

// The CPU has AMX tiles for bfloat16 (Intel Sapphire Rapids and later)
bool has_amx() {
#ifdef LLMP_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("amx-bf16");
#else
    return false;
#endif
}

// How dense_matmul multiplies: AMX tiles where the CPU has them, Linux grants the tile state and the tiles agree
// with their scalar definition on a check product, else vdpbf16ps pairs, or their AVX2 form where the CPU has no
// AVX-512 BF16 (or LLMP_NATIVE_ISA=avx2); LLMP_NATIVE_AMX=0 keeps the pairs, LLMP_NATIVE_AMX=emulate runs the tile
// path in scalar code (tests)
enum class Path { pairs, tiles, emulated_tiles, avx2_pairs };

const char* path_name(Path path) {
    switch (path) {
        case Path::tiles: return "amx tiles";
        case Path::emulated_tiles: return "emulated amx tiles";
        case Path::avx2_pairs: return "avx2 pairs";
        default: return "avx512-bf16 pairs";
    }
}

Path chosen_path();

#ifdef LLMP_X86
#define LLMP_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")))
#endif

int64_t packed_pairs(int64_t K) { return (K + 1) / 2; }

at::Tensor dense_pack(const at::Tensor& weight) {
    TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kBFloat16 && weight.device().is_cpu(),
                "dense_pack: a 2-D bfloat16 CPU weight");
    const int64_t N = weight.size(0), K = weight.size(1), P = (N + kPanel - 1) / kPanel, pairs = packed_pairs(K);
    // [N, K] -> zero-padded [P * 64, 2 * pairs] -> [P, 64, pairs, 2] -> [P, pairs, 64, 2], on 2 MiB pages
    at::Tensor padded = at::zeros({P * kPanel, 2 * pairs}, weight.options());
    padded.narrow(0, 0, N).narrow(1, 0, K).copy_(weight);
    return copy_to_huge_pages(padded.view({P, kPanel, pairs, 2}).permute({0, 2, 1, 3}));
}

// A gate|up weight [2I, K] (a gated MLP's fused gate and up projections) packed for the gated epilogue: panel p
// holds gate rows 32p..32p+31 then the up rows of the same indices (zero rows past I), so that a tile holds the
// matching gate and up outputs of its 32 columns
at::Tensor dense_pack_gated(const at::Tensor& weight) {
    TORCH_CHECK(weight.dim() == 2 && weight.size(0) % 2 == 0, "dense_pack_gated: a [2I, K] gate|up weight");
    const int64_t I = weight.size(0) / 2, K = weight.size(1), P = (I + 31) / 32;
    at::Tensor rows = at::empty({P, 2, 32, K}, weight.options());
    for (int64_t half = 0; half < 2; ++half) {
        at::Tensor padded = at::zeros({P * 32, K}, weight.options());
        padded.narrow(0, 0, I).copy_(weight.narrow(0, half * I, I));
        rows.select(1, half).copy_(padded.view({P, 32, K}));
    }
    return dense_pack(rows.view({P * 64, K}));
}

// What a tile's epilogue writes: its columns (plain); a gate|up panel's columns back in the [gate | up] order
// (split); or SiLU(gate) * up from the same rounded values as the two kernels in turn (gated)
enum class Epilogue { plain, split, gated };

#ifdef LLMP_X86
#include "dense_matmul_avx2.h"
#endif

#ifdef LLMP_X86
// a float32 vector rounded to bfloat16 as c10 rounds (to nearest even; a NaN becomes the quiet NaN 0x7fc0), as the
// row kernels store (elementwise_impl.h's store_n): vcvtneps2bf16 would flush subnormals
LLMP_BF16 inline __m256i round_as_c10(__m512 v) {
    const __m512i bits = _mm512_castps_si512(v);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, nan, _mm512_set1_epi32(0x7fc0)));
}

LLMP_BF16 inline __m512 widen(__m256i bf16) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bf16), 16));
}

// the first n of 16 lanes (none where n <= 0)
LLMP_BF16 inline __mmask16 lanes(int64_t n) {
    return n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

// rows t..t+R of the output, columns of one panel: R x 4 accumulators over every pair of K. Split and gated
// panels (dense_pack_gated) write gate|up columns 32p.. of `half` each; y's rows are N long.
template <int R, Epilogue E, bool OddK>
LLMP_BF16 inline void packed_tile(const uint16_t* x, int64_t K, const uint16_t* panel, const float* bias, int64_t n0,
                                  int64_t cols, c10::BFloat16* y, int64_t N, int64_t half, const char* ahead,
                                  const char* ahead_end, int64_t ahead_step) {
    __m512 acc[R][4];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_ps();
    const int64_t full = K / 2;
    const auto* wp = reinterpret_cast<const __m512i*>(panel);
    for (int64_t p = 0; p < full; ++p, wp += 4) {
        if (ahead < ahead_end) {  // ahead_step / 64 lines of the next panel a pair of K
            _mm_prefetch(ahead, _MM_HINT_T1);
            for (int64_t b = 64; b < ahead_step; b += 64) _mm_prefetch(ahead + b, _MM_HINT_T1);
        }
        ahead += ahead_step;
        const __m512bh w0 = (__m512bh)_mm512_loadu_si512(wp), w1 = (__m512bh)_mm512_loadu_si512(wp + 1);
        const __m512bh w2 = (__m512bh)_mm512_loadu_si512(wp + 2), w3 = (__m512bh)_mm512_loadu_si512(wp + 3);
        for (int r = 0; r < R; ++r) {
            int32_t pair;
            __builtin_memcpy(&pair, x + r * K + 2 * p, 4);
            const __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], xv, w0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], xv, w1);
            acc[r][2] = _mm512_dpbf16_ps(acc[r][2], xv, w2);
            acc[r][3] = _mm512_dpbf16_ps(acc[r][3], xv, w3);
        }
    }
    if constexpr (OddK) {  // the last pair holds one value of K: its partner is 0 in the weight and in x
        const __m512bh w0 = (__m512bh)_mm512_loadu_si512(wp), w1 = (__m512bh)_mm512_loadu_si512(wp + 1);
        const __m512bh w2 = (__m512bh)_mm512_loadu_si512(wp + 2), w3 = (__m512bh)_mm512_loadu_si512(wp + 3);
        for (int r = 0; r < R; ++r) {
            const __m512bh xv = (__m512bh)_mm512_set1_epi32(int32_t(x[r * K + K - 1]));
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], xv, w0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], xv, w1);
            acc[r][2] = _mm512_dpbf16_ps(acc[r][2], xv, w2);
            acc[r][3] = _mm512_dpbf16_ps(acc[r][3], xv, w3);
        }
    }
    // Constant indices only (masks, not early exits) and no branch on K after the loop (OddK): the accumulators
    // stay in registers, where GCC had kept a copy of them on the stack, zeroed at every tile's start, whose
    // stores then waited behind the last tile's output stores
    if constexpr (E == Epilogue::plain) {
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
            const __mmask16 mask = lanes(cols - j * 16);
            if (bias) {  // none: nothing added, as on the AMX tiles (adding 0 would turn a flushed -0 into +0)
                const __m512 b = _mm512_maskz_loadu_ps(mask, bias + n0 + j * 16);
#pragma GCC unroll 8
                for (int r = 0; r < R; ++r) acc[r][j] = _mm512_add_ps(acc[r][j], b);
            }
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r) {
                const __m256i out = (__m256i)_mm512_cvtneps_pbh(acc[r][j]);
                _mm256_mask_storeu_epi16(y + r * N + n0 + j * 16, mask, out);
            }
        }
    } else {  // vectors 0, 1: gate columns g0..g0+31; 2, 3: the up columns of the same indices
        const int64_t g0 = n0 / 2, live = std::min<int64_t>(32, half - g0);
#pragma GCC unroll 2
        for (int j = 0; j < 2; ++j) {
            const __mmask16 mask = lanes(live - j * 16);
            if (bias) {
                const __m512 bg = _mm512_maskz_loadu_ps(mask, bias + n0 + j * 16);
                const __m512 bu = _mm512_maskz_loadu_ps(mask, bias + n0 + 32 + j * 16);
#pragma GCC unroll 8
                for (int r = 0; r < R; ++r) {
                    acc[r][j] = _mm512_add_ps(acc[r][j], bg);
                    acc[r][j + 2] = _mm512_add_ps(acc[r][j + 2], bu);
                }
            }
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r) {
                const __m256i g = (__m256i)_mm512_cvtneps_pbh(acc[r][j]);
                const __m256i u = (__m256i)_mm512_cvtneps_pbh(acc[r][j + 2]);
                if constexpr (E == Epilogue::split) {
                    _mm256_mask_storeu_epi16(y + r * N + g0 + j * 16, mask, g);
                    _mm256_mask_storeu_epi16(y + r * N + half + g0 + j * 16, mask, u);
                } else {
                    const __m512 act = _mm512_mul_ps(silu_exp_fma(widen(g)), widen(u));
                    _mm256_mask_storeu_epi16(y + r * N + g0 + j * 16, mask, round_as_c10(act));
                }
            }
        }
    }
}

template <Epilogue E, int... R>
LLMP_BF16 void packed_rows(std::integer_sequence<int, R...>, int64_t rows, const uint16_t* x, int64_t K,
                           const uint16_t* panel, const float* bias, int64_t n0, int64_t cols, c10::BFloat16* y,
                           int64_t N, int64_t half, const char* ahead, const char* ahead_end, int64_t ahead_step) {
    // an odd K's last pair is a tile of its own (OddK): a branch on it after the loop over K kept the
    // accumulators on the stack for every K
    if (K & 1)
        ((rows == R + 1 ? (packed_tile<R + 1, E, true>(x, K, panel, bias, n0, cols, y, N, half, ahead, ahead_end, ahead_step), 0)
                        : 0),
         ...);
    else
        ((rows == R + 1 ? (packed_tile<R + 1, E, false>(x, K, panel, bias, n0, cols, y, N, half, ahead, ahead_end, ahead_step), 0)
                        : 0),
         ...);
}
#endif

// Threads for a call: each takes whole panels, and none less than kMinBytesPerThread of weight and input
int64_t panel_grain(int64_t T, int64_t K, int64_t N, int64_t P) {
    const int64_t bytes = N * K * 2 + N * K / 2 * (T - 1);
    const int64_t threads = std::clamp<int64_t>(bytes / kMinBytesPerThread, 1,
                                                std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), P)));
    return (P + threads - 1) / threads;
}

#ifdef LLMP_X86
// One unit of a product on the pairs: rows t0..t1 of x [T, K] through panel p of ws [P, pairs, 64, 2] into y (N: y's
// row length; the plain product's columns, 2 * half split, half gated). `next_panel`: the unit may ask for the next
// panel's lines (the calling thread's next unit is that panel).
// Avx2: the AVX2 form of the pairs (dense_matmul_avx2.h), in tiles of fewer rows.
template <Epilogue E, bool Avx2 = false>
void pairs_unit(const uint16_t* xp, int64_t K, const uint16_t* wp, int64_t pairs, int64_t p, int64_t t0, int64_t t1,
                bool next_panel, const float* bp, c10::BFloat16* yp, int64_t N, int64_t half) {
    constexpr int64_t kRows = Avx2 ? avx2_pairs::kMaxRows : kMaxRows;
    const uint16_t* panel = wp + p * pairs * kPanel * 2;
    const int64_t n0 = p * kPanel, cols = std::min(kPanel, N - n0);
    // The next panel comes from memory while this one's tiles compute from L2: the unit's tiles ask for its
    // lines in proportion to their rows (their time), a line or more a pair of K: one from 24 rows up (without,
    // a panel's first tile waited on memory and the others left it idle: a decode step's matmuls at 32 rows
    // took 56 ms instead of 44), more below (one a pair from 2 tiles left half the panel to demand misses: the
    // vocabulary projection of 12 rows took 10.3 ms, now 8.3). A single tile (a matrix-vector product)
    // streams: the hardware prefetcher alone reads faster there. A unit taken from another thread asks for
    // nothing.
    const char* next = reinterpret_cast<const char*>(panel + pairs * kPanel * 2);
    const bool several = next_panel && t1 - t0 > kRows;
    const char* next_end = several ? next + pairs * kPanel * 4 : next;
    const int64_t lines = pairs * kPanel * 4 / 64, share = std::max<int64_t>(1, (t1 - t0) * pairs);  // K = 0: none
    for (int64_t t = t0; t < t1; t += kRows) {
        const int64_t rows = std::min(kRows, t1 - t), step = (lines * rows + share - 1) / share * 64;
        if constexpr (Avx2)
            avx2_pairs::rows<E>(std::make_integer_sequence<int, kRows>{}, rows, xp + t * K, K, panel, bp, n0, cols,
                                yp + t * N, N, half, next, next_end, step);
        else
            packed_rows<E>(std::make_integer_sequence<int, kRows>{}, rows, xp + t * K, K, panel, bp, n0, cols,
                           yp + t * N, N, half, next, next_end, step);
        next += pairs * step;
    }
}

// Thread o owns the panels o * grain.. of every chunk of kChunkRows rows, chunk after chunk: its units.
template <Epilogue E = Epilogue::plain, bool Avx2 = false>
void pairs_matmul(const at::Tensor& xs, const at::Tensor& ws, int64_t N, const float* bp, at::Tensor& y,
                  int64_t half = 0) {
    const int64_t T = xs.size(0), K = xs.size(1), P = ws.size(0), pairs = ws.size(1);
    const auto* xp = reinterpret_cast<const uint16_t*>(xs.data_ptr());
    const auto* wp = reinterpret_cast<const uint16_t*>(ws.data_ptr());
    auto* yp = y.data_ptr<c10::BFloat16>();
    const int64_t grain = panel_grain(T, K, E == Epilogue::plain ? N : P * kPanel, P), owners = (P + grain - 1) / grain;
    const int64_t chunks = (T + kChunkRows - 1) / kChunkRows;
    std::vector<UnitRange> ranges(owners);
    for (int64_t o = 0; o < owners; ++o) ranges[o].reset(chunks * (std::min(P, (o + 1) * grain) - o * grain));
    auto compute = [&](int64_t o, int64_t unit, bool own) {
        const int64_t first = o * grain, panels = std::min(P, first + grain) - first;
        const int64_t t0 = unit / panels * kChunkRows;
        pairs_unit<E, Avx2>(xp, K, wp, pairs, first + unit % panels, t0, std::min(T, t0 + kChunkRows),
                      own && unit % panels + 1 < panels, bp, yp, N, half);
    };
    at::parallel_for(0, owners, 1, [&](int64_t begin, int64_t end) {
        take_units(ranges, begin, end, [&](int64_t o, int64_t unit) { compute(o, unit, true); },
                   [&](int64_t o, int64_t unit) { compute(o, unit, false); });
    });
}
#endif

#if LLMP_AMX_BUILT
// A call's operands for the tile path: x's rows, padded to an even K (the last full tile of K then reads no value
// past a row), and its last partial tile of rows zero-padded (none where T is a multiple of 16)
struct TileCall {
    at::Tensor x, tail;
    tiles::Operands op;
};

TileCall tile_call(const at::Tensor& xs, const at::Tensor& ws, int64_t N, const float* bp, at::Tensor& y) {
    const int64_t T = xs.size(0), K = xs.size(1);
    TileCall call;
    call.x = K % 2 ? at::constant_pad_nd(xs, {0, 1}) : xs;
    const int64_t stride = call.x.size(1), full_rows = T / tiles::kRows * tiles::kRows;
    if (T > full_rows) {
        call.tail = at::zeros({tiles::kRows, stride}, call.x.options());
        call.tail.narrow(0, 0, T - full_rows).copy_(call.x.narrow(0, full_rows, T - full_rows));
    }
    call.op = tiles::Operands{reinterpret_cast<const uint16_t*>(call.x.data_ptr()),
                              call.tail.defined() ? reinterpret_cast<const uint16_t*>(call.tail.data_ptr()) : nullptr,
                              stride,
                              T,
                              K,
                              full_rows,
                              ws.size(1),
                              reinterpret_cast<const uint16_t*>(ws.data_ptr()),
                              bp,
                              y.data_ptr<c10::BFloat16>(),
                              N};
    return call;
}

void tiles_matmul(const at::Tensor& xs, const at::Tensor& ws, int64_t N, const float* bp, at::Tensor& y,
                  bool emulated) {
    const TileCall call = tile_call(xs, ws, N, bp, y);
    at::parallel_for(0, ws.size(0), panel_grain(xs.size(0), xs.size(1), N, ws.size(0)), [&](int64_t begin, int64_t end) {
        if (emulated) tiles::panels<tiles::Emulated>(call.op, begin, end);
        else tiles::panels<tiles::Hardware>(call.op, begin, end);
    });
}
#endif

// x [T, K] @ W.T (+ bias) on `path`
at::Tensor dense_matmul_on(const at::Tensor& x, const at::Tensor& packed, int64_t N,
                           const c10::optional<at::Tensor>& bias, Path path) {
    TORCH_CHECK(supported(), "dense_matmul: needs AVX2 (and LLMP_NATIVE_ISA not below avx2)");
    TORCH_CHECK(path == Path::avx2_pairs || bf16_pairs(),
                "dense_matmul: the ", path_name(path), " need AVX-512 BF16 (and LLMP_NATIVE_ISA not below avx512)");
    TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kBFloat16 && x.dim() == 2,
                "dense_matmul: x must be a 2-D bfloat16 CPU tensor");
    TORCH_CHECK(packed.dim() == 4 && packed.scalar_type() == at::kBFloat16 && packed.size(2) == kPanel &&
                    packed.size(3) == 2 && packed.size(1) == packed_pairs(x.size(1)) &&
                    (N + kPanel - 1) / kPanel == packed.size(0),
                "dense_matmul: x ", x.sizes(), " does not match the packed weight ", packed.sizes(), " of ", N,
                " rows");
    TORCH_CHECK(path != Path::tiles || tiles::hardware_ready(), "dense_matmul: this CPU has no usable AMX tiles (",
                tiles::unusable(), ")");
    TORCH_CHECK(path != Path::emulated_tiles || LLMP_AMX_BUILT, "dense_matmul: built without the AMX tile path");
    at::Tensor b;
    if (bias.has_value() && bias->defined()) {
        TORCH_CHECK(bias->dim() == 1 && bias->size(0) == N, "dense_matmul: the bias must be [", N, "]");
        b = bias->to(at::kFloat).contiguous();
    }
    const at::Tensor xs = x.contiguous(), ws = packed.contiguous();
    at::Tensor y = at::empty({x.size(0), N}, x.options());
    if (x.size(0) == 0 || N == 0) return y;
    const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
#if LLMP_AMX_BUILT
    // K = 0: the bias (or zeros), which the pairs path gives
    if ((path == Path::tiles || path == Path::emulated_tiles) && x.size(1) > 0) {
        tiles_matmul(xs, ws, N, bp, y, path == Path::emulated_tiles);
        return y;
    }
#endif
#ifdef LLMP_X86
    if (path == Path::avx2_pairs) pairs_matmul<Epilogue::plain, true>(xs, ws, N, bp, y);
    else pairs_matmul(xs, ws, N, bp, y);
#endif
    return y;
}

// x [T, K] through a gate|up weight packed by dense_pack_gated (bias: [P * 64] in its packed order, or none), on the
// vdpbf16ps pairs: SiLU(gate) * up [T, half] (gated), or gate|up [T, 2 * half] (split); the bits of dense_matmul
// and silu_and_mul in turn
at::Tensor dense_gated_matmul(const at::Tensor& x, const at::Tensor& packed, int64_t half,
                              const c10::optional<at::Tensor>& bias, bool gated) {
    TORCH_CHECK(supported(), "dense_gated_matmul: needs AVX2 (and LLMP_NATIVE_ISA not below avx2)");
    TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kBFloat16 && x.dim() == 2,
                "dense_gated_matmul: x must be a 2-D bfloat16 CPU tensor");
    const int64_t P = (half + 31) / 32;
    TORCH_CHECK(packed.dim() == 4 && packed.scalar_type() == at::kBFloat16 && packed.size(2) == kPanel &&
                    packed.size(3) == 2 && packed.size(1) == packed_pairs(x.size(1)) && packed.size(0) == P,
                "dense_gated_matmul: x ", x.sizes(), " does not match the gate|up panels ", packed.sizes(), " of ",
                half, " columns each");
    at::Tensor b;
    if (bias.has_value() && bias->defined()) {
        TORCH_CHECK(bias->dim() == 1 && bias->size(0) == P * kPanel, "dense_gated_matmul: the bias must be [",
                    P * kPanel, "] in the panels' order");
        b = bias->to(at::kFloat).contiguous();
    }
    const at::Tensor xs = x.contiguous(), ws = packed.contiguous();
    at::Tensor y = at::empty({x.size(0), gated ? half : 2 * half}, x.options());
    if (x.size(0) == 0 || half == 0) return y;
#ifdef LLMP_X86
    const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
    if (chosen_path() == Path::avx2_pairs) {
        if (gated) pairs_matmul<Epilogue::gated, true>(xs, ws, half, bp, y, half);
        else pairs_matmul<Epilogue::split, true>(xs, ws, 2 * half, bp, y, half);
    } else if (gated) {
        pairs_matmul<Epilogue::gated>(xs, ws, half, bp, y, half);
    } else {
        pairs_matmul<Epilogue::split>(xs, ws, 2 * half, bp, y, half);
    }
#endif
    return y;
}

std::string& tiles_refused() {  // why the tile instructions are not used here although the CPU has them
    static std::string why;
    return why;
}

// The start-up check's product, whose every sum is exact (so any difference is a wrong tile or address, not a
// rounding): a full and a partial tile of rows, two full tiles of K and a tail of pairs, a full and a partial
// panel, a bias
struct CheckProduct {
    static constexpr int64_t T = 21, K = 84, N = 70;
    at::Tensor x = at::arange(T * K, at::kFloat).remainder(13).sub(6).div(4).reshape({T, K}).to(at::kBFloat16);
    at::Tensor w = at::arange(N * K, at::kFloat).remainder(11).sub(5).div(8).reshape({N, K}).to(at::kBFloat16);
    at::Tensor bias = at::arange(N, at::kFloat).remainder(7).sub(3).to(at::kBFloat16);
    at::Tensor packed = dense_pack(w);
    // every sum exact: the float64 product rounded once is every correct path's result (the tiles' on any CPU)
    at::Tensor expected = at::linear(x.to(at::kDouble), w.to(at::kDouble), bias.to(at::kDouble)).to(at::kBFloat16);
};

// A path against the check product's exact result (the tests run it on every path)
bool agrees_with_the_check_product(Path path) {
    const CheckProduct check;
    return at::equal(dense_matmul_on(check.x, check.packed, check.N, check.bias, path), check.expected);
}

// The check product on the tile instructions in a child process, before the engine uses them: nobody has run
// them on every AMX CPU and kernel there is, and an instruction refused there (SIGILL, a fault) must end the
// child, not the engine. The child runs the instructions alone, on one thread, into shared memory: no lock, no
// allocation, no OpenMP after the fork. "" where the result has the definition's bits, else why not.
std::string tiles_check_apart() {
#if LLMP_AMX_BUILT
    const CheckProduct check;
    const at::Tensor bias = check.bias.to(at::kFloat);
    const size_t bytes = check.T * check.N * sizeof(c10::BFloat16);
    void* shared = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED) return std::string("no shared memory for the tiles' check: ") + std::strerror(errno);
    at::Tensor got = at::from_blob(shared, {check.T, check.N}, at::TensorOptions().dtype(at::kBFloat16));
    got.fill_(std::nanf(""));
    const TileCall call = tile_call(check.x, check.packed, check.N, bias.data_ptr<float>(), got);
    const pid_t child = fork();
    if (child == 0) {  // a refused instruction ends it quietly: no handler of the parent's (Python's faulthandler), no core
        for (int each : {SIGILL, SIGSEGV, SIGBUS, SIGFPE}) signal(each, SIG_DFL);
        const rlimit no_core{0, 0};
        setrlimit(RLIMIT_CORE, &no_core);
        tiles::panels<tiles::Hardware>(call.op, 0, check.packed.size(0));
        _exit(0);
    }
    std::string why;
    if (child < 0) {
        why = std::string("could not fork the tiles' check: ") + std::strerror(errno);
    } else {
        int status = 0;
        pid_t done = 0;
        for (int waited_ms = 0; (done = waitpid(child, &status, WNOHANG)) == 0 && waited_ms < 10000; waited_ms += 5)
            usleep(5000);
        if (done == 0) {
            kill(child, SIGKILL);
            waitpid(child, &status, 0);
            why = "the tiles' check did not end in 10 s";
        } else if (done < 0) {
            why = std::string("the tiles' check was lost: ") + std::strerror(errno);
        } else if (WIFSIGNALED(status)) {
            why = "the tiles' check died of signal " + std::to_string(WTERMSIG(status)) + " (" +
                  strsignal(WTERMSIG(status)) + ")";
        } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            why = "the tiles' check exited with status " + std::to_string(WEXITSTATUS(status));
        } else if (!at::equal(got, check.expected)) {
            why = "the tiles disagreed with their definition on a check product";
        }
    }
    munmap(shared, bytes);
    return why;
#else
    return "built without the AMX tile path";
#endif
}

Path chosen_path() {
    static const Path path = [] {
        if (!bf16_pairs()) return Path::avx2_pairs;
        const char* wanted = std::getenv("LLMP_NATIVE_AMX");
        if (wanted != nullptr && std::strcmp(wanted, "0") == 0) return Path::pairs;
        if (wanted != nullptr && std::strcmp(wanted, "emulate") == 0 && LLMP_AMX_BUILT) return Path::emulated_tiles;
        if (!tiles::hardware_ready()) {
            if (tiles::unusable() != "no AMX") tiles_refused() = tiles::unusable();
            return Path::pairs;
        }
        try {
            tiles_refused() = tiles_check_apart();
        } catch (const std::exception& error) {
            tiles_refused() = std::string("the tiles' check product failed: ") + error.what();
        }
        return tiles_refused().empty() ? Path::tiles : Path::pairs;
    }();
    return path;
}

std::string dense_matmul_path() {
    if (!supported()) return "none";
    const Path path = chosen_path();
    return tiles_refused().empty() ? path_name(path) : std::string(path_name(path)) + " (" + tiles_refused() + ")";
}

at::Tensor dense_matmul(const at::Tensor& x, const at::Tensor& packed, int64_t N,
                        const c10::optional<at::Tensor>& bias) {
    return dense_matmul_on(x, packed, N, bias, chosen_path());
}

Path named_path(const std::string& name) {
    for (Path each : {Path::pairs, Path::tiles, Path::emulated_tiles, Path::avx2_pairs})
        if (name == path_name(each)) return each;
    TORCH_CHECK(false, "dense_matmul_with: no path named '", name, "'");
}

bool dense_matmul_check(const std::string& path) { return agrees_with_the_check_product(named_path(path)); }

// The same on a named path ("avx512-bf16 pairs", "avx2 pairs", "amx tiles" or "emulated amx tiles"): tests force
// each in turn
at::Tensor dense_matmul_with(const at::Tensor& x, const at::Tensor& packed, int64_t N,
                             const c10::optional<at::Tensor>& bias, const std::string& path) {
    return dense_matmul_on(x, packed, N, bias, named_path(path));
}

}  // namespace
}  // namespace llmp_native

namespace llmp_native::parts {

bool pairs_chosen() { return supported() && (chosen_path() == Path::pairs || chosen_path() == Path::avx2_pairs); }

struct PairsProduct::State {
    at::Tensor packed, bias;
    const uint16_t* weights = nullptr;  // the tensors' data, read once here and not by every thread in the region
    const float* bias_data = nullptr;
    c10::BFloat16* out = nullptr;
    int64_t n = 0, rows = 0, in_features = 0, grain = 1, owners = 0;
    bool gated = false, avx2 = false;
    std::vector<UnitRange> ranges;
};

PairsProduct::PairsProduct(const at::Tensor& packed, int64_t n, const c10::optional<at::Tensor>& bias, bool gated,
                           int64_t rows, int64_t in_features, int64_t threads)
    : state_(std::make_unique<State>()) {
    TORCH_CHECK(pairs_chosen(), "decoder_layer: its products run on the vdpbf16ps pairs only, not ",
                dense_matmul_path());
    const int64_t P = gated ? (n + 31) / 32 : (n + kPanel - 1) / kPanel;
    TORCH_CHECK(packed.dim() == 4 && packed.scalar_type() == at::kBFloat16 && packed.is_contiguous() &&
                    packed.size(0) == P && packed.size(1) == packed_pairs(in_features) && packed.size(2) == kPanel &&
                    packed.size(3) == 2,
                "decoder_layer: the packed weight ", packed.sizes(), " does not match ", in_features, " inputs and ",
                n, gated ? " gated outputs" : " outputs");
    State& s = *state_;
    s.packed = packed, s.n = n, s.rows = rows, s.in_features = in_features, s.gated = gated;
    s.avx2 = chosen_path() == Path::avx2_pairs;
    if (bias.has_value() && bias->defined()) {
        TORCH_CHECK(bias->dim() == 1 && bias->size(0) == (gated ? P * kPanel : n), "decoder_layer: a bias of ",
                    bias->sizes(), " for ", n, gated ? " gated outputs" : " outputs");
        s.bias = bias->to(at::kFloat).contiguous();
    }
    output = at::empty({rows, n}, packed.options());
    s.weights = reinterpret_cast<const uint16_t*>(packed.data_ptr());
    s.bias_data = s.bias.defined() ? s.bias.data_ptr<float>() : nullptr;
    s.out = output.data_ptr<c10::BFloat16>();
    if (rows == 0 || P == 0) return;
    // as dense_matmul: no thread with less than kMinBytesPerThread of weight and input
    const int64_t columns = gated ? P * kPanel : n, bytes = columns * in_features * 2 + columns * in_features / 2 * (rows - 1);
    const int64_t owners = std::clamp<int64_t>(bytes / kMinBytesPerThread, 1, std::max<int64_t>(1, std::min(threads, P)));
    s.grain = (P + owners - 1) / owners;
    s.owners = (P + s.grain - 1) / s.grain;
    s.ranges = std::vector<UnitRange>(s.owners);
    const int64_t chunks = (rows + kChunkRows - 1) / kChunkRows;
    for (int64_t o = 0; o < s.owners; ++o) s.ranges[o].reset(chunks * (std::min(P, (o + 1) * s.grain) - o * s.grain));
}

PairsProduct::~PairsProduct() = default;

std::pair<const char*, const char*> PairsProduct::first_panels(int64_t thread, int64_t max_bytes) const {
    const State& s = *state_;
    if (thread >= s.owners) return {nullptr, nullptr};
    const int64_t P = s.packed.size(0), panel_bytes = s.packed.size(1) * kPanel * 4;
    const int64_t first = thread * s.grain, panels = std::min(P, first + s.grain) - first;
    const char* begin = reinterpret_cast<const char*>(s.weights) + first * panel_bytes;
    return {begin, begin + std::min(panels * panel_bytes, max_bytes) / 1024 * 1024};
}

void PairsProduct::run(int64_t thread, const at::Tensor& x) {
#ifdef LLMP_X86
    State& s = *state_;
    if (s.owners == 0) return;
    const int64_t T = s.rows, K = s.in_features, P = s.packed.size(0), pairs = s.packed.size(1);
    const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr());
    const uint16_t* wp = s.weights;
    c10::BFloat16* yp = s.out;
    const float* bp = s.bias_data;
    auto compute = [&](int64_t o, int64_t unit, bool own) {
        const int64_t first = o * s.grain, panels = std::min(P, first + s.grain) - first;
        const int64_t p = first + unit % panels, t0 = unit / panels * kChunkRows, t1 = std::min(T, t0 + kChunkRows);
        const bool next = own && unit % panels + 1 < panels;
        if (s.avx2 && s.gated) pairs_unit<Epilogue::gated, true>(xp, K, wp, pairs, p, t0, t1, next, bp, yp, s.n, s.n);
        else if (s.avx2) pairs_unit<Epilogue::plain, true>(xp, K, wp, pairs, p, t0, t1, next, bp, yp, s.n, 0);
        else if (s.gated) pairs_unit<Epilogue::gated>(xp, K, wp, pairs, p, t0, t1, next, bp, yp, s.n, s.n);
        else pairs_unit<Epilogue::plain>(xp, K, wp, pairs, p, t0, t1, next, bp, yp, s.n, 0);
    };
    // a thread past the owners only takes what they leave
    const int64_t begin = std::min(thread, s.owners), end = std::min(thread + 1, s.owners);
    take_units(s.ranges, begin, end, [&](int64_t o, int64_t unit) { compute(o, unit, true); },
               [&](int64_t o, int64_t unit) { compute(o, unit, false); });
#endif
}

}  // namespace llmp_native::parts

TORCH_LIBRARY_FRAGMENT(llmp_native, m) {
    // weight [N, K] bfloat16 -> its panels [ceil(N / 64), ceil(K / 2), 64, 2], zero-padded
    m.def("dense_pack(Tensor weight) -> Tensor");
    // x [T, K] @ W.T (+ bias [N]) -> [T, N] from W's panels, all bfloat16, float32 accumulation; each row alone
    m.def("dense_matmul(Tensor x, Tensor packed, int n, Tensor? bias) -> Tensor");
    // the same on a named path (dense_matmul_path's names): tests force each in turn
    m.def("dense_matmul_with(Tensor x, Tensor packed, int n, Tensor? bias, str path) -> Tensor");
    // gate|up weight [2I, K] -> panels of 32 gate and the same 32 up rows each [ceil(I / 32), ceil(K / 2), 64, 2]
    m.def("dense_pack_gated(Tensor weight) -> Tensor");
    // x [T, K] through those panels (bias [panels * 64] in their order): silu(gate) * up [T, I] when gated, else
    // gate|up [T, 2I]; the pairs path only, with dense_matmul's and then silu_and_mul's bits
    m.def("dense_gated_matmul(Tensor x, Tensor packed, int half, Tensor? bias, bool gated) -> Tensor");
    m.def("dense_matmul_supported() -> bool", &llmp_native::supported);  // AVX2 at least
    m.def("dense_matmul_path() -> str", &llmp_native::dense_matmul_path);  // how dense_matmul multiplies here
    // whether a path gives the tile path's scalar definition's bits on the start-up check's exact product
    m.def("dense_matmul_check(str path) -> bool", &llmp_native::dense_matmul_check);
    // the check product on the tile instructions in a child process, whatever the CPU: "" where they give its bits,
    // else why not (on a CPU without AMX: "the tiles' check died of signal 4 (Illegal instruction)")
    m.def("amx_tiles_check() -> str", &llmp_native::tiles_check_apart);
    m.def("has_amx() -> bool", &llmp_native::has_amx);  // the CPU has AMX tiles (bfloat16)
    // why the tile instructions cannot run here ("" where they can): "no AMX", or Linux refused the tile state
    m.def("amx_tiles_unusable() -> str", [] { return llmp_native::tiles::unusable(); });
}

TORCH_LIBRARY_IMPL(llmp_native, CPU, m) {
    m.impl("dense_pack", &llmp_native::dense_pack);
    m.impl("dense_matmul", &llmp_native::dense_matmul);
    m.impl("dense_matmul_with", &llmp_native::dense_matmul_with);
    m.impl("dense_pack_gated", &llmp_native::dense_pack_gated);
    m.impl("dense_gated_matmul", &llmp_native::dense_gated_matmul);
}
