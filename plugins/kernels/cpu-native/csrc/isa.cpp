#include "isa.h"

#include <cstdlib>
#include <cstring>

namespace llmp_native {
namespace {

Isa detect() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    // the AVX-512 path uses F for the arithmetic, BW for byte shuffles, VL/DQ for conversions
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
        return Isa::avx512;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
        return Isa::avx2;
    }
#endif
    return Isa::scalar;
}

Isa requested(Isa best) {
    const char* forced = std::getenv("LLMP_NATIVE_ISA");
    if (forced == nullptr || *forced == '\0') return best;
    Isa want = best;
    if (std::strcmp(forced, "scalar") == 0) want = Isa::scalar;
    else if (std::strcmp(forced, "avx2") == 0) want = Isa::avx2;
    else if (std::strcmp(forced, "avx512") == 0) want = Isa::avx512;
    return want < best ? want : best;  // lower only: a path the CPU cannot run would crash
}

}  // namespace

Isa selected_isa() {
    static const Isa isa = requested(detect());
    return isa;
}

const char* isa_name(Isa isa) {
    switch (isa) {
        case Isa::avx512: return "avx512";
        case Isa::avx2: return "avx2";
        default: return "scalar";
    }
}

}  // namespace llmp_native
