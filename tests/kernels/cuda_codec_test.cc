// The CUDA FP8/BF16 codecs equal the CPU scalar codecs bit for bit. Skips (with the CUDA
// runtime's reason) where no GPU is present; CI still compiles and links it.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/codec.h"
#include "kernels/cuda/codec.h"
#include "kernels/cuda/device_info.h"
#include "kernels/formats.h"

namespace kvguard::kernels {
namespace {

class CudaCodecTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device: " << cuda::NoDeviceReason();
  }

  template <typename T>
  T* Device(size_t n) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, n * sizeof(T) + 1), cudaSuccess);
    allocations_.push_back(p);
    return static_cast<T*>(p);
  }
  void TearDown() override {
    for (void* p : allocations_) cudaFree(p);
  }
  std::vector<void*> allocations_;
};

std::vector<float> InterestingFloats(size_t n) {
  std::vector<float> x = {0.0f,
                          -0.0f,
                          448.0f,
                          -448.0f,
                          464.0f,
                          1e30f,
                          -1e30f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(),
                          0x1p-6f,
                          0x1p-9f,
                          0x1p-10f,
                          0x1.8p-10f,
                          1e-40f,
                          0.1f,
                          -3.3f};
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits;
  std::normal_distribution<float> normal(0.0f, 50.0f);
  while (x.size() < n) {
    x.push_back(x.size() % 3 == 0 ? BitCast<float>(bits(rng)) : normal(rng));
  }
  return x;
}

TEST_F(CudaCodecTest, Fp8MatchesCpuBitForBit) {
  for (float scale : {1.0f, 0.5f, 3.0f, 1e-3f}) {
    const std::vector<float> x = InterestingFloats(100003);
    std::vector<uint8_t> want(x.size()), got(x.size());
    ref::EncodeFp8(x.data(), x.size(), scale, want.data());
    float* dx = Device<float>(x.size());
    uint8_t* dq = Device<uint8_t>(x.size());
    ASSERT_EQ(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_TRUE(cuda::EncodeFp8(dx, x.size(), scale, dq, nullptr).ok());
    ASSERT_EQ(cudaMemcpy(got.data(), dq, got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(got[i], want[i]) << "x=" << x[i];

    std::vector<uint8_t> codes(256 * 4);
    for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>(i);
    std::vector<float> dec_want(codes.size()), dec_got(codes.size());
    ref::DecodeFp8(codes.data(), codes.size(), scale, dec_want.data());
    float* dd = Device<float>(codes.size());
    ASSERT_EQ(cudaMemcpy(dq, codes.data(), codes.size(), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_TRUE(cuda::DecodeFp8(dq, codes.size(), scale, dd, nullptr).ok());
    ASSERT_EQ(cudaMemcpy(dec_got.data(), dd, codes.size() * 4, cudaMemcpyDeviceToHost),
              cudaSuccess);
    for (size_t i = 0; i < codes.size(); ++i) {
      ASSERT_EQ(BitCast<uint32_t>(dec_got[i]), BitCast<uint32_t>(dec_want[i])) << "code " << i;
    }
  }
}

TEST_F(CudaCodecTest, Bf16MatchesCpuBitForBit) {
  const std::vector<float> x = InterestingFloats(100003);
  std::vector<uint16_t> want(x.size()), got(x.size());
  ref::EncodeBf16(x.data(), x.size(), want.data());
  float* dx = Device<float>(x.size());
  uint16_t* dh = Device<uint16_t>(x.size());
  ASSERT_EQ(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_TRUE(cuda::EncodeBf16(dx, x.size(), dh, nullptr).ok());
  ASSERT_EQ(cudaMemcpy(got.data(), dh, got.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(got[i], want[i]) << "x=" << x[i];
  std::vector<float> back(x.size()), back_want(x.size());
  ASSERT_TRUE(cuda::DecodeBf16(dh, x.size(), dx, nullptr).ok());
  ASSERT_EQ(cudaMemcpy(back.data(), dx, x.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ref::DecodeBf16(want.data(), want.size(), back_want.data());
  EXPECT_EQ(std::memcmp(back.data(), back_want.data(), x.size() * 4), 0);
}

// The no-device path itself: DeviceSummary always answers, and names a reason when it skips.
TEST(CudaDeviceInfoTest, SummaryAlwaysAnswers) {
  const std::string s = cuda::DeviceSummary();
  EXPECT_NE(s.find("runtime"), std::string::npos) << s;
  if (cuda::DeviceCount() == 0) {
    EXPECT_FALSE(cuda::NoDeviceReason().empty());
  } else {
    EXPECT_TRUE(cuda::NoDeviceReason().empty());
  }
}

}  // namespace
}  // namespace kvguard::kernels
