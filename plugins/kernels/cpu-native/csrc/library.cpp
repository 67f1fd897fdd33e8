// The llmp_native operator library. Each kernel family's .cpp adds its ops with TORCH_LIBRARY_FRAGMENT.
#include <torch/library.h>

#include <string>

#include "isa.h"

TORCH_LIBRARY(llmp_native, m) {
    // the instruction set the hot loops run on: avx512, avx2 or scalar
    m.def("isa() -> str", [] { return std::string(llmp_native::isa_name(llmp_native::selected_isa())); });
    // what a call runs on: "openmp" (built with -fopenmp: split over torch's OpenMP threads, torch.get_num_threads())
    // or "calling thread" (built without: at::parallel_for runs inline)
    m.def("threads() -> str", [] {
#ifdef _OPENMP
        return std::string("openmp");
#else
        return std::string("calling thread");
#endif
    });
}
