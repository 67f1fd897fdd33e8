// Which instruction set the hot loops run on: chosen once, when the library loads.
#pragma once

// The function attributes of each level's copy of a hot loop (the scalar copy has none); an AVX-512 BF16 kernel
// (dense_matmul) adds its own. The checks in isa.cpp select a level only where its features are all present.
#define LLMP_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define LLMP_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))

namespace llmp_native {

enum class Isa { scalar = 0, avx2 = 1, avx512 = 2 };

// The best level this CPU runs, lowered to LLMP_NATIVE_ISA (scalar | avx2 | avx512) when that is set.
// A level the CPU lacks is never chosen, whatever the variable says.
Isa selected_isa();

const char* isa_name(Isa isa);

}  // namespace llmp_native
