// Row-wise kernels of a decoder layer, each one pass over its rows in place of torch's chains of small ops
// (a decode step's RMSNorm, rotary and SiLU-and-mul were ~20 dispatches a layer):
//   llmp_native::rms_norm, llmp_native::add_rms_norm (the residual added, rounded, normed; both returned),
//   llmp_native::silu_and_mul, llmp_native::gelu_tanh_and_mul, llmp_native::rotary_ (neox layout, in place),
//   llmp_native::write_kv_ (a step's keys and values into their cache slots), llmp_native::argmax_rows (greedy
//   tokens: torch's bfloat16 max over 64 rows of a 152k vocabulary took 2.5 ms, one pass 0.3 ms).
// The loops are written once on generic vectors (elementwise_impl.h); the AVX2 copy's RMSNorm, activations and
// argmax on __m256 halves (elementwise_avx2.h), the AVX-512 copy's bfloat16 RMSNorm in intrinsics.
// float32, bfloat16 and float16 tensors, float32 arithmetic. In float32 the norms and activations differ from the
// reference's chains of ops only in the order of the RMS sum and the exponential's last bits (within a few ulps;
// rotary_ has the reference's very bits: no FMA contraction); float32 GELU is left to the reference. Rows are split over torch's threads only when a call
// is large enough to pay for waking them.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <type_traits>

#include "decoder_parts.h"
#include "exp_fma.h"
#include "isa.h"
#include "vec16.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LLMP_X86 1
#endif

namespace llmp_native {
namespace {

constexpr int64_t kMinValuesPerThread = 1 << 13;  // below this a second thread costs more than it saves

// GCC 12's AVX-512 headers initialise their undefined vectors from themselves (__Y = __Y), which its own
// -Wuninitialized reports once exp_fma is inlined into the AVX-512 copy: a false positive, silenced here
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define LLMP_ISA_IMPL "elementwise_impl.h"
#include "isa_copies.h"
#pragma GCC diagnostic pop

// the selected instruction set's copy of RowKernels<E>
template <typename E, typename F>
auto with_isa(F&& body) {
#ifdef LLMP_X86
    switch (selected_isa()) {
        case Isa::avx512: return body(avx512::RowKernels<E>{});
        case Isa::avx2: return body(avx2::RowKernels<E>{});
        default: break;
    }
#endif
    return body(scalar::RowKernels<E>{});
}

// rows 0..rows-1 through fn(begin, end), on one thread unless the call is large
template <typename F>
void over_rows(int64_t rows, int64_t values_per_row, F&& fn) {
    const int64_t grain = std::max<int64_t>(1, kMinValuesPerThread / std::max<int64_t>(1, values_per_row));
    if (rows <= grain) {
        fn(0, rows);
        return;
    }
    at::parallel_for(0, rows, grain, fn);
}

template <typename F>
auto dispatch(at::ScalarType dtype, const char* op, F&& body, bool with_float = false) {
    if (with_float && dtype == at::kFloat) return body(float{});
    if (dtype == at::kBFloat16) return body(c10::BFloat16{});
    TORCH_CHECK(dtype == at::kHalf, op, with_float ? ": float32, bfloat16 or float16" : ": bfloat16 or float16",
                " tensors, not ", dtype);
    return body(c10::Half{});
}

void check_rows(const at::Tensor& x, const at::Tensor& weight, const char* op) {
    TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu(), op, ": CPU tensors only");
    TORCH_CHECK(x.dim() >= 1 && weight.dim() == 1 && weight.size(0) == x.size(-1), op, ": x ", x.sizes(),
                " and the weight ", weight.sizes(), " do not match");
    TORCH_CHECK(weight.scalar_type() == x.scalar_type(), op, ": the weight must be ", x.scalar_type());
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
    check_rows(x, weight, "rms_norm");
    const at::Tensor xs = x.contiguous(), ws = weight.contiguous();
    at::Tensor out = at::empty_like(xs);
    const int64_t n = xs.size(-1), rows = n == 0 ? 0 : xs.numel() / n;
    dispatch(xs.scalar_type(), "rms_norm", [&](auto tag) {
        using E = decltype(tag);
        const E *xp = xs.data_ptr<E>(), *wp = ws.data_ptr<E>();
        E* op = out.data_ptr<E>();
        with_isa<E>([&](auto k) {
            over_rows(rows, n, [&](int64_t begin, int64_t end) {
                for (int64_t r = begin; r < end; ++r)
                    k.rms_norm(xp + r * n, nullptr, wp, op + r * n, nullptr, n, static_cast<float>(eps));
            });
            return 0;
        });
        return 0;
    }, /*with_float=*/true);
    return out;
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                                const at::Tensor& weight, double eps) {
    check_rows(x, weight, "add_rms_norm");
    TORCH_CHECK(residual.sizes() == x.sizes() && residual.scalar_type() == x.scalar_type(),
                "add_rms_norm: the residual ", residual.sizes(), " must match x ", x.sizes());
    const at::Tensor xs = x.contiguous(), rs = residual.contiguous(), ws = weight.contiguous();
    at::Tensor out = at::empty_like(xs), sum = at::empty_like(xs);
    const int64_t n = xs.size(-1), rows = n == 0 ? 0 : xs.numel() / n;
    dispatch(xs.scalar_type(), "add_rms_norm", [&](auto tag) {
        using E = decltype(tag);
        const E *xp = xs.data_ptr<E>(), *rp = rs.data_ptr<E>(), *wp = ws.data_ptr<E>();
        E *op = out.data_ptr<E>(), *sp = sum.data_ptr<E>();
        with_isa<E>([&](auto k) {
            over_rows(rows, n, [&](int64_t begin, int64_t end) {
                for (int64_t r = begin; r < end; ++r)
                    k.rms_norm(xp + r * n, rp + r * n, wp, op + r * n, sp + r * n, n, static_cast<float>(eps));
            });
            return 0;
        });
        return 0;
    }, /*with_float=*/true);
    return {out, sum};
}

template <bool kGelu>
at::Tensor act_and_mul(const at::Tensor& x, const char* op) {
    TORCH_CHECK(x.device().is_cpu() && x.dim() >= 1 && x.size(-1) % 2 == 0, op, ": x [..., 2d] on the CPU, not ",
                x.sizes());
    const at::Tensor xs = x.contiguous();
    std::vector<int64_t> shape = xs.sizes().vec();
    const int64_t half = shape.back() / 2, rows = half == 0 ? 0 : xs.numel() / (2 * half);
    shape.back() = half;
    at::Tensor out = at::empty(shape, xs.options());
    dispatch(xs.scalar_type(), op, [&](auto tag) {
        using E = decltype(tag);
        const E* xp = xs.data_ptr<E>();
        E* outp = out.data_ptr<E>();
        with_isa<E>([&](auto k) {
            over_rows(rows, 2 * half, [&](int64_t begin, int64_t end) {
                for (int64_t r = begin; r < end; ++r) {
                    if constexpr (kGelu) k.gelu_and_mul(xp + r * 2 * half, outp + r * half, half);
                    else k.silu_and_mul(xp + r * 2 * half, outp + r * half, half);
                }
            });
            return 0;
        });
        return 0;
    }, /*with_float=*/!kGelu);  // float32 GELU stays on the reference: 1 - 2 / (e + 1) loses tanh's small values
    return out;
}

// logits [R, V] -> [R] int64: the first index of each row's largest value (a NaN counts as the largest), as
// torch's argmax; rows split over threads only when the call is large
at::Tensor argmax_rows(const at::Tensor& logits) {
    TORCH_CHECK(logits.device().is_cpu() && logits.dim() == 2 && logits.size(1) > 0,
                "argmax_rows: logits [R, V] on the CPU, V > 0, not ", logits.sizes());
    const at::Tensor xs = logits.contiguous();
    const int64_t rows = xs.size(0), n = xs.size(1);
    at::Tensor out = at::empty({rows}, xs.options().dtype(at::kLong));
    int64_t* outp = out.data_ptr<int64_t>();
    dispatch(xs.scalar_type(), "argmax_rows", [&](auto tag) {
        using E = decltype(tag);
        const E* xp = xs.data_ptr<E>();
        with_isa<E>([&](auto k) {
            over_rows(rows, n, [&](int64_t begin, int64_t end) {
                for (int64_t r = begin; r < end; ++r) outp[r] = k.argmax(xp + r * n, n);
            });
            return 0;
        });
        return 0;
    }, /*with_float=*/true);
    return out;
}

at::Tensor silu_and_mul(const at::Tensor& x) { return act_and_mul<false>(x, "silu_and_mul"); }
at::Tensor gelu_tanh_and_mul(const at::Tensor& x) { return act_and_mul<true>(x, "gelu_tanh_and_mul"); }

// q [T, H, D] and k [T, Hkv, D] (any token and head strides, D contiguous) rotated in place by the rows of
// cos_sin [max_pos, D] (float32: D/2 cosines, then D/2 sines) at positions [T]
void rotary_(const at::Tensor& positions, const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos_sin) {
    TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && q.size(0) == k.size(0) && q.size(2) == k.size(2) &&
                    q.stride(2) == 1 && k.stride(2) == 1 && q.size(2) % 2 == 0,
                "rotary_: q [T, H, D] and k [T, Hkv, D] with D even and contiguous, not ", q.sizes(), " and ",
                k.sizes());
    TORCH_CHECK(q.scalar_type() == k.scalar_type(), "rotary_: q and k must have one dtype");
    TORCH_CHECK(cos_sin.dim() == 2 && cos_sin.size(1) == q.size(2) && cos_sin.scalar_type() == at::kFloat,
                "rotary_: cos_sin must be float32 [max_positions, ", q.size(2), "], not ", cos_sin.sizes());
    TORCH_CHECK(positions.dim() == 1 && positions.size(0) == q.size(0), "rotary_: positions must be [", q.size(0),
                "]");
    const at::Tensor pos = positions.to(at::kLong).contiguous(), table = cos_sin.contiguous();
    const int64_t T = q.size(0), D = q.size(2), half = D / 2, max_pos = table.size(0);
    const int64_t* pp = pos.data_ptr<int64_t>();
    for (int64_t t = 0; t < T; ++t)
        TORCH_CHECK(pp[t] >= 0 && pp[t] < max_pos, "rotary_: position ", pp[t], " is outside the table's ", max_pos);
    const float* cs = table.data_ptr<float>();
    dispatch(q.scalar_type(), "rotary_", [&](auto tag) {
        using E = decltype(tag);
        E *qp = q.data_ptr<E>(), *kp = k.data_ptr<E>();
        with_isa<E>([&](auto kern) {
            over_rows(T, (q.size(1) + k.size(1)) * D, [&](int64_t begin, int64_t end) {
                for (int64_t t = begin; t < end; ++t) {
                    const float* cos = cs + pp[t] * D;
                    for (int64_t h = 0; h < q.size(1); ++h)
                        kern.rotate(qp + t * q.stride(0) + h * q.stride(1), cos, cos + half, half);
                    for (int64_t h = 0; h < k.size(1); ++h)
                        kern.rotate(kp + t * k.stride(0) + h * k.stride(1), cos, cos + half, half);
                }
            });
            return 0;
        });
        return 0;
    }, /*with_float=*/true);  // float32 too: two products and a sum, each rounded, are the reference's bits
}

// n values of src as To, rounded to nearest even as torch's .to() rounds (through float: exact for these types)
template <typename From, typename To>
void convert_row(const void* src, void* dst, int64_t n) {
    const auto* in = static_cast<const From*>(src);
    auto* out = static_cast<To*>(dst);
    for (int64_t i = 0; i < n; ++i) out[i] = To(static_cast<float>(in[i]));
}

using ConvertRow = void (*)(const void*, void*, int64_t);

// the row conversion from k's dtype to the cache's (float32, bfloat16 or float16), chosen once a call
ConvertRow row_converter(at::ScalarType from, at::ScalarType to) {
    auto into = [&](auto tag) -> ConvertRow {
        using From = decltype(tag);
        switch (to) {
            case at::kBFloat16: return &convert_row<From, c10::BFloat16>;
            case at::kHalf: return &convert_row<From, c10::Half>;
            default: return &convert_row<From, float>;
        }
    };
    switch (from) {
        case at::kBFloat16: return into(c10::BFloat16());
        case at::kHalf: return into(c10::Half());
        default: return into(float());
    }
}

// k, v [T, Hkv, D] (any token stride, heads and D contiguous) copied into the caches [B, S, Hkv, D] at the flat
// slots [T] (-1: not written); k and v of one dtype, the caches of one (--kv-cache-dtype), each of float32, bfloat16
// or float16: a cache of another dtype than k's gets the values rounded as torch's .to() rounds them
void write_kv_(const at::Tensor& k, const at::Tensor& v, const at::Tensor& k_cache, const at::Tensor& v_cache,
               const at::Tensor& slot_mapping) {
    TORCH_CHECK(k.dim() == 3 && v.sizes() == k.sizes() && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes() &&
                    k_cache.size(2) == k.size(1) && k_cache.size(3) == k.size(2),
                "write_kv_: k, v [T, Hkv, D] and caches [B, S, Hkv, D] do not match: ", k.sizes(), " and ",
                k_cache.sizes());
    TORCH_CHECK(v.scalar_type() == k.scalar_type() && v_cache.scalar_type() == k_cache.scalar_type(),
                "write_kv_: k and v must have one dtype, and the caches one");
    for (const at::Tensor* t : {&k, &k_cache}) {
        TORCH_CHECK(t->scalar_type() == at::kFloat || t->scalar_type() == at::kBFloat16 || t->scalar_type() == at::kHalf,
                    "write_kv_: float32, bfloat16 or float16 only, not ", t->scalar_type());
    }
    TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "write_kv_: contiguous caches only");
    TORCH_CHECK(slot_mapping.dim() == 1 && slot_mapping.size(0) == k.size(0), "write_kv_: slot_mapping must be [",
                k.size(0), "]");
    const int64_t row = k.size(1) * k.size(2), slots = k_cache.size(0) * k_cache.size(1);
    const at::Tensor ks = k.stride(2) == 1 && k.stride(1) == k.size(2) ? k : k.contiguous();
    const at::Tensor vs = v.stride(2) == 1 && v.stride(1) == v.size(2) ? v : v.contiguous();
    const at::Tensor map = slot_mapping.to(at::kLong).contiguous();
    const int64_t* sp = map.data_ptr<int64_t>();
    const int64_t bytes = row * k_cache.element_size();
    auto* kc = static_cast<char*>(k_cache.data_ptr());
    auto* vc = static_cast<char*>(v_cache.data_ptr());
    const auto* kp = static_cast<const char*>(ks.data_ptr());
    const auto* vp = static_cast<const char*>(vs.data_ptr());
    const int64_t k_stride = ks.stride(0) * k.element_size(), v_stride = vs.stride(0) * v.element_size();
    const bool same = k.scalar_type() == k_cache.scalar_type();
    const ConvertRow convert = same ? nullptr : row_converter(k.scalar_type(), k_cache.scalar_type());
    for (int64_t t = 0; t < k.size(0); ++t) {
        const int64_t slot = sp[t];
        if (slot < 0) continue;
        TORCH_CHECK(slot < slots, "write_kv_: slot ", slot, " is outside the cache's ", slots);
        if (same) {
            std::memcpy(kc + slot * bytes, kp + t * k_stride, bytes);
            std::memcpy(vc + slot * bytes, vp + t * v_stride, bytes);
        } else {
            convert(kp + t * k_stride, kc + slot * bytes, row);
            convert(vp + t * v_stride, vc + slot * bytes, row);
        }
    }
}

}  // namespace

namespace parts {

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
    return llmp_native::rms_norm(x, weight, eps);
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                                const at::Tensor& weight, double eps) {
    return llmp_native::add_rms_norm(x, residual, weight, eps);
}

void rotary_(const at::Tensor& positions, const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos_sin) {
    llmp_native::rotary_(positions, q, k, cos_sin);
}

void write_kv_(const at::Tensor& k, const at::Tensor& v, const at::Tensor& k_cache, const at::Tensor& v_cache,
               const at::Tensor& slot_mapping) {
    llmp_native::write_kv_(k, v, k_cache, v_cache, slot_mapping);
}

void silu_and_mul_row(const c10::BFloat16* x, c10::BFloat16* out, int64_t half) {
    with_isa<c10::BFloat16>([&](auto kernels) { kernels.silu_and_mul(x, out, half); });
}

}  // namespace parts
}  // namespace llmp_native

TORCH_LIBRARY_FRAGMENT(llmp_native, m) {
    m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
    // (norm(round(x + residual)), round(x + residual))
    m.def("add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)");
    m.def("silu_and_mul(Tensor x) -> Tensor");
    // logits [R, V] -> [R] int64, the first index of each row's largest value (torch's argmax)
    m.def("argmax_rows(Tensor logits) -> Tensor");
    m.def("gelu_tanh_and_mul(Tensor x) -> Tensor");
    m.def("rotary_(Tensor positions, Tensor(a!) q, Tensor(b!) k, Tensor cos_sin) -> ()");
    m.def("write_kv_(Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slot_mapping) -> ()");
}

TORCH_LIBRARY_IMPL(llmp_native, CPU, m) {
    m.impl("rms_norm", &llmp_native::rms_norm);
    m.impl("add_rms_norm", &llmp_native::add_rms_norm);
    m.impl("silu_and_mul", &llmp_native::silu_and_mul);
    m.impl("argmax_rows", &llmp_native::argmax_rows);
    m.impl("gelu_tanh_and_mul", &llmp_native::gelu_tanh_and_mul);
    m.impl("rotary_", &llmp_native::rotary_);
    m.impl("write_kv_", &llmp_native::write_kv_);
}
