// core/text/logprobs.h: a token's log-probability and the most likely alternatives, as the
// OpenAI API's `logprobs` reports them.
//
// The distribution is log_softmax of the model's raw logits: before temperature, top_k and
// top_p, so it is the model's own, whatever the request sampled with (OpenAI and vLLM report
// the same). Evaluation harnesses score text by it (loglikelihood tasks), and two requests
// with different sampling parameters see the same numbers for the same text.
#ifndef KVGUARD_CORE_TEXT_LOGPROBS_H_
#define KVGUARD_CORE_TEXT_LOGPROBS_H_

#include <span>
#include <vector>

namespace kvguard::core {

// A token and its log-probability (natural log; -inf for a token of probability 0).
struct TopLogprob {
  int token = 0;
  float logprob = 0;
};

// TokenLogprobs is one position's report: the token that is there (sampled or given) and its
// logprob, and the `top_n` most likely tokens at that position, most likely first.
struct TokenLogprobs {
  int token = 0;
  float logprob = 0;
  std::vector<TopLogprob> top;
};

// The most alternatives one position reports (OpenAI: completions 5, chat 20).
inline constexpr int kMaxTopLogprobs = 20;

// LogprobsOf returns `token`'s entry under log_softmax(logits) [vocab] and the top_n most
// likely tokens (0 <= top_n <= kMaxTopLogprobs, at most vocab; ties go to the lower id), computed
// in double. NaN logits count as -inf, as for the sampler; if some logit is +inf, those tokens
// share the mass equally (the limit of softmax) and the rest get -inf; if none is above -inf,
// every token gets log(1 / vocab). CHECK: vocab >= 1, token in [0, vocab), top_n in range.
TokenLogprobs LogprobsOf(std::span<const float> logits, int token, int top_n);

}  // namespace kvguard::core

#endif  // KVGUARD_CORE_TEXT_LOGPROBS_H_
