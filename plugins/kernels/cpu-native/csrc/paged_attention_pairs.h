// Paged attention of bfloat16 queries over a bfloat16 cache on CPUs with AVX-512 BF16 (Zen 4/5, Intel from
// Cooper Lake): every product is a vdpbf16ps over pairs of bfloat16, with no conversion of the cache to float32.
// Included once by paged_attention.cpp (x86 only, after exp_fma.h); selected for a call when the CPU has the
// instructions, the AVX-512 level is selected, q and the caches are bfloat16 and the head size is even.
//
// The same online softmax as paged_attention_impl.h, in tiles of 32 keys aligned to absolute positions (0-31,
// 32-63, ...), each row alone in a fixed order (so batch invariance holds as there):
//   scores   s[j] = (q . k_j) * scale, q . k_j one float32 lane accumulated over the head's pairs of dimensions
//            in order (the keys' pairs transposed so that a tile's 32 keys are two vectors' lanes);
//   weights  p[j] = exp(s[j] - m), rounded to bfloat16 for the product with the values (as torch's own flash
//            attention rounds them for its bfloat16 GEMM), summed into l in float32 before the rounding;
//   output   acc[d] = acc[d] * alpha + sum over pairs of keys (p[j] v_j[d] + p[j+1] v_{j+1}[d]), keys in order;
//            the values of two keys interleaved with vpunpck{l,h}wd, so the accumulators' lanes hold the head's
//            dimensions in a fixed permutation, undone when the row is written.
// Against the float32 copies: about 2x fewer instructions for the products, none for converting the cache, half
// the transposing, and a tile's softmax bookkeeping shared by 32 keys instead of 16.

#define LLMP_PAIRS __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,f16c")))

// GCC 12's AVX-512 headers initialise their undefined vectors from themselves (__Y = __Y), which its own
// -Wuninitialized reports at every use once inlined here: a false positive, silenced for this file
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace pairs {

constexpr int kKeys = 32;  // keys a tile
constexpr int kMaxRows = 8;  // query rows a block: 2 x 8 score accumulators, 2 x 8 output accumulators
constexpr int64_t kAhead = 4;  // tiles prefetched ahead of the one computed (2 to 8 measured alike)
// Cache lines asked for at each step of the score loop and of the values' loop: D / 2 steps each, 2D lines a tile of
// 32 keys, so a tile's lines are asked for evenly over a tile's computing (4 a step in the score loop alone left
// the core stalled on its full miss queue through the score loop: decode of 64 sequences at 400 keys 580 -> 480 us)
constexpr int kLinesPerStep = 2;

// AVX-512 BF16 on this CPU and the AVX-512 level selected (LLMP_NATIVE_ISA lowers every kernel)
bool supported() {
    __builtin_cpu_init();
    return selected_isa() == Isa::avx512 && __builtin_cpu_supports("avx512bf16");
}

// The thread's scratch, on 64-byte boundaries (misaligned 64-byte loads span two cache lines)
struct Buffers {
    int64_t pairs = 0, padded = 0, chunks = 0, rows = 0;  // D / 2, rounded up to 16; D in 32-wide chunks
    std::vector<uint32_t> storage;
    uint32_t *q = nullptr, *kt = nullptr, *p = nullptr, *zeros = nullptr;  // q [rows][padded], kt [padded][32],
    float *acc = nullptr, *m = nullptr, *l = nullptr;  // p [kMaxRows][16], acc [rows][chunks * 32]
    std::vector<ActiveRow> active;

    void reserve(int64_t want_rows, int64_t head_dim) {
        const int64_t want_pairs = head_dim / 2;
        if (want_rows <= rows && want_pairs == pairs) return;
        rows = want_rows;
        pairs = want_pairs;
        padded = (pairs + 15) / 16 * 16;
        chunks = (head_dim + 31) / 32;
        const int64_t sizes[] = {rows * padded, padded * kKeys, kMaxRows * 16, padded * 2, rows * chunks * 32,
                                 rows + 16, rows + 16};
        int64_t total = 16;
        for (int64_t s : sizes) total += (s + 15) / 16 * 16;
        storage.assign(total, 0);
        uint32_t* at = storage.data();
        at += (16 - (reinterpret_cast<uintptr_t>(at) / 4) % 16) % 16;
        uint32_t* parts[7];
        for (int i = 0; i < 7; ++i) {
            parts[i] = at;
            at += (sizes[i] + 15) / 16 * 16;
        }
        q = parts[0], kt = parts[1], p = parts[2], zeros = parts[3];
        acc = reinterpret_cast<float*>(parts[4]), m = reinterpret_cast<float*>(parts[5]);
        l = reinterpret_cast<float*>(parts[6]);
        active.resize(rows);
    }
};

LLMP_PAIRS inline __mmask16 lanes_below(int64_t n) {
    return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << std::max<int64_t>(n, 0)) - 1);
}


// 16 x 16 dwords: rows[j][0..15] -> out[i * stride + j]
LLMP_PAIRS inline void transpose16(__m512i r[16], uint32_t* out, int64_t stride) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    // r[4a + b] now holds, in each 128-bit lane c, rows 4a..4a+3 of column 4c + b: column 4c + b is lane c of
    // r[b], r[4 + b], r[8 + b], r[12 + b]
    for (int b = 0; b < 4; ++b) {
        const __m512i a_lo = _mm512_shuffle_i32x4(r[b], r[4 + b], 0x88), a_hi = _mm512_shuffle_i32x4(r[b], r[4 + b], 0xdd);
        const __m512i b_lo = _mm512_shuffle_i32x4(r[8 + b], r[12 + b], 0x88);
        const __m512i b_hi = _mm512_shuffle_i32x4(r[8 + b], r[12 + b], 0xdd);
        _mm512_store_si512(out + b * stride, _mm512_shuffle_i32x4(a_lo, b_lo, 0x88));
        _mm512_store_si512(out + (4 + b) * stride, _mm512_shuffle_i32x4(a_hi, b_hi, 0x88));
        _mm512_store_si512(out + (8 + b) * stride, _mm512_shuffle_i32x4(a_lo, b_lo, 0xdd));
        _mm512_store_si512(out + (12 + b) * stride, _mm512_shuffle_i32x4(a_hi, b_hi, 0xdd));
    }
}

// The keys an item reads: first_tile.. last_key
inline std::pair<int64_t, int64_t> key_range(const AttentionArgs& a, int64_t r, int64_t q0, int64_t q1) {
    const int64_t qlen = a.query_start_loc[r + 1] - a.query_start_loc[r], seq = a.seq_lens[r];
    const int64_t first = a.window > 0 ? std::max<int64_t>(0, seq - qlen + q0 - a.window + 1) : 0;
    return {first / kKeys * kKeys, seq - qlen + q1 - 1};
}

// visit(k, v) with the cache rows (as bytes) of keys first..first+count-1 of request r's KV head kv, in order: an
// address a block (its rows lie kv_heads rows apart), not a multiplication chain a key
template <class Visit>
LLMP_PAIRS inline void for_key_rows(const AttentionArgs& a, int64_t r, int64_t kv, int64_t first, int64_t count,
                                    Visit&& visit) {
    const int32_t* blocks = a.block_tables + r * a.block_table_stride;
    const int64_t row_bytes = a.head_dim * 2, step = a.kv_heads * row_bytes;
    int64_t block = first / a.block_size, offset = first % a.block_size;
    for (int64_t done = 0; done < count; ++block, offset = 0) {
        const int64_t run = std::min(count - done, a.block_size - offset);
        const int64_t at = ((static_cast<int64_t>(blocks[block]) * a.block_size + offset) * a.kv_heads + kv) * row_bytes;
        const char* k = static_cast<const char*>(a.k_cache) + at;
        const char* v = static_cast<const char*>(a.v_cache) + at;
        for (int64_t e = 0; e < run; ++e, k += step, v += step) visit(k, v);
        done += run;
    }
}

// The tiles of keys and values a thread reads, item after item. Blocks lie anywhere in the cache, so the
// hardware prefetcher cannot follow them: the stream asks (into L2) for each tile's rows kAhead tiles before it is
// computed, running on into the thread's next item (an item of a decode batch is only 8 tiles at 256 keys), two cache lines
// at each step of the score loop and of the values' loop (all of a tile's 128 lines at once stalled the core: decode
// of 64 sequences at 400 keys, a layer from memory, 800 -> 580 us; four a step of the score loop alone -> 480 us).
class KeyStream {
  public:
    KeyStream(const AttentionArgs& a, const Item* item, const Item* end)
        : a_(a), row_bytes_(a.head_dim * 2), item_(item), end_(end) {
        start();
        for (int64_t tile = 0; tile < kAhead; ++tile) plan();  // the first tiles, all at once
        issue(kAll);
    }

    // the rows of the next tile, whose lines are asked for a few at a time (issue) while a tile computes: all at
    // once, they queue behind the core's few outstanding misses and stall it
    LLMP_PAIRS void plan() {
        issue(kAll);  // what is left of the last plan
        keys_ = key_ = 0;
        byte_ = 0;
        if (item_ >= end_) return;
        const int64_t to = std::min(next_ + kKeys, last_ + 1);
        int n = 0;
        for_key_rows(a_, item_->request, item_->kv, next_, to - next_, [&](const char* k, const char* v) {
            rows_[n++] = k;
            rows_[n++] = v;
        });
        keys_ = n / 2;
        next_ = to;
        if (next_ > last_) {
            ++item_;
            start();
        }
    }

    // the next `lines` lines of the planned keys' rows, a key's and its value's together
    LLMP_PAIRS void issue(int lines) {
        // into L2, not L1: L1's few miss buffers held the stream back on Zen 4 (decode of 64 sequences at 192
        // keys, 24 layers from memory: 12.2 -> 8.3 ms; one sequence at 4000 keys 4.2 -> 2.4 ms), and the loads
        // that follow find the lines in L2 a few cycles away. (The cursor in locals: the members written once.)
        int key = key_;
        int64_t byte = byte_;
        for (; lines > 0 && key < keys_; lines -= 2) {
            _mm_prefetch(rows_[2 * key] + byte, _MM_HINT_T1);
            _mm_prefetch(rows_[2 * key + 1] + byte, _MM_HINT_T1);
            byte += 64;
            if (byte >= row_bytes_) byte = 0, ++key;
        }
        key_ = key;
        byte_ = byte;
    }

  private:
    void start() {
        if (item_ < end_) std::tie(next_, last_) = key_range(a_, item_->request, item_->q0, item_->q1);
    }

    static constexpr int kAll = 1 << 30;
    const AttentionArgs& a_;
    const int64_t row_bytes_;
    const char* rows_[2 * kKeys];  // the planned keys' rows: key j's at 2j, its value's at 2j + 1
    int keys_ = 0, key_ = 0;       // planned keys; the cursor: a key and a byte of its row
    int64_t byte_ = 0;
    const Item* item_;
    const Item* end_;
    int64_t next_ = 0, last_ = -1;
};

// Rows b..b+count-1 of the tile's active rows (R >= count; the block's last row fills the rest, not stored)
template <int R>
LLMP_PAIRS __attribute__((flatten)) inline void attend_rows(const AttentionArgs& a, Buffers& buf, int64_t b, int count,
                                   const uint16_t* const* vrow, KeyStream& stream) {
    const int64_t P = buf.pairs, stride = buf.padded, C = buf.chunks;
    const ActiveRow* row[R];
    const uint32_t* qrow[R];  // the rows' pairs, addressed once (not re-read through row[] at every pair)
    for (int r = 0; r < R; ++r) {
        row[r] = &buf.active[b + std::min(r, count - 1)];
        qrow[r] = buf.q + row[r]->k * stride;
    }
    __m512 s0[R], s1[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) s0[r] = s1[r] = _mm512_setzero_ps();  // (unrolled: not a memset of the stack)
    for (int64_t i = 0; i < P; ++i) {
        stream.issue(kLinesPerStep);
        const __m512bh k0 = (__m512bh)_mm512_load_si512(buf.kt + i * kKeys);
        const __m512bh k1 = (__m512bh)_mm512_load_si512(buf.kt + i * kKeys + 16);
        for (int r = 0; r < R; ++r) {
            const __m512bh qv = (__m512bh)_mm512_set1_epi32(int32_t(qrow[r][i]));
            s0[r] = _mm512_dpbf16_ps(s0[r], qv, k0);
            s1[r] = _mm512_dpbf16_ps(s1[r], qv, k1);
        }
    }
    const __m512 scale = _mm512_set1_ps(a.scale);
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512 minus_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    // the rows' new maxima first, then one exp_fma gives every row's alpha (a lane each: the bits of one call a row)
    alignas(64) float m_old[16] = {}, m_new[16] = {}, alpha[16];
    __mmask16 v0[R], v1[R];
    int j_first = kKeys, j_last = -1;
    for (int r = 0; r < R; ++r) {
        Vf x0 = reinterpret_cast<Vf>(_mm512_mul_ps(s0[r], scale)), x1 = reinterpret_cast<Vf>(_mm512_mul_ps(s1[r], scale));
        if (a.softcap > 0.0f) x0 = avx512::vsoftcap(x0, a.softcap), x1 = avx512::vsoftcap(x1, a.softcap);
        const __m512i lo = _mm512_set1_epi32(row[r]->j_lo), hi = _mm512_set1_epi32(row[r]->j_hi);
        const __m512i lane1 = _mm512_add_epi32(lane, _mm512_set1_epi32(16));
        v0[r] = _mm512_cmpge_epi32_mask(lane, lo) & _mm512_cmple_epi32_mask(lane, hi);
        v1[r] = _mm512_cmpge_epi32_mask(lane1, lo) & _mm512_cmple_epi32_mask(lane1, hi);
        s0[r] = _mm512_mask_mov_ps(minus_inf, v0[r], reinterpret_cast<__m512>(x0));
        s1[r] = _mm512_mask_mov_ps(minus_inf, v1[r], reinterpret_cast<__m512>(x1));
        m_old[r] = buf.m[row[r]->k];
        m_new[r] = std::max(m_old[r], _mm512_reduce_max_ps(_mm512_max_ps(s0[r], s1[r])));
        j_first = std::min(j_first, row[r]->j_lo);
        j_last = std::max(j_last, row[r]->j_hi);
    }
    _mm512_store_ps(alpha, exp_fma(_mm512_sub_ps(_mm512_load_ps(m_old), _mm512_load_ps(m_new))));
    for (int r = 0; r < R; ++r) {
        const __m512 m_vec = _mm512_set1_ps(m_new[r]);
        // exactly 0 outside the row's keys (other rows of the block may add those keys' values)
        const __m512 p0 = _mm512_maskz_mov_ps(v0[r], exp_fma(_mm512_sub_ps(s0[r], m_vec)));
        const __m512 p1 = _mm512_maskz_mov_ps(v1[r], exp_fma(_mm512_sub_ps(s1[r], m_vec)));
        _mm512_store_si512(buf.p + r * 16, (__m512i)_mm512_cvtne2ps_pbh(p1, p0));  // dword i: keys 2i, 2i + 1
        if (r < count) {
            const int64_t k = row[r]->k;
            buf.l[k] = buf.l[k] * alpha[r] + _mm512_reduce_add_ps(_mm512_add_ps(p0, p1));
            buf.m[k] = m_new[r];
        }
    }
    // a row's weights outside its own keys are exactly 0, and every value read is finite: adding 0 * v leaves
    // its sums as they are
    const int64_t pair_first = j_first / 2, pair_last = j_last / 2;
    for (int64_t c = 0; c < C; ++c) {
        const __mmask32 mask = a.head_dim - c * 32 >= 32 ? __mmask32(0xffffffff)
                                                         : __mmask32((1u << (a.head_dim - c * 32)) - 1);
        __m512 o0[R], o1[R];
        for (int r = 0; r < R; ++r) {
            const __m512 al = _mm512_set1_ps(alpha[r]);
            float* acc = buf.acc + row[r]->k * C * 32 + c * 32;
            o0[r] = _mm512_mul_ps(_mm512_load_ps(acc), al);
            o1[r] = _mm512_mul_ps(_mm512_load_ps(acc + 16), al);
        }
        for (int64_t i = pair_first; i <= pair_last; ++i) {
            stream.issue(kLinesPerStep);
            const __m512i va = _mm512_maskz_loadu_epi16(mask, vrow[2 * i] + c * 32);
            const __m512i vb = _mm512_maskz_loadu_epi16(mask, vrow[2 * i + 1] + c * 32);
            const __m512bh lo = (__m512bh)_mm512_unpacklo_epi16(va, vb), hi = (__m512bh)_mm512_unpackhi_epi16(va, vb);
            for (int r = 0; r < R; ++r) {
                const __m512bh pv = (__m512bh)_mm512_set1_epi32(int32_t(buf.p[r * 16 + i]));
                o0[r] = _mm512_dpbf16_ps(o0[r], pv, lo);
                o1[r] = _mm512_dpbf16_ps(o1[r], pv, hi);
            }
        }
        for (int r = 0; r < R; ++r) {
            if (r >= count) break;  // (r < R: the accumulators' indices stay constants, so they stay in registers)
            float* acc = buf.acc + row[r]->k * C * 32 + c * 32;
            _mm512_store_ps(acc, o0[r]);
            _mm512_store_ps(acc + 16, o1[r]);
        }
    }
}


// One work item, as paged_attention_impl.h's attend_item. No interprocedural optimisation: GCC would specialise it for the calling
// thread's buffers and reach them through __tls_get_addr at every use.
LLMP_PAIRS __attribute__((noipa)) void attend_item(const AttentionArgs& a, int64_t r, int64_t kv, int64_t q0,
                                                  int64_t q1, Buffers& buf, KeyStream& stream) {
    const int64_t D = a.head_dim, G = a.group, P = D / 2, C = (D + 31) / 32;
    const int64_t row0 = a.query_start_loc[r], qlen = a.query_start_loc[r + 1] - row0;
    const int64_t seq = a.seq_lens[r];
    const int64_t rows = (q1 - q0) * G;
    buf.reserve(rows, D);
    const auto* q = static_cast<const uint16_t*>(a.q);
    for (int64_t i = q0; i < q1; ++i) {
        for (int64_t g = 0; g < G; ++g) {
            const int64_t offset = (row0 + i) * a.q_stride_token + (kv * G + g) * a.q_stride_head;
            std::memcpy(buf.q + ((i - q0) * G + g) * buf.padded, q + offset, P * 4);  // the row's P pairs
        }
    }
    for (int64_t k = 0; k < rows; ++k) {
        buf.m[k] = -std::numeric_limits<float>::infinity();
        buf.l[k] = 0.0f;
    }
    std::fill(buf.acc, buf.acc + rows * C * 32, 0.0f);

    auto position = [&](int64_t i) { return seq - qlen + i; };
    auto first_key = [&](int64_t i) { return a.window > 0 ? std::max<int64_t>(0, position(i) - a.window + 1) : 0; };
    const auto [first_tile, last_key] = key_range(a, r, q0, q1);
    const uint16_t* krow[kKeys];
    const uint16_t* vrow[kKeys];
    for (int64_t t0 = first_tile; t0 <= last_key; t0 += kKeys) {
        stream.plan();
        const int64_t n = std::min<int64_t>(kKeys, last_key + 1 - t0);
        int64_t j = 0;
        for_key_rows(a, r, kv, t0, n, [&](const char* k, const char* v) {
            krow[j] = reinterpret_cast<const uint16_t*>(k);
            vrow[j++] = reinterpret_cast<const uint16_t*>(v);
        });
        for (; j < kKeys; ++j) krow[j] = vrow[j] = reinterpret_cast<const uint16_t*>(buf.zeros);  // past the last key
        // the keys' pairs transposed: kt[i][j] = pair i of key j
        for (int64_t i0 = 0; i0 < P; i0 += 16) {
            const __mmask16 mask = lanes_below(P - i0);
            for (int h = 0; h < 2; ++h) {
                __m512i rows16[16];
                for (int j = 0; j < 16; ++j) {
                    rows16[j] = _mm512_maskz_loadu_epi32(mask, reinterpret_cast<const uint32_t*>(krow[16 * h + j]) + i0);
                }
                transpose16(rows16, buf.kt + i0 * kKeys + 16 * h, kKeys);
            }
        }
        int64_t active = 0;
        for (int64_t i = q0; i < q1; ++i) {
            const int64_t lo = first_key(i), hi = position(i);
            if (t0 > hi || t0 + kKeys - 1 < lo) continue;
            const int j_lo = static_cast<int>(std::max<int64_t>(lo - t0, 0));
            const int j_hi = static_cast<int>(std::min<int64_t>(hi - t0, kKeys - 1));
            for (int64_t g = 0; g < G; ++g) buf.active[active++] = {(i - q0) * G + g, j_lo, j_hi};
        }
        int64_t b = 0;
        for (; b + kMaxRows <= active; b += kMaxRows) attend_rows<kMaxRows>(a, buf, b, kMaxRows, vrow, stream);
        switch (active - b) {
            case 7: attend_rows<7>(a, buf, b, 7, vrow, stream); break;
            case 6: attend_rows<6>(a, buf, b, 6, vrow, stream); break;
            case 5: attend_rows<5>(a, buf, b, 5, vrow, stream); break;
            case 4: attend_rows<4>(a, buf, b, 4, vrow, stream); break;
            case 3: attend_rows<3>(a, buf, b, 3, vrow, stream); break;
            case 2: attend_rows<2>(a, buf, b, 2, vrow, stream); break;
            case 1: attend_rows<1>(a, buf, b, 1, vrow, stream); break;
            default: break;
        }
    }
    // the accumulators' lanes back in the head's order: of a chunk's 32 dimensions, o0 holds 0-3, 8-11, 16-19,
    // 24-27 and o1 4-7, 12-15, 20-23, 28-31
    const __m512i first16 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i last16 = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    auto* out = static_cast<uint16_t*>(a.out);
    for (int64_t i = q0; i < q1; ++i) {
        for (int64_t g = 0; g < G; ++g) {
            const int64_t k = (i - q0) * G + g;
            const __m512 inv = _mm512_set1_ps(1.0f / buf.l[k]);
            uint16_t* dst = out + ((row0 + i) * a.heads + kv * G + g) * D;
            for (int64_t c = 0; c < C; ++c) {
                const float* acc = buf.acc + k * C * 32 + c * 32;
                const __m512 o0 = _mm512_load_ps(acc), o1 = _mm512_load_ps(acc + 16);
                const __m512 d0 = _mm512_mul_ps(_mm512_permutex2var_ps(o0, first16, o1), inv);
                const __m512 d1 = _mm512_mul_ps(_mm512_permutex2var_ps(o0, last16, o1), inv);
                const __m512i bits = (__m512i)_mm512_cvtne2ps_pbh(d1, d0);
                const int64_t left = D - c * 32;
                _mm512_mask_storeu_epi16(dst + c * 32, left >= 32 ? __mmask32(0xffffffff) : __mmask32((1u << left) - 1),
                                         bits);
            }
        }
    }
}

}  // namespace pairs

#pragma GCC diagnostic pop
