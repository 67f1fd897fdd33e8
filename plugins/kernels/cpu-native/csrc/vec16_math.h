// vfma and vexp on Vf (vec16.h), compiled in each instruction set's copy: included inside the copy's namespace
// with LLMP_TARGET, LLMP_ISA_LEVEL (0 scalar, 1 AVX2, 2 AVX-512) and LLMP_FN set. No include guard: one
// definition per copy.

#if LLMP_ISA_LEVEL == 1
// The AVX2 copy holds a Vf in two registers: its halves are taken and joined by shuffles, which GCC keeps in
// registers, where a copy through memory (memcpy into two __m256) or a vector built from a scalar (Vf{} + x)
// went through the stack a lane at a time (a batch-1 decode layer's attention took 7x the scalar copy's time)
typedef float Vf8 __attribute__((vector_size(8 * sizeof(float))));

LLMP_FN __m256 low_half(Vf v) { return reinterpret_cast<__m256>(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7)); }

LLMP_FN __m256 high_half(Vf v) {
    return reinterpret_cast<__m256>(__builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15));
}

LLMP_FN Vf joined(__m256 lo, __m256 hi) {
    return __builtin_shufflevector(reinterpret_cast<Vf8>(lo), reinterpret_cast<Vf8>(hi), 0, 1, 2, 3, 4, 5, 6, 7, 8,
                                   9, 10, 11, 12, 13, 14, 15);
}
#endif

// x in every lane
LLMP_FN Vf vsplat(float x) {
#if LLMP_ISA_LEVEL == 1
    const __m256 half = _mm256_set1_ps(x);
    return joined(half, half);
#else
    return Vf{} + x;
#endif
}

// c + a * b, one rounding where the instruction set has FMA (so the scalar copy's bits differ from the others')
LLMP_FN Vf vfma(Vf a, Vf b, Vf c) {
#if LLMP_ISA_LEVEL == 2
    return reinterpret_cast<Vf>(_mm512_fmadd_ps(reinterpret_cast<__m512>(a), reinterpret_cast<__m512>(b),
                                                 reinterpret_cast<__m512>(c)));
#elif LLMP_ISA_LEVEL == 1
    return joined(_mm256_fmadd_ps(low_half(a), low_half(b), low_half(c)),
                  _mm256_fmadd_ps(high_half(a), high_half(b), high_half(c)));
#else
    return c + a * b;
#endif
}

#if LLMP_ISA_LEVEL == 1
// vexp's very operations on one __m256 (its bits): GCC ran vexp's clamps and selects on the AVX2 copy's 16-lane
// vectors a lane at a time, through the stack
LLMP_FN __m256 vexp8(__m256 x) {
    const __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(kExpMin), _CMP_LT_OQ);  // lanes that underflow (and -inf)
    x = _mm256_blendv_ps(x, _mm256_set1_ps(kExpMin), under);
    x = _mm256_blendv_ps(x, _mm256_set1_ps(kExpMax), _mm256_cmp_ps(x, _mm256_set1_ps(kExpMax), _CMP_GT_OQ));
    const __m256 y = _mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), _mm256_set1_ps(0.5f));
    __m256i n = _mm256_cvttps_epi32(y);
    n = _mm256_add_epi32(n, _mm256_castps_si256(_mm256_cmp_ps(_mm256_cvtepi32_ps(n), y, _CMP_GT_OQ)));  // floor
    const __m256 fn = _mm256_cvtepi32_ps(n);
    const __m256 r = _mm256_sub_ps(_mm256_sub_ps(x, _mm256_mul_ps(fn, _mm256_set1_ps(kLn2Hi))),
                                   _mm256_mul_ps(fn, _mm256_set1_ps(kLn2Lo)));
    const __m256 r2 = _mm256_mul_ps(r, r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    for (const float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f})
        p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(c));
    p = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(p, r2), r), _mm256_set1_ps(1.0f));
    const __m256 scale = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23));
    return _mm256_andnot_ps(under, _mm256_mul_ps(p, scale));
}
#endif

// exp(x) for x in [-inf, 88]: Cephes' expf (range reduction by ln 2 in two parts, a degree-5 polynomial, the
// exponent set directly); 0 below -87.3 (so exp(-inf) = 0 exactly: masked keys add nothing).
LLMP_FN Vf vexp(Vf x) {
    const Vf lo = x < kExpMin ? Vf{} + 1.0f : Vf{};  // lanes that underflow (and -inf)
    x = x < kExpMin ? Vf{} + kExpMin : x;
    x = x > kExpMax ? Vf{} + kExpMax : x;
    const Vf y = x * kLog2e + 0.5f;
    Vi n = __builtin_convertvector(y, Vi);
    n = n - (__builtin_convertvector(n, Vf) > y ? 1 : 0);  // floor: truncation rounds negatives up
    const Vf fn = __builtin_convertvector(n, Vf);
    const Vf r = x - fn * kLn2Hi - fn * kLn2Lo;
    const Vf r2 = r * r;
    Vf p = Vf{} + 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r2 + r + 1.0f;
    const Vi bits = (n + 127) << 23;
    Vf scale;
    __builtin_memcpy(&scale, &bits, sizeof scale);
    const Vf result = p * scale;
    return lo > 0.0f ? Vf{} : result;
}

