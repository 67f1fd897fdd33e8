// Three copies of a hot loop's header, one per instruction-set level, each in its own namespace with its target
// attributes: define LLMP_ISA_IMPL to the header's name, then include this file (inside namespace llmp_native).
//
//     #define LLMP_ISA_IMPL "my_op_impl.h"
//     #include "isa_copies.h"   // -> scalar::..., avx2::..., avx512::... (the last two on x86 only)
//
// The header sees LLMP_TARGET (the function attributes of its level) and LLMP_ISA_LEVEL (0 scalar, 1 AVX2,
// 2 AVX-512). The vector types of the AVX2 and AVX-512 copies live only inside their own target functions, all
// inlined: no call between differently compiled code passes them, whatever GCC's ABI note (-Wpsabi) says.
// No include guard: included once per kernel family.

#pragma GCC diagnostic ignored "-Wpsabi"
namespace scalar {
#define LLMP_TARGET
#define LLMP_ISA_LEVEL 0
#include LLMP_ISA_IMPL
#undef LLMP_ISA_LEVEL
#undef LLMP_TARGET
}  // namespace scalar

#ifdef LLMP_X86
namespace avx2 {
#define LLMP_TARGET LLMP_TARGET_AVX2
#define LLMP_ISA_LEVEL 1
#include LLMP_ISA_IMPL
#undef LLMP_ISA_LEVEL
#undef LLMP_TARGET
}  // namespace avx2
namespace avx512 {
#define LLMP_TARGET LLMP_TARGET_AVX512
#define LLMP_ISA_LEVEL 2
#include LLMP_ISA_IMPL
#undef LLMP_ISA_LEVEL
#undef LLMP_TARGET
}  // namespace avx512
#endif

#undef LLMP_ISA_IMPL
