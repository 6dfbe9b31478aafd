// Tests for SamplingParams, Sampler and StopMatcher. Sampling is checked statistically against
// softmax probabilities computed here in double (chi-square over many draws) and by exact
// support: every draw comes from a fixed seed, so each test is deterministic. The Sampler runs
// the SIMD softmax/argmax kernels, so the sampling tests run on every supported Highway target.
#include "core/text/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/ops.h"

namespace kvguard::core {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

template <typename Body>
void ForEachTarget(Body body) {
  struct Reset {
    ~Reset() { kernels::ResetTarget(); }
  } reset;
  const std::vector<int64_t> targets = kernels::SupportedTargets();
  ASSERT_FALSE(targets.empty());
  for (const int64_t t : targets) {
    SCOPED_TRACE(kernels::TargetName(t));
    kernels::ForceTarget(t);
    body();
  }
}

SamplingParams Params(float temperature, int top_k = 0, float top_p = 1.0f, uint64_t seed = 1) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.seed = seed;
  return p;
}

// RefProbs returns softmax(logits / t) in double.
std::vector<double> RefProbs(const std::vector<float>& logits, double t) {
  const double max = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  double sum = 0.0;
  for (size_t i = 0; i < p.size(); ++i) sum += p[i] = std::exp((logits[i] - max) / t);
  for (double& x : p) x /= sum;
  return p;
}

// Restrict zeroes every probability outside `keep` and renormalises.
std::vector<double> Restrict(std::vector<double> p, const std::set<int>& keep) {
  double sum = 0.0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (!keep.count(static_cast<int>(i))) p[i] = 0.0;
    sum += p[i];
  }
  for (double& x : p) x /= sum;
  return p;
}

// RankOrder returns the ids sorted by value, largest first, lower id first on ties.
std::vector<int> RankOrder(const std::vector<double>& v) {
  std::vector<int> ids(v.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int a, int b) { return v[a] > v[b]; });
  return ids;
}

std::set<int> TopK(const std::vector<float>& logits, int k) {
  const std::vector<int> order = RankOrder(std::vector<double>(logits.begin(), logits.end()));
  return std::set<int>(order.begin(), order.begin() + k);
}

// Nucleus returns the smallest set of most probable ids whose mass reaches top_p.
std::set<int> Nucleus(const std::vector<double>& p, double top_p) {
  std::set<int> keep;
  double mass = 0.0;
  for (const int id : RankOrder(p)) {
    keep.insert(id);
    mass += p[id];
    if (mass >= top_p) break;
  }
  return keep;
}

std::vector<int> Counts(Sampler& sampler, const std::vector<float>& logits, int draws) {
  const int vocab = static_cast<int>(logits.size());
  std::vector<int> counts(logits.size());
  int out_of_range = 0;
  for (int i = 0; i < draws; ++i) {
    const int id = sampler.Sample(logits.data(), vocab);
    if (id >= 0 && id < vocab) {
      ++counts[id];
    } else {
      ++out_of_range;
    }
  }
  EXPECT_EQ(out_of_range, 0);
  return counts;
}

std::set<int> Support(const std::vector<int>& counts) {
  std::set<int> ids;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] > 0) ids.insert(static_cast<int>(i));
  }
  return ids;
}

// ExpectFrequencies checks `counts` against `p` with Pearson's chi-square test at p = 1e-4
// (critical value by the Wilson-Hilferty approximation), after requiring that no id of
// probability 0 was drawn. Ids are binned in rank order until each bin expects >= 20 draws, so
// that the chi-square approximation holds for long tails too.
void ExpectFrequencies(const std::vector<int>& counts, const std::vector<double>& p) {
  const double draws = std::accumulate(counts.begin(), counts.end(), 0.0);
  std::vector<std::pair<double, double>> bins;  // (expected, observed)
  double expected = 0.0, observed = 0.0;
  for (const int id : RankOrder(p)) {
    if (p[id] == 0.0) {
      EXPECT_EQ(counts[id], 0) << "id " << id << " has probability 0";
      continue;
    }
    expected += draws * p[id];
    observed += counts[id];
    if (expected >= 20.0) {
      bins.emplace_back(expected, observed);
      expected = observed = 0.0;
    }
  }
  if (bins.empty()) {
    bins.emplace_back(expected, observed);
  } else {  // fold the short remainder into the last bin
    bins.back().first += expected;
    bins.back().second += observed;
  }
  double chi2 = 0.0;
  for (const auto& [e, o] : bins) chi2 += (o - e) * (o - e) / e;
  const double df = static_cast<double>(bins.size()) - 1.0;
  if (df < 1) return;
  const double z = 3.719;  // upper 1e-4 quantile of N(0, 1)
  const double h = 2.0 / (9.0 * df);
  const double critical = df * std::pow(1.0 - h + z * std::sqrt(h), 3.0);
  EXPECT_LT(chi2, critical) << "chi-square with " << df << " degrees of freedom";
}

TEST(SamplingParamsTest, ValidateNamesTheBadField) {
  struct Case {
    SamplingParams params;
    std::string_view field;
  };
  const Case bad[] = {
      {Params(-0.01f), "temperature"},   {Params(100.5f), "temperature"},
      {Params(kNan), "temperature"},     {Params(kInf), "temperature"},
      {Params(1.0f, -1), "top_k"},       {Params(1.0f, 0, 0.0f), "top_p"},
      {Params(1.0f, 0, -0.5f), "top_p"}, {Params(1.0f, 0, 1.0001f), "top_p"},
      {Params(1.0f, 0, kNan), "top_p"},
  };
  for (const Case& c : bad) {
    const absl::Status s = c.params.Validate();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(std::string(s.message()).find(c.field), std::string::npos) << s;
  }
  // Positive twins: the edges of every range.
  EXPECT_TRUE(SamplingParams{}.Validate().ok());
  EXPECT_TRUE(Params(0.0f).Validate().ok());
  EXPECT_TRUE(Params(100.0f).Validate().ok());
  EXPECT_TRUE(Params(1e-30f).Validate().ok());
  EXPECT_TRUE(Params(1.0f, 0, 1.0f).Validate().ok());
  EXPECT_TRUE(Params(1.0f, 1 << 30, 1e-7f).Validate().ok());
}

TEST(SamplerDeathTest, RefusesInvalidParams) {
  EXPECT_DEATH(Sampler(Params(-1.0f)), "invalid SamplingParams");
  Sampler ok(Params(1.0f));  // positive twin
  EXPECT_EQ(ok.params().temperature, 1.0f);
}

TEST(SamplerTest, GreedyIsArgmaxFirstOnTies) {
  ForEachTarget([] {
    Sampler greedy(Params(0.0f));
    const std::vector<float> ties = {1.0f, 3.0f, 3.0f, 2.0f};
    EXPECT_EQ(greedy.Sample(ties.data(), 4), 1);
    const std::vector<float> nan_first = {kNan, 1.0f, kNan, 0.5f};
    EXPECT_EQ(greedy.Sample(nan_first.data(), 4), 1);
    std::mt19937 rng(3);
    std::normal_distribution<float> normal(0.0f, 2.0f);
    for (int trial = 0; trial < 100; ++trial) {
      std::vector<float> logits(1 + rng() % 3000);
      for (float& x : logits) x = std::round(normal(rng) * 4.0f) / 4.0f;  // many ties
      const int n = static_cast<int>(logits.size());
      ASSERT_EQ(greedy.Sample(logits.data(), n),
                static_cast<int>(kernels::ref::Argmax(logits.data(), logits.size())));
    }
  });
}

TEST(SamplerTest, TemperatureFrequenciesMatchSoftmax) {
  const std::vector<float> logits = {1.0f, 2.5f, 0.0f, -1.0f, 2.0f, 0.5f, 1.5f, -0.5f, 3.0f, 1.0f};
  ForEachTarget([&] {
    for (const float t : {0.5f, 1.0f, 2.0f}) {
      SCOPED_TRACE(t);
      Sampler sampler(Params(t, 0, 1.0f, 42));
      ExpectFrequencies(Counts(sampler, logits, 5000), RefProbs(logits, t));
    }
  });
}

TEST(SamplerTest, ExtremeTemperatures) {
  const std::vector<float> logits = {0.1f, 0.9f, 0.5f, 0.0f, 0.7f, 0.3f};
  ForEachTarget([&] {
    Sampler cold(Params(1e-30f, 0, 1.0f, 5));
    const std::vector<int> cold_counts = Counts(cold, logits, 500);
    EXPECT_EQ(cold_counts[1], 500);
    Sampler hot(Params(100.0f, 0, 1.0f, 5));
    const std::vector<int> hot_counts = Counts(hot, logits, 5000);
    ExpectFrequencies(hot_counts, RefProbs(logits, 100.0));
    EXPECT_EQ(Support(hot_counts).size(), logits.size());
  });
}

TEST(SamplerTest, TopK1IsGreedy) {
  ForEachTarget([] {
    std::mt19937 rng(9);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    Sampler top1(Params(1.5f, 1, 1.0f, 77));
    Sampler greedy(Params(0.0f));
    for (int trial = 0; trial < 100; ++trial) {
      std::vector<float> logits(1 + rng() % 2000);
      for (float& x : logits) x = std::round(normal(rng) * 2.0f) / 2.0f;  // ties at the top
      if (trial % 3 == 0) logits[rng() % logits.size()] = kNan;
      const int n = static_cast<int>(logits.size());
      ASSERT_EQ(top1.Sample(logits.data(), n), greedy.Sample(logits.data(), n));
    }
  });
}

TEST(SamplerTest, TopKRestrictsSupportToKLargest) {
  std::mt19937 rng(21);
  std::normal_distribution<float> normal(0.0f, 0.3f);
  std::vector<float> logits(64);
  for (float& x : logits) x = normal(rng);
  for (const int k : {2, 5, 13}) {
    SCOPED_TRACE(k);
    Sampler sampler(Params(2.0f, k, 1.0f, 8));
    const std::vector<int> counts = Counts(sampler, logits, 5000);
    const std::set<int> top = TopK(logits, k);
    EXPECT_EQ(Support(counts), top);
    ExpectFrequencies(counts, Restrict(RefProbs(logits, 2.0), top));
  }
  // k >= vocab keeps everything (positive twin).
  Sampler all(Params(2.0f, 64, 1.0f, 8));
  EXPECT_EQ(Support(Counts(all, logits, 5000)).size(), 64u);
}

TEST(SamplerTest, TopKTiesGoToTheLowerId) {
  const std::vector<float> logits = {1.0f, 5.0f, 5.0f, 5.0f, 0.0f};
  Sampler sampler(Params(1.0f, 2, 1.0f, 4));
  EXPECT_EQ(Support(Counts(sampler, logits, 1000)), (std::set<int>{1, 2}));
  Sampler three(Params(1.0f, 3, 1.0f, 4));
  EXPECT_EQ(Support(Counts(three, logits, 1000)), (std::set<int>{1, 2, 3}));
}

TEST(SamplerTest, TopPBoundaryIsInclusive) {
  // Ids permuted so that rank order differs from id order: p = {0.2, 0.5, 0.3}.
  const std::vector<float> logits = {std::log(0.2f), std::log(0.5f), std::log(0.3f)};
  ForEachTarget([&] {
    // 0.5 + 0.3 reaches 0.8: two tokens.
    Sampler two(Params(1.0f, 0, 0.8f, 6));
    const std::vector<int> counts_two = Counts(two, logits, 4000);
    EXPECT_EQ(Support(counts_two), (std::set<int>{1, 2}));
    ExpectFrequencies(counts_two, {0.0, 0.5 / 0.8, 0.3 / 0.8});
    // 0.81 needs the third.
    Sampler three(Params(1.0f, 0, 0.81f, 6));
    const std::vector<int> counts_three = Counts(three, logits, 4000);
    EXPECT_EQ(Support(counts_three), (std::set<int>{0, 1, 2}));
    ExpectFrequencies(counts_three, {0.2, 0.5, 0.3});
    // 0.5 alone reaches 0.5; just above needs two.
    Sampler one(Params(1.0f, 0, 0.5f, 6));
    EXPECT_EQ(Support(Counts(one, logits, 1000)), (std::set<int>{1}));
    Sampler just_above(Params(1.0f, 0, 0.501f, 6));
    EXPECT_EQ(Support(Counts(just_above, logits, 1000)), (std::set<int>{1, 2}));
    Sampler tiny(Params(1.0f, 0, 1e-7f, 6));
    EXPECT_EQ(Support(Counts(tiny, logits, 1000)), (std::set<int>{1}));
  });
}

TEST(SamplerTest, TopPBoundaryToleratesRounding) {
  // top_p set to the float nearest a + b, the mass of the two most probable tokens: in real
  // arithmetic the nucleus is exactly those two, but the float probabilities and top_p itself
  // are each off by an ulp or so, either way. The third token (p >= 0.15, so 100 draws would
  // show it) must never come in, on either path (full softmax, or the small top-k one).
  std::mt19937 rng(37);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  ForEachTarget([&] {
    for (int trial = 0; trial < 50; ++trial) {
      const double a = 0.4 + 0.15 * unit(rng);
      const double c = 0.15 + 0.05 * unit(rng);
      const double b = 1.0 - a - c;
      const std::vector<float> logits = {static_cast<float>(std::log(c)),
                                         static_cast<float>(std::log(a)), -kInf,
                                         static_cast<float>(std::log(b))};
      const float top_p = static_cast<float>(a + b);
      for (const int top_k : {0, 3}) {
        Sampler sampler(Params(1.0f, top_k, top_p, 100 + trial));
        ASSERT_EQ(Support(Counts(sampler, logits, 100)), (std::set<int>{1, 3}))
            << "a=" << a << " b=" << b << " top_k=" << top_k;
      }
    }
  });
}

// The tests that use the vocabulary-wide kernels (Argmax always, Softmax unless top-k is small)
// in a way that could differ between SIMD targets (NaN, infinities, frequencies, the top-p
// boundary) run on every target. The bigger statistical tests below, and the small-k tests
// above (whose path uses no Softmax), run on the default target: the kernels have their own
// all-target tests.
TEST(SamplerTest, TopPMatchesBruteForceNucleus) {
  // Smoothly decaying probabilities, shuffled, so that the boundary token still has a
  // probability that shows in 3000 draws. 60 ids take the sort-everything path, 200 the
  // histogram path.
  for (const int vocab : {60, 200}) {
    SCOPED_TRACE(vocab);
    std::vector<float> logits(vocab);
    for (int i = 0; i < vocab; ++i) logits[i] = -static_cast<float>(i) / static_cast<float>(vocab);
    std::shuffle(logits.begin(), logits.end(), std::mt19937(13));
    const std::vector<double> p = RefProbs(logits, 1.0);
    const std::vector<int> order = RankOrder(p);
    for (const int boundary : {0, 1, vocab / 3, vocab - 2}) {
      // top_p halfway between two prefix masses, so float rounding cannot move the boundary.
      double below = 0.0;
      for (int j = 0; j < boundary; ++j) below += p[order[j]];
      const float top_p = static_cast<float>(below + p[order[boundary]] / 2);
      SCOPED_TRACE(top_p);
      Sampler sampler(Params(1.0f, 0, top_p, 31));
      const std::vector<int> counts = Counts(sampler, logits, 3000);
      const std::set<int> nucleus = Nucleus(p, top_p);
      ASSERT_EQ(nucleus.size(), static_cast<size_t>(boundary + 1));
      const std::set<int> support = Support(counts);
      EXPECT_TRUE(std::includes(nucleus.begin(), nucleus.end(), support.begin(), support.end()));
      EXPECT_GT(counts[order[boundary]], 0);  // the boundary token itself is in
      ExpectFrequencies(counts, Restrict(p, nucleus));
    }
    // With top_k first, top_p applies to the renormalised top-k mass.
    Sampler both(Params(1.0f, vocab / 2, 0.5f, 32));
    const std::vector<int> counts = Counts(both, logits, 3000);
    const std::vector<double> p_k = Restrict(p, TopK(logits, vocab / 2));
    const std::set<int> nucleus = Nucleus(p_k, 0.5);
    EXPECT_LT(nucleus.size(), Nucleus(p, 0.5).size());
    EXPECT_EQ(Support(counts), nucleus);
    ExpectFrequencies(counts, Restrict(p, nucleus));
  }
}

TEST(SamplerTest, LargeTopKUsesTheSameRule) {
  // k above the heap's limit (256) takes the selection path over the whole vocabulary; the
  // kept set and the frequencies must follow the same rule as for small k.
  std::mt19937 rng(23);
  std::normal_distribution<float> normal(0.0f, 0.3f);
  std::vector<float> logits(400);
  for (float& x : logits) x = std::round(normal(rng) * 20.0f) / 20.0f;  // ties at the boundary
  const std::vector<double> p = RefProbs(logits, 2.0);
  const std::set<int> top = TopK(logits, 300);
  Sampler sampler(Params(2.0f, 300, 1.0f, 19));
  const std::vector<int> counts = Counts(sampler, logits, 4000);
  EXPECT_EQ(Support(counts), top);
  ExpectFrequencies(counts, Restrict(p, top));
  // And top_p on top of it, over the renormalised top-k mass.
  const std::vector<double> p_k = Restrict(p, top);
  const std::vector<int> order = RankOrder(p_k);
  double below = 0.0;
  for (int j = 0; j < 150; ++j) below += p_k[order[j]];
  const float top_p = static_cast<float>(below + p_k[order[150]] / 2);
  Sampler both(Params(2.0f, 300, top_p, 19));
  const std::vector<int> counts_both = Counts(both, logits, 4000);
  const std::set<int> nucleus = Nucleus(p_k, top_p);
  ASSERT_EQ(nucleus.size(), 151u);
  EXPECT_EQ(Support(counts_both), nucleus);
  ExpectFrequencies(counts_both, Restrict(p, nucleus));
}

TEST(SamplerTest, TopKTopPOnFullSizeVocabulary) {
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(32000);
  for (float& x : logits) x = normal(rng);
  const std::set<int> top40 = TopK(logits, 40);
  const std::vector<double> p = RefProbs(logits, 0.8);
  // Float rounding of the probabilities can at most add the token at the boundary, so the
  // oracle's nucleus for a hair more mass is the bound.
  const std::set<int> nucleus = Nucleus(p, 0.9 + 1e-4);
  Sampler sampler(Params(0.8f, 40, 0.9f, 3));
  Sampler top_p_only(Params(0.8f, 0, 0.9f, 3));
  std::set<int> seen;
  for (int i = 0; i < 50; ++i) {
    const int id = sampler.Sample(logits.data(), 32000);
    ASSERT_TRUE(top40.count(id)) << id;
    const int id_p = top_p_only.Sample(logits.data(), 32000);
    ASSERT_TRUE(nucleus.count(id_p)) << id_p;
    seen.insert(id_p);
  }
  EXPECT_GT(seen.size(), 1u);
}

TEST(SamplerTest, SameSeedSameTokensOtherSeedOtherTokens) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<float>> steps(200, std::vector<float>(500));
  for (auto& logits : steps) {
    for (float& x : logits) x = normal(rng);
  }
  const auto run = [&](uint64_t seed) {
    Sampler sampler(Params(1.0f, 50, 0.95f, seed));
    std::vector<int> tokens;
    for (const auto& logits : steps) tokens.push_back(sampler.Sample(logits.data(), 500));
    return tokens;
  };
  const std::vector<int> a = run(1234);
  EXPECT_EQ(run(1234), a);
  EXPECT_NE(run(1235), a);
  EXPECT_NE(run(0), a);
}

TEST(SamplerTest, ConcurrentSamplersMatchSequentialRuns) {
  // Scratch buffers are per thread: two requests sampled at once on two threads get exactly
  // the tokens they get alone.
  std::mt19937 rng(41);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(3000);
  for (float& x : logits) x = normal(rng);
  const std::vector<SamplingParams> params = {Params(1.0f, 0, 0.9f, 1), Params(0.7f, 500, 1.0f, 2),
                                              Params(1.3f, 20, 0.8f, 3), Params(2.0f, 0, 1.0f, 4)};
  const auto run = [&](const SamplingParams& p) {
    Sampler sampler(p);
    std::vector<int> tokens;
    for (int i = 0; i < 200; ++i) tokens.push_back(sampler.Sample(logits.data(), 3000));
    return tokens;
  };
  std::vector<std::vector<int>> alone;
  for (const SamplingParams& p : params) alone.push_back(run(p));
  std::vector<std::vector<int>> together(params.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < params.size(); ++i) {
    threads.emplace_back([&, i] { together[i] = run(params[i]); });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(together, alone);
}

TEST(SamplerTest, EachDrawIsTheTopBitsOfMt19937_64) {
  // Four equal logits: each probability is exactly 1/4, so the token is floor(4 u), i.e. the two
  // top bits of the PRNG output; this pins the generator and the bits used, for every platform.
  const std::vector<float> logits(4, 0.5f);
  for (const uint64_t seed : {uint64_t{0}, uint64_t{1}, uint64_t{0xDEADBEEFCAFEF00D}}) {
    std::mt19937_64 reference(seed);
    Sampler sampler(Params(0.7f, 0, 1.0f, seed));
    for (int i = 0; i < 1000; ++i) {
      ASSERT_EQ(sampler.Sample(logits.data(), 4), static_cast<int>(reference() >> 62));
    }
  }
}

TEST(SamplerTest, EveryNonGreedyCallConsumesOneDraw) {
  const std::vector<float> uniform(4, 0.0f);
  const std::vector<float> all_nan(4, kNan);
  const std::vector<float> one_hot = {-kInf, -kInf, 2.0f, -kInf};
  const auto run = [&](bool degenerate_first) {
    Sampler sampler(Params(1.0f, 0, 1.0f, 99));
    if (degenerate_first) {
      EXPECT_EQ(sampler.Sample(all_nan.data(), 4), 0);
      EXPECT_EQ(sampler.Sample(one_hot.data(), 4), 2);
    } else {
      sampler.Sample(uniform.data(), 4);
      sampler.Sample(uniform.data(), 4);
    }
    std::vector<int> rest;
    for (int i = 0; i < 50; ++i) rest.push_back(sampler.Sample(uniform.data(), 4));
    return rest;
  };
  EXPECT_EQ(run(true), run(false));
}

TEST(SamplerTest, NanAndNegativeInfinityAreNeverSampled) {
  std::vector<float> logits(40);
  for (size_t i = 0; i < logits.size(); ++i) {
    logits[i] = i % 3 == 0 ? kNan : i % 3 == 1 ? -kInf : 0.1f * static_cast<float>(i % 7);
  }
  ForEachTarget([&] {
    for (const SamplingParams& params :
         {Params(1.0f), Params(5.0f, 10), Params(1.0f, 0, 0.9f), Params(50.0f, 30, 0.99f)}) {
      Sampler sampler(params);
      const std::vector<int> counts = Counts(sampler, logits, 500);
      for (size_t i = 0; i < logits.size(); ++i) {
        if (!std::isfinite(logits[i])) {
          ASSERT_EQ(counts[i], 0) << i;
        }
      }
    }
    // Positive twin: with plain temperature sampling every finite logit does come up.
    Sampler sampler(Params(1.0f));
    const std::vector<int> counts = Counts(sampler, logits, 500);
    for (size_t i = 2; i < logits.size(); i += 3) EXPECT_GT(counts[i], 0) << i;
  });
}

TEST(SamplerTest, DegenerateLogitsFollowArgmax) {
  ForEachTarget([] {
    Sampler sampler(Params(1.0f, 3, 0.5f));
    const std::vector<float> all_nan(7, kNan);
    EXPECT_EQ(sampler.Sample(all_nan.data(), 7), 0);
    const std::vector<float> no_finite = {kNan, kNan, -kInf, kNan, -kInf};
    EXPECT_EQ(sampler.Sample(no_finite.data(), 5), 2);
    const float single = 3.0f;
    EXPECT_EQ(sampler.Sample(&single, 1), 0);
  });
}

TEST(SamplerTest, PositiveInfinityTakesAllTheMass) {
  ForEachTarget([] {
    const std::vector<float> one = {1.0f, kInf, 3e38f, kNan, 2.0f};
    Sampler sampler(Params(1.0f, 0, 1.0f, 3));
    EXPECT_EQ(Support(Counts(sampler, one, 500)), (std::set<int>{1}));
    // Two +inf share it equally, whatever the temperature and filters.
    const std::vector<float> two = {kInf, 1.0f, 3e38f, kInf, kNan};
    for (const SamplingParams& params : {Params(0.3f), Params(2.0f, 2), Params(1.0f, 0, 0.9f)}) {
      Sampler s(params);
      const std::vector<int> counts = Counts(s, two, 3000);
      ExpectFrequencies(counts, {0.5, 0.0, 0.0, 0.5, 0.0});
      EXPECT_EQ(Support(counts), (std::set<int>{0, 3}));
    }
    // top_k = 1 keeps the first of them, as greedy does.
    Sampler top1(Params(2.0f, 1));
    EXPECT_EQ(Support(Counts(top1, two, 200)), (std::set<int>{0}));
  });
}

TEST(SamplerTest, HugeFiniteLogitsDoNotOverflow) {
  const std::vector<float> logits = {-3e38f, 3e38f, 3e38f, -1.0f};
  ForEachTarget([&] {
    Sampler sampler(Params(0.01f, 0, 1.0f, 12));
    const std::vector<int> counts = Counts(sampler, logits, 3000);
    ExpectFrequencies(counts, {0.0, 0.5, 0.5, 0.0});
  });
}

// ---- StopMatcher ----

StopMatcher Matcher(std::vector<std::string> stops) {
  absl::StatusOr<StopMatcher> m = StopMatcher::Create(std::move(stops));
  EXPECT_TRUE(m.ok()) << m.status();
  return *std::move(m);
}

TEST(StopMatcherTest, ValidateRefusesBadStopSequences) {
  const std::vector<std::vector<std::string>> bad = {
      {"a", "b", "c", "d", "e"}, {"ok", ""},
      {std::string(65, 'x')},    {"\xE4\xB8"},  // half a CJK character
      {"fine", "\xFF"},
  };
  for (const auto& stops : bad) {
    const absl::Status s = StopMatcher::Create(stops).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("stop"), std::string_view::npos) << s;
  }
  EXPECT_NE(StopMatcher::Validate({"ok", ""}).message().find("stop[1] is empty"),
            std::string_view::npos);
  // Positive twins.
  EXPECT_TRUE(StopMatcher::Validate({}).ok());
  EXPECT_TRUE(StopMatcher::Validate({"a", "b", "c", "d"}).ok());
  EXPECT_TRUE(StopMatcher::Validate({std::string(64, 'x')}).ok());
  EXPECT_TRUE(StopMatcher::Validate({"\xE4\xB8\xAD", "\n\n"}).ok());
}

TEST(StopMatcherTest, StopSplitAcrossChunks) {
  StopMatcher m = Matcher({"STOP"});
  StopMatcher::Result r = m.Feed("Hello ST");
  EXPECT_EQ(r.emit, "Hello ");
  EXPECT_FALSE(r.stopped);
  r = m.Feed("O");
  EXPECT_EQ(r.emit, "");
  EXPECT_FALSE(r.stopped);
  r = m.Feed("P and more");
  EXPECT_EQ(r.emit, "");
  EXPECT_TRUE(r.stopped);
  EXPECT_TRUE(m.stopped());
  r = m.Feed("later text");
  EXPECT_EQ(r.emit, "");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(m.Flush(), "");
}

TEST(StopMatcherTest, PartialPrefixThatIsNotAStopIsEmitted) {
  StopMatcher m = Matcher({"STOP"});
  StopMatcher::Result r = m.Feed("Hello STO");
  EXPECT_EQ(r.emit, "Hello ");
  r = m.Feed("RM is coming");
  EXPECT_EQ(r.emit, "STORM is coming");
  EXPECT_FALSE(r.stopped);
  r = m.Feed(", S");
  EXPECT_EQ(r.emit, ", ");
  EXPECT_EQ(m.Flush(), "S");  // the stream ended: what was held goes out
}

TEST(StopMatcherTest, HoldsOnlyTheLongestPossibleStart) {
  StopMatcher m = Matcher({"aab"});
  StopMatcher::Result r = m.Feed("xaaa");
  EXPECT_EQ(r.emit, "xa");  // "aa" may still become "aab"
  r = m.Feed("b tail");
  EXPECT_EQ(r.emit, "");  // it did
  EXPECT_TRUE(r.stopped);
  StopMatcher other = Matcher({"aab"});
  EXPECT_EQ(other.Feed("xaaa").emit, "xa");
  r = other.Feed("a");
  EXPECT_EQ(r.emit, "a");  // now only the last two can still start "aab"
  EXPECT_FALSE(r.stopped);
  EXPECT_EQ(other.Flush(), "aa");
}

TEST(StopMatcherTest, EarliestOfSeveralStopsWins) {
  StopMatcher m = Matcher({"\n\n", "END", "Observation:"});
  StopMatcher::Result r = m.Feed("foo END bar\n\nObservation:");
  EXPECT_EQ(r.emit, "foo ");
  EXPECT_TRUE(r.stopped);
  // One stop a prefix of another: the shorter one already matches.
  StopMatcher nested = Matcher({"abc", "ab"});
  r = nested.Feed("xa");
  EXPECT_EQ(r.emit, "x");
  r = nested.Feed("bc");
  EXPECT_EQ(r.emit, "");
  EXPECT_TRUE(r.stopped);
  // A later-listed stop that starts earlier wins, split across chunks.
  StopMatcher split = Matcher({"world", "lo w"});
  EXPECT_EQ(split.Feed("hel").emit, "he");
  r = split.Feed("lo world");
  EXPECT_EQ(r.emit, "l");
  EXPECT_TRUE(r.stopped);
}

TEST(StopMatcherTest, StopAtTheVeryStart) {
  StopMatcher m = Matcher({"<|end|>"});
  StopMatcher::Result r = m.Feed("<|e");
  EXPECT_EQ(r.emit, "");
  EXPECT_FALSE(r.stopped);
  r = m.Feed("nd|>rest");
  EXPECT_EQ(r.emit, "");
  EXPECT_TRUE(r.stopped);
  StopMatcher whole = Matcher({"<|end|>"});
  r = whole.Feed("<|end|>");
  EXPECT_EQ(r.emit, "");
  EXPECT_TRUE(r.stopped);
}

TEST(StopMatcherTest, NoStopEmitsEverythingByFlush) {
  StopMatcher m = Matcher({"zzz", "\xE3\x80\x82"});  // and the CJK full stop
  std::string out;
  for (const std::string_view chunk : {"no stop ", "here, z", "z but not", " three\xE3\x80"}) {
    const StopMatcher::Result r = m.Feed(chunk);
    EXPECT_FALSE(r.stopped);
    out += r.emit;
  }
  out += m.Flush();
  EXPECT_EQ(out, "no stop here, zz but not three\xE3\x80");
  // Without stop sequences nothing is held at all.
  StopMatcher none = Matcher({});
  EXPECT_EQ(none.Feed("abc").emit, "abc");
  EXPECT_EQ(none.Flush(), "");
}

TEST(StopMatcherTest, CutsAtMultiByteStop) {
  StopMatcher m = Matcher({"\xE3\x80\x82"});  // "。"
  std::string out;
  StopMatcher::Result r;
  for (const std::string_view chunk : {"\xE4\xBD\xA0\xE5\xA5\xBD", "\xE3\x80\x82", "more"}) {
    r = m.Feed(chunk);
    out += r.emit;
    if (r.stopped) break;
  }
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(out, "\xE4\xBD\xA0\xE5\xA5\xBD");
}

// The exact contract, checked on random streams against a brute-force oracle. The stream
// stops at the first chunk after which some stop sequence occurs in the text so far, and the
// output is the text before the earliest such occurrence. Before that, after every chunk,
// everything is emitted except the longest tail that begins a stop sequence.
TEST(StopMatcherTest, RandomStreamsMatchOracle) {
  std::mt19937 rng(29);
  const std::vector<std::vector<std::string>> stop_sets = {
      {"abc"}, {"aa", "bab"}, {"abab", "c", "bca"}, {"aab", "ab", "abcab", "cc"}};
  int stops_seen = 0;
  for (const auto& stops : stop_sets) {
    for (int trial = 0; trial < 300; ++trial) {
      std::string text(rng() % 30, 'a');
      for (char& c : text) c = static_cast<char>('a' + rng() % 3);
      StopMatcher m = Matcher(stops);
      std::string fed, emitted;
      bool stopped = false;
      for (size_t pos = 0; pos < text.size() && !stopped;) {
        const size_t len = std::min<size_t>(text.size() - pos, rng() % 4);
        fed += text.substr(pos, len);
        const StopMatcher::Result r = m.Feed(std::string_view(text).substr(pos, len));
        pos += len;
        emitted += r.emit;
        size_t first = std::string::npos;
        for (const std::string& s : stops) first = std::min(first, fed.find(s));
        ASSERT_EQ(r.stopped, first != std::string::npos) << fed;
        stopped = r.stopped;
        if (stopped) {
          ASSERT_EQ(emitted, fed.substr(0, first)) << fed;
          ++stops_seen;
        } else {
          size_t hold = 0;
          for (const std::string& s : stops) {
            for (size_t l = 1; l < s.size() && l <= fed.size(); ++l) {
              if (fed.compare(fed.size() - l, l, s, 0, l) == 0) hold = std::max(hold, l);
            }
          }
          ASSERT_EQ(emitted, fed.substr(0, fed.size() - hold)) << fed;
        }
      }
      if (!stopped) {
        emitted += m.Flush();
        ASSERT_EQ(emitted, text);
      }
    }
  }
  EXPECT_GT(stops_seen, 500);
}

}  // namespace
}  // namespace kvguard::core
