// Tests for the per-token operators: the scalar references against hand-computed values and
// invariants, and the SIMD versions (every supported Highway target) against the references
// within named error budgets, for every length 1..300 (all tails).
#include "kernels/cpu/ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/dispatch.h"

namespace kvguard::kernels {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr size_t kMaxLength = 300;

// Error budgets of the SIMD kernels against the (double-precision) references, with the largest
// errors measured on this machine's six targets (AVX3_DL ... SCALAR) in brackets.
// RmsNorm: FP32 sum of squares in 4 vector accumulators, rsqrt, two multiplies; relative to
// each output [2.24 ulp].
constexpr double kRmsNormRelBudget = 4 * FLT_EPSILON;
// Rope: cos/sin rounded to FP32, one FMA and one multiply; relative to the pair's norm [1.2].
constexpr double kRopeNormBudget = 2 * FLT_EPSILON;
// SiluMul: Highway's Exp is within 1 ulp (its documented bound), then add, divide, multiply;
// relative [2.0 ulp]. Below ~1e-36 (gate < -88, where FP32 exp overflows and the result is -0)
// only the absolute floor applies.
constexpr double kSiluMulRelBudget = 4 * FLT_EPSILON;
constexpr double kSiluMulAbsFloor = 1e-35;
// Softmax: x - max is rounded in FP32, which moves exp(x - max) by up to |x - max| * 2^-24
// relative (a property of any FP32 softmax); on top of that Exp (1 ulp), the FP32 sum and the
// reciprocal [2.14 ulp], relative to each probability.
constexpr double kSoftmaxRelBudget = 4 * FLT_EPSILON;
double SoftmaxBudget(float x, float max, float p) {
  return (std::fabs(static_cast<double>(x) - max) * 0x1p-24 + kSoftmaxRelBudget) * p;
}

template <typename Body>
void ForEachTarget(Body body) {
  struct Reset {
    ~Reset() { ResetTarget(); }
  } reset;
  const std::vector<int64_t> targets = SupportedTargets();
  ASSERT_FALSE(targets.empty());
  for (int64_t t : targets) {
    SCOPED_TRACE(TargetName(t));
    ForceTarget(t);
    body();
  }
}

std::vector<float> Normal(std::mt19937& rng, size_t n, float sigma) {
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// ---------------------------------------------------------------------------------------------
// RmsNorm
// ---------------------------------------------------------------------------------------------

TEST(RmsNormRef, HandComputedValues) {
  const float x[2] = {3.0f, 4.0f};
  const float w[2] = {1.0f, 2.0f};
  float out[2];
  ref::RmsNorm(x, w, 2, 0.0f, out);  // rms = sqrt(12.5)
  EXPECT_FLOAT_EQ(out[0], 3.0f / std::sqrt(12.5f));
  EXPECT_FLOAT_EQ(out[1], 8.0f / std::sqrt(12.5f));
}

// RmsNorm of a constant vector c is sign(c) * weight (eps = 0), for every implementation.
void ExpectConstantVectorNormalises(void (*rms_norm)(const float*, const float*, size_t, float,
                                                     float*)) {
  for (size_t n : {1, 7, 16, 33, 300}) {
    for (float c : {3.0f, -2.5f, 1e-3f, 1e3f}) {
      std::vector<float> x(n, c), w(n), out(n);
      for (size_t i = 0; i < n; ++i) w[i] = static_cast<float>(i % 5 + 1);
      rms_norm(x.data(), w.data(), n, 0.0f, out.data());
      for (size_t i = 0; i < n; ++i) {
        EXPECT_NEAR(out[i], std::copysign(w[i], c), 2e-6 * w[i]) << "n=" << n << " c=" << c;
      }
    }
  }
  // eps keeps an all-zero input finite; without eps it is 0/0 (the negative twin).
  std::vector<float> zeros(8, 0.0f), ones(8, 1.0f), out(8);
  rms_norm(zeros.data(), ones.data(), 8, 1e-5f, out.data());
  for (float v : out) EXPECT_EQ(v, 0.0f);
  rms_norm(zeros.data(), ones.data(), 8, 0.0f, out.data());
  for (float v : out) EXPECT_TRUE(std::isnan(v));
}

TEST(RmsNormRef, ConstantVector) { ExpectConstantVectorNormalises(&ref::RmsNorm); }

TEST(RmsNorm, ConstantVectorOnEveryTarget) {
  ForEachTarget([] { ExpectConstantVectorNormalises(&RmsNorm); });
}

TEST(RmsNorm, MatchesRefOnEveryTargetAndLength) {
  std::mt19937 rng(11);
  ForEachTarget([&] {
    for (size_t n = 1; n <= kMaxLength; ++n) {
      const std::vector<float> x = Normal(rng, n, 2.0f);
      std::vector<float> w = Normal(rng, n, 1.0f);
      std::vector<float> want(n), got(n), in_place = x;
      ref::RmsNorm(x.data(), w.data(), n, 1e-5f, want.data());
      RmsNorm(x.data(), w.data(), n, 1e-5f, got.data());
      RmsNorm(in_place.data(), w.data(), n, 1e-5f, in_place.data());  // out aliases x
      for (size_t i = 0; i < n; ++i) {
        const double budget = kRmsNormRelBudget * std::fabs(want[i]) + 1e-30;
        ASSERT_NEAR(got[i], want[i], budget) << "n=" << n << " i=" << i;
        ASSERT_EQ(in_place[i], got[i]) << "n=" << n << " i=" << i;
      }
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Rope
// ---------------------------------------------------------------------------------------------

TEST(RopeRef, PositionZeroIsIdentity) {
  std::mt19937 rng(12);
  std::vector<float> x = Normal(rng, 4 * 128, 1.0f);
  const std::vector<float> before = x;
  ref::Rope(x.data(), 4, 128, 0, 10000.0f);
  EXPECT_EQ(x, before);
  ref::Rope(x.data(), 4, 128, 1, 10000.0f);  // twin: any other position moves it
  EXPECT_NE(x, before);
}

TEST(RopeRef, HandComputedRotations) {
  // head_dim 2: one frequency, theta^0 = 1, so the angle is the position in radians.
  float x[2] = {1.0f, 0.0f};
  ref::Rope(x, 1, 2, 1, 10000.0f);
  EXPECT_FLOAT_EQ(x[0], static_cast<float>(std::cos(1.0)));
  EXPECT_FLOAT_EQ(x[1], static_cast<float>(std::sin(1.0)));
  // head_dim 4, theta 10000: frequency 1 is 10000^(-2/4) = 0.01, so position 100 is 1 rad;
  // pairs are (x[i], x[i + 2]), rotate-half.
  float y[4] = {0.0f, 2.0f, 0.0f, 0.0f};
  ref::Rope(y, 1, 4, 100, 10000.0f);
  EXPECT_NEAR(y[1], 2 * std::cos(1.0), 1e-6);
  EXPECT_NEAR(y[3], 2 * std::sin(1.0), 1e-6);
  EXPECT_NEAR(y[0], 0.0f, 1e-6);  // frequency 0 rotates (0, 0): still zero
  EXPECT_NEAR(y[2], 0.0f, 1e-6);
}

TEST(RopeRef, LongPositionsKeepTheAngleExact) {
  // Angles of 1e5 rad: an FP32 angle would be off by ~4e-3 rad here.
  for (int pos : {65536, 100000, 131071}) {
    for (float theta : {10000.0f, 500000.0f}) {
      constexpr int kHeadDim = 128;
      std::vector<float> x(kHeadDim, 0.0f);
      for (int i = 0; i < kHeadDim / 2; ++i) x[i] = 1.0f;
      ref::Rope(x.data(), 1, kHeadDim, pos, theta);
      for (int i = 0; i < kHeadDim / 2; ++i) {
        const long double angle = static_cast<long double>(pos) *
                                  std::pow(static_cast<long double>(theta), -2.0L * i / kHeadDim);
        EXPECT_NEAR(x[i], static_cast<double>(std::cos(angle)), 2e-7) << pos << " " << i;
        EXPECT_NEAR(x[i + kHeadDim / 2], static_cast<double>(std::sin(angle)), 2e-7)
            << pos << " " << i;
      }
    }
  }
}

TEST(RopeRef, RotationsPreserveNormsAndCompose) {
  std::mt19937 rng(13);
  constexpr int kHeads = 2, kHeadDim = 64;
  const std::vector<float> x = Normal(rng, kHeads * kHeadDim, 1.0f);
  std::vector<float> once = x, twice = x;
  ref::Rope(once.data(), kHeads, kHeadDim, 1234, 10000.0f);
  ref::Rope(twice.data(), kHeads, kHeadDim, 1000, 10000.0f);
  ref::Rope(twice.data(), kHeads, kHeadDim, 234, 10000.0f);
  for (int h = 0; h < kHeads; ++h) {
    for (int i = 0; i < kHeadDim / 2; ++i) {
      const size_t a = h * kHeadDim + i, b = a + kHeadDim / 2;
      const double norm = std::hypot(x[a], x[b]);
      EXPECT_NEAR(std::hypot(once[a], once[b]), norm, 2 * FLT_EPSILON * norm);
      EXPECT_NEAR(once[a], twice[a], 1e-5);
      EXPECT_NEAR(once[b], twice[b], 1e-5);
    }
  }
}

TEST(Rope, MatchesRefOnEveryTargetHeadDimAndPosition) {
  std::mt19937 rng(14);
  ForEachTarget([&] {
    for (int head_dim = 2; head_dim <= 2 * static_cast<int>(kMaxLength); head_dim += 2) {
      const int heads = 1 + head_dim % 3;
      for (int pos : {0, 1, 17, 4095, 100000}) {
        const float theta = head_dim % 4 == 0 ? 10000.0f : 500000.0f;
        const std::vector<float> x = Normal(rng, static_cast<size_t>(heads) * head_dim, 1.0f);
        std::vector<float> want = x, got = x;
        ref::Rope(want.data(), heads, head_dim, pos, theta);
        Rope(got.data(), heads, head_dim, pos, theta);
        for (int h = 0; h < heads; ++h) {
          for (int i = 0; i < head_dim / 2; ++i) {
            const size_t a = static_cast<size_t>(h) * head_dim + i, b = a + head_dim / 2;
            const double budget = kRopeNormBudget * std::hypot(x[a], x[b]);
            ASSERT_NEAR(got[a], want[a], budget) << head_dim << " " << pos << " " << i;
            ASSERT_NEAR(got[b], want[b], budget) << head_dim << " " << pos << " " << i;
          }
        }
        if (pos == 0) {
          ASSERT_EQ(got, x);  // exactly the identity on every target
        }
      }
    }
  });
}

TEST(RopeDeath, RejectsOddHeadDim) {
  std::vector<float> x(6, 1.0f);
  EXPECT_DEATH(Rope(x.data(), 2, 3, 5, 10000.0f), "head_dim");
  EXPECT_DEATH(ref::Rope(x.data(), 2, 3, 5, 10000.0f), "head_dim");
  Rope(x.data(), 3, 2, 5, 10000.0f);  // twin: the same buffer as 3 heads of 2 is fine
  EXPECT_NEAR(std::hypot(x[0], x[1]), std::sqrt(2.0), 1e-6);
}

// ---------------------------------------------------------------------------------------------
// SiluMul
// ---------------------------------------------------------------------------------------------

// ExpectSiluMulHandValues checks silu(g) * u = g / (1 + e^-g) * u at hand-computed points.
void ExpectSiluMulHandValues(void (*silu_mul)(const float*, const float*, size_t, float*)) {
  const float gate[] = {0.0f, 1.0f, -1.0f, 100.0f, -100.0f, -1000.0f, 20.0f, kInf};
  const float up[] = {5.0f, 2.0f, 2.0f, 0.5f, 1.0f, 1.0f, -1.0f, 1.0f};
  float out[8];
  silu_mul(gate, up, 8, out);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_FLOAT_EQ(out[1], 1.4621171572600098f);   // 2 / (1 + e^-1)
  EXPECT_FLOAT_EQ(out[2], -0.5378828427399902f);  // -2 / (1 + e)
  EXPECT_EQ(out[3], 50.0f);
  EXPECT_LE(std::fabs(out[4]), 1e-35f);  // -100 / e^100 ~ -3.7e-42
  EXPECT_LE(out[4], 0.0f);
  EXPECT_EQ(out[5], 0.0f);  // -0
  EXPECT_FLOAT_EQ(out[6], -20.0f / (1.0f + std::exp(-20.0f)));
  EXPECT_EQ(out[7], kInf);
}

TEST(SiluMulRef, HandComputedValues) { ExpectSiluMulHandValues(&ref::SiluMul); }

TEST(SiluMul, HandComputedValuesOnEveryTarget) {
  ForEachTarget([] { ExpectSiluMulHandValues(&SiluMul); });
}

TEST(SiluMul, MatchesRefOnEveryTargetAndLength) {
  std::mt19937 rng(15);
  const float extremes[] = {-1000.0f, -100.0f, -89.0f, -88.0f, -20.0f, 20.0f, 100.0f, 1000.0f};
  ForEachTarget([&] {
    for (size_t n = 1; n <= kMaxLength; ++n) {
      std::vector<float> gate = Normal(rng, n, 4.0f);
      const std::vector<float> up = Normal(rng, n, 1.0f);
      for (size_t i = 0; i < n; i += 7) gate[i] = extremes[(n + i) % std::size(extremes)];
      std::vector<float> want(n), got(n), alias_gate = gate, alias_up = up;
      ref::SiluMul(gate.data(), up.data(), n, want.data());
      SiluMul(gate.data(), up.data(), n, got.data());
      SiluMul(alias_gate.data(), up.data(), n, alias_gate.data());
      SiluMul(gate.data(), alias_up.data(), n, alias_up.data());
      for (size_t i = 0; i < n; ++i) {
        const double budget =
            kSiluMulRelBudget * std::fabs(want[i]) + kSiluMulAbsFloor * std::fabs(up[i]);
        ASSERT_NEAR(got[i], want[i], budget) << "n=" << n << " gate=" << gate[i];
        ASSERT_EQ(alias_gate[i], got[i]);
        ASSERT_EQ(alias_up[i], got[i]);
      }
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Softmax
// ---------------------------------------------------------------------------------------------

// ExpectSoftmaxHandValues checks properties any correct softmax has.
void ExpectSoftmaxHandValues(void (*softmax)(float*, size_t)) {
  float one[1] = {-7.0f};
  softmax(one, 1);
  EXPECT_EQ(one[0], 1.0f);

  std::vector<float> equal(37, 2.5f);
  softmax(equal.data(), equal.size());
  for (float p : equal) EXPECT_FLOAT_EQ(p, 1.0f / 37);

  // A huge logit takes everything and nothing overflows.
  float huge[5] = {1e30f, 0.0f, -1e30f, 5.0f, FLT_MAX};
  softmax(huge, 4);
  EXPECT_EQ(huge[0], 1.0f);
  EXPECT_EQ(huge[1], 0.0f);
  EXPECT_EQ(huge[2], 0.0f);
  EXPECT_EQ(huge[3], 0.0f);
  EXPECT_EQ(huge[4], FLT_MAX);  // untouched past n

  // -inf logits (masked positions) get exactly 0; the rest renormalise.
  float masked[3] = {0.0f, -kInf, 0.0f};
  softmax(masked, 3);
  EXPECT_FLOAT_EQ(masked[0], 0.5f);
  EXPECT_EQ(masked[1], 0.0f);
  EXPECT_FLOAT_EQ(masked[2], 0.5f);

  float pair[2] = {0.0f, std::log(3.0f)};  // 1 : 3
  softmax(pair, 2);
  EXPECT_FLOAT_EQ(pair[0], 0.25f);
  EXPECT_FLOAT_EQ(pair[1], 0.75f);
}

TEST(SoftmaxRef, HandComputedValues) { ExpectSoftmaxHandValues(&ref::Softmax); }

TEST(Softmax, HandComputedValuesOnEveryTarget) {
  ForEachTarget([] { ExpectSoftmaxHandValues(&Softmax); });
}

// ExpectSumsToOneAndShiftInvariant checks both invariants for lengths 1..300.
void ExpectSumsToOneAndShiftInvariant(void (*softmax)(float*, size_t)) {
  std::mt19937 rng(16);
  std::uniform_real_distribution<float> logit(-20.0f, 20.0f);
  for (size_t n = 1; n <= kMaxLength; ++n) {
    std::vector<float> x(n);
    // On a 2^-16 grid, so that x + 64 is exact and the shift changes nothing but the offset.
    for (float& v : x) v = std::round(logit(rng) * 65536.0f) / 65536.0f;
    std::vector<float> p = x, shifted(n);
    for (size_t i = 0; i < n; ++i) shifted[i] = x[i] + 64.0f;
    softmax(p.data(), n);
    softmax(shifted.data(), n);
    double sum = 0.0;
    for (size_t i = 0; i < n; ++i) {
      ASSERT_GE(p[i], 0.0f);
      sum += p[i];
      ASSERT_NEAR(shifted[i], p[i], kSoftmaxRelBudget * p[i]) << "n=" << n;
    }
    ASSERT_NEAR(sum, 1.0, 2e-6) << "n=" << n;
  }
}

TEST(SoftmaxRef, SumsToOneAndIsShiftInvariant) { ExpectSumsToOneAndShiftInvariant(&ref::Softmax); }

TEST(Softmax, SumsToOneAndIsShiftInvariantOnEveryTarget) {
  ForEachTarget([] { ExpectSumsToOneAndShiftInvariant(&Softmax); });
}

TEST(Softmax, MatchesRefOnEveryTargetAndLength) {
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> logit(-20.0f, 20.0f);
  ForEachTarget([&] {
    for (size_t n = 1; n <= kMaxLength; ++n) {
      std::vector<float> x(n);
      for (float& v : x) v = logit(rng);
      std::vector<float> want = x, got = x;
      ref::Softmax(want.data(), n);
      Softmax(got.data(), n);
      const float max = *std::max_element(x.begin(), x.end());
      for (size_t i = 0; i < n; ++i) {
        ASSERT_NEAR(got[i], want[i], SoftmaxBudget(x[i], max, want[i])) << "n=" << n << " i=" << i;
      }
    }
  });
}

TEST(SoftmaxDeath, RejectsEmptyInput) {
  float x[1] = {3.0f};
  EXPECT_DEATH(Softmax(x, 0), "n must be");
  EXPECT_DEATH(ref::Softmax(x, 0), "n must be");
  Softmax(x, 1);  // twin
  EXPECT_EQ(x[0], 1.0f);
}

// ---------------------------------------------------------------------------------------------
// Argmax
// ---------------------------------------------------------------------------------------------

// ExpectArgmaxRules checks the first-index tie rule and the NaN rule at hand-picked inputs.
void ExpectArgmaxRules(size_t (*argmax)(const float*, size_t)) {
  const float ties[] = {1.0f, 3.0f, 3.0f, 2.0f};
  EXPECT_EQ(argmax(ties, 4), 1u);
  const float larger_later[] = {1.0f, 3.0f, 3.5f, 2.0f};  // twin: a larger later value wins
  EXPECT_EQ(argmax(larger_later, 4), 2u);

  // Ties far apart, in different vector lanes and blocks, and in the tail.
  std::vector<float> spread(67, 0.0f);
  spread[66] = 1.0f;
  EXPECT_EQ(argmax(spread.data(), spread.size()), 66u);
  spread[37] = 1.0f;
  EXPECT_EQ(argmax(spread.data(), spread.size()), 37u);
  spread[5] = 1.0f;
  EXPECT_EQ(argmax(spread.data(), spread.size()), 5u);

  const float nan_first[] = {kNan, 1.0f, 2.0f};
  EXPECT_EQ(argmax(nan_first, 3), 2u);
  const float nan_between[] = {1.0f, kNan, 0.0f};
  EXPECT_EQ(argmax(nan_between, 3), 0u);
  const float nan_and_neg_inf[] = {kNan, -kInf, kNan};
  EXPECT_EQ(argmax(nan_and_neg_inf, 3), 1u);
  const float all_nan[] = {kNan, kNan, kNan};
  EXPECT_EQ(argmax(all_nan, 3), 0u);
  const float all_neg_inf[] = {-kInf, -kInf};
  EXPECT_EQ(argmax(all_neg_inf, 2), 0u);
  const float infs[] = {1.0f, kInf, kNan, kInf};
  EXPECT_EQ(argmax(infs, 4), 1u);
  const float negatives[] = {-5.0f, -1.0f, -3.0f};
  EXPECT_EQ(argmax(negatives, 3), 1u);
  EXPECT_EQ(argmax(negatives, 1), 0u);

  std::vector<float> nan_then_max(40, kNan);
  nan_then_max[39] = -1e30f;
  EXPECT_EQ(argmax(nan_then_max.data(), nan_then_max.size()), 39u);
}

TEST(ArgmaxRef, TieAndNanRules) { ExpectArgmaxRules(&ref::Argmax); }

TEST(Argmax, TieAndNanRulesOnEveryTarget) {
  ForEachTarget([] { ExpectArgmaxRules(&Argmax); });
}

TEST(Argmax, MatchesRefOnEveryTargetAndLength) {
  std::mt19937 rng(18);
  ForEachTarget([&] {
    for (size_t n = 1; n <= kMaxLength; ++n) {
      for (int trial = 0; trial < 4; ++trial) {
        // Few distinct values, so ties are common; NaN and -inf sprinkled in.
        std::vector<float> x(n);
        for (float& v : x) {
          const uint32_t r = rng() % 16;
          v = r == 0 ? kNan : r == 1 ? -kInf : static_cast<float>(r % 5);
        }
        if (trial == 3) x[n - 1] = 100.0f;  // the maximum in the tail
        ASSERT_EQ(Argmax(x.data(), n), ref::Argmax(x.data(), n)) << "n=" << n;
      }
    }
  });
}

TEST(ArgmaxDeath, RejectsEmptyInput) {
  const float x[1] = {3.0f};
  EXPECT_DEATH(Argmax(x, 0), "n must be");
  EXPECT_DEATH(ref::Argmax(x, 0), "n must be");
  EXPECT_EQ(Argmax(x, 1), 0u);  // twin
}

}  // namespace
}  // namespace kvguard::kernels
