// GCC's generic 16-lane vectors, shared by the kernels written once and compiled per instruction set
// (paged_attention_impl.h, elementwise_impl.h): the AVX-512 copy runs a Vf in one register, the AVX2 copy in
// two, the scalar copy in SSE2. Their arithmetic is in vec16_math.h, included inside each copy's namespace.
#pragma once

#include <cstdint>

namespace llmp_native {

constexpr int kLanes = 16;
typedef float Vf __attribute__((vector_size(kLanes * sizeof(float))));
typedef int32_t Vi __attribute__((vector_size(kLanes * sizeof(int32_t))));
typedef uint32_t Vu __attribute__((vector_size(kLanes * sizeof(uint32_t))));
typedef uint16_t Vh __attribute__((vector_size(kLanes * sizeof(uint16_t))));  // 16 bfloat16 bits

constexpr float kExpMin = -87.3365448f, kExpMax = 88.3762626f;
constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;

}  // namespace llmp_native
