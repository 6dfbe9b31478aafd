// Tests of core/text/logprobs.h: log_softmax against a direct computation, the top-N order and
// ties, and the limits (NaN, +inf, all -inf).
#include "core/text/logprobs.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace kvguard::core {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Direct is log(exp(x_i) / sum_j exp(x_j)), the definition, in long double.
double Direct(const std::vector<float>& x, int i) {
  long double sum = 0;
  for (float v : x) sum += std::exp(static_cast<long double>(v));
  return static_cast<double>(std::log(std::exp(static_cast<long double>(x[size_t(i)])) / sum));
}

TEST(LogprobsTest, MatchesTheDefinitionAndRanksTheTop) {
  const std::vector<float> x = {1.0f, 3.5f, -2.0f, 3.5f, 0.25f, 2.0f};
  for (int t = 0; t < static_cast<int>(x.size()); ++t) {
    const TokenLogprobs lp = LogprobsOf(x, t, 4);
    EXPECT_EQ(lp.token, t);
    EXPECT_NEAR(lp.logprob, Direct(x, t), 1e-6) << t;
    ASSERT_EQ(lp.top.size(), 4u);
    // Most likely first; the tie between ids 1 and 3 goes to the lower id.
    EXPECT_EQ(lp.top[0].token, 1);
    EXPECT_EQ(lp.top[1].token, 3);
    EXPECT_EQ(lp.top[2].token, 5);
    EXPECT_EQ(lp.top[3].token, 0);
    for (const TopLogprob& a : lp.top) EXPECT_NEAR(a.logprob, Direct(x, a.token), 1e-6);
  }
  EXPECT_TRUE(LogprobsOf(x, 2, 0).top.empty());
  EXPECT_EQ(LogprobsOf(x, 2, kMaxTopLogprobs).top.size(), x.size());  // at most the vocabulary
  // Probabilities sum to 1.
  double sum = 0;
  for (const TopLogprob& a : LogprobsOf(x, 0, 6).top) sum += std::exp(a.logprob);
  EXPECT_NEAR(sum, 1.0, 1e-6);
}

TEST(LogprobsTest, LargeLogitsDoNotOverflow) {
  const std::vector<float> x = {1000.0f, 999.0f};
  EXPECT_NEAR(LogprobsOf(x, 0, 0).logprob, -std::log1p(std::exp(-1.0)), 1e-6);
  EXPECT_NEAR(LogprobsOf(x, 1, 0).logprob, -1.0 - std::log1p(std::exp(-1.0)), 1e-6);
}

TEST(LogprobsTest, Limits) {
  // NaN counts as -inf: probability 0, never in the top before a finite logit.
  const std::vector<float> nan = {std::nanf(""), 0.0f, 0.0f};
  EXPECT_EQ(LogprobsOf(nan, 0, 0).logprob, -kInf);
  EXPECT_NEAR(LogprobsOf(nan, 1, 0).logprob, std::log(0.5), 1e-6);
  EXPECT_EQ(LogprobsOf(nan, 0, 3).top.back().token, 0);
  // +inf logits share all the mass; the rest have none.
  const std::vector<float> inf = {kInf, 5.0f, kInf};
  EXPECT_NEAR(LogprobsOf(inf, 0, 0).logprob, std::log(0.5), 1e-6);
  EXPECT_EQ(LogprobsOf(inf, 1, 0).logprob, -kInf);
  // None above -inf: uniform.
  const std::vector<float> none = {-kInf, -kInf, -kInf, -kInf};
  EXPECT_NEAR(LogprobsOf(none, 3, 0).logprob, std::log(0.25), 1e-6);
}

}  // namespace
}  // namespace kvguard::core
