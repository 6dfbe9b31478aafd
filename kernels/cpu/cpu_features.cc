#include "kernels/cpu/internal/cpu_features.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#define KVGUARD_X86_CPUID 1
#else
#define KVGUARD_X86_CPUID 0
#endif

namespace kvguard::kernels::internal {

bool HasAvx512Bf16Vbmi() {
#if KVGUARD_X86_CPUID
  static const bool supported = [] {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    const bool avx512 = (b & (1u << 16)) && (b & (1u << 17)) && (b & (1u << 30)) &&
                        (b & (1u << 31)) && (c & (1u << 1));  // F, DQ, BW, VL; VBMI
    if (!avx512 || a < 1) return false;
    unsigned a1, b1, c1, d1;
    if (!__get_cpuid_count(7, 1, &a1, &b1, &c1, &d1) || !(a1 & (1u << 5))) return false;  // BF16
    // The OS must save the opmask and the full ZMM state (XCR0 bits 1, 2, 5, 6, 7).
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return false;  // OSXSAVE
    unsigned lo, hi;
    asm volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo & 0xE6u) == 0xE6u;
  }();
  return supported;
#else
  return false;
#endif
}

}  // namespace kvguard::kernels::internal
