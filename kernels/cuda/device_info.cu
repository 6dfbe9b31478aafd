#include <cuda_runtime.h>

#include <string>

#include "kernels/cuda/device_info.h"

#ifndef KVGUARD_CUDA_ARCHITECTURES
#define KVGUARD_CUDA_ARCHITECTURES "unknown"
#endif

namespace kvguard::kernels::cuda {

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later calls start clean
    return 0;
  }
  return n;
}

std::string NoDeviceReason() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
  }
  return n == 0 ? "no CUDA device present" : "";
}

std::string DeviceSummary() {
  int runtime = 0;
  cudaRuntimeGetVersion(&runtime);
  std::string s = "runtime " + std::to_string(runtime / 1000) + "." +
                  std::to_string(runtime % 1000 / 10) + ", sm " + KVGUARD_CUDA_ARCHITECTURES;
  const int n = DeviceCount();
  if (n == 0) return s + ", no device: " + NoDeviceReason();
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) == cudaSuccess) {
      s += ", device " + std::to_string(i) + ": " + prop.name + " (sm_" +
           std::to_string(prop.major) + std::to_string(prop.minor) + ", " +
           std::to_string(prop.totalGlobalMem >> 20) + " MiB)";
    }
  }
  return s;
}

}  // namespace kvguard::kernels::cuda
