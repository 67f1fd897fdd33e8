// The llmp_native operator library. Each kernel family's .cpp adds its ops with TORCH_LIBRARY_FRAGMENT.
#include <torch/library.h>

#include <string>

#include "isa.h"

TORCH_LIBRARY(llmp_native, m) {
    // the instruction set the hot loops run on: avx512, avx2 or scalar
    m.def("isa() -> str", [] { return std::string(llmp_native::isa_name(llmp_native::selected_isa())); });
}
