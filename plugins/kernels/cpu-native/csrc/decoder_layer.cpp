// decoder_layer: a Llama-shaped decoder layer of a decode step in one call and one OpenMP region
// (llmp_native::decoder_layer; the plugin's pack_decoder_layer, llmp.api.PacksDecoderLayer).
//
// The layer's own ops in turn, with their bits: RMSNorm (with the residual), the q|k|v product, rotary on q and
// k, the KV-cache write, paged attention, the output projection, RMSNorm with the residual, SiLU(gate) * up from
// the gated product, the down projection. Called one op at a time, each product is a parallel region of its own
// and everything between them runs on one thread while the others spin: at batch 1 a SmolLM2-135M step is 121
// regions, and memory idles between them. Here the layer is one region: each product and the attention are split
// over its threads as their own ops split them, the row kernels (and a one-thread attention) run on the first
// thread, and meanwhile the others read the first panels of the weights they multiply next into their caches.
// A decode step of SmolLM2-135M at batch 1 took 4-5% less time than with the ops one at a time (2% without the
// reading ahead; AMD Zen 4, 2026-12-06, bit for bit the same tokens). The products run on the vdpbf16ps pairs only
// (an AMX CPU's tiles keep the ops one at a time).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <atomic>
#include <exception>
#include <initializer_list>
#include <tuple>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "decoder_parts.h"

namespace llmp_native {
namespace {

using parts::AttentionCall;
using parts::PairsProduct;

// What a thread waiting for another's serial part reads of the weights it multiplies next: half of a Zen 4 core's
// L2 (the next products' first panels stay there until it multiplies them). 384 KiB to 1 MiB all gave the
// same 4-5% a decode step of SmolLM2-135M at batch 1 (AMD Zen 4, 2026-12-06); reading nothing, 2%.
constexpr int64_t kWarmBytes = 512 << 10;

std::tuple<at::Tensor, at::Tensor> decoder_layer(
    const at::Tensor& hidden, const c10::optional<at::Tensor>& residual, const at::Tensor& input_norm,
    const at::Tensor& qkv, int64_t qkv_n, const c10::optional<at::Tensor>& qkv_bias, const at::Tensor& positions,
    const at::Tensor& cos_sin, int64_t heads, int64_t kv_heads, int64_t head_dim, const at::Tensor& k_cache,
    const at::Tensor& v_cache, const at::Tensor& slot_mapping, const at::Tensor& query_start_loc,
    const at::Tensor& seq_lens, const at::Tensor& block_tables, double scale, double softcap, int64_t window,
    const at::Tensor& o, const at::Tensor& post_norm, double eps, const at::Tensor& gate_up, int64_t intermediate,
    const c10::optional<at::Tensor>& gate_up_bias, const at::Tensor& down) {
    TORCH_CHECK(hidden.dim() == 2 && hidden.scalar_type() == at::kBFloat16 && hidden.is_contiguous() &&
                    hidden.device().is_cpu(),
                "decoder_layer: hidden must be a contiguous [T, N] bfloat16 CPU tensor, not ", hidden.sizes());
    TORCH_CHECK(qkv_n == (heads + 2 * kv_heads) * head_dim, "decoder_layer: ", qkv_n, " q|k|v outputs for ", heads,
                " heads and ", kv_heads, " KV heads of ", head_dim);
    const int64_t T = hidden.size(0), N = hidden.size(1);
    const bool first = !residual.has_value() || !residual->defined();
    TORCH_CHECK(first || residual->sizes() == hidden.sizes(), "decoder_layer: the residual must be ", hidden.sizes());
    const int64_t threads = std::max(1, at::get_num_threads());
    PairsProduct qkv_product(qkv, qkv_n, qkv_bias, false, T, N, threads);
    at::Tensor q = qkv_product.output.narrow(1, 0, heads * head_dim).view({T, heads, head_dim});
    at::Tensor k = qkv_product.output.narrow(1, heads * head_dim, kv_heads * head_dim).view({T, kv_heads, head_dim});
    at::Tensor v =
        qkv_product.output.narrow(1, (heads + kv_heads) * head_dim, kv_heads * head_dim).view({T, kv_heads, head_dim});
    AttentionCall attention(q, k_cache, v_cache, query_start_loc, seq_lens, block_tables, scale, softcap, window);
    const at::Tensor attended = attention.output.view({T, heads * head_dim});
    PairsProduct o_product(o, N, c10::nullopt, false, T, heads * head_dim, threads);
    PairsProduct gated_product(gate_up, intermediate, gate_up_bias, true, T, N, threads);
    PairsProduct down_product(down, N, c10::nullopt, false, T, intermediate, threads);

    at::Tensor x, res;
    std::exception_ptr error;
    std::atomic<bool> failed{false};
    std::atomic<int> serial_done{0};  // the serial parts the first thread has finished
    auto barrier = [] {
#ifdef _OPENMP
#pragma omp barrier
#endif
    };
    // A serial part: the first thread runs it (any failure ends every thread's work) while the others read the
    // weights they multiply next, until it is done; then all meet.
    auto serial = [&](int64_t thread, int part, std::initializer_list<const PairsProduct*> next, auto&& fn) {
        if (thread == 0) {
            if (!failed.load()) {
                try {
                    fn();
                } catch (...) {
                    error = std::current_exception();
                    failed.store(true);
                }
            }
            serial_done.store(part, std::memory_order_release);
        } else {
            auto done = [&] { return serial_done.load(std::memory_order_acquire) >= part; };
            for (const PairsProduct* product : next) {
                if (done()) break;
                product->warm(thread, kWarmBytes, done);
            }
        }
        barrier();
    };
    const bool attention_alone = attention.owners() == 1;  // one thread's work: a serial part of its own
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
#endif
    {
#ifdef _OPENMP
        const int64_t thread = omp_get_thread_num(), team = omp_get_num_threads();
#else
        const int64_t thread = 0, team = 1;
#endif
        serial(thread, 1, {&qkv_product}, [&] {
            if (first) res = hidden, x = parts::rms_norm(hidden, input_norm, eps);
            else std::tie(x, res) = parts::add_rms_norm(hidden, *residual, input_norm, eps);
        });
        if (!failed.load()) qkv_product.run(thread, x);
        barrier();
        serial(thread, 2, {&o_product, &gated_product}, [&] {
            parts::rotary_(positions, q, k, cos_sin);
            parts::write_kv_(k, v, k_cache, v_cache, slot_mapping);
            if (attention_alone) attention.run(0, 1);
        });
        if (!attention_alone) {  // its owners as its own op chooses them
            if (!failed.load()) {
                if (team == 1) attention.run(0, attention.owners());
                else if (thread < attention.owners()) attention.run(thread, thread + 1);
            }
            barrier();
        }
        if (!failed.load()) o_product.run(thread, attended);
        barrier();
        serial(thread, 3, {&gated_product},
               [&] { std::tie(x, res) = parts::add_rms_norm(o_product.output, res, post_norm, eps); });
        if (!failed.load()) gated_product.run(thread, x);
        barrier();
        if (!failed.load()) down_product.run(thread, gated_product.output);
    }
    if (error) std::rethrow_exception(error);
    return {down_product.output, res};
}

}  // namespace
}  // namespace llmp_native

TORCH_LIBRARY_FRAGMENT(llmp_native, m) {
    // A decode step's decoder layer: x = RMSNorm(hidden (+ residual)); q|k|v = x @ qkv (+ qkv_bias); rotary on q
    // and k at positions from cos_sin [max_pos, D] (float32); k, v written to the caches at slot_mapping; attention
    // over the caches (as paged_attention); h = attention @ o; x, residual = RMSNorm(h + residual); the result
    // SiLU(gate) * up of x through gate_up (dense_pack_gated) @ down -> (result, residual), all bfloat16, each part
    // with its own op's bits; products on the vdpbf16ps pairs only
    m.def(
        "decoder_layer(Tensor hidden, Tensor? residual, Tensor input_norm, Tensor qkv, int qkv_n, Tensor? qkv_bias, "
        "Tensor positions, Tensor cos_sin, int heads, int kv_heads, int head_dim, Tensor(a!) k_cache, "
        "Tensor(b!) v_cache, Tensor slot_mapping, Tensor query_start_loc, Tensor seq_lens, Tensor block_tables, "
        "float scale, float softcap, int window, Tensor o, Tensor post_norm, float eps, Tensor gate_up, "
        "int intermediate, Tensor? gate_up_bias, Tensor down) -> (Tensor, Tensor)");
    // whether decoder_layer runs here (its products on the vdpbf16ps pairs)
    m.def("decoder_layer_supported() -> bool", &llmp_native::parts::pairs_chosen);
}

TORCH_LIBRARY_IMPL(llmp_native, CPU, m) { m.impl("decoder_layer", &llmp_native::decoder_layer); }
