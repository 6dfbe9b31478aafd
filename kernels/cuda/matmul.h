// kernels/cuda/matmul.h: y = W x on the GPU for the weight formats of kernels/formats.h.
//
// W is a WeightView whose data and scales are device memory, in exactly the CPU layout (INT4:
// 16-row blocks of 64-byte tiles, 8 columns per tile, and FP16 group scales per block, groups of
// 32, 64 or 128; FP8: e4m3 codes with one FP32 scale per row; BF16; FP32): no repack at load. x is
// [batch, cols] FP32 and stays FP32 (W4A16 in the GPU sense, with FP32 rather than 16-bit
// activations: the CPU reference's numbers), y [batch, rows] FP32; batch 1..64. FP32
// accumulation of exactly dequantised weights, so results are within the kF32Accum budget of
// ref::MatMul (the CPU INT4 kernel's int8 activation rounding does not happen here).
//
// One warp per output row reads the row once per 8 columns of x (x tiles in shared memory). FP8
// and BF16 rows are contiguous: 128-byte transactions. An INT4 row is 4 bytes of every 64-byte
// tile of its block; a thread block's 8 rows (8 warps, rows 8k .. 8k + 7) share each tile's
// 32-byte sector (the codes' allocation being 32-byte aligned, as cudaMalloc's are), so DRAM
// still delivers the matrix once and L1 serves the other warps' reads (not yet measured on a
// device). The GEMV (batch 1) is meant to be bound by HBM bandwidth;
// larger batches re-read W's rows from L2 once per 8 columns. Prefill uses the same kernel with
// FP8 weights.
#ifndef KVGUARD_KERNELS_CUDA_MATMUL_H_
#define KVGUARD_KERNELS_CUDA_MATMUL_H_

#include "absl/status/status.h"
#include "kernels/formats.h"

namespace kvguard::kernels::cuda {

// MatMul computes y[b, r] = sum_c W[r, c] x[b, c]. InvalidArgument for a bad shape (batch
// outside 1..64, an INT4 group that does not divide cols, missing scales, FP8 cols not a
// multiple of 4, BF16 cols odd, weights not 4-byte aligned); the launch error otherwise. Device
// pointers; asynchronous on `stream`.
absl::Status MatMul(const WeightView& w, const float* x, int batch, float* y, void* stream);

}  // namespace kvguard::kernels::cuda

#endif  // KVGUARD_KERNELS_CUDA_MATMUL_H_
