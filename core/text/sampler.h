// core/text/sampler.h: picking the next token from the lm head's logits, and cutting the output at
// stop sequences.
#ifndef KVGUARD_CORE_TEXT_SAMPLER_H_
#define KVGUARD_CORE_TEXT_SAMPLER_H_

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvguard::core {

// SamplingParams are the per-request sampling knobs (OpenAI/vLLM meaning).
struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy; logits are divided by it otherwise
  int top_k = 0;             // keep the k largest logits; 0 = off
  float top_p = 1.0f;        // nucleus mass, applied after top_k; 1 = off
  uint64_t seed = 0;         // seeds the request's own PRNG

  // Validate returns InvalidArgument naming the first bad field: temperature must be finite
  // and in [0, 100], top_k >= 0, top_p in (0, 1].
  absl::Status Validate() const;
};

// Sampler draws a request's tokens. One per request: it owns that request's PRNG, so the same
// params (seed included) and the same sequence of logits give the same tokens, run after run.
// Not thread-safe; distinct Samplers may run concurrently (scratch space is per thread).
class Sampler {
 public:
  // Sampler takes `params`, which must pass Validate() (a crash otherwise: callers validate at
  // the API boundary).
  explicit Sampler(const SamplingParams& params);

  // Sample returns a token id in [0, vocab) for `logits` [vocab], vocab >= 1.
  //
  // temperature 0: kernels::Argmax (the first maximum; NaN never wins). Otherwise:
  //  1. NaN logits count as -inf (never sampled). If some logit is +inf, the +inf ones share
  //     all the mass equally (the limit of softmax); if none is above -inf, the result is
  //     kernels::Argmax's answer (the first -inf, or 0 when all are NaN).
  //  2. top_k keeps the k largest logits, ties going to the lower id.
  //  3. top_p keeps, of those, the smallest set of most probable tokens whose mass (renormalised
  //     over the top-k set) is >= top_p, ties going to the lower id; a shortfall under 1e-6
  //     counts as reaching it, so that rounding cannot add a token at an exact boundary.
  //  4. One draw picks among the kept tokens in proportion to softmax(logits / temperature).
  // Every non-greedy call consumes exactly one 64-bit PRNG output (std::mt19937_64, whose
  // sequence the C++ standard fixes), turned into a double in [0, 1) from its top 53 bits, so
  // the random stream is the same on every platform. The probabilities are computed in double
  // for the k tokens when 0 < top_k <= 256, else in float by the SIMD softmax kernel, whose
  // last bits may differ between SIMD targets.
  //
  // Cost for a 32000-token vocabulary (Zen 5, AVX3_DL; the softmax kernel alone is ~17 us):
  // ~33 us with temperature only, ~27-37 us with top_k 40 (with or without top_p), ~100-125 us
  // with top_p alone. No allocation once the calling thread's scratch has grown to the
  // vocabulary.
  int Sample(const float* logits, int vocab);

  const SamplingParams& params() const { return params_; }

 private:
  // NextUniform returns a double in [0, 1) from the next PRNG output.
  double NextUniform();

  SamplingParams params_;
  std::mt19937_64 rng_;
};

// StopMatcher cuts a stream of decoded text at the first stop sequence, OpenAI style: the stop
// sequence itself and everything after it are never emitted, and text that might still turn
// out to be the start of a stop sequence is held back until it is decided. The stream stops at
// the first chunk that completes a stop sequence; should that chunk complete several, the cut
// is at the one that starts first.
class StopMatcher {
 public:
  static constexpr size_t kMaxStops = 4;
  static constexpr size_t kMaxStopBytes = 64;

  struct Result {
    std::string emit;      // text now safe to send to the client
    bool stopped = false;  // a stop sequence was seen; nothing more will be emitted
  };

  // Validate returns InvalidArgument when there are more than kMaxStops stop sequences, or one
  // is empty, longer than kMaxStopBytes or not valid UTF-8 (the decoded stream always is, so
  // such a sequence could only match inside a character).
  static absl::Status Validate(const std::vector<std::string>& stops);

  // Create returns a matcher for `stops` (none is fine: then text passes straight through), or
  // Validate's error.
  static absl::StatusOr<StopMatcher> Create(std::vector<std::string> stops);

  // Feed consumes the next `chunk` of text and returns what may be emitted now. Once a stop
  // sequence has been seen it returns {"", true} for every later chunk. When the chunks are
  // valid UTF-8 (Utf8StreamDecoder output), so is every `emit`.
  Result Feed(std::string_view chunk);

  // Flush returns the held-back text at the end of the stream (empty after a stop).
  std::string Flush();

  bool stopped() const { return stopped_; }

 private:
  explicit StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}

  std::vector<std::string> stops_;
  std::string held_;  // shorter than the longest stop sequence
  bool stopped_ = false;
};

}  // namespace kvguard::core

#endif  // KVGUARD_CORE_TEXT_SAMPLER_H_
