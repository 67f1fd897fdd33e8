// GGML's block layouts, as llmp/quantization/ggml.py (and gguf/quants.py) read them, one block at a time.
//
// Each dequantize_* writes a block's weights as float32 with the reference's float32 operations in its order
// (scale products first, then times the integer, then the minimum subtracted or added), so the values are
// bit-identical to llmp.quantization.dequantize. Every product is exact (a float16 scale has 11 significant
// bits, the integers at most 8), so only the final add or subtract rounds.
//
// A block is unpacked in two steps: its integers into int8 (byte loops over contiguous runs, which the
// compiler vectorises), then each run of 16 or 32 is converted and scaled by the ISA's scale_* (below, in
// quant_matmul_impl.h, before this file is included).
//
// Included by quant_matmul_impl.h inside a per-ISA namespace with LLMP_TARGET set, so that the loops compile
// for that instruction set.
// No include guard: included once per ISA namespace.

#include <cstdint>
#include <cstring>

#ifndef LLMP_TARGET
#error "include ggml_blocks.h through quant_matmul_impl.h"
#endif

// the float16 at p, as float32 (exact, subnormals included; little-endian as GGUF files are)
LLMP_FN float f16_at(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
#if LLMP_ISA_LEVEL >= 1
    // F16C's conversion: exact like the loop below (only a NaN's payload may differ: it is quietened), and
    // free of the branches that made the scales a good part of a small-batch matmul's time
    return _cvtsh_ss(h);
#endif
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
    const uint32_t exponent = (h >> 10) & 0x1F;
    uint32_t mantissa = h & 0x3FF;
    uint32_t bits;
    if (exponent == 0x1F) {
        bits = sign | 0x7F800000u | (mantissa << 13);  // inf, nan
    } else if (exponent != 0) {
        bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
    } else if (mantissa == 0) {
        bits = sign;
    } else {  // subnormal: normalise
        int e = 113;
        while ((mantissa & 0x400) == 0) {
            mantissa <<= 1;
            --e;
        }
        bits = sign | (static_cast<uint32_t>(e) << 23) | ((mantissa & 0x3FF) << 13);
    }
    float value;
    std::memcpy(&value, &bits, 4);
    return value;
}

// -- legacy formats: 32 weights a block ------------------------------------------------------------------
// Element j < 16 is the low nibble of qs[j], element j + 16 its high nibble; the fifth bit of element j
// (Q5_*) is bit j of the little-endian 32-bit qh.

// q[j] = (low nibble of qs[j] | high[j]) - bias and q[j + 16] = (its high nibble | high[j + 16]) - bias, for
// j < 16; high (Q5's fifth bits, as 0 or 16) may be null. Written with SSE2 where there is x86's baseline: the
// compiler does not vectorise the loop.
LLMP_FN void nibbles32(const uint8_t* qs, const uint8_t* high, int bias, int8_t* q) {
#ifdef LLMP_X86
    const __m128i mask = _mm_set1_epi8(0x0F), b = _mm_set1_epi8(static_cast<char>(bias));
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    __m128i low = _mm_and_si128(v, mask), upper = _mm_and_si128(_mm_srli_epi16(v, 4), mask);
    if (high != nullptr) {
        low = _mm_or_si128(low, _mm_loadu_si128(reinterpret_cast<const __m128i*>(high)));
        upper = _mm_or_si128(upper, _mm_loadu_si128(reinterpret_cast<const __m128i*>(high + 16)));
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm_sub_epi8(low, b));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm_sub_epi8(upper, b));
#else
    for (int j = 0; j < 16; ++j) {
        q[j] = static_cast<int8_t>(((qs[j] & 0x0F) | (high ? high[j] : 0)) - bias);
        q[j + 16] = static_cast<int8_t>(((qs[j] >> 4) | (high ? high[j + 16] : 0)) - bias);
    }
#endif
}

// Q5_*'s fifth bits: bit j of the 4 bytes at qh as 32 bytes of 0 or 16
LLMP_FN void fifth_bits(const uint8_t* qh, uint8_t* high) {
    for (int i = 0; i < 4; ++i) std::memcpy(high + 8 * i, &kBitsAsSixteens[qh[i]], 8);
}

LLMP_FN void dequantize_q4_0(const uint8_t* b, float* out) {  // (q - 8) * d
    int8_t q[32];
    nibbles32(b + 2, nullptr, 8, q);
    scale(q, 32, f16_at(b), out);
}

LLMP_FN void dequantize_q4_1(const uint8_t* b, float* out) {  // q * d + m
    int8_t q[32];
    nibbles32(b + 4, nullptr, 0, q);
    scale_add(q, 32, f16_at(b), f16_at(b + 2), out);
}

LLMP_FN void dequantize_q5_0(const uint8_t* b, float* out) {  // (q - 16) * d
    int8_t q[32];
    uint8_t high[32];
    fifth_bits(b + 2, high);
    nibbles32(b + 6, high, 16, q);
    scale(q, 32, f16_at(b), out);
}

LLMP_FN void dequantize_q5_1(const uint8_t* b, float* out) {  // q * d + m
    int8_t q[32];
    uint8_t high[32];
    fifth_bits(b + 4, high);
    nibbles32(b + 8, high, 0, q);
    scale_add(q, 32, f16_at(b), f16_at(b + 2), out);
}

LLMP_FN void dequantize_q8_0(const uint8_t* b, float* out) {  // q * d
    scale(reinterpret_cast<const int8_t*>(b + 2), 32, f16_at(b), out);
}

// -- k-quants: super-blocks of 256 weights in sub-blocks with their own integer scales -------------------

// Q2_K/Q3_K/Q6_K's 2-bit planes: element 128 * g + 32 * p + j is bits 2p..2p+1 of bytes[32 * g + j].
LLMP_FN void planes2(const uint8_t* bytes, int8_t* q) {
    for (int g = 0; g < 2; ++g) {
        for (int p = 0; p < 4; ++p) {
            for (int j = 0; j < 32; ++j) q[128 * g + 32 * p + j] = static_cast<int8_t>((bytes[32 * g + j] >> (2 * p)) & 3);
        }
    }
}

LLMP_FN void dequantize_q2_k(const uint8_t* b, float* out) {  // q * (d * sc) - dmin * m, 16 sub-blocks
    const uint8_t* scales = b;
    const float d = f16_at(b + 80), dmin = f16_at(b + 82);
    int8_t q[256];
    planes2(b + 16, q);
    for (int s = 0; s < 16; ++s) {
        const float dl = d * static_cast<float>(scales[s] & 0x0F);
        const float ml = dmin * static_cast<float>(scales[s] >> 4);
        scale_sub(q + 16 * s, 16, dl, ml, out + 16 * s);
    }
}

LLMP_FN void dequantize_q3_k(const uint8_t* b, float* out) {  // q * (d * sc), q in -4..3, sc in -32..31
    const uint8_t* hmask = b;
    const uint8_t* packed = b + 96;
    const float d = f16_at(b + 108);
    int8_t q[256];
    planes2(b + 32, q);
    // the third bit of element 32p + j is bit p of hmask[j]; a clear bit subtracts 4
    for (int p = 0; p < 8; ++p) {
        for (int j = 0; j < 32; ++j) q[32 * p + j] = static_cast<int8_t>(q[32 * p + j] - (((hmask[j] >> p) & 1) ? 0 : 4));
    }
    for (int s = 0; s < 16; ++s) {
        // 6-bit scale: low nibble in bytes 0-7 (s < 8 low nibbles, then high), high 2 bits in bytes 8-11
        const int low = s < 8 ? (packed[s] & 0x0F) : (packed[s - 8] >> 4);
        const int high = (packed[8 + (s & 3)] >> (2 * (s >> 2))) & 3;
        scale(q + 16 * s, 16, d * (static_cast<float>(low | (high << 4)) - 32.0f), out + 16 * s);
    }
}

// Q4_K/Q5_K's 12 bytes of scales and minimums: 8 of each, 6 bits.
LLMP_FN void scale_min_k4(const uint8_t* p, int s, int* sc, int* mn) {
    if (s < 4) {
        *sc = p[s] & 0x3F;
        *mn = p[s + 4] & 0x3F;
    } else {
        *sc = (p[s + 4] & 0x0F) | ((p[s - 4] >> 2) & 0x30);
        *mn = (p[s + 4] >> 4) | ((p[s] >> 2) & 0x30);
    }
}

// Q4_K/Q5_K: q * (d * sc) - dmin * m, 8 sub-blocks of 32. Sub-block 2g holds the low nibbles of
// qs[32g .. 32g + 32], sub-block 2g + 1 the high ones; Q5_K's fifth bit of sub-block s, element j is bit s of qh[j].
template <bool FIVE_BITS>
LLMP_FN void dequantize_k4(const uint8_t* b, float* out) {
    const float d = f16_at(b), dmin = f16_at(b + 2);
    const uint8_t* qh = b + 16;
    const uint8_t* qs = b + (FIVE_BITS ? 48 : 16);
    for (int s = 0; s < 8; ++s) {
        int8_t q[32];
        const uint8_t* group = qs + 32 * (s >> 1);
        const int shift = 4 * (s & 1);
        for (int j = 0; j < 32; ++j) {
            int v = (group[j] >> shift) & 0x0F;
            if (FIVE_BITS) v |= ((qh[j] >> s) & 1) << 4;
            q[j] = static_cast<int8_t>(v);
        }
        int sc, mn;
        scale_min_k4(b + 4, s, &sc, &mn);
        scale_sub(q, 32, d * static_cast<float>(sc), dmin * static_cast<float>(mn), out + 32 * s);
    }
}

LLMP_FN void dequantize_q4_k(const uint8_t* b, float* out) { dequantize_k4<false>(b, out); }
LLMP_FN void dequantize_q5_k(const uint8_t* b, float* out) { dequantize_k4<true>(b, out); }

// Q6_K: (q - 32) * (d * sc), 16 sub-blocks of 16 with signed 8-bit scales. Low nibbles in ql (element
// 128g + j is ql[64g + j]'s low nibble, 128g + 64 + j its high one, j < 64), high 2 bits in qh's planes.
LLMP_FN void dequantize_q6_k(const uint8_t* b, float* out) {
    const uint8_t* ql = b;
    const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
    const float d = f16_at(b + 208);
    int8_t q[256];
    planes2(b + 128, q);
    for (int g = 0; g < 2; ++g) {
        int8_t* e = q + 128 * g;
        const uint8_t* l = ql + 64 * g;
        for (int j = 0; j < 64; ++j) e[j] = static_cast<int8_t>(((l[j] & 0x0F) | (e[j] << 4)) - 32);
        for (int j = 0; j < 64; ++j) e[j + 64] = static_cast<int8_t>(((l[j] >> 4) | (e[j + 64] << 4)) - 32);
    }
    for (int s = 0; s < 16; ++s) scale(q + 16 * s, 16, d * static_cast<float>(scales[s]), out + 16 * s);
}
