// The AVX2 copy's row kernels on explicit __m256 halves (lanes 0-7, 8-15 of each 16-lane chunk), included by
// elementwise_impl.h in that copy only. Written on GCC's generic 16-lane vectors, its loads, selects and
// conversions went through the stack a lane at a time: SiLU-and-mul took 6.6 ns an element, argmax 3 ns, both
// slower than the scalar copy. Each kernel does the generic code's operations in its order (no contraction:
// -ffp-contract=off), so a row's bits do not depend on the batch, as before.

struct Halves {
    __m256 lo, hi;
};

LLMP_FN __m256 widen_bf16x8(__m128i h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); }

// v rounded to bfloat16 as store_n rounds (to nearest even, a NaN a quiet NaN), in the low half of each lane
LLMP_FN __m256i bf16_bits8(__m256 v) {
    const __m256i bits = _mm256_castps_si256(v);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    const __m256i rounded =
        _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
    const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    return _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7fc0), _mm256_castps_si256(nan));
}

// 16 values (n < 16: lanes past n zero) as two halves of float32; float16 through the generic load
template <typename E>
LLMP_FN Halves load16(const E* p, int64_t n) {
    if constexpr (std::is_same_v<E, c10::BFloat16>) {
        __m256i h;
        if (n == kLanes) {
            h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
        } else {
            alignas(32) uint16_t t[kLanes] = {};
            __builtin_memcpy(t, p, n * sizeof(E));
            h = _mm256_load_si256(reinterpret_cast<const __m256i*>(t));
        }
        return {widen_bf16x8(_mm256_castsi256_si128(h)), widen_bf16x8(_mm256_extracti128_si256(h, 1))};
    } else if constexpr (std::is_same_v<E, float>) {
        if (n == kLanes) return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)};
        alignas(32) float t[kLanes] = {};
        __builtin_memcpy(t, p, n * sizeof(float));
        return {_mm256_load_ps(t), _mm256_load_ps(t + 8)};
    } else {
        alignas(32) float t[kLanes];
        const Vf v = load_n(p, n);
        __builtin_memcpy(t, &v, sizeof t);
        return {_mm256_load_ps(t), _mm256_load_ps(t + 8)};
    }
}

// the first n lanes rounded to E
template <typename E>
LLMP_FN void store16(E* p, Halves v, int64_t n) {
    if constexpr (std::is_same_v<E, c10::BFloat16>) {
        // packus interleaves the 128-bit lanes (lo 0-3, hi 0-3, lo 4-7, hi 4-7): the permute restores the order
        const __m256i h = _mm256_permute4x64_epi64(_mm256_packus_epi32(bf16_bits8(v.lo), bf16_bits8(v.hi)), 0xd8);
        if (n == kLanes) {
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), h);
        } else {
            alignas(32) uint16_t t[kLanes];
            _mm256_store_si256(reinterpret_cast<__m256i*>(t), h);
            __builtin_memcpy(p, t, n * sizeof(E));
        }
    } else {
        alignas(32) float t[kLanes];
        _mm256_store_ps(t, v.lo);
        _mm256_store_ps(t + 8, v.hi);
        if constexpr (std::is_same_v<E, float>) {
            __builtin_memcpy(p, t, n * sizeof(float));
        } else {
            for (int64_t i = 0; i < n; ++i) p[i] = E(t[i]);
        }
    }
}

LLMP_FN float sum_lanes(__m256 lo, __m256 hi) {  // lane 0 to 15 in order, as the generic code sums
    alignas(32) float lanes[kLanes];
    _mm256_store_ps(lanes, lo);
    _mm256_store_ps(lanes + 8, hi);
    float total = 0.0f;
    for (int l = 0; l < kLanes; ++l) total += lanes[l];
    return total;
}

template <typename E>
LLMP_FN void rms_norm_row_avx2(const E* x, const E* res, const E* w, E* out, E* sum, int64_t n, float eps) {
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += kLanes) {
        const int64_t m = std::min<int64_t>(kLanes, n - i);
        Halves v = load16(x + i, m);
        if (res != nullptr) {
            const Halves r = load16(res + i, m);
            store16(sum + i, {_mm256_add_ps(v.lo, r.lo), _mm256_add_ps(v.hi, r.hi)}, m);
            v = load16(sum + i, m);  // the sum as stored
        }
        lo = _mm256_add_ps(lo, _mm256_mul_ps(v.lo, v.lo));
        hi = _mm256_add_ps(hi, _mm256_mul_ps(v.hi, v.hi));
    }
    const __m256 inv = _mm256_set1_ps(1.0f / std::sqrt(sum_lanes(lo, hi) / static_cast<float>(n) + eps));
    const E* normed = res != nullptr ? sum : x;
    for (int64_t i = 0; i < n; i += kLanes) {
        const int64_t m = std::min<int64_t>(kLanes, n - i);
        const Halves v = load16(normed + i, m), g = load16(w + i, m);
        store16(out + i, {_mm256_mul_ps(_mm256_mul_ps(v.lo, inv), g.lo), _mm256_mul_ps(_mm256_mul_ps(v.hi, inv), g.hi)},
                m);
    }
}

// act_and_mul_row's activation of 8 lanes: g / (exp(-g) + 1), or 0.5 g (2 - 2 / (exp(2y) + 1))
template <bool kGelu>
LLMP_FN __m256 activation8(__m256 g) {
    const __m256 one = _mm256_set1_ps(1.0f);
    if constexpr (kGelu) {
        const __m256 cube = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(g, g), g), _mm256_set1_ps(0.044715f));
        const __m256 y = _mm256_mul_ps(_mm256_add_ps(g, cube), _mm256_set1_ps(0.7978845608028654f));
        const __m256 e = _mm256_add_ps(vexp8(_mm256_mul_ps(y, _mm256_set1_ps(2.0f))), one);
        const __m256 t = _mm256_sub_ps(_mm256_set1_ps(2.0f), _mm256_div_ps(_mm256_set1_ps(2.0f), e));
        return _mm256_mul_ps(_mm256_mul_ps(g, _mm256_set1_ps(0.5f)), t);
    } else {
        return _mm256_div_ps(g, _mm256_add_ps(vexp8(_mm256_sub_ps(_mm256_setzero_ps(), g)), one));
    }
}

template <typename E, bool kGelu>
LLMP_FN void act_and_mul_row_avx2(const E* x, E* out, int64_t half) {
    for (int64_t i = 0; i < half; i += kLanes) {
        const int64_t m = std::min<int64_t>(kLanes, half - i);
        const Halves g = load16(x + i, m), u = load16(x + half + i, m);
        store16(out + i,
                {_mm256_mul_ps(activation8<kGelu>(g.lo), u.lo), _mm256_mul_ps(activation8<kGelu>(g.hi), u.hi)}, m);
    }
}

// argmax_row's loop: each lane keeps its first largest (a strict >) and its index, and whether it saw a NaN
template <typename E>
LLMP_FN int64_t argmax_row_avx2(const E* x, int64_t n) {
    const __m256 minus_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    const __m256i lanes_lo = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i lanes_hi = _mm256_add_epi32(lanes_lo, _mm256_set1_epi32(8));
    __m256 best_lo = minus_inf, best_hi = minus_inf, nan = _mm256_setzero_ps();
    __m256i at_lo = _mm256_setzero_si256(), at_hi = _mm256_setzero_si256();
    for (int64_t i = 0; i < n; i += kLanes) {
        const int64_t m = std::min<int64_t>(kLanes, n - i);
        Halves v = load16(x + i, m);
        const __m256i base = _mm256_set1_epi32(static_cast<int32_t>(i));
        const __m256i idx_lo = _mm256_add_epi32(lanes_lo, base), idx_hi = _mm256_add_epi32(lanes_hi, base);
        if (m < kLanes) {  // lanes past the row never win
            const __m256i count = _mm256_set1_epi32(static_cast<int32_t>(m));
            v.lo = _mm256_blendv_ps(minus_inf, v.lo, _mm256_castsi256_ps(_mm256_cmpgt_epi32(count, lanes_lo)));
            v.hi = _mm256_blendv_ps(minus_inf, v.hi, _mm256_castsi256_ps(_mm256_cmpgt_epi32(count, lanes_hi)));
        }
        const __m256 larger_lo = _mm256_cmp_ps(v.lo, best_lo, _CMP_GT_OQ);
        const __m256 larger_hi = _mm256_cmp_ps(v.hi, best_hi, _CMP_GT_OQ);
        best_lo = _mm256_blendv_ps(best_lo, v.lo, larger_lo);
        best_hi = _mm256_blendv_ps(best_hi, v.hi, larger_hi);
        at_lo = _mm256_blendv_epi8(at_lo, idx_lo, _mm256_castps_si256(larger_lo));
        at_hi = _mm256_blendv_epi8(at_hi, idx_hi, _mm256_castps_si256(larger_hi));
        nan = _mm256_or_ps(nan, _mm256_or_ps(_mm256_cmp_ps(v.lo, v.lo, _CMP_UNORD_Q), _mm256_cmp_ps(v.hi, v.hi, _CMP_UNORD_Q)));
    }
    if (_mm256_movemask_ps(nan) != 0) return first_nan(x, n);
    alignas(32) float best[kLanes];
    alignas(32) int32_t at[kLanes];
    _mm256_store_ps(best, best_lo);
    _mm256_store_ps(best + 8, best_hi);
    _mm256_store_si256(reinterpret_cast<__m256i*>(at), at_lo);
    _mm256_store_si256(reinterpret_cast<__m256i*>(at + 8), at_hi);
    return first_largest(best, at, n);
}
