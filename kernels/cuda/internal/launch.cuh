// kernels/cuda/internal/launch.cuh: what the .cu files share (not public): launch checks and
// warp/block reductions. Included by CUDA sources only.
#ifndef KVGUARD_KERNELS_CUDA_INTERNAL_LAUNCH_CUH_
#define KVGUARD_KERNELS_CUDA_INTERNAL_LAUNCH_CUH_

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "absl/status/status.h"

namespace kvguard::kernels::cuda::internal {

// LaunchStatus returns OK if no CUDA error is pending, else an internal error naming `what` and
// the error. cudaGetLastError also returns (and clears) an earlier asynchronous failure, so the
// error named may belong to an earlier kernel; callers treat any error as fatal for the step.
inline absl::Status LaunchStatus(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(std::string(what) + ": " + cudaGetErrorString(err));
}

inline cudaStream_t Stream(void* stream) { return static_cast<cudaStream_t>(stream); }

// GridFor returns enough blocks of `threads` for `n` items, capped for grid-stride loops.
inline unsigned GridFor(size_t n, unsigned threads) {
  const size_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b == 0 ? 1 : (b < 65535 ? b : 65535));
}

__device__ __forceinline__ float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// BlockSum / BlockMax reduce one value per thread over the block (blockDim.x a multiple of 32,
// at most 1024); every thread gets the result. `scratch` holds 32 floats of shared memory and
// may be reused after the call returns.
__device__ __forceinline__ float BlockSum(float v, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = WarpSum(v);
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.0f;
  return WarpSum(v);
}

__device__ __forceinline__ float BlockMax(float v, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = WarpMax(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : -INFINITY;
  return WarpMax(v);
}

}  // namespace kvguard::kernels::cuda::internal

#endif  // KVGUARD_KERNELS_CUDA_INTERNAL_LAUNCH_CUH_
