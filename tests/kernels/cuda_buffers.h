// tests/kernels/cuda_buffers.h: device memory for the CUDA kernel tests (host code only).
#ifndef KVGUARD_TESTS_KERNELS_CUDA_BUFFERS_H_
#define KVGUARD_TESTS_KERNELS_CUDA_BUFFERS_H_

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

#include "kernels/cuda/device_info.h"

namespace kvguard::kernels::testing {

// DeviceBuffer owns `count` elements of T on the device (one spare byte, so a zero-length
// buffer is still a valid pointer).
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t count) : count_(count) {
    EXPECT_EQ(cudaMalloc(&p_, count * sizeof(T) + 1), cudaSuccess);
  }
  template <typename Alloc>
  explicit DeviceBuffer(const std::vector<T, Alloc>& host) : DeviceBuffer(host.size()) {
    Upload(host);
  }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return static_cast<T*>(p_); }
  template <typename Alloc>
  void Upload(const std::vector<T, Alloc>& host) {
    ASSERT_LE(host.size(), count_);
    ASSERT_EQ(cudaMemcpy(p_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  std::vector<T> Download() const {
    std::vector<T> host(count_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(host.data(), p_, count_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }

 private:
  void* p_ = nullptr;
  size_t count_;
};

// SkipWithoutDevice skips the calling test with the CUDA runtime's reason when no GPU is
// present (CI compiles and links the tests; they run where a GPU is).
#define KVGUARD_SKIP_WITHOUT_CUDA_DEVICE()                                              \
  do {                                                                                  \
    if (::kvguard::kernels::cuda::DeviceCount() == 0) {                                 \
      GTEST_SKIP() << "no CUDA device: " << ::kvguard::kernels::cuda::NoDeviceReason(); \
    }                                                                                   \
  } while (0)

}  // namespace kvguard::kernels::testing

#endif  // KVGUARD_TESTS_KERNELS_CUDA_BUFFERS_H_
