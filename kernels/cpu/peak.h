// kernels/cpu/peak.h: the rate this CPU reaches on the multiply-add instruction a matmul
// arithmetic runs on, measured here and now rather than taken from a datasheet (clock speeds,
// turbo and a shared host's neighbours all move it): the denominator of the "fraction of peak"
// that `kvguard bench prefill` reports.
#ifndef KVGUARD_KERNELS_CPU_PEAK_H_
#define KVGUARD_KERNELS_CPU_PEAK_H_

#include <string>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/thread_pool.h"

namespace kvguard::kernels {

struct PeakRate {
  // Operations per second over all the pool's threads together, a multiply-add counted as two
  // (FLOP/s for kFp32 and kBf16Products, integer OP/s for kInt8Activations). 0 when this CPU
  // has no instruction to measure for that arithmetic (see `instruction`).
  double ops_per_second = 0;
  std::string instruction;  // e.g. "VDPBF16PS zmm", "FMA f32 x16 (AVX3_DL)"
};

// MeasurePeak runs independent chains of `arithmetic`'s multiply-add instruction (enough of
// them to hide its latency) on every thread of `pool` (the caller alone if null) for about
// `seconds`, and returns the rate. The instruction is the one MatMul uses for that arithmetic
// on this CPU: VDPBF16PS for kBf16Products, VPDPBUSD for kInt8Activations where the CPU has
// AVX-512 VNNI (else 0), FMA at the SIMD target dispatch picks for kFp32.
PeakRate MeasurePeak(MatMulArithmetic arithmetic, ThreadPool* pool, double seconds = 0.3);

}  // namespace kvguard::kernels

#endif  // KVGUARD_KERNELS_CPU_PEAK_H_
