// exp(x) in AVX-512 fused multiply-adds, for values rounded to bfloat16 or float16 after (the attention weights
// in bfloat16 pairs, SiLU of bfloat16 rows): 2^(x log2 e) as 2^n 2^f, f in [-1/2, 1/2], 2^f by its degree-5 Taylor
// polynomial, relative error under 2e-6 (bfloat16 keeps 4e-3); 2^n by vscalefps. x log2 e is clamped to
// [-150, 126]: exp(-inf) is exactly 0, exp(+inf) finite (2^126). About a third of vexp's instructions
// (vec16_math.h, which keeps float32's last bits for float32 rows).
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include "vec16.h"

namespace llmp_native {

__attribute__((target("avx512f,avx512dq,fma"), always_inline)) static inline __m512 exp_fma(__m512 x) {
    const __m512 t = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)), _mm512_set1_ps(-150.0f)),
                                   _mm512_set1_ps(126.0f));
    const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(t, n);
    __m512 p = _mm512_set1_ps(1.3333558146e-3f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108665e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650696e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718056e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);  // 2^n p: 0 below the smallest float
}

// g / (1 + exp(-g)) for values rounded to bfloat16 or float16 after: exp_fma, and the division as a reciprocal
// estimate refined once (2^-14 -> about 2^-27). 2x faster than vexp and a division. The SiLU of the row kernels
// (elementwise_impl.h) and of the gated matmul's epilogue (dense_matmul.cpp): the same bits in both.
__attribute__((target("avx512f,avx512dq,fma"), always_inline)) static inline __m512 silu_exp_fma(__m512 g) {
    const __m512 d = _mm512_add_ps(exp_fma(_mm512_sub_ps(_mm512_setzero_ps(), g)), _mm512_set1_ps(1.0f));  // finite
    __m512 r = _mm512_rcp14_ps(d);
    r = _mm512_mul_ps(r, _mm512_fnmadd_ps(d, r, _mm512_set1_ps(2.0f)));  // r (2 - d r)
    return _mm512_mul_ps(g, r);
}

}  // namespace llmp_native
#endif
