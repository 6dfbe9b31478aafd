// tests/kernels/peak_test.cc: MeasurePeak (kernels/cpu/peak.h) measures the instruction MatMul
// uses for each arithmetic on this CPU, or says there is none. No figure is checked beyond
// "a positive, finite rate": how fast a shared machine is at the moment is not a test verdict.
#include "kernels/cpu/peak.h"

#include <cmath>

#include "gtest/gtest.h"

namespace kvguard::kernels {
namespace {

void ExpectMeasured(const PeakRate& r) {
  EXPECT_GT(r.ops_per_second, 0) << r.instruction;
  EXPECT_TRUE(std::isfinite(r.ops_per_second)) << r.instruction;
  EXPECT_EQ(r.instruction.rfind("none", 0), std::string::npos) << r.instruction;
}

TEST(PeakTest, Fp32IsMeasuredEverywhereOnTheDispatchedTarget) {
  ThreadPool pool(2);
  const PeakRate r = MeasurePeak(MatMulArithmetic::kFp32, &pool, 0.02);
  ExpectMeasured(r);
  EXPECT_EQ(r.instruction.rfind("FMA f32 x", 0), 0u) << r.instruction;
}

TEST(PeakTest, Bf16IsMeasuredExactlyWhereMatMulUsesBf16DotProducts) {
  const bool bf16 = MatMulArithmeticFor(WeightFormat::kFp8, MatMulActivations::kBf16) ==
                    MatMulArithmetic::kBf16Products;
  const PeakRate r = MeasurePeak(MatMulArithmetic::kBf16Products, nullptr, 0.02);
  if (bf16) {
    ExpectMeasured(r);
    EXPECT_EQ(r.instruction, "VDPBF16PS zmm");
  } else {
    EXPECT_EQ(r.ops_per_second, 0);
    EXPECT_EQ(r.instruction, "none (no AVX-512 BF16)");
  }
}

TEST(PeakTest, Int8IsMeasuredWhereTheCpuHasVnniOrSaysItIsNot) {
  const PeakRate r = MeasurePeak(MatMulArithmetic::kInt8Activations, nullptr, 0.02);
  if (r.ops_per_second > 0) {
    EXPECT_EQ(r.instruction, "VPDPBUSD zmm");
    EXPECT_TRUE(std::isfinite(r.ops_per_second));
  } else {
    EXPECT_EQ(r.instruction, "none (no AVX-512 VNNI)");
  }
}

}  // namespace
}  // namespace kvguard::kernels
