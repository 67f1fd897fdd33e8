// dense_matmul: x @ W.T (+ bias) for bfloat16 x [T, K] and W [N, K], on CPUs with AVX-512 BF16 and no AMX
// (AMD Zen 4 and 5) (llmp_native::dense_matmul).
//
// Each output is one dot product computed the same way whatever T: 32 products at a time into a 16-lane float32
// accumulator (vdpbf16ps; a bfloat16 product is exact in float32), the K tail masked to zeros, one fixed
// reduction of the lanes, the bias added, one rounding to bfloat16. So a row's result never depends on the other
// rows: the model layer calls it on the batch as it is, where oneDNN must be called in padded 32-row blocks for
// the same guarantee (a decode step of one sequence then multiplies 32 rows, at about half the memory bandwidth
// a matrix-vector product reaches). Weight rows are split over torch's threads in whole groups, as in
// quant_matmul, so the bits do not depend on the thread count either.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>

#include "isa.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LLMP_X86 1
#endif

namespace llmp_native {
namespace {

constexpr int64_t kGroupRows = 16;  // weight rows a thread's range is made of
constexpr int64_t kTileT = 128;  // input rows whose chunks stay in L2 while the weight rows pass (best of 16-128)
constexpr int64_t kMinBytesPerThread = 64 << 10;  // as quant_matmul: less work than this a thread costs more than it saves

// The AVX-512 level is selected (LLMP_NATIVE_ISA lowers it for every kernel, this one too) and the CPU has BF16
bool supported() {
#ifdef LLMP_X86
    __builtin_cpu_init();
    return selected_isa() == Isa::avx512 && __builtin_cpu_supports("avx512bf16");
#else
    return false;
#endif
}

// Where the CPU has AMX tiles (Intel Sapphire Rapids and later), oneDNN's AMX kernels multiply a prefill's 32-row
// blocks several times faster than vdpbf16ps can: the kernel set leaves bfloat16 layers to them there
bool has_amx() {
#ifdef LLMP_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("amx-bf16");
#else
    return false;
#endif
}

#ifdef LLMP_X86
#define LLMP_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

// TB input rows x NB weight rows: TB * NB accumulators, each chunk of x and W loaded once for all of them
template <int TB, int NB>
LLMP_BF16 inline void tile(const uint16_t* const* x, const uint16_t* const* w, int64_t K, float (*out)[NB]) {
    __m512 acc[TB][NB];
    for (int t = 0; t < TB; ++t)
        for (int n = 0; n < NB; ++n) acc[t][n] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
        __m512bh wv[NB];
        for (int n = 0; n < NB; ++n) wv[n] = (__m512bh)_mm512_loadu_si512(w[n] + k);
        for (int t = 0; t < TB; ++t) {
            const __m512bh xv = (__m512bh)_mm512_loadu_si512(x[t] + k);
            for (int n = 0; n < NB; ++n) acc[t][n] = _mm512_dpbf16_ps(acc[t][n], xv, wv[n]);
        }
    }
    if (k < K) {  // the tail, zero-padded: 0 * w adds nothing
        const __mmask32 mask = (1u << (K - k)) - 1;
        __m512bh wv[NB];
        for (int n = 0; n < NB; ++n) wv[n] = (__m512bh)_mm512_maskz_loadu_epi16(mask, w[n] + k);
        for (int t = 0; t < TB; ++t) {
            const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(mask, x[t] + k);
            for (int n = 0; n < NB; ++n) acc[t][n] = _mm512_dpbf16_ps(acc[t][n], xv, wv[n]);
        }
    }
    for (int t = 0; t < TB; ++t)
        for (int n = 0; n < NB; ++n) out[t][n] = _mm512_reduce_add_ps(acc[t][n]);
}

// rows n0..n1 of the output for every input row: NB weight rows (in L1) against TB input rows at a time (4 x 6:
// 24 accumulators, 6 weight chunks and an input chunk fill the 32 registers; measured best of 4x4, 3x8, 4x6)
template <int TB, int NB>
LLMP_BF16 void rows(const uint16_t* x, const uint16_t* w, const float* bias, c10::BFloat16* y, int64_t T, int64_t N,
                    int64_t K, int64_t n0, int64_t n1) {
    auto store = [&](int64_t t, int64_t n, float value) { y[t * N + n] = c10::BFloat16(bias ? value + bias[n] : value); };
    for (int64_t t0 = 0; t0 < T; t0 += kTileT) {
        const int64_t t1 = std::min(T, t0 + kTileT);
        for (int64_t n = n0; n < n1; n += NB) {
            const int64_t nb = std::min<int64_t>(NB, n1 - n);
            const uint16_t* wr[NB];
            for (int j = 0; j < NB; ++j) wr[j] = w + (n + std::min<int64_t>(j, nb - 1)) * K;  // repeats the last
            int64_t t = t0;
            for (; t + TB <= t1; t += TB) {
                const uint16_t* xr[TB];
                for (int i = 0; i < TB; ++i) xr[i] = x + (t + i) * K;
                float out[TB][NB];
                tile<TB, NB>(xr, wr, K, out);
                for (int i = 0; i < TB; ++i)
                    for (int j = 0; j < nb; ++j) store(t + i, n + j, out[i][j]);
            }
            for (; t < t1; ++t) {
                const uint16_t* xr[1] = {x + t * K};
                float out[1][NB];
                tile<1, NB>(xr, wr, K, out);
                for (int j = 0; j < nb; ++j) store(t, n + j, out[0][j]);
            }
        }
    }
}
#endif

at::Tensor dense_matmul(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias) {
    TORCH_CHECK(supported(), "dense_matmul: needs AVX-512 BF16 (and LLMP_NATIVE_ISA not below avx512)");
    TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu(), "dense_matmul: CPU tensors only");
    TORCH_CHECK(x.scalar_type() == at::kBFloat16 && weight.scalar_type() == at::kBFloat16,
                "dense_matmul: x and the weight must be bfloat16");
    TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), "dense_matmul: x ", x.sizes(),
                " does not match the weight ", weight.sizes());
    const int64_t T = x.size(0), N = weight.size(0), K = weight.size(1);
    at::Tensor b;
    if (bias.has_value() && bias->defined()) {
        TORCH_CHECK(bias->dim() == 1 && bias->size(0) == N, "dense_matmul: the bias must be [", N, "]");
        b = bias->to(at::kFloat).contiguous();
    }
    const at::Tensor xs = x.contiguous(), ws = weight.contiguous();
    at::Tensor y = at::empty({T, N}, x.options());
    if (T == 0 || N == 0) return y;
#ifdef LLMP_X86
    const auto* xp = reinterpret_cast<const uint16_t*>(xs.data_ptr());
    const auto* wp = reinterpret_cast<const uint16_t*>(ws.data_ptr());
    const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
    auto* yp = y.data_ptr<c10::BFloat16>();
    const int64_t groups = (N + kGroupRows - 1) / kGroupRows;
    const int64_t bytes = N * K * 2 + N * K / 2 * (T - 1);  // as quant_matmul: later rows cost less than the first
    const int64_t threads = std::clamp<int64_t>(bytes / kMinBytesPerThread, 1,
                                                std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), groups)));
    at::parallel_for(0, groups, (groups + threads - 1) / threads, [&](int64_t begin, int64_t end) {
        rows<4, 6>(xp, wp, bp, yp, T, N, K, begin * kGroupRows, std::min(N, end * kGroupRows));
    });
#endif
    return y;
}

}  // namespace
}  // namespace llmp_native

TORCH_LIBRARY_FRAGMENT(llmp_native, m) {
    // x [T, K] @ weight [N, K].T (+ bias [N]) -> [T, N], all bfloat16, float32 accumulation; each row alone
    m.def("dense_matmul(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
    m.def("dense_matmul_supported() -> bool", &llmp_native::supported);  // the CPU has AVX-512 BF16
    m.def("has_amx() -> bool", &llmp_native::has_amx);  // the CPU has AMX tiles (bfloat16)
}

TORCH_LIBRARY_IMPL(llmp_native, CPU, m) { m.impl("dense_matmul", &llmp_native::dense_matmul); }
