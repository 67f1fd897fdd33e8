// The quantised matmul's hot loops, compiled once per instruction set: quant_matmul.cpp includes this file
// three times through isa_copies.h, each inside its own namespace with LLMP_TARGET and LLMP_ISA_LEVEL set
// (0 scalar, 1 AVX2 + FMA, 2 AVX-512).
//
// For each tile of weight rows: dequantise the rows into a float32 buffer (bit-identical to the reference
// dequantize), then take their dot products with every input row (a chunk of inputs at a time). With few inputs
// (decoding: up to kFusedMaxT on AVX-512, one on AVX2) the buffer's store and reload would cost more than the
// arithmetic, so the weights go straight from the blocks into registers instead (every format but Q2_K and Q3_K,
// which go block by block through a small buffer), each row unpacked once for two inputs or four on AVX-512 (AVX2
// has the registers for one input, so it unpacks in registers for a single input only). One dot product always
// runs the same way, whatever T and whatever tile it is part of: the dequantised values, lanes, accumulators (Acc)
// and final reduction depend only on K, so a row's result never depends on the batch (row invariance).

// The helpers (unpacking, loads, accumulators) are always inlined into the loops: left to GCC, one that several
// loops use (chunk_q5_0 once T = 1 unpacked Q5_0 in registers too) was compiled out of line, each chunk then a call
// returning its vectors through memory (Q5_0 at T = 4 and 8: 2.2x slower). The loops are LLMP_LOOP.
#define LLMP_FN static inline __attribute__((always_inline)) LLMP_TARGET
#define LLMP_METHOD inline __attribute__((always_inline)) LLMP_TARGET  // a member function
#define LLMP_LOOP static LLMP_TARGET

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

// -- one dot product's accumulation ------------------------------------------------------------------------
// K is a multiple of 32 (every format's block). A dot product is taken 32 elements at a time, in order:
// Acc::add takes x's 32 (X32, loaded once for all the weight rows that share it) and a weight row's 32 (W32,
// loaded from a dequantised buffer or unpacked straight into registers), and Acc::sum reduces at the end.
// Both paths below (many inputs: dequantise a tile to a buffer; a few: unpack in registers) go through these
// same operations, in the same order, on the same dequantised values: a row's result is the same bits
// whatever T (row invariance), only where the weights come from differs.

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

struct V32 {
    __m512 v0, v1;
};
using X32 = V32;
using W32 = V32;
LLMP_FN V32 load32(const float* p) { return {_mm512_loadu_ps(p), _mm512_loadu_ps(p + 16)}; }
LLMP_FN void store32(const V32& w, float* p) {
    _mm512_storeu_ps(p, w.v0);
    _mm512_storeu_ps(p + 16, w.v1);
}

// two accumulators of 16 lanes: element i goes to lane i % 16 of accumulator (i / 16) % 2
struct Acc {
    __m512 a0, a1;
    LLMP_METHOD Acc() : a0(_mm512_setzero_ps()), a1(_mm512_setzero_ps()) {}
    LLMP_METHOD void add(const X32& x, const W32& w) {
        a0 = _mm512_fmadd_ps(x.v0, w.v0, a0);
        a1 = _mm512_fmadd_ps(x.v1, w.v1, a1);
    }
    LLMP_METHOD float sum() const { return hsum16(_mm512_add_ps(a0, a1)); }
};

// 16 bytes of small integers (uint8 or int8) as float32
LLMP_FN __m512 u8_to_ps(__m128i b) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b)); }
LLMP_FN __m512 i8_to_ps(__m128i b) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)); }
LLMP_FN __m512 set1(float v) { return _mm512_set1_ps(v); }
#define LLMP_MUL _mm512_mul_ps
#define LLMP_FMA _mm512_fmadd_ps

#elif LLMP_ISA_LEVEL == 1

struct V32 {
    __m256 v[4];
};
struct V32i {  // 32 integers in 32-bit lanes
    __m256i v[4];
};
using X32 = V32;
using W32 = V32;
LLMP_FN V32 load32(const float* p) {
    return {{_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8), _mm256_loadu_ps(p + 16), _mm256_loadu_ps(p + 24)}};
}
LLMP_FN void store32(const V32& w, float* p) {
    for (int i = 0; i < 4; ++i) _mm256_storeu_ps(p + 8 * i, w.v[i]);
}

// two accumulators of 8 lanes: element i goes to lane i % 8 of accumulator (i / 8) % 2
struct Acc {
    __m256 a0, a1;
    LLMP_METHOD Acc() : a0(_mm256_setzero_ps()), a1(_mm256_setzero_ps()) {}
    LLMP_METHOD void add(const X32& x, const W32& w) {
        a0 = _mm256_fmadd_ps(x.v[0], w.v[0], a0);
        a1 = _mm256_fmadd_ps(x.v[1], w.v[1], a1);
        a0 = _mm256_fmadd_ps(x.v[2], w.v[2], a0);
        a1 = _mm256_fmadd_ps(x.v[3], w.v[3], a1);
    }
    LLMP_METHOD float sum() const { return hsum8(_mm256_add_ps(a0, a1)); }
};

#else

struct X32 {
    const float* p;
};
struct W32 {
    float v[32];
};
LLMP_FN X32 x32_at(const float* p) { return {p}; }
LLMP_FN W32 load32(const float* p) {
    W32 w;
    std::memcpy(w.v, p, sizeof w.v);
    return w;
}

// eight partial sums (element i to sum i % 8), added pairwise: the same order for every dot product
struct Acc {
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    LLMP_METHOD void add(const X32& x, const W32& w) {
        for (int i = 0; i < 32; i += 8) {
            for (int l = 0; l < 8; ++l) s[l] += x.p[i + l] * w.v[i + l];
        }
    }
    LLMP_METHOD float sum() const { return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7])); }
};

#endif

#if LLMP_ISA_LEVEL >= 1
LLMP_FN X32 x32_at(const float* p) { return load32(p); }
#endif

// -- weights unpacked straight into registers (the formats of the common models, AVX2 and AVX-512) -----------
// Each chunk32 gives a block's 32 weights [32c, 32c + 32) with the reference's values, bit for bit: the float16
// scales widen exactly and every product of a scale and an integer (at most 8 bits) is exact, so q * d + m in
// one FMA rounds once, as the reference's product-then-add does.

LLMP_FN uint32_t u32_at(const uint8_t* p) {
    uint32_t bits;
    std::memcpy(&bits, p, 4);
    return bits;
}

#if LLMP_ISA_LEVEL == 2

LLMP_FN W32 chunk_q8_0(const uint8_t* b, int) {  // q * d
    const __m512 d = set1(f16_at(b));
    const __m128i* q = reinterpret_cast<const __m128i*>(b + 2);
    return {LLMP_MUL(i8_to_ps(_mm_loadu_si128(q)), d), LLMP_MUL(i8_to_ps(_mm_loadu_si128(q + 1)), d)};
}

// The 4-bit formats by lookup: a block's 16 possible weights are worked out once (the same one product, or
// product and sum, as the reference's), and each weight is the entry its nibble picks (vpermps reads the low 4
// bits of each 32-bit lane, so a byte widened to 32 bits picks by its low nibble, shifted right by 4 by its high
// one): two shuffles a 16 weights where converting each integer and scaling it took three operations.
LLMP_FN __m512 iota16() { return _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15); }

// element j < 16 is the low nibble of qs[j], element j + 16 its high nibble: entries of table
LLMP_FN W32 nibbles_looked_up(const uint8_t* qs, __m512 table) {
    const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
    return {_mm512_permutexvar_ps(bytes, table), _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), table)};
}

LLMP_FN W32 chunk_q4_1(const uint8_t* b, int) {  // q * d + m
    return nibbles_looked_up(b + 4, LLMP_FMA(iota16(), set1(f16_at(b)), set1(f16_at(b + 2))));
}

LLMP_FN W32 chunk_q4_0(const uint8_t* b, int) {  // (q - 8) * d
    return nibbles_looked_up(b + 2, LLMP_MUL(_mm512_sub_ps(iota16(), set1(8.0f)), set1(f16_at(b))));
}

// The 5-bit formats the same way from 32 entries (vpermt2ps reads 5 bits: low picks the first 16, high the
// last): element j < 16 is the low nibble of qs[j] and bit j of the fifth bits, element j + 16 the high nibble
// and bit j + 16
LLMP_FN W32 fives_looked_up(const uint8_t* qs, uint32_t fifth, __m512 low, __m512 high) {
    const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
    const __m512i sixteen = _mm512_set1_epi32(16);
    const __m512i first = _mm512_and_si512(bytes, _mm512_set1_epi32(0x0F)), second = _mm512_srli_epi32(bytes, 4);
    const __m512i i0 = _mm512_mask_or_epi32(first, static_cast<__mmask16>(fifth), first, sixteen);
    const __m512i i1 = _mm512_mask_or_epi32(second, static_cast<__mmask16>(fifth >> 16), second, sixteen);
    return {_mm512_permutex2var_ps(low, i0, high), _mm512_permutex2var_ps(low, i1, high)};
}

LLMP_FN W32 chunk_q5_0(const uint8_t* b, int) {  // (q - 16) * d
    const __m512 d = set1(f16_at(b));
    return fives_looked_up(b + 6, u32_at(b + 2), LLMP_MUL(_mm512_sub_ps(iota16(), set1(16.0f)), d),
                           LLMP_MUL(iota16(), d));
}

LLMP_FN W32 chunk_q5_1(const uint8_t* b, int) {  // q * d + m
    const __m512 d = set1(f16_at(b)), m = set1(f16_at(b + 2));
    return fives_looked_up(b + 8, u32_at(b + 4), LLMP_FMA(iota16(), d, m),
                           LLMP_FMA(_mm512_add_ps(iota16(), set1(16.0f)), d, m));
}

#elif LLMP_ISA_LEVEL == 1

// 8 bytes of small integers as float32
LLMP_FN __m256 i8_to_ps(__m128i b) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)); }

LLMP_FN W32 chunk_q8_0(const uint8_t* b, int) {  // q * d
    const __m256 d = _mm256_set1_ps(f16_at(b));
    W32 w;
    for (int i = 0; i < 4; ++i) {
        w.v[i] = _mm256_mul_ps(i8_to_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 2 + 8 * i))), d);
    }
    return w;
}

// 16 bytes as two vectors of 32-bit lanes, bytes 0-7 and bytes 8-15 zero-extended: the bytes loaded into both
// halves, then one in-lane shuffle for each 8. vpmovzxbd from a register needed a shuffle more to bring bytes 8-15
// down, and shuffles were what the 4-bit formats waited on (Zen 3, one thread, Q4_1 896x4864 at T = 1: 533 ->
// 368 us).
LLMP_FN void widen16(const uint8_t* p, __m256i* first, __m256i* second) {
    const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    *first = _mm256_shuffle_epi8(b, _mm256_setr_epi8(0, -1, -1, -1, 1, -1, -1, -1, 2, -1, -1, -1, 3, -1, -1, -1,
                                                     4, -1, -1, -1, 5, -1, -1, -1, 6, -1, -1, -1, 7, -1, -1, -1));
    *second = _mm256_shuffle_epi8(b, _mm256_setr_epi8(8, -1, -1, -1, 9, -1, -1, -1, 10, -1, -1, -1, 11, -1, -1, -1,
                                                      12, -1, -1, -1, 13, -1, -1, -1, 14, -1, -1, -1, 15, -1, -1, -1));
}

// The nibbles of 16 bytes as 32 integers in 32-bit lanes: elements j < 16 the low nibble of qs[j], j + 16 its high one
LLMP_FN V32i nibbles32(const uint8_t* qs) {
    __m256i first, second;
    widen16(qs, &first, &second);
    const __m256i mask = _mm256_set1_epi32(0x0F);
    return {{_mm256_and_si256(first, mask), _mm256_and_si256(second, mask), _mm256_srli_epi32(first, 4),
             _mm256_srli_epi32(second, 4)}};
}

// Element j's fifth bit (bit j of bits) added as 16: lanes of bits shifted right so that bit j lands on bit 4
LLMP_FN void add_fifth_bits(V32i& q, uint32_t bits) {
    const __m256i all = _mm256_set1_epi32(static_cast<int>(bits)), sixteen = _mm256_set1_epi32(16);
    const __m256i first = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);  // elements 0-7: bits << 4 >> j
    q.v[0] = _mm256_or_si256(q.v[0], _mm256_and_si256(_mm256_srlv_epi32(_mm256_slli_epi32(all, 4), first), sixteen));
    for (int i = 1; i < 4; ++i) {  // elements 8i + j: bits >> (8i + j - 4)
        const __m256i shift = _mm256_add_epi32(first, _mm256_set1_epi32(8 * i - 4));
        q.v[i] = _mm256_or_si256(q.v[i], _mm256_and_si256(_mm256_srlv_epi32(all, shift), sixteen));
    }
}

// q * d + m, one FMA a weight (q * d exact, so one rounding, as the reference's product then sum)
LLMP_FN W32 fma32(const V32i& q, __m256 d, __m256 m) {
    W32 w;
    for (int i = 0; i < 4; ++i) w.v[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q.v[i]), d, m);
    return w;
}

LLMP_FN W32 chunk_q4_1(const uint8_t* b, int) {  // q * d + m
    return fma32(nibbles32(b + 4), _mm256_set1_ps(f16_at(b)), _mm256_set1_ps(f16_at(b + 2)));
}

// (q - 8) * d as q * d - 8d: 8d is exact, so is q * d - 8d, and the one rounding keeps it (the reference's value)
LLMP_FN W32 chunk_q4_0(const uint8_t* b, int) {
    const float d = f16_at(b);
    return fma32(nibbles32(b + 2), _mm256_set1_ps(d), _mm256_set1_ps(-8.0f * d));
}

// (q - 16) * d as q * d - 16d, as chunk_q4_0
LLMP_FN W32 chunk_q5_0(const uint8_t* b, int) {
    const float d = f16_at(b);
    V32i q = nibbles32(b + 6);
    add_fifth_bits(q, u32_at(b + 2));
    return fma32(q, _mm256_set1_ps(d), _mm256_set1_ps(-16.0f * d));
}

LLMP_FN W32 chunk_q5_1(const uint8_t* b, int) {  // q * d + m
    V32i q = nibbles32(b + 8);
    add_fifth_bits(q, u32_at(b + 4));
    return fma32(q, _mm256_set1_ps(f16_at(b)), _mm256_set1_ps(f16_at(b + 2)));
}

#endif

#undef LLMP_MUL
#undef LLMP_FMA

// -- formats: how a block's weights are had, 32 at a time -------------------------------------------------
// A Blocks<...> decoder reads one block (prepare) and gives its chunks in order (chunk). Formats unpacked in
// registers read them straight from the block; the others dequantise the whole block to a small buffer first.

template <void (*DEQUANTIZE)(const uint8_t*, float*), int BLOCK_, int TYPE_SIZE_>
struct Buffered {
    static constexpr int BLOCK = BLOCK_, TYPE_SIZE = TYPE_SIZE_;
    // rows_fused may unpack a row once for 4 inputs; not a 32-weight block, whose buffer is reloaded right after
    // it is written (Q5_0 at T = 4, Zen 5: 227 -> 327 us, the reloads waiting on the stores)
    static constexpr bool WIDE_INPUTS = BLOCK > 32;
    using Wide = Buffered;  // the decoder of rows_fused's 4-input tiles
    static LLMP_METHOD void dequantize(const uint8_t* b, float* out) { DEQUANTIZE(b, out); }
    alignas(64) float values[BLOCK];
    LLMP_METHOD void prepare(const uint8_t* b) { DEQUANTIZE(b, values); }
    LLMP_METHOD W32 chunk(int c) const { return load32(values + 32 * c); }
};

#if LLMP_ISA_LEVEL >= 1
// The k-quants in registers: a block's sub-block scales are worked out once (prepare, vectorised), not from
// their packed bits and float16 for every chunk and every input pair (that scalar work was most of Q4_K's time
// at T = 1 on AVX-512), and Q5_K/Q6_K's bits are unpacked 32 bytes at once (the buffer gathers them byte by byte).
// The values are the reference's: each float scale is the same one float product, each weight the same
// product (and difference) of it.

// Q4_K/Q5_K's 8 6-bit scales and 8 6-bit mins (12 bytes at p) as 16 bytes: scales, then mins (ggml's masks)
LLMP_FN __m128i scales_mins_k4(const uint8_t* p) {
    uint32_t u[4];
    std::memcpy(u, p, 12);
    constexpr uint32_t kLow6 = 0x3f3f3f3f, kLow4 = 0x0f0f0f0f, kLow2 = 0x03030303;
    u[3] = ((u[2] >> 4) & kLow4) | (((u[1] >> 6) & kLow2) << 4);  // mins 4-7
    const uint32_t mins_low = u[1] & kLow6;                         // mins 0-3
    u[1] = (u[2] & kLow4) | (((u[0] >> 6) & kLow2) << 4);           // scales 4-7
    u[2] = mins_low;
    u[0] &= kLow6;                                                  // scales 0-3
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(u));
}

template <bool FIVE_BITS>
struct K4InRegisters {
    static constexpr int BLOCK = 256, TYPE_SIZE = FIVE_BITS ? 176 : 144;
    static constexpr bool WIDE_INPUTS = true;
    using Wide = K4InRegisters;
    alignas(32) float dl[8], ml[8];  // sub-block s: d * sc[s], dmin * m[s]
    const uint8_t* block = nullptr;
#if LLMP_ISA_LEVEL == 1
    // AVX2, Q5_K: the block's 5-bit integers as bytes, 32 at a time (Q6KInRegisters says why)
    alignas(32) int8_t fives[FIVE_BITS ? 256 : 1];
#endif
    LLMP_METHOD void prepare(const uint8_t* b) {
        block = b;
        const __m128i sm = scales_mins_k4(b + 4);
        const __m256 scales = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sm));
        const __m256 mins = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(sm, 8)));
        _mm256_store_ps(dl, _mm256_mul_ps(_mm256_set1_ps(f16_at(b)), scales));
        _mm256_store_ps(ml, _mm256_mul_ps(_mm256_set1_ps(f16_at(b + 2)), mins));
#if LLMP_ISA_LEVEL == 1
        if constexpr (FIVE_BITS) {  // sub-block c: the nibbles of qs[32 (c / 2) + j] (high ones for odd c), bit c of qh[j]
            const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16));
            for (int c = 0; c < 8; ++c) {
                const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 48 + 32 * (c >> 1)));
                const __m256i q = _mm256_and_si256(_mm256_srli_epi16(bytes, 4 * (c & 1)), _mm256_set1_epi8(0x0F));
                const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << c));
                const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit);
                _mm256_store_si256(reinterpret_cast<__m256i*>(fives + 32 * c),
                                   _mm256_or_si256(q, _mm256_and_si256(set, _mm256_set1_epi8(16))));
            }
        }
#endif
    }
#if LLMP_ISA_LEVEL == 1
    // sub-block c: q * dl - ml (product, then difference, as dequantize_k4)
    LLMP_METHOD W32 chunk(int c) const {
        const uint8_t* group = block + (FIVE_BITS ? 48 : 16) + 32 * (c >> 1);  // low nibbles for even c
        const __m256 d = _mm256_set1_ps(dl[c]), m = _mm256_set1_ps(ml[c]);
        W32 w;
        if constexpr (FIVE_BITS) {  // the integers prepare unpacked, widened straight from memory (as Q6_K's)
            for (int i = 0; i < 4; ++i) {
                const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(fives + 32 * c + 8 * i));
                w.v[i] = _mm256_sub_ps(_mm256_mul_ps(i8_to_ps(bytes), d), m);
            }
        } else {  // the nibbles widened from the loads (widen16)
            __m256i lanes[4];
            widen16(group, &lanes[0], &lanes[1]);
            widen16(group + 16, &lanes[2], &lanes[3]);
            const __m256i mask = _mm256_set1_epi32(0x0F);
            for (int i = 0; i < 4; ++i) {
                const __m256i q = _mm256_and_si256(_mm256_srli_epi32(lanes[i], 4 * (c & 1)), mask);
                w.v[i] = _mm256_sub_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(q), d), m);
            }
        }
        return w;
    }
#else
    // sub-block c: q * dl - ml (product, then difference, as dequantize_k4), looked up as the 4-bit formats' are
    LLMP_METHOD W32 chunk(int c) const {
        const uint8_t* group = block + (FIVE_BITS ? 48 : 16) + 32 * (c >> 1);  // low nibbles for even c
        __m512i q0 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(group)));
        __m512i q1 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(group + 16)));
        if (c & 1) {
            q0 = _mm512_srli_epi32(q0, 4);
            q1 = _mm512_srli_epi32(q1, 4);
        }
        const __m512 d = _mm512_set1_ps(dl[c]), m = _mm512_set1_ps(ml[c]);
        const __m512 low = _mm512_sub_ps(_mm512_mul_ps(iota16(), d), m);
        if constexpr (!FIVE_BITS) {
            return {_mm512_permutexvar_ps(q0, low), _mm512_permutexvar_ps(q1, low)};
        } else {  // bit c of qh[j] is element j's fifth bit
            if (!(c & 1)) {
                q0 = _mm512_and_si512(q0, _mm512_set1_epi32(0x0F));
                q1 = _mm512_and_si512(q1, _mm512_set1_epi32(0x0F));
            }
            const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 16));
            const __mmask32 fifth = _mm256_test_epi8_mask(qh, _mm256_set1_epi8(static_cast<char>(1 << c)));
            const __m512i sixteen = _mm512_set1_epi32(16);
            q0 = _mm512_mask_or_epi32(q0, static_cast<__mmask16>(fifth), q0, sixteen);
            q1 = _mm512_mask_or_epi32(q1, static_cast<__mmask16>(fifth >> 16), q1, sixteen);
            const __m512 sixteen_on = _mm512_add_ps(iota16(), _mm512_set1_ps(16.0f));
            const __m512 high = _mm512_sub_ps(_mm512_mul_ps(sixteen_on, d), m);
            return {_mm512_permutex2var_ps(low, q0, high), _mm512_permutex2var_ps(low, q1, high)};
        }
    }
#endif
    static LLMP_METHOD void dequantize(const uint8_t* b, float* out) {
        K4InRegisters decoder;
        decoder.prepare(b);
        for (int c = 0; c < BLOCK / 32; ++c) store32(decoder.chunk(c), out + 32 * c);
    }
};

// Q6_K: (q - 32) * (d * sc), 16 sub-blocks of 16. Chunk c = 4g + p (g: which 128, p: which 32 of them):
// its low nibbles are ql[64g + 32(p & 1) + j] (high nibbles for p >= 2), its high 2 bits bits 2p, 2p + 1 of
// qh[32g + j].
struct Q6KInRegisters {
    static constexpr int BLOCK = 256, TYPE_SIZE = 210;
    static constexpr bool WIDE_INPUTS = true;
    using Wide = Q6KInRegisters;
    alignas(64) float ds[16];  // sub-block s: d * sc[s]
    const uint8_t* block = nullptr;
#if LLMP_ISA_LEVEL == 1
    // AVX2: the block's integers as bytes, unpacked 32 at a time in prepare, so that each chunk widens its bytes
    // straight from memory (vpmovsxbd m64), not with three more shuffles from a register (Zen 3, 896x4864 at
    // T = 1, one thread: 633 -> 387 us; two: 340 -> 213)
    alignas(32) int8_t q[256];
#endif
    // chunk c's 32 integers (q - 32) as bytes
    LLMP_METHOD __m256i integers(int c) const {
        const int g = c >> 2, p = c & 3;
        const __m256i low =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 64 * g + 32 * (p & 1)));
        const __m256i high = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 128 + 32 * g));
        const __m256i nibble = _mm256_and_si256(_mm256_srli_epi16(low, 4 * (p >> 1)), _mm256_set1_epi8(0x0F));
        const __m256i two = _mm256_and_si256(_mm256_srli_epi16(high, 2 * p), _mm256_set1_epi8(0x03));
        return _mm256_sub_epi8(_mm256_or_si256(nibble, _mm256_slli_epi16(two, 4)), _mm256_set1_epi8(32));
    }
    LLMP_METHOD void prepare(const uint8_t* b) {
        block = b;
        const __m128i scales = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192));
#if LLMP_ISA_LEVEL == 2
        _mm512_store_ps(ds, _mm512_mul_ps(_mm512_set1_ps(f16_at(b + 208)), i8_to_ps(scales)));
#else
        const __m256 d = _mm256_set1_ps(f16_at(b + 208));
        _mm256_store_ps(ds, _mm256_mul_ps(d, i8_to_ps(scales)));
        _mm256_store_ps(ds + 8, _mm256_mul_ps(d, i8_to_ps(_mm_srli_si128(scales, 8))));
        for (int c = 0; c < 8; ++c) _mm256_store_si256(reinterpret_cast<__m256i*>(q + 32 * c), integers(c));
#endif
    }
    LLMP_METHOD W32 chunk(int c) const {
#if LLMP_ISA_LEVEL == 2
        const __m256i q = integers(c);
        return {_mm512_mul_ps(i8_to_ps(_mm256_castsi256_si128(q)), _mm512_set1_ps(ds[2 * c])),
                _mm512_mul_ps(i8_to_ps(_mm256_extracti128_si256(q, 1)), _mm512_set1_ps(ds[2 * c + 1]))};
#else
        W32 w;
        for (int i = 0; i < 4; ++i) {
            const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 32 * c + 8 * i));
            w.v[i] = _mm256_mul_ps(i8_to_ps(bytes), _mm256_set1_ps(ds[2 * c + i / 2]));
        }
        return w;
#endif
    }
    static LLMP_METHOD void dequantize(const uint8_t* b, float* out) {
        Q6KInRegisters decoder;
        decoder.prepare(b);
        for (int c = 0; c < BLOCK / 32; ++c) store32(decoder.chunk(c), out + 32 * c);
    }
};
#endif

#if LLMP_ISA_LEVEL >= 1
template <W32 (*CHUNK)(const uint8_t*, int), int BLOCK_, int TYPE_SIZE_>
struct InRegisters {
    static constexpr int BLOCK = BLOCK_, TYPE_SIZE = TYPE_SIZE_;
    static constexpr bool WIDE_INPUTS = true;
    using Wide = InRegisters;
    // the buffer path stores the very same chunks: one unpacking for both paths
    static LLMP_METHOD void dequantize(const uint8_t* b, float* out) {
        for (int c = 0; c < BLOCK / 32; ++c) store32(CHUNK(b, c), out + 32 * c);
    }
    const uint8_t* block = nullptr;
    LLMP_METHOD void prepare(const uint8_t* b) { block = b; }
    LLMP_METHOD W32 chunk(int c) const { return CHUNK(block, c); }
};
using Q4_0 = InRegisters<chunk_q4_0, 32, 18>;
using Q4_1 = InRegisters<chunk_q4_1, 32, 20>;
using Q8_0 = InRegisters<chunk_q8_0, 32, 34>;
// In registers for every T: Zen 5, 2 threads, 4864x896 Q5_0, 2026-12-04, T = 1 150 -> 108 us, T = 2 241 -> 130
// against its buffer (the buffer measured faster once, when chunk_q5_0 was compiled out of line: see LLMP_FN)
using Q5_0 = InRegisters<chunk_q5_0, 32, 22>;
using Q5_1 = InRegisters<chunk_q5_1, 32, 24>;
using Q4_K = K4InRegisters<false>;
using Q5_K = K4InRegisters<true>;
using Q6_K = Q6KInRegisters;
#else
using Q4_0 = Buffered<dequantize_q4_0, 32, 18>;
using Q4_1 = Buffered<dequantize_q4_1, 32, 20>;
using Q8_0 = Buffered<dequantize_q8_0, 32, 34>;
using Q5_0 = Buffered<dequantize_q5_0, 32, 22>;
using Q5_1 = Buffered<dequantize_q5_1, 32, 24>;
using Q4_K = Buffered<dequantize_q4_k, 256, 144>;
using Q5_K = Buffered<dequantize_q5_k, 256, 176>;
using Q6_K = Buffered<dequantize_q6_k, 256, 210>;
#endif
using Q2_K = Buffered<dequantize_q2_k, 256, 84>;
using Q3_K = Buffered<dequantize_q3_k, 256, 110>;

// -- the row loops ---------------------------------------------------------------------------------------

// The tile's rows are read as interleaved streams, which the hardware prefetcher follows badly in a matrix larger
// than the caches: ask for the next tile (its rows are contiguous) in one sequential sweep. `left`: rows from w on.
LLMP_FN void prefetch_next_tile(const uint8_t* w, int64_t row_bytes, int64_t left) {
    const uint8_t* next = w + kTileRows * row_bytes;
    const int64_t next_bytes = std::min<int64_t>(kTileRows, std::max<int64_t>(0, left - kTileRows)) * row_bytes;
    for (int64_t offset = 0; offset < next_bytes; offset += 64) __builtin_prefetch(next + offset);
}

// Inputs taken together by the row loops (U below): each weight chunk loaded or unpacked once serves U inputs
// and each x chunk R rows. AVX-512 has the 32 registers for 4 rows x 2 inputs of accumulators (16), the inputs'
// chunks (4) and a row's chunk; the AVX2 and scalar copies take one input at a time.
#if LLMP_ISA_LEVEL == 2
constexpr int kInputs = 2;
#else
constexpr int kInputs = 1;
#endif

// R dot products of each of U inputs (x, K apart) with R dequantised rows (w, K apart), sharing the loads, over
// elements [k_begin, k_end): the accumulators start from `state` (U x R, inputs then rows, `stride` Accs from one
// input's to the next's) unless k_begin is 0, and are saved there unless k_end is K, when their sums go to out. A
// dot product taken slice by slice is the same operations in the same order as taken whole: the same bits.
template <int R, int U>
LLMP_LOOP void dot_rows(const float* x, const float* w, int64_t K, int64_t k_begin, int64_t k_end, Acc* state,
                      int64_t stride, float* out, int64_t N) {
    Acc acc[U][R];
    if (k_begin > 0) {
        for (int u = 0; u < U; ++u) {
            for (int r = 0; r < R; ++r) acc[u][r] = state[u * stride + r];
        }
    }
    for (int64_t i = k_begin; i < k_end; i += 32) {
        X32 xi[U];
        for (int u = 0; u < U; ++u) xi[u] = x32_at(x + u * K + i);
        for (int r = 0; r < R; ++r) {
            W32 wr = load32(w + r * K + i);
#if LLMP_ISA_LEVEL == 2
            // in registers once for all U inputs: GCC otherwise folds the load into each FMA, U loads of it
            asm("" : "+v"(wr.v0), "+v"(wr.v1));
#endif
            for (int u = 0; u < U; ++u) acc[u][r].add(xi[u], wr);
        }
    }
    for (int u = 0; u < U; ++u) {
        for (int r = 0; r < R; ++r) {
            if (k_end < K) {
                state[u * stride + r] = acc[u][r];
            } else {
                out[u * N + r] = acc[u][r].sum();
            }
        }
    }
}

// A tile's dequantised rows are taken kSliceFloats of K at a time, so that the slice (kTileRows x 4 KiB) stays in
// L1 while every input of the chunk passes over it: whole rows of a large K (4 x 19 KiB at K = 4864) were read
// from L2 again for every pair of inputs (Zen 5, one thread, Q8_0 896x4864, T = 512: 94 -> 131 GFLOP/s).
constexpr int64_t kSliceFloats = 1024;

// Many inputs: each tile of rows is dequantised into the buffer once for every chunk of inputs. The inputs are
// taken kInputChunkBytes at a time, so that a chunk stays near while every tile of rows passes over it (all of a
// 1024-token prompt's inputs, 20 MB at K = 4864, were re-read from L3 or memory for each tile of 4 rows).
template <class F>
LLMP_LOOP void rows_buffered(const QuantMatmulArgs& a, int64_t n_begin, int64_t n_end, float* buffer) {
    const int64_t K = a.in_features, N = a.N, row_bytes = K / F::BLOCK * F::TYPE_SIZE;
    const int64_t chunk = std::max<int64_t>(kInputs, kInputChunkBytes / (K * 4) / kInputs * kInputs);
    // the accumulators between slices of K: kTileRows for each input of a chunk
    // (raw bytes aligned by hand: std::vector<Acc> handed a worker thread memory unaligned for Acc's vectors)
    thread_local std::vector<unsigned char> saved_bytes;
    saved_bytes.resize(static_cast<size_t>(chunk * kTileRows) * sizeof(Acc) + alignof(Acc));
    const uintptr_t address = reinterpret_cast<uintptr_t>(saved_bytes.data());
    Acc* const saved = reinterpret_cast<Acc*>((address + alignof(Acc) - 1) / alignof(Acc) * alignof(Acc));
    for (int64_t t_begin = 0; t_begin < a.T; t_begin += chunk) {
        const int64_t t_end = std::min(a.T, t_begin + chunk);
        for (int64_t n = n_begin; n < n_end; n += kTileRows) {
            const int rows = static_cast<int>(std::min<int64_t>(kTileRows, n_end - n));
            prefetch_next_tile(a.blocks + n * row_bytes, row_bytes, n_end - n);
            for (int r = 0; r < rows; ++r) {
                const uint8_t* row = a.blocks + (n + r) * row_bytes;
                for (int64_t k = 0; k < K; k += F::BLOCK, row += F::TYPE_SIZE) F::dequantize(row, buffer + r * K + k);
            }
            for (int64_t k = 0; k < K; k += kSliceFloats) {
                const int64_t k_end = std::min(K, k + kSliceFloats);
                for (int r = 0; r < rows; r += (rows == kTileRows ? kTileRows : 1)) {
                    const float* w = buffer + r * K;
                    for (int64_t t = t_begin; t < t_end;) {
                        const float* x = a.x + t * K;
                        float* out = a.out + t * N + n + r;
                        Acc* state = saved + (t - t_begin) * kTileRows + r;
                        if (rows < kTileRows) {
                            dot_rows<1, 1>(x, w, K, k, k_end, state, kTileRows, out, N);
                            t += 1;
                        } else if (t + kInputs <= t_end) {
                            dot_rows<kTileRows, kInputs>(x, w, K, k, k_end, state, kTileRows, out, N);
                            t += kInputs;
                        } else {
                            dot_rows<kTileRows, 1>(x, w, K, k, k_end, state, kTileRows, out, N);
                            t += 1;
                        }
                    }
                }
            }
        }
    }
}

// R rows' dot products with each of U inputs, the weights unpacked block by block as they are used (no buffer
// round trip): the same Acc operations in the same order as dot_rows, on the same values. `ahead`: the bytes from a
// row to the one its blocks are prefetched from (rows_fused).
template <class F, int R, int U>
LLMP_LOOP void dot_rows_fused(const float* x, const uint8_t* w, int64_t row_bytes, int64_t K, float* out, int64_t N,
                              int64_t ahead) {
    Acc acc[U][R];
    F dec[R];
    for (int64_t k = 0, offset = 0; k < K; k += F::BLOCK, offset += F::TYPE_SIZE) {
        for (int r = 0; r < R; ++r) {
            for (int line = 0; line < F::TYPE_SIZE; line += 64) {
                __builtin_prefetch(w + ahead + r * row_bytes + offset + line);
            }
            dec[r].prepare(w + r * row_bytes + offset);
        }
        for (int c = 0; c < F::BLOCK / 32; ++c) {
            if constexpr (R == 1) {  // each x chunk serves one row: read at its use (no registers held for it)
                const W32 wr = dec[0].chunk(c);
                for (int u = 0; u < U; ++u) acc[u][0].add(x32_at(x + u * K + k + 32 * c), wr);
            } else {
                X32 xi[U];
                for (int u = 0; u < U; ++u) xi[u] = x32_at(x + u * K + k + 32 * c);
                for (int r = 0; r < R; ++r) {
                    const W32 wr = dec[r].chunk(c);
                    for (int u = 0; u < U; ++u) acc[u][r].add(xi[u], wr);
                }
            }
        }
    }
    for (int u = 0; u < U; ++u) {
        for (int r = 0; r < R; ++r) out[u * N + r] = acc[u][r].sum();
    }
}

// U inputs' dot products with a tile's `rows` rows, R rows at a time (then one by one)
template <class F, int R, int U>
LLMP_LOOP void tile_fused(const float* x, const uint8_t* w, int64_t row_bytes, int64_t K, float* out, int64_t N,
                          int rows, int64_t ahead) {
    int r = 0;
    for (; r + R <= rows; r += R) dot_rows_fused<F, R, U>(x, w + r * row_bytes, row_bytes, K, out + r, N, ahead);
    for (; r < rows; ++r) dot_rows_fused<F, 1, U>(x, w + r * row_bytes, row_bytes, K, out + r, N, ahead);
}

// Few inputs (decoding, T <= kFusedMaxT): tiles of rows unpacked on the fly, read once at memory speed. Unpacking
// is much of the work from two inputs on, so on AVX-512 a pair of rows is unpacked once for 4 inputs (their
// accumulators take the registers that two more rows would). Zen 5, 2 threads, 2026-12-04, T = 8 (T = 4): Q4_1
// 1536x2304 328 -> 214 us (170 -> 107), Q4_K 896x4864 482 -> 323 (254 -> 170), Q6_K 791 -> 482 (410 -> 254),
// Q8_0 4864x896 303 -> 242 (154 -> 130). One row for 8 inputs measured slower than two for 4 (349 us for Q4_1's
// T = 8). The grouping changes no bits (row invariance).
// Few inputs read the weights at memory speed, row streams the hardware prefetcher follows badly here: each
// block step asks for the same bytes of the rows whole tiles ahead, at least kPrefetchBytes on. Zen 5, 2 threads,
// T = 1, weights from memory, against one sweep over the next tile at a tile's start: Q4_K 896x4864 128 -> 79 us,
// Q6_K 200 -> 112, Q4_1 3072x576 44 -> 34, Q5_0 and Q8_0 4864x896 3% slower (100, 112 us); 4 and 16 KiB alike.
constexpr int64_t kPrefetchBytes = 8192;

template <class F>
LLMP_LOOP void rows_fused(const QuantMatmulArgs& a, int64_t n_begin, int64_t n_end) {
    const int64_t K = a.in_features, N = a.N, row_bytes = K / F::BLOCK * F::TYPE_SIZE;
    const int64_t tile_bytes = kTileRows * row_bytes;
    const int64_t ahead = tile_bytes * std::max<int64_t>(1, (kPrefetchBytes + tile_bytes - 1) / tile_bytes);
    for (int64_t n = n_begin; n < n_end; n += kTileRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kTileRows, n_end - n));
        const uint8_t* w = a.blocks + n * row_bytes;
        for (int64_t t = 0; t < a.T;) {
            const int64_t left = a.T - t;
            const float* x = a.x + t * K;
            float* out = a.out + t * N + n;
#if LLMP_ISA_LEVEL == 2
            if (F::Wide::WIDE_INPUTS && left >= 4) {
                tile_fused<typename F::Wide, 2, 4>(x, w, row_bytes, K, out, N, rows, ahead);
                t += 4;
                continue;
            }
#endif
            if (left >= kInputs) {
                tile_fused<F, kTileRows, kInputs>(x, w, row_bytes, K, out, N, rows, ahead);
                t += kInputs;
            } else {
                tile_fused<F, kTileRows, 1>(x, w, row_bytes, K, out, N, rows, ahead);
                t += 1;
            }
        }
    }
}

// AVX2 unpacks a row again for every input (kInputs = 1): from two inputs on, dequantising a tile once into the
// buffer pays (Zen 3, one thread, T = 8: Q4_K 896x4864 4921 -> 2036 us, Q5_0 4864x896 4998 -> 1835, Q8_0 2921 ->
// 1527; T = 2: Q5_0 1075 -> 709, Q4_K 1019 -> 848).
#if LLMP_ISA_LEVEL == 1
constexpr int64_t kFusedMaxTHere = 1;
#else
constexpr int64_t kFusedMaxTHere = kFusedMaxT;
#endif

template <class F>
LLMP_LOOP void rows_of(const QuantMatmulArgs& a, int64_t n_begin, int64_t n_end, float* buffer) {
    if (a.T <= kFusedMaxTHere) {
        rows_fused<F>(a, n_begin, n_end);
    } else {
        rows_buffered<F>(a, n_begin, n_end, buffer);
    }
}

// The entry point of this ISA's copy: rows [n_begin, n_end) of format a.ggml_type; false for a format not here.
LLMP_TARGET bool quant_matmul_rows(const QuantMatmulArgs& a, int64_t n_begin, int64_t n_end, float* buffer) {
    switch (a.ggml_type) {
        case kQ4_0: rows_of<Q4_0>(a, n_begin, n_end, buffer); return true;
        case kQ4_1: rows_of<Q4_1>(a, n_begin, n_end, buffer); return true;
        case kQ5_0: rows_of<Q5_0>(a, n_begin, n_end, buffer); return true;
        case kQ5_1: rows_of<Q5_1>(a, n_begin, n_end, buffer); return true;
        case kQ8_0: rows_of<Q8_0>(a, n_begin, n_end, buffer); return true;
        case kQ2_K: rows_of<Q2_K>(a, n_begin, n_end, buffer); return true;
        case kQ3_K: rows_of<Q3_K>(a, n_begin, n_end, buffer); return true;
        case kQ4_K: rows_of<Q4_K>(a, n_begin, n_end, buffer); return true;
        case kQ5_K: rows_of<Q5_K>(a, n_begin, n_end, buffer); return true;
        case kQ6_K: rows_of<Q6_K>(a, n_begin, n_end, buffer); return true;
        default: return false;
    }
}

#undef LLMP_FN
#undef LLMP_METHOD
#undef LLMP_LOOP
