// kernels/cpu/internal/matmul_bf16dot.h: the BF16 dot-product matmul (not public: MatMul in
// matmul.h runs it for MatMulActivations::kBf16 where the CPU has it).
#ifndef KVGUARD_KERNELS_CPU_INTERNAL_MATMUL_BF16DOT_H_
#define KVGUARD_KERNELS_CPU_INTERNAL_MATMUL_BF16DOT_H_

#include <cstdint>

#include "kernels/cpu/thread_pool.h"
#include "kernels/formats.h"

namespace kvguard::kernels::matmul_internal {

// MatMulBf16Dot computes MatMul's y for FP8 or BF16 `w` with x rounded to BF16 and the weights
// exact, summing products in FP32 with VDPBF16PS (matmul_bf16dot.cc derives the error). `call`
// is matmul_internal::NextCall() of this call (each thread packs x once per call). Only call it
// when internal::HasAvx512Bf16Vbmi(); batch in [1, kMaxBf16DotBatch].
// The most columns one call takes: x is packed per thread (batch x cols BF16), so larger
// batches are cut into calls (matmul.cc, MatMulImpl), each widening W once more; at 512 columns
// that widening is under 1% of the call's multiply-adds.
inline constexpr int kMaxBf16DotBatch = 512;

void MatMulBf16Dot(const WeightView& w, const float* x, int batch, float* y, ThreadPool* pool,
                   uint64_t call);

// Fp8CodeToBf16 returns the BF16 encoding of e4m3 code `code`'s value, exactly (the NaN codes
// as +-480, as MatMul's FP32 kernel reads them).
uint16_t Fp8CodeToBf16(uint8_t code);

}  // namespace kvguard::kernels::matmul_internal

#endif  // KVGUARD_KERNELS_CPU_INTERNAL_MATMUL_BF16DOT_H_
