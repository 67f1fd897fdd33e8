// The llmp_native operator library. Each kernel family's .cpp adds its ops with TORCH_LIBRARY_FRAGMENT.
#include <torch/library.h>

#include <string>

#include "isa.h"
#include "work_pool.h"

TORCH_LIBRARY(llmp_native, m) {
    // the instruction set the hot loops run on: avx512, avx2 or scalar
    m.def("isa() -> str", [] { return std::string(llmp_native::isa_name(llmp_native::selected_isa())); });
    // what a call runs on: the calling thread and helpers up to torch's thread count (torch.get_num_threads()),
    // claiming chunks of the call one at a time (work_pool.h)
    m.def("threads() -> str", [] { return std::string(llmp_native::work_sharing()); });
}
