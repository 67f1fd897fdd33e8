// The parts of a decoder layer that decoder_layer.cpp runs in one OpenMP region, each with the bits of its own
// op: the row kernels (elementwise.cpp), a product on the pairs (dense_matmul.cpp) and paged attention
// (paged_attention.cpp), the last two prepared before the region and then run by each of its threads.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <tuple>
#include <utility>

namespace llmp_native::parts {

// llmp_native::rms_norm, add_rms_norm, rotary_ and write_kv_ (elementwise.cpp)
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                                const at::Tensor& weight, double eps);
void rotary_(const at::Tensor& positions, const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos_sin);
void write_kv_(const at::Tensor& k, const at::Tensor& v, const at::Tensor& k_cache, const at::Tensor& v_cache,
               const at::Tensor& slot_mapping);

// One bfloat16 row's silu_and_mul: out[i] = SiLU(x[i]) * x[half + i], the selected instruction set's row kernel
void silu_and_mul_row(const c10::BFloat16* x, c10::BFloat16* out, int64_t half);

// Whether dense_matmul multiplies on the pairs here: vdpbf16ps (AVX-512 BF16, no AMX tiles chosen) or their AVX2 form
bool pairs_chosen();

// llmp_native::dense_matmul (or dense_gated_matmul with gated: SiLU(gate) * up) of `rows` rows through a packed
// weight on the pairs, its output allocated: thread t of the region owns the panels t * grain.. and, done with
// them, takes the others' last (unit_range.h), so the bits are dense_matmul's whatever thread computes a panel.
class PairsProduct {
  public:
    PairsProduct(const at::Tensor& packed, int64_t n, const c10::optional<at::Tensor>& bias, bool gated, int64_t rows,
                 int64_t in_features, int64_t threads);
    ~PairsProduct();
    // thread `thread` of the region's; x [rows, in_features] bfloat16, contiguous
    void run(int64_t thread, const at::Tensor& x);
    // thread `thread` reads the panels it will multiply first into its caches, up to `max_bytes`, until
    // `stop()` (checked every KiB): a thread waiting for another's serial part streams its next weights
    template <class Stop>
    void warm(int64_t thread, int64_t max_bytes, Stop stop) const {
        const auto [begin, end] = first_panels(thread, max_bytes);
        uint64_t sum = 0;
        for (const char* line = begin; line < end; line += 1024) {
            if (stop()) break;
            for (int i = 0; i < 1024; i += 64) sum += *reinterpret_cast<const volatile uint64_t*>(line + i);
        }
        sink_ = sum;
    }
    at::Tensor output;

  private:
    std::pair<const char*, const char*> first_panels(int64_t thread, int64_t max_bytes) const;
    struct State;
    std::unique_ptr<State> state_;
    mutable uint64_t sink_ = 0;
};

// llmp_native::paged_attention prepared for q [T, H, D] (its values are read only by run) and the cache and
// metadata, its output allocated: thread t of the region runs the items it owns, and takes the others' last
class AttentionCall {
  public:
    AttentionCall(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                  const at::Tensor& query_start_loc, const at::Tensor& seq_lens, const at::Tensor& block_tables,
                  double scale, double softcap, int64_t window);
    ~AttentionCall();
    // the threads that own items: threads from this one on take only what the owners leave
    int64_t owners() const;
    // threads [begin, end) of the owners (a parallel_for's range over owners(), or one thread of a region)
    void run(int64_t begin, int64_t end);
    at::Tensor output;

  private:
    struct State;
    std::unique_ptr<State> state_;
};

}  // namespace llmp_native::parts
