// paged_attention: causal attention of a mixed prefill/decode batch straight over the paged KV cache
// (llmp_native::paged_attention; the KernelSet.paged_attention contract, metadata as plain tensors).
//
// Keys and values are read through the block table where they lie: no gather, no mirror, no padded query
// block. Grouped-query attention shares each tile of keys between the query heads of its KV head. Sliding
// windows and Gemma 2's soft-capping as the torch reference computes them; bfloat16, float16 and float32 queries
// and caches, float32 arithmetic. A query row's result depends only on that row (see paged_attention_impl.h).
//
// Threads: work items are (request, KV head, up to kItemRows query rows), split over torch's threads as
// quant_matmul's rows are (fewer threads for a call under kMinWorkPerThread a thread); an item runs whole on one,
// its owner's or, once that thread is behind and another has none left, the other's (unit_range.h). A call of
// fewer than 4 items a thread (a decode of few requests: SmolLM2's 3 KV heads on 2 threads left one idle half the
// time, and a 16-core host used 3) runs each item over more than one 512-key partition as a unit a partition.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "decoder_parts.h"
#include "exp_fma.h"
#include "isa.h"
#include "unit_range.h"
#include "vec16.h"

namespace llmp_native {
namespace {

constexpr int kTile = kLanes;  // keys a tile, aligned to absolute positions
// keys a partition, aligned to absolute positions (paged_attention_impl.h): 32 tiles, little merging, and a decode
// over a context of 8192 splits into 16 units a KV head
constexpr int64_t kPartition = 512;
constexpr int64_t kAllPartitions = std::numeric_limits<int64_t>::max();

enum class Dtype { f32, bf16, f16 };

struct AttentionArgs {
    const void* q;  // [T, H, D], head dim contiguous
    const void* k_cache;  // [B, S, Hkv, D], contiguous
    const void* v_cache;
    void* out;  // [T, H, D], contiguous, q's dtype
    const int32_t* query_start_loc;  // [R + 1]
    const int32_t* seq_lens;  // [R]
    const int32_t* block_tables;  // [R, block_table_stride]
    int64_t block_table_stride;
    Dtype q_dtype, cache_dtype;
    int64_t q_stride_token, q_stride_head;  // in elements
    int64_t heads, kv_heads, group, head_dim, block_size, window;  // window 0: none
    float scale, softcap;  // softcap 0: none
};

struct ActiveRow {
    int64_t k;  // the row in the item
    int j_lo, j_hi;  // its keys in the tile: lanes j_lo..j_hi
};

struct ItemBuffers {
    int64_t dv = 0;  // head_dim padded to whole tiles
    std::vector<float> q, acc, m, l, kt, vt, row, zeros;  // row: a tile's keys as float32 rows, before the transpose
    std::vector<float> tacc, tm, tl;  // each row's partitions merged so far
    std::vector<ActiveRow> active;

    void reserve(int64_t rows, int64_t head_dim) {
        dv = (head_dim + kTile - 1) / kTile * kTile;
        q.resize(rows * dv);
        acc.resize(rows * dv);
        m.resize(rows);
        l.resize(rows);
        tacc.resize(rows * dv);
        tm.resize(rows);
        tl.resize(rows);
        active.resize(rows);
        kt.resize(dv * kTile);
        vt.resize(kTile * dv);
        row.resize(kTile * dv);
        zeros.assign(dv, 0.0f);
    }
};

// elements offset..offset+n of a tensor's data as float32
void load_row(Dtype dtype, const void* base, int64_t offset, int64_t n, float* out) {
    switch (dtype) {
        case Dtype::f32: std::copy_n(static_cast<const float*>(base) + offset, n, out); break;
        case Dtype::bf16: {
            const auto* src = static_cast<const c10::BFloat16*>(base) + offset;
            for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(src[i]);
            break;
        }
        case Dtype::f16: {
            const auto* src = static_cast<const c10::Half*>(base) + offset;
            for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(src[i]);
            break;
        }
    }
}

// n float32 values into a tensor's data at offset, rounded to its dtype (to nearest even)
void store_row(Dtype dtype, void* base, int64_t offset, int64_t n, const float* values) {
    switch (dtype) {
        case Dtype::f32: std::copy_n(values, n, static_cast<float*>(base) + offset); break;
        case Dtype::bf16: {
            auto* dst = static_cast<c10::BFloat16*>(base) + offset;
            for (int64_t i = 0; i < n; ++i) dst[i] = c10::BFloat16(values[i]);
            break;
        }
        case Dtype::f16: {
            auto* dst = static_cast<c10::Half*>(base) + offset;
            for (int64_t i = 0; i < n; ++i) dst[i] = c10::Half(values[i]);
            break;
        }
    }
}

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LLMP_X86 1
#endif

#define LLMP_ISA_IMPL "paged_attention_impl.h"
#include "isa_copies.h"

struct ItemFns {
    void (*attend)(const AttentionArgs&, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float*, ItemBuffers&);
    void (*reduce)(const AttentionArgs&, int64_t, int64_t, int64_t, int64_t, int64_t, const float*, ItemBuffers&);
};

ItemFns item_fns_for_isa() {
#ifdef LLMP_X86
    switch (selected_isa()) {
        case Isa::avx512: return {avx512::attend_item, avx512::reduce_partitions};
        case Isa::avx2: return {avx2::attend_item, avx2::reduce_partitions};
        default: break;
    }
#endif
    return {scalar::attend_item, scalar::reduce_partitions};
}

// Each thread gets at least this many (query row, key) pairs, about 20 us of work: below that, waking a thread
// and waiting for it costs more than it saves.
constexpr int64_t kMinWorkPerThread = 2048;

// Query rows an item (its positions x the query heads of its KV head): they share each tile of keys read.
constexpr int64_t kItemRows = 256;

Dtype dtype_of(const at::Tensor& t, const char* name) {
    switch (t.scalar_type()) {
        case at::kFloat: return Dtype::f32;
        case at::kBFloat16: return Dtype::bf16;
        case at::kHalf: return Dtype::f16;
        default: TORCH_CHECK(false, "paged_attention: ", name, " must be float32, bfloat16 or float16, not ",
                             t.scalar_type());
    }
    return Dtype::f32;  // not reached
}

struct Item {
    int64_t request, kv, q0, q1;
    int64_t first_part = 0, end_part = kAllPartitions;  // its rows' partitions it attends
    int64_t split = -1;  // one partition of a split item (AttentionCall::State::splits), else -1
};

// An item split into one unit a partition (a call of few items over long contexts): the units' partials, and
// how many units are still to finish (the last reduces them)
struct Split {
    int64_t first_part = 0, parts = 0;
    size_t offset = 0;  // into State::partials
    std::atomic<int64_t> remaining{0};
};

#ifdef LLMP_X86
#include "paged_attention_pairs.h"

bool pairs_supported() {
    static const bool supported = pairs::supported();
    return supported;
}
#endif

}  // namespace

namespace parts {

struct AttentionCall::State {
    at::Tensor qs, starts, lens, tables;  // held for args' pointers
    AttentionArgs args;
    std::vector<Item> items;
    std::vector<float> partials;  // the split items' partitions: [parts][rows][Dv + 2] each
    std::unique_ptr<Split[]> splits;
    std::vector<UnitRange> ranges;
    std::vector<int64_t> firsts;
    int64_t positions = 1;
    bool in_pairs = false;
};

AttentionCall::AttentionCall(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                             const at::Tensor& query_start_loc, const at::Tensor& seq_lens,
                             const at::Tensor& block_tables, double scale, double softcap, int64_t window)
    : state_(std::make_unique<State>()) {
    TORCH_CHECK(q.device().is_cpu() && k_cache.device().is_cpu() && v_cache.device().is_cpu(),
                "paged_attention: CPU tensors only");
    TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(),
                "paged_attention: q must be [T, H, D] and the caches [B, S, Hkv, D], not ", q.sizes(), " and ",
                k_cache.sizes());
    TORCH_CHECK(k_cache.scalar_type() == v_cache.scalar_type() && k_cache.is_contiguous() && v_cache.is_contiguous(),
                "paged_attention: the caches must be contiguous and of one dtype");
    const int64_t T = q.size(0), H = q.size(1), D = q.size(2), Hkv = k_cache.size(2);
    TORCH_CHECK(k_cache.size(3) == D && Hkv > 0 && H % Hkv == 0, "paged_attention: ", H, " query heads of size ", D,
                " do not group over ", Hkv, " KV heads of size ", k_cache.size(3));
    for (const at::Tensor* t : {&query_start_loc, &seq_lens, &block_tables}) {
        TORCH_CHECK(t->scalar_type() == at::kInt && t->device().is_cpu(), "paged_attention: metadata must be int32");
    }
    State& st = *state_;
    st.qs = q.stride(2) == 1 ? q : q.contiguous();
    st.starts = query_start_loc.contiguous(), st.lens = seq_lens.contiguous();
    st.tables = block_tables.dim() == 2 && block_tables.stride(1) == 1 ? block_tables : block_tables.contiguous();
    const at::Tensor &qs = st.qs, &tables = st.tables;
    const int64_t R = st.lens.size(0);
    TORCH_CHECK(st.starts.size(0) == R + 1 && tables.dim() == 2 && tables.size(0) >= R,
                "paged_attention: query_start_loc, seq_lens and block_tables disagree on the requests");
    output = at::empty({T, H, D}, q.options().memory_format(at::MemoryFormat::Contiguous));

    st.args = AttentionArgs{qs.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), output.data_ptr(),
                            st.starts.data_ptr<int32_t>(), st.lens.data_ptr<int32_t>(), tables.data_ptr<int32_t>(),
                            tables.stride(0), dtype_of(q, "q"), dtype_of(k_cache, "the cache"), qs.stride(0),
                            qs.stride(1), H, Hkv, H / Hkv, D, k_cache.size(1), std::max<int64_t>(window, 0),
                            static_cast<float>(scale), softcap > 0 ? static_cast<float>(softcap) : 0.0f};
    const AttentionArgs& args = st.args;
    st.positions = std::max<int64_t>(1, kItemRows / args.group);
    // the items, and the (query row, key) pairs of each
    std::vector<int64_t> works;
    std::vector<std::pair<int64_t, int64_t>> key_ranges;  // an item's rows' keys, first..last
    for (int64_t r = 0; r < R; ++r) {
        const int64_t qlen = args.query_start_loc[r + 1] - args.query_start_loc[r], seq = args.seq_lens[r];
        TORCH_CHECK(qlen >= 0 && qlen <= seq, "paged_attention: request ", r, " has ", qlen, " queries but ", seq,
                    " tokens");
        TORCH_CHECK((seq + args.block_size - 1) / args.block_size <= tables.size(1), "paged_attention: request ", r,
                    "'s block table is too short for ", seq, " tokens");
        for (int64_t q0 = 0; q0 < qlen; q0 += st.positions) {
            const int64_t q1 = std::min(qlen, q0 + st.positions), keys = seq - qlen + q1;  // its last row's keys
            const int64_t first = args.window > 0 ? std::max<int64_t>(0, seq - qlen + q0 - args.window + 1) : 0;
            for (int64_t kv = 0; kv < Hkv; ++kv) {
                st.items.push_back({r, kv, q0, q1});
                works.push_back((q1 - q0) * args.group * (args.window > 0 ? std::min(args.window, keys) : keys));
                key_ranges.emplace_back(first, keys - 1);
            }
        }
    }
#ifdef LLMP_X86
    st.in_pairs = pairs_supported() && args.q_dtype == Dtype::bf16 && args.cache_dtype == Dtype::bf16 && D % 2 == 0;
#endif
    // Few items for the threads (a decode of few requests: an item a KV head): an item over several partitions
    // becomes a unit a partition, so that every thread has work (the pairs' kernel keeps its items whole)
    const int64_t available = std::max(1, at::get_num_threads());
    if (!st.in_pairs && available > 1 && static_cast<int64_t>(st.items.size()) < 4 * available) {
        std::vector<Item> units;
        std::vector<int64_t> unit_works;
        std::vector<std::array<int64_t, 3>> split_items;  // (offset, first partition, parts)
        const int64_t dv = (D + kTile - 1) / kTile * kTile;
        size_t floats = 0;
        for (size_t i = 0; i < st.items.size(); ++i) {
            const Item& item = st.items[i];
            const auto [first, last] = key_ranges[i];
            const int64_t p0 = first / kPartition, parts = last / kPartition - p0 + 1;
            if (parts < 2) {
                units.push_back(item);
                unit_works.push_back(works[i]);
                continue;
            }
            const int64_t rows = (item.q1 - item.q0) * args.group;
            for (int64_t p = p0; p < p0 + parts; ++p) {
                Item unit = item;
                unit.first_part = p, unit.end_part = p + 1;
                unit.split = static_cast<int64_t>(split_items.size());
                units.push_back(unit);
                const int64_t keys = std::min(last, (p + 1) * kPartition - 1) - std::max(first, p * kPartition) + 1;
                unit_works.push_back(rows * keys);
            }
            split_items.push_back({static_cast<int64_t>(floats), p0, parts});
            floats += static_cast<size_t>(parts * rows * (dv + 2));
        }
        if (!split_items.empty()) {
            st.splits = std::make_unique<Split[]>(split_items.size());
            for (size_t i = 0; i < split_items.size(); ++i) {
                const auto [offset, first_part, parts] = split_items[i];
                st.splits[i].offset = static_cast<size_t>(offset);
                st.splits[i].first_part = first_part, st.splits[i].parts = parts;
                st.splits[i].remaining.store(parts, std::memory_order_relaxed);
            }
            st.partials.resize(floats);
            st.items = std::move(units);
            works = std::move(unit_works);
        }
    }
    std::vector<int64_t> ends;  // the (query row, key) pairs of items 0..i, for a split of equal work
    int64_t work = 0;
    for (int64_t each : works) ends.push_back(work += each);
    const int64_t n = static_cast<int64_t>(st.items.size());
    const int64_t threads = std::clamp<int64_t>(work / kMinWorkPerThread, 1, std::max<int64_t>(1, std::min<int64_t>(available, n)));
    // thread t owns the items whose work ends in (t, t + 1] / threads of the total: contiguous, about equal
    // (a prefill's later rows read more keys than its first); a thread done with its own takes the others' last
    st.ranges = std::vector<UnitRange>(threads);
    st.firsts.resize(threads);
    for (int64_t t = 0; t < threads; ++t) {
        const auto first = std::lower_bound(ends.begin(), ends.end(), work * t / threads + 1);
        const auto last = std::lower_bound(ends.begin(), ends.end(), work * (t + 1) / threads + 1);
        st.firsts[t] = first - ends.begin();
        st.ranges[t].reset(std::max<int64_t>(0, std::min<int64_t>(last - ends.begin(), n) - st.firsts[t]));
    }
}

AttentionCall::~AttentionCall() = default;

int64_t AttentionCall::owners() const { return static_cast<int64_t>(state_->ranges.size()); }

void AttentionCall::run(int64_t begin, int64_t end) {
    State& st = *state_;
    const AttentionArgs& args = st.args;
    const std::vector<Item>& items = st.items;
    std::vector<UnitRange>& ranges = st.ranges;
    const std::vector<int64_t>& firsts = st.firsts;
    static const ItemFns fns = item_fns_for_isa();
    thread_local ItemBuffers buffers;
#ifdef LLMP_X86
    thread_local pairs::Buffers pair_buffers;
    if (st.in_pairs) {
        // the owner's key stream runs ahead through its items in order; a taken item streams its own keys
        std::vector<pairs::KeyStream> streams;
        streams.reserve(end - begin);
        for (int64_t t = begin; t < end; ++t)
            streams.emplace_back(args, items.data() + firsts[t], items.data() + firsts[t] + ranges[t].size());
        take_units(
            ranges, begin, end,
            [&](int64_t t, int64_t unit) {
                const Item& item = items[firsts[t] + unit];
                pairs::attend_item(args, item.request, item.kv, item.q0, item.q1, pair_buffers, streams[t - begin]);
            },
            [&](int64_t t, int64_t unit) {
                const Item& item = items[firsts[t] + unit];
                pairs::KeyStream stream(args, &item, &item + 1);
                pairs::attend_item(args, item.request, item.kv, item.q0, item.q1, pair_buffers, stream);
            });
        return;
    }
#endif
    buffers.reserve(st.positions * args.group, args.head_dim);
    auto run_item = [&](int64_t t, int64_t unit) {
        const Item& item = items[firsts[t] + unit];
        if (item.split < 0) {
            fns.attend(args, item.request, item.kv, item.q0, item.q1, item.first_part, item.end_part, nullptr, buffers);
            return;
        }
        Split& split = st.splits[item.split];
        float* partials = st.partials.data() + split.offset;
        const int64_t rows = (item.q1 - item.q0) * args.group;
        fns.attend(args, item.request, item.kv, item.q0, item.q1, item.first_part, item.end_part,
                   partials + (item.first_part - split.first_part) * rows * (buffers.dv + 2), buffers);
        // the last of the item's units to finish merges them (acq_rel: it sees the others' partials)
        if (split.remaining.fetch_sub(1, std::memory_order_acq_rel) == 1)
            fns.reduce(args, item.request, item.kv, item.q0, item.q1, split.parts, partials, buffers);
    };
    take_units(ranges, begin, end, run_item, run_item);
}

}  // namespace parts

namespace {

at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                           const at::Tensor& query_start_loc, const at::Tensor& seq_lens,
                           const at::Tensor& block_tables, double scale, double softcap, int64_t window) {
    parts::AttentionCall call(q, k_cache, v_cache, query_start_loc, seq_lens, block_tables, scale, softcap, window);
    at::parallel_for(0, call.owners(), 1, [&](int64_t begin, int64_t end) { call.run(begin, end); });
    return call.output;
}

}  // namespace
}  // namespace llmp_native

TORCH_LIBRARY_FRAGMENT(llmp_native, m) {
    // causal attention of q [T, H, D] over the paged caches [B, S, Hkv, D] for the batch the metadata describes
    // (int32 query_start_loc [R + 1], seq_lens [R], block_tables [R, max_blocks]) -> [T, H, D] in q's dtype;
    // softcap 0 and window 0 mean none
    m.def(
        "paged_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor query_start_loc, Tensor seq_lens, "
        "Tensor block_tables, float scale, float softcap, int window) -> Tensor");
    // whether bfloat16 queries over a bfloat16 cache take the vdpbf16ps path here (paged_attention_pairs.h)
    m.def("paged_attention_pairs() -> bool", [] {
#ifdef LLMP_X86
        return llmp_native::pairs_supported();
#else
        return false;
#endif
    });
}

TORCH_LIBRARY_IMPL(llmp_native, CPU, m) { m.impl("paged_attention", &llmp_native::paged_attention); }
