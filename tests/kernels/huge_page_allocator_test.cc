#include "kernels/cpu/huge_page_allocator.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <utility>

#include "kernels/cpu/quantize.h"

namespace kvguard::kernels {
namespace {

bool HugeAligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kHugePageBytes == 0; }

// A buffer of at least one huge page starts on a huge-page boundary (so the kernel can back it
// with whole 2 MiB pages) and holds what is written to it, through growth, copy and move.
TEST(HugePageAllocatorTest, LargeBuffersAreHugePageAlignedAndKeepTheirContents) {
  HugePageVector<uint32_t> v(kHugePageBytes / sizeof(uint32_t) + 123);
  ASSERT_TRUE(HugeAligned(v.data()));
  std::iota(v.begin(), v.end(), 7u);
  v.resize(3 * v.size());  // reallocates: a new aligned block, old contents copied
  ASSERT_TRUE(HugeAligned(v.data()));
  for (uint32_t i = 0; i < 1000; ++i) ASSERT_EQ(v[i], 7u + i);
  const HugePageVector<uint32_t> copy = v;
  EXPECT_TRUE(HugeAligned(copy.data()));
  EXPECT_EQ(copy, v);
  HugePageVector<uint32_t> moved = std::move(v);
  EXPECT_EQ(moved, copy);
}

// Positive twin: below one huge page the ordinary allocator serves (no 2 MiB alignment is
// spent on small matrices), and such buffers work the same way.
TEST(HugePageAllocatorTest, SmallBuffersUseTheOrdinaryAllocator) {
  int misaligned = 0;
  for (int i = 0; i < 8; ++i) {
    HugePageVector<uint8_t> v(4096 + i);
    misaligned += HugeAligned(v.data()) ? 0 : 1;
    v.back() = 42;
    EXPECT_EQ(v.back(), 42);
  }
  EXPECT_GT(misaligned, 0) << "small buffers should not all be 2 MiB-aligned";
}

// The weight matrices the engine streams every step use it.
TEST(HugePageAllocatorTest, QuantizedMatrixCodesSitOnHugePages) {
  std::vector<float> w(size_t{2048} * 2048, 0.01f);
  const QuantizedMatrix fp8 = QuantizeMatrix(w.data(), 2048, 2048, WeightFormat::kFp8);
  EXPECT_TRUE(HugeAligned(fp8.data.data()));
  const QuantizedMatrix small = QuantizeMatrix(w.data(), 16, 2048, WeightFormat::kFp8);
  EXPECT_EQ(small.data.size(), size_t{16} * 2048);
}

}  // namespace
}  // namespace kvguard::kernels
