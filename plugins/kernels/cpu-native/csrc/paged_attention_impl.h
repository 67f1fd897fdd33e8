// Paged attention's hot loop, compiled once per instruction set: paged_attention.cpp includes this file three
// times (isa_copies.h), each inside its own namespace with LLMP_TARGET set. The arithmetic is written once, on GCC's generic
// 16-lane vectors (Vf): the AVX-512 copy runs them in one register, the AVX2 copy in two, the scalar copy in SSE2.
// Every copy performs the same float32 operations in the same order (no FMA contraction: -ffp-contract=off);
// the scalar copy differs only in rounding a * b + c twice where the others fuse it (vfma).
//
// One query row (a position of one query head) is computed alone, in a fixed order that depends only on its
// position, its window and the keys: keys are taken in tiles of 16 aligned to absolute positions (0-15, 16-31, ...),
// and within a tile in ascending order. So a row's bits never depend on the other rows of the batch, on how the
// prompt was chunked, on what the prefix cache held, or on the thread count (batch invariance).
//
// A row's keys are attended in partitions of kPartition keys, aligned to absolute positions too: each partition's
// softmax runs from scratch, and the partitions are merged in order (merge_partition). One thread may run a
// row's partitions one after another, or (a call of fewer than 4 items a thread: a decode of few requests over
// a long context) several threads one partition each, the last to finish merging them (reduce_partitions): the
// same operations either way, so the same bits. A row within one partition (under 512 keys) is never merged.

#define LLMP_FN static inline LLMP_TARGET

#include "vec16_math.h"

// cap * tanh(s / cap), tanh(y) = 1 - 2 / (exp(2y) + 1)
LLMP_FN Vf vsoftcap(Vf s, float cap) {
    const Vf e = vexp(s * (2.0f / cap));
    return (1.0f - 2.0f / (e + 1.0f)) * cap;
}

// n values of a bfloat16, float16 or float32 row as float32 (exact: either way the same bits), 16 lanes at a time
// (float16 8 at a time with F16C; the scalar copy converts a value at a time)
LLMP_FN void load_floats(Dtype dtype, const void* base, int64_t offset, int64_t n, float* out) {
    int64_t i = 0;
    if (dtype == Dtype::bf16) {
        const auto* src = static_cast<const uint16_t*>(base) + offset;
#if LLMP_ISA_LEVEL == 1  // 8 lanes at a time in registers (GCC's 16-lane conversion went through the stack)
        for (; i + 8 <= n; i += 8) {
            const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
        }
#endif
        for (; i + kTile <= n; i += kTile) {
            Vh h;
            __builtin_memcpy(&h, src + i, sizeof h);
            const Vi bits = __builtin_convertvector(h, Vi) << 16;  // a bfloat16 is a float32's upper half
            __builtin_memcpy(out + i, &bits, sizeof bits);
        }
    } else if (dtype == Dtype::f32) {
        const auto* src = static_cast<const float*>(base) + offset;
        for (; i + kTile <= n; i += kTile) __builtin_memcpy(out + i, src + i, sizeof(Vf));
    }
#if LLMP_ISA_LEVEL >= 1
    else if (dtype == Dtype::f16) {  // F16C, 8 at a time (the scalar conversion took 3x the attention's time)
        const auto* src = static_cast<const uint16_t*>(base) + offset;
        for (; i + 8 <= n; i += 8) {
            const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
            _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
        }
    }
#endif
    if (i < n) load_row(dtype, base, offset + i, n - i, out + i);
}

#if LLMP_ISA_LEVEL == 1
// AVX2 shuffles no 16-lane vector in registers (GCC moved each lane through the stack): 8 x 8 blocks instead.
// r[j] holds 8 values of row j; after the transpose r[d] holds value d of rows 0..7.
LLMP_FN void transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 4; ++i) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; ++i) {
        u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xee);
        u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xee);
    }
    for (int i = 0; i < 4; ++i) {
        r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}

// 16 rows of `width` (a multiple of 8) values -> kt[width][16], 8 x 8 blocks; load(j, d) gives row j's values d..d+7
template <typename Load>
LLMP_FN void transpose_blocks8(int64_t width, float* kt, Load load) {
    for (int64_t d0 = 0; d0 < width; d0 += 8) {
        for (int j0 = 0; j0 < kTile; j0 += 8) {
            __m256 r[8];
            for (int j = 0; j < 8; ++j) r[j] = load(j0 + j, d0);
            transpose8(r);
            for (int d = 0; d < 8; ++d) _mm256_storeu_ps(kt + (d0 + d) * kTile + j0, r[d]);
        }
    }
}

// 16 bfloat16 (or, with f16, float16) rows of D (a multiple of 8) values -> kt[D][16] as float32, widened on the
// way (no float32 copy of the rows first)
LLMP_FN void transpose_half_tiles(const uint16_t* const* rows, int64_t D, float* kt, bool f16) {
    transpose_blocks8(D, kt, [&](int j, int64_t d) LLMP_TARGET {  // a lambda takes no target from its function
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[j] + d));
        return f16 ? _mm256_cvtph_ps(h) : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    });
}
#endif

// 16 rows of Dv floats -> kt[Dv][16], one 16 x 16 block at a time: four rounds of pairing row i with row i + 8,
// which rotate the bits of (row, column) by one each, so that after four the row's bits are the column's
LLMP_FN void transpose_tiles(const float* const* rows, int64_t Dv, float* kt) {
#if LLMP_ISA_LEVEL == 1
    return transpose_blocks8(Dv, kt, [&](int j, int64_t d) LLMP_TARGET { return _mm256_loadu_ps(rows[j] + d); });
#endif
    for (int64_t d0 = 0; d0 < Dv; d0 += kTile) {
        Vf r[kTile];
        for (int j = 0; j < kTile; ++j) __builtin_memcpy(&r[j], rows[j] + d0, sizeof(Vf));
        for (int round = 0; round < 4; ++round) {
            Vf next[kTile];
            for (int i = 0; i < 8; ++i) {
                next[2 * i] = __builtin_shufflevector(r[i], r[i + 8], 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6,
                                                      22, 7, 23);
                next[2 * i + 1] = __builtin_shufflevector(r[i], r[i + 8], 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13,
                                                          29, 14, 30, 15, 31);
            }
            for (int j = 0; j < kTile; ++j) r[j] = next[j];
        }
        for (int d = 0; d < kTile; ++d) __builtin_memcpy(kt + (d0 + d) * kTile, &r[d], sizeof(Vf));
    }
}

// Row k's running softmax sum and maximum after a tile of weights p (exp(s - m_new)), its old sum rescaled by alpha
LLMP_FN void fold_tile(ItemBuffers& buf, int64_t k, const float* p, float alpha, float m_new) {
    float sum = 0.0f;
    for (int j = 0; j < kTile; ++j) sum += p[j];
    buf.l[k] = buf.l[k] * alpha + sum;
    buf.m[k] = m_new;
}

// Rows b..b+count-1 of the tile's active rows, R at a time (a block's last row repeats to fill it; its copies are
// not stored): each load of a key or value column serves every row of the block. One row's operations are the
// same whatever R and whatever the other rows.
template <int R>
LLMP_FN void attend_rows(const AttentionArgs& a, ItemBuffers& buf, int64_t b, int count, const float* kt,
                         const float* const* vrow) {
    const int64_t D = a.head_dim, Dv = buf.dv;
    const ActiveRow* row[R];
    const float* qf[R];
    for (int r = 0; r < R; ++r) {
        row[r] = &buf.active[b + std::min(r, count - 1)];
        qf[r] = buf.q.data() + row[r]->k * Dv;
    }
    alignas(64) float p[R][kTile];  // the weights, read back one at a time (a load, not a shuffle)
    float alpha[R];
#if LLMP_ISA_LEVEL == 1
    // the whole block on the halves of each row's 16 lanes in __m256 registers: the same operations in the same
    // order as the other copies' code below (the same bits), where GCC kept the 16-lane vectors of the AVX2 copy in
    // memory and ran its selects a lane at a time (the AVX2 attention took 7x the scalar copy's time)
    {
        __m256 lo[R], hi[R];
        for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm256_setzero_ps();
        for (int64_t d = 0; d < D; ++d) {
            const __m256 klo = _mm256_loadu_ps(kt + d * kTile), khi = _mm256_loadu_ps(kt + d * kTile + 8);
            for (int r = 0; r < R; ++r) {
                const __m256 q = _mm256_set1_ps(qf[r][d]);
                lo[r] = _mm256_fmadd_ps(q, klo, lo[r]);
                hi[r] = _mm256_fmadd_ps(q, khi, hi[r]);
            }
        }
        // the softmax of each row's tile as below, on the halves (vexp8: vexp's operations)
        const __m256i lanes_lo = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        const __m256i lanes_hi = _mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15);
        const __m256 none = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
        int j_first = kTile, j_last = -1;
        for (int r = 0; r < R; ++r) {
            const int64_t k = row[r]->k;
            if (a.softcap > 0.0f) {  // vsoftcap: cap * (1 - 2 / (exp(s * (2 / cap)) + 1))
                const __m256 twice = _mm256_set1_ps(2.0f / a.softcap), one = _mm256_set1_ps(1.0f);
                const __m256 two = _mm256_set1_ps(2.0f), cap = _mm256_set1_ps(a.softcap);
                for (__m256* half : {&lo[r], &hi[r]}) {
                    const __m256 e = vexp8(_mm256_mul_ps(*half, twice));
                    *half = _mm256_mul_ps(_mm256_sub_ps(one, _mm256_div_ps(two, _mm256_add_ps(e, one))), cap);
                }
            }
            const __m256i j_lo = _mm256_set1_epi32(row[r]->j_lo), j_hi = _mm256_set1_epi32(row[r]->j_hi);
            const __m256i out_lo = _mm256_or_si256(_mm256_cmpgt_epi32(j_lo, lanes_lo), _mm256_cmpgt_epi32(lanes_lo, j_hi));
            const __m256i out_hi = _mm256_or_si256(_mm256_cmpgt_epi32(j_lo, lanes_hi), _mm256_cmpgt_epi32(lanes_hi, j_hi));
            lo[r] = _mm256_blendv_ps(lo[r], none, _mm256_castsi256_ps(out_lo));
            hi[r] = _mm256_blendv_ps(hi[r], none, _mm256_castsi256_ps(out_hi));
            alignas(32) float t[kTile];
            _mm256_store_ps(t, lo[r]);
            _mm256_store_ps(t + 8, hi[r]);
            float tile_max = t[0];
            for (int j = 1; j < kTile; ++j) tile_max = std::max(tile_max, t[j]);
            const float m_new = std::max(buf.m[k], tile_max);
            const __m256 m = _mm256_set1_ps(m_new);
            _mm256_store_ps(p[r], vexp8(_mm256_sub_ps(lo[r], m)));
            _mm256_store_ps(p[r] + 8, vexp8(_mm256_sub_ps(hi[r], m)));
            alpha[r] = _mm256_cvtss_f32(vexp8(_mm256_set1_ps(buf.m[k] - m_new)));
            if (r < count) fold_tile(buf, k, p[r], alpha[r], m_new);
            j_first = std::min(j_first, row[r]->j_lo);
            j_last = std::max(j_last, row[r]->j_hi);
        }
        // and the values, as below
        for (int64_t d = 0; d < Dv; d += kTile) {
            for (int r = 0; r < R; ++r) {
                const float* acc = buf.acc.data() + row[r]->k * Dv + d;
                const __m256 scale = _mm256_set1_ps(alpha[r]);
                lo[r] = _mm256_mul_ps(_mm256_loadu_ps(acc), scale);
                hi[r] = _mm256_mul_ps(_mm256_loadu_ps(acc + 8), scale);
            }
            for (int j = j_first; j <= j_last; ++j) {
                const __m256 vlo = _mm256_loadu_ps(vrow[j] + d), vhi = _mm256_loadu_ps(vrow[j] + d + 8);
                for (int r = 0; r < R; ++r) {
                    const __m256 w = _mm256_set1_ps(p[r][j]);
                    lo[r] = _mm256_fmadd_ps(w, vlo, lo[r]);
                    hi[r] = _mm256_fmadd_ps(w, vhi, hi[r]);
                }
            }
            for (int r = 0; r < count; ++r) {
                float* acc = buf.acc.data() + row[r]->k * Dv + d;
                _mm256_storeu_ps(acc, lo[r]);
                _mm256_storeu_ps(acc + 8, hi[r]);
            }
        }
    }
#else
    Vf s[R];
    for (int r = 0; r < R; ++r) s[r] = Vf{};
    for (int64_t d = 0; d < D; ++d) {
        Vf kd;
        __builtin_memcpy(&kd, kt + d * kTile, sizeof kd);
        for (int r = 0; r < R; ++r) s[r] = vfma(Vf{} + qf[r][d], kd, s[r]);
    }
    Vi lane;
    for (int j = 0; j < kTile; ++j) lane[j] = j;
    int j_first = kTile, j_last = -1;
    for (int r = 0; r < R; ++r) {
        const int64_t k = row[r]->k;
        if (a.softcap > 0.0f) s[r] = vsoftcap(s[r], a.softcap);
        const Vi valid = (lane >= row[r]->j_lo) & (lane <= row[r]->j_hi);
        s[r] = valid ? s[r] : Vf{} - std::numeric_limits<float>::infinity();
        float tile_max = s[r][0];
        for (int j = 1; j < kTile; ++j) tile_max = std::max(tile_max, s[r][j]);
        const float m_new = std::max(buf.m[k], tile_max);
        const Vf weights = vexp(s[r] - m_new);
        __builtin_memcpy(p[r], &weights, sizeof weights);
        alpha[r] = vexp(Vf{} + (buf.m[k] - m_new))[0];
        if (r < count) fold_tile(buf, k, p[r], alpha[r], m_new);
        j_first = std::min(j_first, row[r]->j_lo);
        j_last = std::max(j_last, row[r]->j_hi);
    }
    // a row's weights outside its own keys are exactly 0: adding 0 * v leaves its sums as they are
    for (int64_t d = 0; d < Dv; d += kTile) {
        Vf o[R];
        for (int r = 0; r < R; ++r) {
            __builtin_memcpy(&o[r], buf.acc.data() + row[r]->k * Dv + d, sizeof o[r]);
            o[r] = o[r] * alpha[r];
        }
        for (int j = j_first; j <= j_last; ++j) {
            Vf v;
            __builtin_memcpy(&v, vrow[j] + d, sizeof v);
            for (int r = 0; r < R; ++r) o[r] = vfma(Vf{} + p[r][j], v, o[r]);
        }
        for (int r = 0; r < count; ++r) __builtin_memcpy(buf.acc.data() + row[r]->k * Dv + d, &o[r], sizeof o[r]);
    }
#endif
}

// A row's partition (its running m, l, acc) merged into the row's totals (tm, tl, tacc); a partition without the
// row's keys (m = -inf) leaves them as they are, and the first with keys is taken as it is.
LLMP_FN void merge_partition(float& tm, float& tl, float* tacc, float m, float l, const float* acc, int64_t Dv) {
    if (m == -std::numeric_limits<float>::infinity()) return;
    if (tm == -std::numeric_limits<float>::infinity()) {
        tm = m, tl = l;
        std::copy_n(acc, Dv, tacc);
        return;
    }
    const float m_new = std::max(tm, m);
    const float alpha = vexp(Vf{} + (tm - m_new))[0], beta = vexp(Vf{} + (m - m_new))[0];
    tl = tl * alpha + l * beta;
    for (int64_t d = 0; d < Dv; d += kTile) {
        Vf t, x;
        __builtin_memcpy(&t, tacc + d, sizeof t);
        __builtin_memcpy(&x, acc + d, sizeof x);
        t = vfma(x, Vf{} + beta, t * alpha);
        __builtin_memcpy(tacc + d, &t, sizeof t);
    }
    tm = m_new;
}

// The row's totals divided by its softmax sum, written to the output row in q's dtype
LLMP_FN void store_result(const AttentionArgs& a, int64_t out_row, float l, float* acc) {
    const float inv = 1.0f / l;
    for (int64_t d = 0; d < a.head_dim; ++d) acc[d] *= inv;
    store_row(a.q_dtype, a.out, out_row * a.head_dim, a.head_dim, acc);
}

// A split item's rows, once all its partitions are done: partials[p][row] holds (m, l, acc[Dv]) of partition p
LLMP_FN void reduce_partitions(const AttentionArgs& a, int64_t r, int64_t kv, int64_t q0, int64_t q1, int64_t parts,
                               const float* partials, ItemBuffers& buf) {
    const int64_t Dv = buf.dv, G = a.group, rows = (q1 - q0) * G, row0 = a.query_start_loc[r];
    float* acc = buf.acc.data();
    for (int64_t k = 0; k < rows; ++k) {
        float tm = -std::numeric_limits<float>::infinity(), tl = 0.0f;
        for (int64_t p = 0; p < parts; ++p) {
            const float* state = partials + (p * rows + k) * (Dv + 2);
            merge_partition(tm, tl, acc, state[0], state[1], state + 2, Dv);
        }
        store_result(a, (row0 + q0 + k / G) * a.heads + kv * G + k % G, tl, acc);
    }
}

// how many tiles ahead the keys and values are fetched (two: 10-20% less time for a decode row over 600 keys
// read from memory, AMD Zen 3; one gained half that)
constexpr int kAheadTiles = 2;

// The rows of one work item: query positions q0..q1 of request `r` (their rows in q: row0 + i), every query head
// of KV head `kv` (`group` of them), attending to the paged cache over partitions first_part..end_part - 1 (all
// of the rows' keys: 0 and kAllPartitions). Written to the output, or where `partials` is given (a split item),
// each partition's (m, l, acc[Dv]) of each row there, for reduce_partitions. Buffers are the calling thread's own.
LLMP_FN void attend_item(const AttentionArgs& a, int64_t r, int64_t kv, int64_t q0, int64_t q1, int64_t first_part,
                         int64_t end_part, float* partials, ItemBuffers& buf) {
    const int64_t D = a.head_dim, Dv = buf.dv, G = a.group;
    const int64_t row0 = a.query_start_loc[r], qlen = a.query_start_loc[r + 1] - row0;
    const int64_t seq = a.seq_lens[r];
    const int32_t* blocks = a.block_tables + r * a.block_table_stride;
    const int64_t rows = (q1 - q0) * G;
    // queries times the scale, float32, padded to Dv lanes with zeros
    for (int64_t i = q0; i < q1; ++i) {
        for (int64_t g = 0; g < G; ++g) {
            float* qf = buf.q.data() + ((i - q0) * G + g) * Dv;
            load_row(a.q_dtype, a.q, (row0 + i) * a.q_stride_token + (kv * G + g) * a.q_stride_head, D, qf);
            for (int64_t d = 0; d < D; ++d) qf[d] *= a.scale;
            for (int64_t d = D; d < Dv; ++d) qf[d] = 0.0f;
        }
    }
    auto start_partition = [&] {
        for (int64_t k = 0; k < rows; ++k) {
            buf.m[k] = -std::numeric_limits<float>::infinity();
            buf.l[k] = 0.0f;
        }
        std::fill(buf.acc.begin(), buf.acc.begin() + rows * Dv, 0.0f);
    };
    for (int64_t k = 0; k < rows; ++k) buf.tm[k] = -std::numeric_limits<float>::infinity(), buf.tl[k] = 0.0f;
    auto end_partition = [&](int64_t partition) {
        for (int64_t k = 0; k < rows; ++k) {
            const float* acc = buf.acc.data() + k * Dv;
            if (partials == nullptr) {
                merge_partition(buf.tm[k], buf.tl[k], buf.tacc.data() + k * Dv, buf.m[k], buf.l[k], acc, Dv);
                continue;
            }
            float* state = partials + ((partition - first_part) * rows + k) * (Dv + 2);
            state[0] = buf.m[k], state[1] = buf.l[k];
            std::copy_n(acc, Dv, state + 2);
        }
    };
    start_partition();

    auto position = [&](int64_t i) { return seq - qlen + i; };  // the position of query i
    auto first_key = [&](int64_t i) { return a.window > 0 ? std::max<int64_t>(0, position(i) - a.window + 1) : 0; };
    const int64_t first_tile = std::max(first_key(q0) / kTile * kTile, first_part * kPartition);
    const int64_t last_key = std::min(position(q1 - 1), end_part == kAllPartitions ? position(q1 - 1)
                                                                                   : end_part * kPartition - 1);
    int64_t partition = first_tile / kPartition;
    float* kt = buf.kt.data();  // [D][16]: the tile's keys, transposed
    float* vt = buf.vt.data();  // [16][Dv]: the tile's values, where they are copied
    // float32 rows of whole tiles are read where they lie in the cache; others are converted (and padded) first
    const bool in_place = a.cache_dtype == Dtype::f32 && D == Dv;
    const float* krow[kTile];
    const float* vrow[kTile];
#if LLMP_ISA_LEVEL == 1
    // 16-bit keys transposed straight from the cache
    const bool half_keys = (a.cache_dtype == Dtype::bf16 || a.cache_dtype == Dtype::f16) && D % 8 == 0;
    const uint16_t* krow16[kTile];
#endif
    const int64_t row_bytes = D * (a.cache_dtype == Dtype::f32 ? 4 : 2);
    for (int64_t t0 = first_tile; t0 <= last_key; t0 += kTile) {
        if (t0 / kPartition != partition) {
            end_partition(partition);
            start_partition();
            partition = t0 / kPartition;
        }
        const int64_t n = std::min<int64_t>(kTile, last_key + 1 - t0);
        // the keys and values kAheadTiles on asked of memory now (at the first tile, those of every tile up to
        // there): a tile's rows lie in one block and a later tile's anywhere, whose first lines the hardware
        // prefetchers would only fetch once missed
        const int64_t ahead = t0 + kAheadTiles * kTile, ahead_from = t0 == first_tile ? t0 + kTile : ahead;
        for (int64_t pos = ahead_from; pos < std::min(ahead + kTile, last_key + 1); ++pos) {
            const int64_t slot = static_cast<int64_t>(blocks[pos / a.block_size]) * a.block_size + pos % a.block_size;
            const int64_t offset = (slot * a.kv_heads + kv) * row_bytes;
            for (int64_t byte = 0; byte < row_bytes; byte += 64) {
                __builtin_prefetch(static_cast<const char*>(a.k_cache) + offset + byte);
                __builtin_prefetch(static_cast<const char*>(a.v_cache) + offset + byte);
            }
        }
        float* key_rows = buf.row.data();  // [16][Dv], zero-padded
        for (int64_t j = 0; j < kTile; ++j) {
            if (j < n) {
                const int64_t pos = t0 + j;
                const int64_t slot = static_cast<int64_t>(blocks[pos / a.block_size]) * a.block_size + pos % a.block_size;
                const int64_t offset = (slot * a.kv_heads + kv) * D;
                if (in_place) {
                    krow[j] = static_cast<const float*>(a.k_cache) + offset;
                    vrow[j] = static_cast<const float*>(a.v_cache) + offset;
                    continue;
                }
#if LLMP_ISA_LEVEL == 1
                krow16[j] = static_cast<const uint16_t*>(a.k_cache) + offset;
                if (!half_keys)
#endif
                {
                    load_floats(a.cache_dtype, a.k_cache, offset, D, key_rows + j * Dv);
                    std::fill(key_rows + j * Dv + D, key_rows + (j + 1) * Dv, 0.0f);
                }
                load_floats(a.cache_dtype, a.v_cache, offset, D, vt + j * Dv);
                std::fill(vt + j * Dv + D, vt + (j + 1) * Dv, 0.0f);
                krow[j] = key_rows + j * Dv;
                vrow[j] = vt + j * Dv;
            } else {
                krow[j] = vrow[j] = buf.zeros.data();  // past the last key: zero keys, values never read
#if LLMP_ISA_LEVEL == 1
                krow16[j] = reinterpret_cast<const uint16_t*>(buf.zeros.data());  // Dv floats: 2 Dv zero bfloat16
#endif
            }
        }
#if LLMP_ISA_LEVEL == 1
        if (half_keys) transpose_half_tiles(krow16, D, kt, a.cache_dtype == Dtype::f16);
        else
#endif
            transpose_tiles(krow, Dv, kt);
        // the rows with a key in this tile
        int64_t active = 0;
        for (int64_t i = q0; i < q1; ++i) {
            const int64_t lo = first_key(i), hi = position(i);  // keys lo..hi, inclusive
            if (t0 > hi || t0 + kTile - 1 < lo) continue;
            const int j_lo = static_cast<int>(std::max<int64_t>(lo - t0, 0));
            const int j_hi = static_cast<int>(std::min<int64_t>(hi - t0, kTile - 1));
            for (int64_t g = 0; g < G; ++g) buf.active[active++] = {(i - q0) * G + g, j_lo, j_hi};
        }
        // blocks of 8 rows while they last, then of 4, then the rest (a decode token of a 3-query-head group: 3):
        // a row's operations are the same in any
        int64_t b = 0;
        if (LLMP_ISA_LEVEL != 1)  // AVX2's 16 registers hold 4 rows' sums (8 halves) and their operands
            for (; b + 8 <= active; b += 8) attend_rows<8>(a, buf, b, 8, kt, vrow);
        for (; b + 4 <= active; b += 4) attend_rows<4>(a, buf, b, 4, kt, vrow);
        switch (active - b) {
            case 3: attend_rows<3>(a, buf, b, 3, kt, vrow); break;
            case 2: attend_rows<2>(a, buf, b, 2, kt, vrow); break;
            case 1: attend_rows<1>(a, buf, b, 1, kt, vrow); break;
            default: break;
        }
    }
    end_partition(partition);
    if (partials != nullptr) return;
    for (int64_t k = 0; k < rows; ++k)
        store_result(a, (row0 + q0 + k / G) * a.heads + kv * G + k % G, buf.tl[k], buf.tacc.data() + k * Dv);
}

#undef LLMP_FN
