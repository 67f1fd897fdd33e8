// dense_matmul's panels multiplied with AVX2 and FMA, on CPUs without AVX-512 BF16 (AMD Zen 2 and 3, Intel before
// Cooper Lake): the same packed weight ([P][K/2][64][2]). Each 32-bit lane of a weight vector holds the bfloat16
// pair (w[n][k], w[n][k+1]) and is widened to two float32 vectors in registers (the low half shifted up, the high
// half masked), the input's pair broadcast and widened the same way; each output lane is
// acc = fma(x[k], w[n][k], acc), then fma(x[k+1], w[n][k+1], acc), pair after pair of K: one fixed order whatever
// the tile, so a row's result never depends on the other rows. Without it such a CPU multiplied a float32 copy of
// each weight on oneDNN (the cpu set's UpcastLinear: twice the bytes read for each decoded token).
//
// Included by dense_matmul.cpp inside its namespace, after Epilogue, kPanel and parts::silu_and_mul_row.
#pragma once

#define LLMP_AVX2_FMA __attribute__((target("avx2,fma")))

namespace avx2_pairs {

constexpr int kMaxRows = 4;  // input rows of a tile
constexpr int kVectors = kPanel / 8;  // a panel's columns in 8-lane vectors

LLMP_AVX2_FMA inline __m256 low_halves(__m256i pairs) { return _mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16)); }

LLMP_AVX2_FMA inline __m256 high_halves(__m256i pairs) {
    return _mm256_castsi256_ps(_mm256_and_si256(pairs, _mm256_set1_epi32(int32_t(0xffff0000u))));
}

// 8 float32 lanes rounded to bfloat16 as c10 rounds (to nearest even; a NaN becomes the quiet NaN 0x7fc0)
LLMP_AVX2_FMA inline __m128i round_as_c10(__m256 v) {
    const __m256i bits = _mm256_castps_si256(v);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
    rounded = _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7fc0), _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
    return _mm_packus_epi32(_mm256_castsi256_si128(rounded), _mm256_extracti128_si256(rounded, 1));
}

// rows x[0..R) through vectors v0..v0+CV of a panel, over every pair of K, into sums[r][v * 8 + lane]. The unit's
// reading ahead (ahead..ahead_end, ahead_step bytes a pair of K) is asked for by the first block of a tile only.
template <int R, int CV, bool OddK>
LLMP_AVX2_FMA inline void block(const uint16_t* x, int64_t K, const uint16_t* panel, int v0, float (*sums)[kPanel],
                                const char* ahead, const char* ahead_end, int64_t ahead_step) {
    __m256 acc[R][CV];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
        for (int j = 0; j < CV; ++j) acc[r][j] = _mm256_setzero_ps();
    const int64_t full = K / 2;
    const uint16_t* wp = panel + v0 * 16;
    for (int64_t p = 0; p < full; ++p, wp += 2 * kPanel) {
        if (ahead < ahead_end) {
            _mm_prefetch(ahead, _MM_HINT_T1);
            for (int64_t b = 64; b < ahead_step; b += 64) _mm_prefetch(ahead + b, _MM_HINT_T1);
        }
        ahead += ahead_step;
        __m256 even[CV], odd[CV];
#pragma GCC unroll 8
        for (int j = 0; j < CV; ++j) {
            const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp + j * 16));
            even[j] = low_halves(w);
            odd[j] = high_halves(w);
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
            int32_t pair;
            __builtin_memcpy(&pair, x + r * K + 2 * p, 4);
            const __m256i xv = _mm256_set1_epi32(pair);
            const __m256 xe = low_halves(xv), xo = high_halves(xv);
#pragma GCC unroll 8
            for (int j = 0; j < CV; ++j) {
                acc[r][j] = _mm256_fmadd_ps(xe, even[j], acc[r][j]);
                acc[r][j] = _mm256_fmadd_ps(xo, odd[j], acc[r][j]);
            }
        }
    }
    if constexpr (OddK) {  // the last pair holds one value of K (its partner is 0 in the weight): no second product
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
            const __m256 xe = _mm256_castsi256_ps(_mm256_set1_epi32(int32_t(x[r * K + K - 1]) << 16));
#pragma GCC unroll 8
            for (int j = 0; j < CV; ++j) {
                const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp + j * 16));
                acc[r][j] = _mm256_fmadd_ps(xe, low_halves(w), acc[r][j]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
        for (int j = 0; j < CV; ++j) _mm256_storeu_ps(sums[r] + (v0 + j) * 8, acc[r][j]);
}

// n <= 8 float32 values (zeros past n) plus the bias's
LLMP_AVX2_FMA inline __m256 with_bias(const float* sums, const float* bias, int64_t n) {
    const __m256 v = _mm256_loadu_ps(sums);
    if (!bias) return v;  // none: nothing added (adding 0 would turn a -0 into +0)
    alignas(32) float b[8] = {};
    __builtin_memcpy(b, bias, std::min<int64_t>(n, 8) * sizeof(float));
    return _mm256_add_ps(v, _mm256_load_ps(b));
}

LLMP_AVX2_FMA inline void store_bf16(c10::BFloat16* out, __m128i h, int64_t n) {
    if (n >= 8) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out), h);
    } else {
        alignas(16) uint16_t t[8];
        _mm_store_si128(reinterpret_cast<__m128i*>(t), h);
        __builtin_memcpy(out, t, n * sizeof(uint16_t));
    }
}

// a tile: rows t..t+R of x through one panel, its sums then its epilogue (as dense_matmul.cpp's packed_tile writes)
template <int R, Epilogue E, bool OddK>
LLMP_AVX2_FMA void tile(const uint16_t* x, int64_t K, const uint16_t* panel, const float* bias, int64_t n0, int64_t cols,
                        c10::BFloat16* y, int64_t N, int64_t half, const char* ahead, const char* ahead_end,
                        int64_t ahead_step) {
    // accumulators, widened weights and broadcast inputs within 16 registers: 1 x 8, 2 x 4, 3 and 4 x 2 vectors
    constexpr int CV = R == 1 ? 8 : R == 2 ? 4 : 2;
    alignas(32) float sums[R][kPanel];
    for (int v0 = 0; v0 < kVectors; v0 += CV)
        block<R, CV, OddK>(x, K, panel, v0, sums, v0 == 0 ? ahead : nullptr, v0 == 0 ? ahead_end : nullptr,
                           ahead_step);
    if constexpr (E == Epilogue::plain) {
        for (int r = 0; r < R; ++r)
            for (int64_t c = 0; c < cols; c += 8)
                store_bf16(y + r * N + n0 + c, round_as_c10(with_bias(sums[r] + c, bias ? bias + n0 + c : nullptr, cols - c)),
                           cols - c);
    } else {  // columns 0..31: gate g0..g0+31; 32..63: the up columns of the same indices
        const int64_t g0 = n0 / 2, live = std::min<int64_t>(32, half - g0);
        for (int r = 0; r < R; ++r) {
            alignas(16) c10::BFloat16 rounded[2 * 32];  // gate (live) then up (live), as silu_and_mul reads a row
            for (int64_t c = 0; c < live; c += 8) {
                const int64_t n = std::min<int64_t>(8, live - c);
                store_bf16(rounded + c, round_as_c10(with_bias(sums[r] + c, bias ? bias + n0 + c : nullptr, 8)), n);
                store_bf16(rounded + live + c,
                           round_as_c10(with_bias(sums[r] + 32 + c, bias ? bias + n0 + 32 + c : nullptr, 8)), n);
            }
            if constexpr (E == Epilogue::split) {
                __builtin_memcpy(y + r * N + g0, rounded, live * sizeof(c10::BFloat16));
                __builtin_memcpy(y + r * N + half + g0, rounded + live, live * sizeof(c10::BFloat16));
            } else {
                parts::silu_and_mul_row(rounded, y + r * N + g0, live);
            }
        }
    }
}

template <Epilogue E, int... R>
LLMP_AVX2_FMA void rows(std::integer_sequence<int, R...>, int64_t rows, const uint16_t* x, int64_t K,
                        const uint16_t* panel, const float* bias, int64_t n0, int64_t cols, c10::BFloat16* y, int64_t N,
                        int64_t half, const char* ahead, const char* ahead_end, int64_t ahead_step) {
    if (K & 1)
        ((rows == R + 1 ? (tile<R + 1, E, true>(x, K, panel, bias, n0, cols, y, N, half, ahead, ahead_end, ahead_step), 0)
                        : 0),
         ...);
    else
        ((rows == R + 1 ? (tile<R + 1, E, false>(x, K, panel, bias, n0, cols, y, N, half, ahead, ahead_end, ahead_step), 0)
                        : 0),
         ...);
}

}  // namespace avx2_pairs
