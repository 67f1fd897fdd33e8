// vfma and vexp on Vf (vec16.h), compiled in each instruction set's copy: included inside the copy's namespace
// with LLMP_TARGET, LLMP_ISA_LEVEL (0 scalar, 1 AVX2, 2 AVX-512) and LLMP_FN set. No include guard: one
// definition per copy.

// c + a * b, one rounding where the instruction set has FMA (so the scalar copy's bits differ from the others')
LLMP_FN Vf vfma(Vf a, Vf b, Vf c) {
#if LLMP_ISA_LEVEL == 2
    return reinterpret_cast<Vf>(_mm512_fmadd_ps(reinterpret_cast<__m512>(a), reinterpret_cast<__m512>(b),
                                                 reinterpret_cast<__m512>(c)));
#elif LLMP_ISA_LEVEL == 1
    __m256 x[2], y[2], z[2];
    __builtin_memcpy(x, &a, sizeof a);
    __builtin_memcpy(y, &b, sizeof b);
    __builtin_memcpy(z, &c, sizeof c);
    z[0] = _mm256_fmadd_ps(x[0], y[0], z[0]);
    z[1] = _mm256_fmadd_ps(x[1], y[1], z[1]);
    Vf out;
    __builtin_memcpy(&out, z, sizeof out);
    return out;
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

