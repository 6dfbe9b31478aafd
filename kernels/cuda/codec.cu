#include <cuda_runtime.h>

#include <string>

#include "kernels/cuda/codec.h"
#include "kernels/cuda/internal/launch.cuh"
#include "kernels/formats.h"

namespace kvguard::kernels::cuda {
namespace {

using internal::LaunchStatus;

constexpr int kThreads = 256;

// Grid-stride loops: one launch covers any n without a grid-size limit.
__global__ void EncodeFp8Kernel(const float* x, size_t n, float scale, uint8_t* out) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    out[i] = Fp8E4m3FromFloat(__fdiv_rn(x[i], scale));
  }
}

__global__ void DecodeFp8Kernel(const uint8_t* in, size_t n, float scale, float* out) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    out[i] = __fmul_rn(Fp8E4m3ToFloat(in[i]), scale);
  }
}

__global__ void EncodeBf16Kernel(const float* x, size_t n, uint16_t* out) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    out[i] = Bf16FromFloat(x[i]);
  }
}

__global__ void DecodeBf16Kernel(const uint16_t* in, size_t n, float* out) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    out[i] = Bf16ToFloat(in[i]);
  }
}

unsigned Blocks(size_t n) { return internal::GridFor(n, kThreads); }

}  // namespace

absl::Status EncodeFp8(const float* x, size_t n, float scale, uint8_t* out, void* stream) {
  if (n == 0) return absl::OkStatus();
  EncodeFp8Kernel<<<Blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, n, scale, out);
  return LaunchStatus("EncodeFp8");
}

absl::Status DecodeFp8(const uint8_t* in, size_t n, float scale, float* out, void* stream) {
  if (n == 0) return absl::OkStatus();
  DecodeFp8Kernel<<<Blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(in, n, scale, out);
  return LaunchStatus("DecodeFp8");
}

absl::Status EncodeBf16(const float* x, size_t n, uint16_t* out, void* stream) {
  if (n == 0) return absl::OkStatus();
  EncodeBf16Kernel<<<Blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, n, out);
  return LaunchStatus("EncodeBf16");
}

absl::Status DecodeBf16(const uint16_t* in, size_t n, float* out, void* stream) {
  if (n == 0) return absl::OkStatus();
  DecodeBf16Kernel<<<Blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(in, n, out);
  return LaunchStatus("DecodeBf16");
}

}  // namespace kvguard::kernels::cuda
