// kernels/cpu/internal/cpu_features.h: CPU features that kernels outside Highway's dispatch
// check at run time (not public). Highway's own targets cover the rest.
#ifndef KVGUARD_KERNELS_CPU_INTERNAL_CPU_FEATURES_H_
#define KVGUARD_KERNELS_CPU_INTERNAL_CPU_FEATURES_H_

namespace kvguard::kernels::internal {

// HasAvx512Bf16Vbmi returns whether this CPU runs the BF16 dot-product kernels
// (attention_bf16dot.cc, matmul_bf16dot.cc): x86-64 with AVX-512 F, BW, VL, DQ, VBMI and BF16,
// and an OS that saves the AVX-512 state. Zen 4, Zen 5 and Sapphire Rapids have them; Ice Lake
// and Zen 3 do not. Read once.
bool HasAvx512Bf16Vbmi();

}  // namespace kvguard::kernels::internal

#endif  // KVGUARD_KERNELS_CPU_INTERNAL_CPU_FEATURES_H_
