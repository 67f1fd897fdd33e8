// Which instruction set the hot loops run on: chosen once, when the library loads.
#pragma once

namespace llmp_native {

enum class Isa { scalar = 0, avx2 = 1, avx512 = 2 };

// The best level this CPU runs, lowered to LLMP_NATIVE_ISA (scalar | avx2 | avx512) when that is set.
// A level the CPU lacks is never chosen, whatever the variable says.
Isa selected_isa();

const char* isa_name(Isa isa);

}  // namespace llmp_native
