// The quantised matmul's hot loops, compiled once per instruction set: quant_matmul.cpp includes this file
// three times, each inside its own namespace with LLMP_TARGET and LLMP_ISA_LEVEL set
// (0 scalar, 1 AVX2 + FMA, 2 AVX-512).
//
// For each tile of weight rows: dequantise the rows into a float32 buffer (bit-identical to the reference
// dequantize), then take their dot products with every input row. One dot product always runs the same way,
// whatever T and whatever tile it is part of: the lanes, accumulators and final reduction depend only on K,
// so a row's result never depends on the batch (row invariance).

#define LLMP_FN static inline LLMP_TARGET

// -- scaling a block's integers ------------------------------------------------------------------------
// q int8 [n] (n a multiple of 16) -> out float32: q * d, q * d - m, q * d + m (each product exact, one rounding)

#if LLMP_ISA_LEVEL == 2

#define LLMP_SCALE(name, combine)                                                        \
    LLMP_FN void name(const int8_t* q, int n, float d, float m, float* out) {            \
        const __m512 vd = _mm512_set1_ps(d), vm = _mm512_set1_ps(m);                     \
        (void)vm;                                                                        \
        for (int i = 0; i < n; i += 16) {                                                \
            const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + i)); \
            const __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes)), vd); \
            _mm512_storeu_ps(out + i, combine);                                          \
        }                                                                                \
    }
LLMP_SCALE(scale_m, v)
LLMP_SCALE(scale_sub, _mm512_sub_ps(v, vm))
LLMP_SCALE(scale_add, _mm512_add_ps(v, vm))

#elif LLMP_ISA_LEVEL == 1

#define LLMP_SCALE(name, combine)                                                        \
    LLMP_FN void name(const int8_t* q, int n, float d, float m, float* out) {            \
        const __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m);                     \
        (void)vm;                                                                        \
        for (int i = 0; i < n; i += 8) {                                                 \
            const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + i)); \
            const __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)), vd); \
            _mm256_storeu_ps(out + i, combine);                                          \
        }                                                                                \
    }
LLMP_SCALE(scale_m, v)
LLMP_SCALE(scale_sub, _mm256_sub_ps(v, vm))
LLMP_SCALE(scale_add, _mm256_add_ps(v, vm))

#else

#define LLMP_SCALE(name, combine)                                              \
    LLMP_FN void name(const int8_t* q, int n, float d, float m, float* out) {  \
        for (int i = 0; i < n; ++i) {                                          \
            const float v = static_cast<float>(q[i]) * d;                      \
            out[i] = combine;                                                  \
        }                                                                      \
    }
LLMP_SCALE(scale_m, v)
LLMP_SCALE(scale_sub, v - m)
LLMP_SCALE(scale_add, v + m)

#endif
#undef LLMP_SCALE

LLMP_FN void scale(const int8_t* q, int n, float d, float* out) { scale_m(q, n, d, 0.0f, out); }

#include "ggml_blocks.h"

// -- dot products --------------------------------------------------------------------------------------
// K is a multiple of 32 (every format's block). dot_rows computes R dot products sharing each load of x;
// every one of them sums exactly as dot_rows<1> would.

#if LLMP_ISA_LEVEL >= 1

// the 8 lanes' sum, in a fixed order: halves, then pairs, then the last two
LLMP_FN float hsum8(__m256 v) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

#endif

#if LLMP_ISA_LEVEL == 2

LLMP_FN float hsum16(__m512 v) {
    const __m256 low = _mm512_castps512_ps256(v);
    const __m256 high = _mm512_castps512_ps256(_mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(1, 0, 3, 2)));
    return hsum8(_mm256_add_ps(low, high));
}

// two accumulators of 16 lanes: element i goes to lane i % 16 of accumulator (i / 16) % 2
template <int R>
LLMP_FN void dot_rows(const float* x, const float* w, int64_t K, float* out) {
    __m512 a0[R], a1[R];
    for (int r = 0; r < R; ++r) a0[r] = a1[r] = _mm512_setzero_ps();
    for (int64_t i = 0; i < K; i += 32) {
        const __m512 x0 = _mm512_loadu_ps(x + i), x1 = _mm512_loadu_ps(x + i + 16);
        for (int r = 0; r < R; ++r) {
            a0[r] = _mm512_fmadd_ps(x0, _mm512_loadu_ps(w + r * K + i), a0[r]);
            a1[r] = _mm512_fmadd_ps(x1, _mm512_loadu_ps(w + r * K + i + 16), a1[r]);
        }
    }
    for (int r = 0; r < R; ++r) out[r] = hsum16(_mm512_add_ps(a0[r], a1[r]));
}

#elif LLMP_ISA_LEVEL == 1

// two accumulators of 8 lanes: element i goes to lane i % 8 of accumulator (i / 8) % 2
template <int R>
LLMP_FN void dot_rows(const float* x, const float* w, int64_t K, float* out) {
    __m256 a0[R], a1[R];
    for (int r = 0; r < R; ++r) a0[r] = a1[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < K; i += 16) {
        const __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + i + 8);
        for (int r = 0; r < R; ++r) {
            a0[r] = _mm256_fmadd_ps(x0, _mm256_loadu_ps(w + r * K + i), a0[r]);
            a1[r] = _mm256_fmadd_ps(x1, _mm256_loadu_ps(w + r * K + i + 8), a1[r]);
        }
    }
    for (int r = 0; r < R; ++r) out[r] = hsum8(_mm256_add_ps(a0[r], a1[r]));
}

#else

// eight partial sums (element i to sum i % 8), added pairwise: the same order for every dot product
template <int R>
LLMP_FN void dot_rows(const float* x, const float* w, int64_t K, float* out) {
    for (int r = 0; r < R; ++r) {
        const float* wr = w + r * K;
        float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int64_t i = 0; i < K; i += 8) {
            for (int l = 0; l < 8; ++l) s[l] += x[i + l] * wr[i + l];
        }
        out[r] = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    }
}

#endif

// -- the row loop --------------------------------------------------------------------------------------

template <void (*DEQUANTIZE)(const uint8_t*, float*), int BLOCK, int TYPE_SIZE>
LLMP_FN void dequantize_row(const uint8_t* row, int64_t K, float* out) {
    for (int64_t k = 0; k < K; k += BLOCK, row += TYPE_SIZE) DEQUANTIZE(row, out + k);
}

// out[t, n] = x[t] . W[n] for n in [n_begin, n_end): each tile of rows is dequantised once, for all T inputs
template <void (*DEQUANTIZE)(const uint8_t*, float*), int BLOCK, int TYPE_SIZE>
LLMP_FN void rows_of(const QuantMatmulArgs& a, int64_t n_begin, int64_t n_end, float* buffer) {
    const int64_t K = a.in_features, row_bytes = K / BLOCK * TYPE_SIZE;
    for (int64_t n = n_begin; n < n_end; n += kTileRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kTileRows, n_end - n));
        for (int r = 0; r < rows; ++r) {
            dequantize_row<DEQUANTIZE, BLOCK, TYPE_SIZE>(a.blocks + (n + r) * row_bytes, K, buffer + r * K);
        }
        for (int64_t t = 0; t < a.T; ++t) {
            const float* x = a.x + t * K;
            float* out = a.out + t * a.N + n;
            if (rows == kTileRows) {
                dot_rows<kTileRows>(x, buffer, K, out);
            } else {
                for (int r = 0; r < rows; ++r) dot_rows<1>(x, buffer + r * K, K, out + r);
            }
        }
    }
}

// The entry point of this ISA's copy: rows [n_begin, n_end) of format a.ggml_type; false for a format not here.
LLMP_TARGET bool quant_matmul_rows(const QuantMatmulArgs& a, int64_t n_begin, int64_t n_end, float* buffer) {
    switch (a.ggml_type) {
        case kQ4_0: rows_of<dequantize_q4_0, 32, 18>(a, n_begin, n_end, buffer); return true;
        case kQ4_1: rows_of<dequantize_q4_1, 32, 20>(a, n_begin, n_end, buffer); return true;
        case kQ5_0: rows_of<dequantize_q5_0, 32, 22>(a, n_begin, n_end, buffer); return true;
        case kQ5_1: rows_of<dequantize_q5_1, 32, 24>(a, n_begin, n_end, buffer); return true;
        case kQ8_0: rows_of<dequantize_q8_0, 32, 34>(a, n_begin, n_end, buffer); return true;
        case kQ2_K: rows_of<dequantize_q2_k, 256, 84>(a, n_begin, n_end, buffer); return true;
        case kQ3_K: rows_of<dequantize_q3_k, 256, 110>(a, n_begin, n_end, buffer); return true;
        case kQ4_K: rows_of<dequantize_q4_k, 256, 144>(a, n_begin, n_end, buffer); return true;
        case kQ5_K: rows_of<dequantize_q5_k, 256, 176>(a, n_begin, n_end, buffer); return true;
        case kQ6_K: rows_of<dequantize_q6_k, 256, 210>(a, n_begin, n_end, buffer); return true;
        default: return false;
    }
}

#undef LLMP_FN
