// quant_matmul: x @ W.T with W kept in GGML blocks (llmp_native::quant_matmul; schema in library.cpp).
//
// Threads: the output columns (weight rows) are split into one contiguous range a thread, over the threads torch
// is configured with (torch.set_num_threads: the engine's --num-threads), fewer for a small call
// (threads_for). Each dot product runs whole on one thread in a fixed order, K is never split: the result does
// not depend on the thread count or on T. The threads are torch's own: where torch's ATen uses OpenMP (its
// Linux wheels), setup.py compiles with -fopenmp, so at::parallel_for is an OpenMP region of torch's team; the
// library is not linked with an OpenMP runtime, its OpenMP calls bind at load to the one libtorch_cpu loaded
// (torch's libgomp: the system's is never mapped). A region ends when every thread of the team has arrived:
// when other processes keep the cores busy, a call (as torch's own threaded ops) waits for the scheduler to run
// the late thread, in multiples of the 4 ms tick (the "8 ms stalls" of an earlier -fopenmp build: measured as
// that thread's run-queue wait, absent on an idle machine). Built without OpenMP, at::parallel_for runs the
// whole range inline on the calling thread.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LLMP_X86 1
#endif

#include "isa.h"

namespace llmp_native {
namespace {

// GGML type ids (gguf.GGMLQuantizationType), as llmp.quantization.BlockFormat.ggml_type
enum GgmlType : int64_t {
    kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8,
    kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14,
};

struct BlockShape {
    int64_t block_size, type_size;
};

bool block_shape(int64_t ggml_type, BlockShape* shape) {
    switch (ggml_type) {
        case kQ4_0: *shape = {32, 18}; return true;
        case kQ4_1: *shape = {32, 20}; return true;
        case kQ5_0: *shape = {32, 22}; return true;
        case kQ5_1: *shape = {32, 24}; return true;
        case kQ8_0: *shape = {32, 34}; return true;
        case kQ2_K: *shape = {256, 84}; return true;
        case kQ3_K: *shape = {256, 110}; return true;
        case kQ4_K: *shape = {256, 144}; return true;
        case kQ5_K: *shape = {256, 176}; return true;
        case kQ6_K: *shape = {256, 210}; return true;
        default: return false;
    }
}

// Byte b's 8 bits as 8 bytes of 0 or 16 (little-endian: bit i is byte i): Q5_0/Q5_1's fifth bits, in place.
constexpr std::array<uint64_t, 256> bits_as_sixteens() {
    std::array<uint64_t, 256> table{};
    for (int b = 0; b < 256; ++b) {
        for (int i = 0; i < 8; ++i) table[b] |= static_cast<uint64_t>(((b >> i) & 1) << 4) << (8 * i);
    }
    return table;
}
constexpr std::array<uint64_t, 256> kBitsAsSixteens = bits_as_sixteens();

constexpr int kTileRows = 4;  // weight rows dequantised together: each load of x serves four dot products
// Up to this many inputs, weights are unpacked in registers for each pair of inputs (AVX-512; AVX2 for one
// input only: see kFusedMaxTHere)
// rather than dequantised once to a buffer and reloaded for every input: with few inputs the buffer's store and
// reload cost more than unpacking again (measured on Zen 5, 2 threads, 3.5M weights of Q4_1: T = 2 103 vs
// 249 us, T = 4 199 vs 279, T = 8 382 vs 430, T = 16 about even; a decode step of 8 sequences 31 -> 26 ms)
constexpr int64_t kFusedMaxT = 8;
// With more, the inputs are taken about this many bytes at a time (a Zen 4/5 core's L2, half a Sapphire Rapids
// core's), each chunk passed over by every tile of dequantised rows while it is near. Zen 5, 2 threads, Q4_K
// 896x4864, 2026-12-04, GFLOP/s at T = 128 / 1024: all inputs at once 166 / 102, chunks of 256 KiB 155 / 155
// (the rows dequantised again for every 12 inputs), 1 MiB 188 / 189.
constexpr int64_t kInputChunkBytes = 1 << 20;

struct QuantMatmulArgs {
    const float* x;         // [T, K], contiguous
    const uint8_t* blocks;  // [N, K / block_size * type_size], contiguous
    float* out;             // [T, N], contiguous
    int64_t T, N, in_features, ggml_type;
};

// GCC 12's AVX-512 intrinsics warn of their own deliberately undefined operands (GCC bug 105593)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define LLMP_ISA_IMPL "quant_matmul_impl.h"
#include "isa_copies.h"
#pragma GCC diagnostic pop

using RowsFn = bool (*)(const QuantMatmulArgs&, int64_t, int64_t, float*);

RowsFn rows_for_isa() {
#ifdef LLMP_X86
    switch (selected_isa()) {
        case Isa::avx512: return avx512::quant_matmul_rows;
        case Isa::avx2: return avx2::quant_matmul_rows;
        default: break;
    }
#endif
    return scalar::quant_matmul_rows;
}

// The threads take contiguous ranges of whole groups of 16 weight rows (whole tiles; 16 float32 outputs, a
// cache line of a row of out, so no two threads write one line). Contiguous, not interleaved chunks: each
// thread then streams its own part of the matrix, which the hardware prefetcher follows (chunks of ~16 KiB
// taken in turn measured up to 2.6x slower at T = 1 on the 49152-row head).
constexpr int64_t kGroupRows = 16;
constexpr int64_t kFloatsPerLine = 16;  // a 64-byte cache line
// Each thread gets at least this much work, counted in bytes of blocks read, an input beyond the first adding a
// quarter of them (a row's blocks are dequantised once for all T inputs): below that, waking a thread and
// waiting for it at the region's end cost more than it saves (measured on 2 cores: the 192x576 Q4_1
// matrix, 69 KB, is slower on 2 threads than on 1 at T = 1 and 2; 576x576, 207 KB, is 1.3x faster).
constexpr int64_t kMinBytesPerThread = 64 << 10;

// The threads a call runs on: torch's (at::get_num_threads()), fewer for a small call.
int64_t threads_for(int64_t weight_bytes, int64_t T, int64_t groups) {
    const int64_t work = weight_bytes + weight_bytes / 4 * (T - 1);
    const int64_t most = std::min<int64_t>(at::get_num_threads(), groups);
    return std::clamp<int64_t>(work / kMinBytesPerThread, 1, std::max<int64_t>(most, 1));
}

at::Tensor quant_matmul(const at::Tensor& x, const at::Tensor& blocks, int64_t ggml_type, int64_t in_features) {
    BlockShape shape;
    TORCH_CHECK(block_shape(ggml_type, &shape), "quant_matmul: GGML type ", ggml_type, " is not supported");
    TORCH_CHECK(x.device().is_cpu() && blocks.device().is_cpu(), "quant_matmul: CPU tensors only");
    TORCH_CHECK(x.dim() == 2 && x.size(1) == in_features, "quant_matmul: x must be [T, ", in_features, "], not ",
                x.sizes());
    TORCH_CHECK(at::isFloatingType(x.scalar_type()), "quant_matmul: x must be floating point, not ", x.scalar_type());
    TORCH_CHECK(blocks.scalar_type() == at::kByte && blocks.dim() == 2, "quant_matmul: blocks must be uint8 [N, bytes]");
    TORCH_CHECK(in_features > 0 && in_features % shape.block_size == 0 &&
                    blocks.size(1) == in_features / shape.block_size * shape.type_size,
                "quant_matmul: ", blocks.size(1), " bytes a row do not hold ", in_features, " weights of type ",
                ggml_type);

    const at::Tensor xf = x.to(at::kFloat).contiguous();  // bfloat16 and float16 widen exactly; float32 stays
    const at::Tensor w = blocks.contiguous();
    const int64_t T = x.size(0), N = blocks.size(0), K = in_features;
    at::Tensor out = at::empty({T, N}, x.options().dtype(at::kFloat));
    if (T == 0 || N == 0) return out.to(x.scalar_type());

    const QuantMatmulArgs args{xf.data_ptr<float>(), w.data_ptr<uint8_t>(), out.data_ptr<float>(), T, N, K, ggml_type};
    static const RowsFn rows = rows_for_isa();
    const int64_t groups = (N + kGroupRows - 1) / kGroupRows;
    const int64_t threads = threads_for(blocks.size(1) * N, T, groups);
    // a grain of all the groups runs inline on the calling thread; otherwise an OpenMP region of torch's team
    // (its threads beyond `threads` get no range), each thread one contiguous range of about groups / threads
    at::parallel_for(0, groups, (groups + threads - 1) / threads, [&](int64_t begin, int64_t end) {
        // this thread's dequantised tile of weight rows, kept between calls, on a cache line's boundary: a row
        // (K floats, K a multiple of 32) then starts on one too, and no load of 16 of its floats spans two lines
        // (malloc's 16-byte alignment made every one of them span two: 94 -> 200 GFLOP/s a core, T >= 16)
        thread_local std::vector<float> buffer;
        buffer.resize(static_cast<size_t>(kTileRows * K + kFloatsPerLine));
        float* tile = buffer.data();
        const uintptr_t misaligned = reinterpret_cast<uintptr_t>(tile) / sizeof(float) % kFloatsPerLine;
        tile += (kFloatsPerLine - misaligned) % kFloatsPerLine;
        rows(args, begin * kGroupRows, std::min(N, end * kGroupRows), tile);
    });
    return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());  // one rounding to x's dtype
}

std::vector<int64_t> quant_matmul_types() {
    return {kQ4_0, kQ4_1, kQ5_0, kQ5_1, kQ8_0, kQ2_K, kQ3_K, kQ4_K, kQ5_K, kQ6_K};
}

}  // namespace
}  // namespace llmp_native

TORCH_LIBRARY_FRAGMENT(llmp_native, m) {
    // x [T, in] float32/bfloat16 @ W.T, W GGML blocks uint8 [out, row_bytes] of type ggml_type -> [T, out] in x's
    // dtype, accumulated in float32
    m.def("quant_matmul(Tensor x, Tensor blocks, int ggml_type, int in_features) -> Tensor");
    m.def("quant_matmul_types() -> int[]", &llmp_native::quant_matmul_types);  // the GGML type ids it computes
}

TORCH_LIBRARY_IMPL(llmp_native, CPU, m) { m.impl("quant_matmul", &llmp_native::quant_matmul); }
