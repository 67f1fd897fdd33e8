// The row-wise kernels' loops (elementwise.cpp), compiled once per instruction set as paged_attention_impl.h is:
// elementwise.cpp includes this file (isa_copies.h) inside each copy's namespace with LLMP_TARGET and LLMP_ISA_LEVEL set.
// A row is computed alone, 16 lanes at a time in a fixed order: its bits never depend on the other rows.

#define LLMP_FN static inline LLMP_TARGET

#include "vec16_math.h"

// n <= 16 values as float32, lanes past n zero (bfloat16 and float32 exactly, float16 through its conversion)
template <typename E>
LLMP_FN Vf load_n(const E* p, int64_t n) {
    if constexpr (std::is_same_v<E, c10::BFloat16>) {
        Vh h{};
        if (n == kLanes) __builtin_memcpy(&h, p, sizeof h);  // a constant size: one vector load
        else __builtin_memcpy(&h, p, n * sizeof(E));
        const Vi bits = __builtin_convertvector(h, Vi) << 16;  // a bfloat16 is a float32's upper half
        Vf v;
        __builtin_memcpy(&v, &bits, sizeof v);
        return v;
    } else if constexpr (std::is_same_v<E, float>) {
        Vf v{};
        if (n == kLanes) __builtin_memcpy(&v, p, sizeof v);
        else __builtin_memcpy(&v, p, n * sizeof(float));
        return v;
    } else {
        alignas(64) float t[kLanes] = {};
        for (int64_t i = 0; i < n; ++i) t[i] = static_cast<float>(p[i]);
        Vf v;
        __builtin_memcpy(&v, t, sizeof v);
        return v;
    }
}

// the first n lanes rounded to E (to nearest even, as c10's conversions: a NaN stays a quiet NaN)
template <typename E>
LLMP_FN void store_n(E* p, Vf v, int64_t n) {
    if constexpr (std::is_same_v<E, c10::BFloat16>) {
        Vu bits;
        __builtin_memcpy(&bits, &v, sizeof bits);
        const Vu rounded = (bits + (((bits >> 16) & 1u) + 0x7fffu)) >> 16;
        const Vu out = v != v ? Vu{} + 0x7fc0u : rounded;
        const Vh h = __builtin_convertvector(out, Vh);
        if (n == kLanes) __builtin_memcpy(p, &h, sizeof h);
        else __builtin_memcpy(p, &h, n * sizeof(E));
    } else if constexpr (std::is_same_v<E, float>) {
        if (n == kLanes) __builtin_memcpy(p, &v, sizeof v);
        else __builtin_memcpy(p, &v, n * sizeof(float));
    } else {
        alignas(64) float t[kLanes];
        __builtin_memcpy(t, &v, sizeof v);
        for (int64_t i = 0; i < n; ++i) p[i] = E(t[i]);
    }
}

// argmax_row's ends: the index of the row's first NaN (the largest, as torch counts it), or -1
template <typename E>
LLMP_FN int64_t first_nan(const E* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        const float v = static_cast<float>(x[i]);
        if (v != v) return i;
    }
    return -1;
}

// and the smallest index among the lanes holding the largest of their values (each lane's first)
LLMP_FN int64_t first_largest(const float* best, const int32_t* at, int64_t n) {
    float top = best[0];
    for (int l = 1; l < kLanes; ++l) top = std::max(top, best[l]);
    int64_t first = n > 0 ? n : 0;
    for (int l = 0; l < kLanes; ++l) {
        if (best[l] == top) first = std::min<int64_t>(first, at[l]);
    }
    return n > 0 ? first : 0;
}

#if LLMP_ISA_LEVEL == 1
#include "elementwise_avx2.h"
#endif

#if LLMP_ISA_LEVEL == 2
// rms_norm_row's bfloat16 rows in AVX-512 instructions (GCC's generic vectors spilled every load through the stack:
// 2x slower with the residual), with its very operations and order: the same bits
LLMP_FN __m512 widen_bf16(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }

// v rounded to bfloat16 as store_n rounds, in the low half of each lane
LLMP_FN __m512i bf16_bits(__m512 v) {
    const __m512i bits = _mm512_castps_si512(v);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
    return _mm512_mask_mov_epi32(rounded, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7fc0));
}

LLMP_FN void rms_norm_row_bf16(const c10::BFloat16* x, const c10::BFloat16* res, const c10::BFloat16* w,
                               c10::BFloat16* out, c10::BFloat16* sum, int64_t n, float eps) {
    __m512 squares = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += kLanes) {
        const __mmask16 m = n - i >= kLanes ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1);
        __m512 v = widen_bf16(_mm256_maskz_loadu_epi16(m, x + i));
        if (res != nullptr) {
            const __m512i bits = bf16_bits(_mm512_add_ps(v, widen_bf16(_mm256_maskz_loadu_epi16(m, res + i))));
            _mm256_mask_storeu_epi16(sum + i, m, _mm512_cvtepi32_epi16(bits));
            v = _mm512_castsi512_ps(_mm512_slli_epi32(bits, 16));  // the sum as stored
        }
        squares = _mm512_add_ps(squares, _mm512_mul_ps(v, v));
    }
    alignas(64) float lanes[kLanes];
    _mm512_store_ps(lanes, squares);
    float total = 0.0f;
    for (int l = 0; l < kLanes; ++l) total += lanes[l];
    const __m512 inv = _mm512_set1_ps(1.0f / std::sqrt(total / static_cast<float>(n) + eps));
    const c10::BFloat16* normed = res != nullptr ? sum : x;
    for (int64_t i = 0; i < n; i += kLanes) {
        const __mmask16 m = n - i >= kLanes ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1);
        const __m512 v = _mm512_mul_ps(_mm512_mul_ps(widen_bf16(_mm256_maskz_loadu_epi16(m, normed + i)), inv),
                                       widen_bf16(_mm256_maskz_loadu_epi16(m, w + i)));
        _mm256_mask_storeu_epi16(out + i, m, _mm512_cvtepi32_epi16(bf16_bits(v)));
    }
}
#endif

// out = x / rms(x) * w; with res, sum = round(x + res) first, and the norm of sum
template <typename E>
LLMP_FN void rms_norm_row(const E* x, const E* res, const E* w, E* out, E* sum, int64_t n, float eps) {
#if LLMP_ISA_LEVEL == 2
    if constexpr (std::is_same_v<E, c10::BFloat16>) return rms_norm_row_bf16(x, res, w, out, sum, n, eps);
#elif LLMP_ISA_LEVEL == 1
    return rms_norm_row_avx2(x, res, w, out, sum, n, eps);
#endif
    Vf squares{};
    for (int64_t i = 0; i < n; i += kLanes) {
        const int64_t m = std::min<int64_t>(kLanes, n - i);
        Vf v = load_n(x + i, m);
        if (res != nullptr) {
            store_n(sum + i, v + load_n(res + i, m), m);
            v = load_n(sum + i, m);  // the sum as stored
        }
        squares = squares + v * v;
    }
    float total = 0.0f;
    for (int l = 0; l < kLanes; ++l) total += squares[l];
    const float inv = 1.0f / std::sqrt(total / static_cast<float>(n) + eps);
    const E* normed = res != nullptr ? sum : x;
    for (int64_t i = 0; i < n; i += kLanes) {
        const int64_t m = std::min<int64_t>(kLanes, n - i);
        store_n(out + i, load_n(normed + i, m) * inv * load_n(w + i, m), m);
    }
}

#if LLMP_ISA_LEVEL == 2
// SiLU of rows rounded to bfloat16 or float16 after (exp_fma.h); float32 rows keep vexp and a division
LLMP_FN Vf silu_rounded(Vf gate) {
    return reinterpret_cast<Vf>(silu_exp_fma(reinterpret_cast<__m512>(gate)));
}
#endif

// out[i] = act(x[i]) * x[half + i]: SiLU (gate / (1 + exp(-gate))) or tanh-approximated GELU
template <typename E, bool kGelu>
LLMP_FN void act_and_mul_row(const E* x, E* out, int64_t half) {
#if LLMP_ISA_LEVEL == 1
    return act_and_mul_row_avx2<E, kGelu>(x, out, half);
#endif
    for (int64_t i = 0; i < half; i += kLanes) {
        const int64_t m = std::min<int64_t>(kLanes, half - i);
        const Vf g = load_n(x + i, m), u = load_n(x + half + i, m);
        Vf a;
        if constexpr (kGelu) {  // 0.5 g (1 + tanh(y)), tanh(y) = 1 - 2 / (exp(2y) + 1)
            const Vf y = (g + g * g * g * 0.044715f) * 0.7978845608028654f;
            a = g * 0.5f * (2.0f - 2.0f / (vexp(y * 2.0f) + 1.0f));
        } else {
#if LLMP_ISA_LEVEL == 2
            if constexpr (!std::is_same_v<E, float>) a = silu_rounded(g);
            else a = g / (vexp(-g) + 1.0f);
#else
            a = g / (vexp(-g) + 1.0f);
#endif
        }
        store_n(out + i, a * u, m);
    }
}

// neox rotation in place of one head's row: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)
template <typename E>
LLMP_FN void rotate_row(E* row, const float* cos, const float* sin, int64_t half) {
    for (int64_t i = 0; i < half; i += kLanes) {
        const int64_t m = std::min<int64_t>(kLanes, half - i);
        const Vf x1 = load_n(row + i, m), x2 = load_n(row + half + i, m);
        const Vf c = load_n(cos + i, m), s = load_n(sin + i, m);
        store_n(row + i, x1 * c - x2 * s, m);
        store_n(row + half + i, x2 * c + x1 * s, m);
    }
}

// The first index of the row's largest value, a NaN counting as the largest (torch's max and argmax): each lane
// keeps its first largest (a strict >), then the smallest index among the lanes holding the largest
template <typename E>
LLMP_FN int64_t argmax_row(const E* x, int64_t n) {
#if LLMP_ISA_LEVEL == 1
    return argmax_row_avx2(x, n);
#endif
    Vi lane;
    for (int l = 0; l < kLanes; ++l) lane[l] = l;
    Vf best = Vf{} - std::numeric_limits<float>::infinity();
    Vi at{}, nan{};
    for (int64_t i = 0; i < n; i += kLanes) {
        const int64_t m = std::min<int64_t>(kLanes, n - i);
        Vf v = load_n(x + i, m);
        if (m < kLanes) v = lane < static_cast<int32_t>(m) ? v : Vf{} - std::numeric_limits<float>::infinity();
        const Vi larger = v > best;
        best = larger ? v : best;
        at = larger ? lane + static_cast<int32_t>(i) : at;
        nan |= v != v;
    }
    bool any_nan = false;
    for (int l = 0; l < kLanes; ++l) any_nan |= nan[l] != 0;
    if (any_nan) return first_nan(x, n);
    float best_lanes[kLanes];
    int32_t at_lanes[kLanes];
    __builtin_memcpy(best_lanes, &best, sizeof best_lanes);
    __builtin_memcpy(at_lanes, &at, sizeof at_lanes);
    return first_largest(best_lanes, at_lanes, n);
}

template <typename E>
struct RowKernels {
    static LLMP_TARGET void rms_norm(const E* x, const E* res, const E* w, E* out, E* sum, int64_t n, float eps) {
        rms_norm_row(x, res, w, out, sum, n, eps);
    }
    static LLMP_TARGET void silu_and_mul(const E* x, E* out, int64_t half) { act_and_mul_row<E, false>(x, out, half); }
    static LLMP_TARGET void gelu_and_mul(const E* x, E* out, int64_t half) { act_and_mul_row<E, true>(x, out, half); }
    static LLMP_TARGET int64_t argmax(const E* row, int64_t n) { return argmax_row(row, n); }
    static LLMP_TARGET void rotate(E* row, const float* cos, const float* sin, int64_t half) {
        rotate_row(row, cos, sin, half);
    }
};

#undef LLMP_FN
