// kernels/cpu/matmul.h: y = W x for quantised W (FP32, BF16, FP8, INT4) and FP32 x.
//
// Batch 1 is a GEMV; batch > 1 is a small GEMM that streams W once and applies each loaded
// piece of it to every column of x. Work is split over output rows on the caller's pool.
#ifndef KVGUARD_KERNELS_CPU_MATMUL_H_
#define KVGUARD_KERNELS_CPU_MATMUL_H_

#include "kernels/cpu/thread_pool.h"
#include "kernels/formats.h"

namespace kvguard::kernels {

// MatMul computes y[b, r] = sum_c W[r, c] * x[b, c] for b < batch, r < w.rows.
//   x: [batch, w.cols] row-major FP32; y: [batch, w.rows] row-major FP32 (overwritten).
//   batch in [1, 64]. `pool` may be null (single-threaded). Preconditions (CHECKed): a
//   non-empty view, batch in range, FP8 row scales, INT4 group 32/64/128 dividing cols and at
//   most 1024 groups per row.
// FP32, BF16 and FP8 weights multiply x exactly as given (FP32 accumulation error only); INT4
// rounds x to int8 per weight group (the error bound is derived in matmul.cc, and a non-finite
// x makes that column's outputs NaN). Safe to call from several threads at once, each with its
// own pool (or none): per-call scratch is per thread.
void MatMul(const WeightView& w, const float* x, int batch, float* y, ThreadPool* pool);

namespace ref {
// Scalar reference: dequantises each weight and accumulates in FP64, so it is the exact
// product of the dequantised W and x up to one final rounding per output.
void MatMul(const WeightView& w, const float* x, int batch, float* y, ThreadPool* pool);
}  // namespace ref

}  // namespace kvguard::kernels

#endif  // KVGUARD_KERNELS_CPU_MATMUL_H_
