#include "core/text/logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/base/internal/raw_logging.h"

namespace kvguard::core {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Value is a logit as the distribution sees it: NaN is -inf.
double Value(float x) { return std::isnan(x) ? -kInf : static_cast<double>(x); }

}  // namespace

TokenLogprobs LogprobsOf(std::span<const float> logits, int token, int top_n) {
  const int vocab = static_cast<int>(logits.size());
  ABSL_RAW_CHECK(vocab >= 1 && token >= 0 && token < vocab, "LogprobsOf: token outside the vocab");
  ABSL_RAW_CHECK(top_n >= 0 && top_n <= kMaxTopLogprobs, "LogprobsOf: top_n out of range");
  double max = -kInf;
  for (float x : logits) max = std::max(max, Value(x));
  // log_softmax(x)_i = x_i - log(sum_j exp(x_j)), as x_i - max - log(sum_j exp(x_j - max)).
  // With +inf logits the limit is -log(count) for those and -inf for the rest; with every logit
  // at -inf, the uniform distribution (what the limit of equal logits gives).
  auto logprob = [&](int id) -> double { return Value(logits[size_t(id)]); };
  double log_norm = 0;  // logprob(id) = shifted(id) - log_norm
  auto shifted = [&](int id) -> double {
    const double x = logprob(id);
    if (std::isinf(max)) return x == max ? 0.0 : -kInf;
    return x - max;
  };
  if (std::isinf(max)) {
    int count = 0;
    for (int i = 0; i < vocab; ++i) count += logprob(i) == max ? 1 : 0;
    log_norm = std::log(static_cast<double>(count));
  } else {
    double sum = 0;
    for (int i = 0; i < vocab; ++i) sum += std::exp(shifted(i));
    log_norm = std::log(sum);
  }
  TokenLogprobs out;
  out.token = token;
  out.logprob = static_cast<float>(shifted(token) - log_norm);
  // The top_n best by (logit descending, id ascending), kept sorted in one pass over the
  // vocabulary: top_n is at most 20.
  const int n = std::min(top_n, vocab);
  std::vector<int> best;
  best.reserve(size_t(n) + 1);
  auto better = [&](int a, int b) {
    const double va = logprob(a), vb = logprob(b);
    return va > vb || (va == vb && a < b);
  };
  for (int i = 0; i < vocab && n > 0; ++i) {
    if (static_cast<int>(best.size()) == n && !better(i, best.back())) continue;
    best.insert(std::upper_bound(best.begin(), best.end(), i, better), i);
    if (static_cast<int>(best.size()) > n) best.pop_back();
  }
  for (int id : best) out.top.push_back({id, static_cast<float>(shifted(id) - log_norm)});
  return out;
}

}  // namespace kvguard::core
