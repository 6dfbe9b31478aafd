#include "core/text/sampler.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "absl/base/internal/raw_logging.h"
#include "absl/strings/str_cat.h"
#include "core/text/tokenizer.h"
#include "core/text/utf8.h"
#include "kernels/cpu/ops.h"

namespace kvguard::core {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// The probabilities carry float rounding, so a nucleus that reaches top_p exactly in real
// arithmetic (0.5 + 0.3 for top_p 0.8) can miss it by a few ulp; this much shortfall counts as
// reaching it rather than pulling in one more token.
constexpr double kTopPSlack = 1e-6;

// Up to this k, top-k keeps a heap of the k best logits in one pass and works on those k
// tokens alone (no vocabulary-wide softmax); above it, std::nth_element over all of them.
constexpr size_t kMaxHeapTopK = 256;

// Ranked is a token and the value it is ranked by (its logit for top-k, its probability for
// top-p).
struct Ranked {
  float value;
  int id;
};

// Better is the strict total order both filters rank by: larger value first, then lower id.
// Because it is total, the kept sets do not depend on how a std algorithm arranges ties.
bool Better(const Ranked& a, const Ranked& b) {
  return a.value > b.value || (a.value == b.value && a.id < b.id);
}

// Candidate is a kept token and its unnormalised weight.
struct Candidate {
  double weight;
  int id;
};

// Histogram buckets of a probability in [0, 1] by its top 12 bits: exponent and 3 mantissa
// bits, an eighth of an octave each, so bucket order is probability order. Probabilities
// below 2^-64 share bucket 0: together they weigh under vocab * 2^-64, so the nucleus boundary
// never lies there in practice (if it did, it would still be found exactly, just slowly).
// Kept in 4 interleaved copies so that neighbouring tokens falling into one bucket do not wait
// on each other's store.
constexpr uint32_t kBucketShift = 20;
constexpr uint32_t kLowestKey = (127 - 64) << 3;                             // the key of 2^-64
constexpr size_t kBuckets = (0x3F800000u >> kBucketShift) - kLowestKey + 2;  // up to 1.0f
constexpr size_t kHistogramCopies = 4;

size_t BucketOf(float p) {
  const uint32_t key = std::bit_cast<uint32_t>(p) >> kBucketShift;
  return key < kLowestKey ? 0 : std::min<size_t>(key - kLowestKey + 1, kBuckets - 1);
}

// Per-thread scratch: a Sampler lives as long as its request, and the engine holds hundreds of
// them, so vocabulary-sized buffers are shared by all Samplers that run on one thread instead.
struct Scratch {
  std::vector<float> probs;           // [vocab]
  std::vector<Ranked> ranked;         // [<= vocab]
  std::vector<Candidate> candidates;  // [<= kMaxHeapTopK]
  std::vector<double> block_sums;     // [vocab / 64]
  std::array<double, kHistogramCopies * kBuckets> histogram;
};

Scratch& ThreadScratch() {
  thread_local Scratch scratch;
  return scratch;
}

float Sanitized(float logit) { return std::isnan(logit) ? -kInf : logit; }

// SelectTopK leaves in `heap` the k best (Better) of the sanitized logits, in heap order, in one
// pass where a token that does not beat the worst of the heap (nearly all of them) costs one
// well-predicted comparison.
void SelectTopK(const float* logits, size_t n, size_t k, std::vector<Ranked>& heap) {
  heap.clear();
  for (size_t i = 0; i < k; ++i) heap.push_back(Ranked{Sanitized(logits[i]), static_cast<int>(i)});
  // With Better as "less", the heap's front is its worst member.
  std::make_heap(heap.begin(), heap.end(), Better);
  float worst = heap.front().value;
  for (size_t i = k; i < n; ++i) {
    // Ids only grow, so a token that merely ties the worst loses on the id: it has to be
    // strictly larger. NaN never is.
    if (!(logits[i] > worst)) continue;
    std::pop_heap(heap.begin(), heap.end(), Better);
    heap.back() = Ranked{logits[i], static_cast<int>(i)};
    std::push_heap(heap.begin(), heap.end(), Better);
    worst = heap.front().value;
  }
}

// The vocabulary-wide loops below run in chunks with a constant trip count: the form that
// GCC's -O2 vectorizer accepts (it will not add an epilogue or a runtime alias check).
constexpr size_t kChunk = 16;

// ZeroBelow zeroes weights[i] for i in [begin, end) where values[i] < threshold, or <= it
// when !inclusive. NaN values are always zeroed.
void ZeroBelow(const float* __restrict values, float* __restrict weights, size_t begin, size_t end,
               float threshold, bool inclusive) {
  size_t i = begin;
  if (inclusive) {
    for (; i + kChunk <= end; i += kChunk) {
      for (size_t j = 0; j < kChunk; ++j) {
        weights[i + j] = values[i + j] >= threshold ? weights[i + j] : 0.0f;
      }
    }
    for (; i < end; ++i) weights[i] = values[i] >= threshold ? weights[i] : 0.0f;
  } else {
    for (; i + kChunk <= end; i += kChunk) {
      for (size_t j = 0; j < kChunk; ++j) {
        weights[i + j] = values[i + j] > threshold ? weights[i + j] : 0.0f;
      }
    }
    for (; i < end; ++i) weights[i] = values[i] > threshold ? weights[i] : 0.0f;
  }
}

// ZeroBelowInPlace is ZeroBelow with values == weights.
void ZeroBelowInPlace(float* weights, size_t begin, size_t end, float threshold, bool inclusive) {
  size_t i = begin;
  if (inclusive) {
    for (; i + kChunk <= end; i += kChunk) {
      for (size_t j = 0; j < kChunk; ++j) {
        weights[i + j] = weights[i + j] >= threshold ? weights[i + j] : 0.0f;
      }
    }
    for (; i < end; ++i) weights[i] = weights[i] >= threshold ? weights[i] : 0.0f;
  } else {
    for (; i + kChunk <= end; i += kChunk) {
      for (size_t j = 0; j < kChunk; ++j) {
        weights[i + j] = weights[i + j] > threshold ? weights[i + j] : 0.0f;
      }
    }
    for (; i < end; ++i) weights[i] = weights[i] > threshold ? weights[i] : 0.0f;
  }
}

// KeepAtLeast zeroes weights[0, n) wherever (values[i], i) ranks below `threshold` (Better).
// Ids up to threshold.id win a tie with it and later ones lose, so the test splits into two
// plain comparisons, which vectorise, instead of one on (value, id) pairs.
void KeepAtLeast(const float* values, size_t n, Ranked threshold, float* weights) {
  const size_t split = std::min(n, static_cast<size_t>(threshold.id) + 1);
  if (values == weights) {
    ZeroBelowInPlace(weights, 0, split, threshold.value, /*inclusive=*/true);
    ZeroBelowInPlace(weights, split, n, threshold.value, /*inclusive=*/false);
  } else {
    ZeroBelow(values, weights, 0, split, threshold.value, /*inclusive=*/true);
    ZeroBelow(values, weights, split, n, threshold.value, /*inclusive=*/false);
  }
}

// ScaleLogits writes out[i] = (logits[i] - max) * inv_t, -inf for a NaN logit.
void ScaleLogits(const float* __restrict logits, size_t n, float max, float inv_t,
                 float* __restrict out) {
  size_t i = 0;
  for (; i + kChunk <= n; i += kChunk) {
    for (size_t j = 0; j < kChunk; ++j) {
      const float x = (logits[i + j] - max) * inv_t;
      out[i + j] = x == x ? x : -kInf;
    }
  }
  for (; i < n; ++i) {
    const float x = (logits[i] - max) * inv_t;
    out[i] = x == x ? x : -kInf;
  }
}

// DrawCandidates returns the id of the first candidate (in the given order) whose cumulative
// weight exceeds u times the total; a zero weight is never chosen, and at least one weight
// must be positive.
int DrawCandidates(const std::vector<Candidate>& candidates, double u) {
  double total = 0.0;
  for (const Candidate& c : candidates) total += c.weight;
  const double target = u * total;
  double cum = 0.0;
  int last = -1;
  for (const Candidate& c : candidates) {
    if (c.weight > 0.0) {
      cum += c.weight;
      last = c.id;
      if (cum > target) return c.id;
    }
  }
  ABSL_RAW_CHECK(last >= 0, "DrawCandidates: no candidate has weight");
  return last;  // u * total rounded up to total
}

// DrawWeights is DrawCandidates over weights[0, n) (ids = indices). Block sums first, so that
// finding the block costs n / 64 dependent additions instead of n.
int DrawWeights(const float* weights, size_t n, double u, std::vector<double>& block_sums) {
  constexpr size_t kBlock = 64;
  const size_t blocks = (n + kBlock - 1) / kBlock;
  block_sums.resize(blocks);
  double total = 0.0;
  for (size_t b = 0; b < blocks; ++b) {
    const size_t end = std::min(n, (b + 1) * kBlock);
    // Four independent chains, so that the additions overlap.
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    size_t i = b * kBlock;
    for (; i + 4 <= end; i += 4) {
      s0 += weights[i];
      s1 += weights[i + 1];
      s2 += weights[i + 2];
      s3 += weights[i + 3];
    }
    for (; i < end; ++i) s0 += weights[i];
    block_sums[b] = (s0 + s1) + (s2 + s3);
    total += block_sums[b];
  }
  const double target = u * total;
  double cum = 0.0;
  for (size_t b = 0; b < blocks; ++b) {
    if (block_sums[b] > 0.0 && (cum + block_sums[b] > target || b + 1 == blocks)) {
      // The draw lands in this block (or in the last one with weight, if rounding pushed it
      // past the end).
      const size_t end = std::min(n, (b + 1) * kBlock);
      size_t last = b * kBlock;
      for (size_t i = b * kBlock; i < end; ++i) {
        if (weights[i] > 0.0f) {
          cum += weights[i];
          last = i;
          if (cum > target) return static_cast<int>(i);
        }
      }
      // Summed one by one instead of in four chains, the block fell an ulp short.
      return static_cast<int>(last);
    }
    cum += block_sums[b];
  }
  // Only reached when the last block has no weight: take the last token that has some.
  for (size_t i = n; i-- > 0;) {
    if (weights[i] > 0.0f) return static_cast<int>(i);
  }
  return 0;
}

// NucleusThreshold returns the worst-ranked (Better) member of the nucleus of probs[0, n): the
// smallest set of most probable tokens whose mass is at least `top_p` (less kTopPSlack) of the
// total. A histogram of the probabilities finds the bucket where the boundary lies in one
// pass, so only that bucket's tokens are sorted: O(n) even for the flat distributions of high
// temperatures, where the nucleus is most of the vocabulary. Below kHistogramMinN tokens the
// histogram's fixed cost is not worth it and all of them are sorted. Every sum runs in a fixed
// order, so the result does not depend on the standard library.
Ranked NucleusThreshold(const float* probs, size_t n, float top_p, Scratch& scratch) {
  constexpr size_t kHistogramMinN = 128;
  double above = 0.0;  // mass of the buckets above the boundary bucket
  double target;
  size_t boundary = kBuckets;  // none: every token with probability is a candidate
  if (n < kHistogramMinN) {
    double mass = 0.0;
    for (size_t i = 0; i < n; ++i) mass += probs[i];
    target = (top_p - kTopPSlack) * mass;
  } else {
    double* hist = scratch.histogram.data();
    std::fill_n(hist, kHistogramCopies * kBuckets, 0.0);
    size_t i = 0;
    for (; i + kHistogramCopies <= n; i += kHistogramCopies) {
      for (size_t c = 0; c < kHistogramCopies; ++c) {
        hist[c * kBuckets + BucketOf(probs[i + c])] += probs[i + c];
      }
    }
    for (; i < n; ++i) hist[BucketOf(probs[i])] += probs[i];
    double mass = 0.0;
    for (size_t b = 0; b < kBuckets; ++b) {
      for (size_t c = 1; c < kHistogramCopies; ++c) hist[b] += hist[c * kBuckets + b];
      mass += hist[b];
    }
    target = (top_p - kTopPSlack) * mass;
    // Walk down from the most probable bucket to the one that completes the nucleus.
    for (size_t b = kBuckets; b-- > 0;) {
      if (hist[b] == 0.0) continue;
      boundary = b;
      if (above + hist[b] >= target) break;
      above += hist[b];
    }
    ABSL_RAW_CHECK(boundary < kBuckets, "NucleusThreshold: no probability mass");
  }
  std::vector<Ranked>& ranked = scratch.ranked;
  ranked.clear();
  for (size_t i = 0; i < n; ++i) {
    if (probs[i] > 0.0f && (boundary == kBuckets || BucketOf(probs[i]) == boundary)) {
      ranked.push_back(Ranked{probs[i], static_cast<int>(i)});
    }
  }
  ABSL_RAW_CHECK(!ranked.empty(), "NucleusThreshold: no probability mass");
  std::sort(ranked.begin(), ranked.end(), Better);
  for (const Ranked& r : ranked) {
    above += r.value;
    if (above >= target) return r;
  }
  // Summed in another order the candidates fell an ulp short: all of them are in.
  return ranked.back();
}

}  // namespace

absl::Status SamplingParams::Validate() const {
  // Written as "!(in range)" so that NaN fails too.
  if (!(temperature >= 0.0f && temperature <= 100.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("sampling params: temperature = ", temperature,
                                                   ": must be finite and in [0, 100]"));
  }
  if (top_k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling params: top_k = ", top_k, ": must be >= 0 (0 = off)"));
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling params: top_p = ", top_p, ": must be in (0, 1] (1 = off)"));
  }
  return absl::OkStatus();
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {
  ABSL_RAW_CHECK(params.Validate().ok(), "Sampler: invalid SamplingParams (call Validate first)");
}

double Sampler::NextUniform() {
  return static_cast<double>(rng_() >> 11) * 0x1.0p-53;  // 53 bits: every value exact
}

int Sampler::Sample(const float* logits, int vocab) {
  ABSL_RAW_CHECK(logits != nullptr && vocab >= 1, "Sampler::Sample: need logits and vocab >= 1");
  const size_t n = static_cast<size_t>(vocab);
  const size_t best = kernels::Argmax(logits, n);
  if (params_.temperature == 0.0f) return static_cast<int>(best);

  const double u = NextUniform();
  const float max = logits[best];
  if (!(max > -kInf)) return static_cast<int>(best);  // no finite logit, no +inf either

  Scratch& scratch = ThreadScratch();
  const size_t k = static_cast<size_t>(params_.top_k);
  const bool use_top_k = k > 0 && k < n;
  const bool use_top_p = params_.top_p < 1.0f;

  if (use_top_k && k <= kMaxHeapTopK) {
    // Small k: only the k best tokens matter, so weigh just those, in double.
    SelectTopK(logits, n, k, scratch.ranked);
    std::vector<Candidate>& candidates = scratch.candidates;
    candidates.clear();
    const double t = params_.temperature;
    for (const Ranked& r : scratch.ranked) {
      const double w = max == kInf ? (r.value == kInf ? 1.0 : 0.0)
                                   : std::exp((static_cast<double>(r.value) - max) / t);
      candidates.push_back(Candidate{w, r.id});
    }
    if (use_top_p) {
      std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
        return a.weight > b.weight || (a.weight == b.weight && a.id < b.id);
      });
      double mass = 0.0;
      for (const Candidate& c : candidates) mass += c.weight;
      const double target = (params_.top_p - kTopPSlack) * mass;
      double acc = 0.0;
      size_t keep = 0;
      while (keep < candidates.size()) {
        acc += candidates[keep++].weight;
        if (acc >= target) break;
      }
      candidates.resize(keep);
    }
    // Draw in id order, so that the outcome does not depend on the heap's arrangement.
    std::sort(candidates.begin(), candidates.end(),
              [](const Candidate& a, const Candidate& b) { return a.id < b.id; });
    return DrawCandidates(candidates, u);
  }

  scratch.probs.resize(n);
  float* probs = scratch.probs.data();
  if (max == kInf) {
    for (size_t i = 0; i < n; ++i) probs[i] = logits[i] == kInf ? 0.0f : -kInf;
  } else {
    // Subtracting the max first keeps (logit - max) / T <= 0, so a small T cannot overflow.
    // A multiply by 1 / T, far cheaper than a divide, capped so that the max itself still
    // gives 0 * cap = 0 rather than 0 * inf = NaN when T is below 1 / FLT_MAX.
    const float inv_t = std::min(1.0f / params_.temperature, std::numeric_limits<float>::max());
    ScaleLogits(logits, n, max, inv_t, probs);
  }
  kernels::Softmax(probs, n);

  if (use_top_k) {
    // Large k: the k-th best logit by selection over all tokens; ranking logits rather than
    // probabilities keeps tokens with distinct logits apart even where their probabilities
    // round to the same float.
    std::vector<Ranked>& ranked = scratch.ranked;
    ranked.resize(n);
    for (size_t i = 0; i < n; ++i) ranked[i] = Ranked{Sanitized(logits[i]), static_cast<int>(i)};
    std::nth_element(ranked.begin(), ranked.begin() + (k - 1), ranked.end(), Better);
    KeepAtLeast(logits, n, ranked[k - 1], probs);
  }
  if (use_top_p) {
    KeepAtLeast(probs, n, NucleusThreshold(probs, n, params_.top_p, scratch), probs);
  }
  return DrawWeights(probs, n, u, scratch.block_sums);
}

absl::Status StopMatcher::Validate(const std::vector<std::string>& stops) {
  if (stops.size() > kMaxStops) {
    return absl::InvalidArgumentError(
        absl::StrCat("stop: ", stops.size(), " sequences given, at most ", kMaxStops));
  }
  for (size_t i = 0; i < stops.size(); ++i) {
    const std::string& s = stops[i];
    if (s.empty()) return absl::InvalidArgumentError(absl::StrCat("stop[", i, "] is empty"));
    if (s.size() > kMaxStopBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("stop[", i, "] is ", s.size(), " bytes long, at most ", kMaxStopBytes));
    }
    if (!IsValidUtf8(s)) {
      return absl::InvalidArgumentError(absl::StrCat("stop[", i, "] is not valid UTF-8"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<StopMatcher> StopMatcher::Create(std::vector<std::string> stops) {
  if (absl::Status s = Validate(stops); !s.ok()) return s;
  return StopMatcher(std::move(stops));
}

StopMatcher::Result StopMatcher::Feed(std::string_view chunk) {
  Result result;
  if (stopped_) {
    result.stopped = true;
    return result;
  }
  std::string text = std::move(held_);
  held_.clear();
  text.append(chunk);

  size_t first = std::string::npos;
  for (const std::string& stop : stops_) first = std::min(first, text.find(stop));
  if (first != std::string::npos) {
    text.resize(first);
    result.emit = std::move(text);
    result.stopped = stopped_ = true;
    return result;
  }

  // No stop yet. The longest tail of `text` that begins some stop sequence may still grow into
  // one, so it waits; anything before it can no longer be part of a match.
  size_t hold = 0;
  const std::string_view view = text;
  for (const std::string_view stop : stops_) {
    for (size_t len = std::min(view.size(), stop.size() - 1); len > hold; --len) {
      if (view.ends_with(stop.substr(0, len))) {
        hold = len;
        break;
      }
    }
  }
  held_.assign(view.substr(view.size() - hold));
  text.resize(text.size() - hold);
  result.emit = std::move(text);
  return result;
}

std::string StopMatcher::Flush() {
  std::string out = std::move(held_);
  held_.clear();
  return out;
}

}  // namespace kvguard::core
