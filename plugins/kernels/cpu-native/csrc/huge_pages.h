// Weights on 2 MiB pages (Linux's transparent huge pages, asked for with madvise).
//
// A decode step of a small batch streams every weight from memory once. On 4 KiB pages each page is a TLB miss
// and the hardware prefetchers stop at its end, so a matrix-vector product read its weight at 27-37 GB/s where the
// machine streams 57: SmolLM2-135M's 30 layers of matmuls took 6.85 ms a token on 4 KiB pages and 4.33 on 2 MiB
// pages, its vocabulary projection 1.20 and 0.87 ms (AMD Zen 4, 2026-12-05). A layer's matrices are 0.7-3.5 MB,
// mostly smaller than a huge page, so the packed weights are placed one after another in chunks of 64 MiB
// aligned to 2 MiB: only the pages written are resident, and a chunk is unmapped when its last tensor goes (a
// sleeping engine's level 2, a model dropped). Where Linux gives no huge page (THP off, none free), the same
// memory is ordinary pages.
#pragma once

#include <ATen/ATen.h>

namespace llmp_native {

// An uninitialised CPU tensor placed in the huge-page chunks (at::empty where no chunk can be mapped)
at::Tensor empty_on_huge_pages(at::IntArrayRef sizes, at::ScalarType dtype);

// A contiguous copy of a CPU tensor there
at::Tensor copy_to_huge_pages(const at::Tensor& tensor);

}  // namespace llmp_native
