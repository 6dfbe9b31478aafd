// The continuous-batching engine: batching, preemption, cancel, stop sequences, limits.
#include "core/engine/engine.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "core/model/synthetic_model.h"
#include "tests/core/model/reference_decoder.h"
#include "tests/core/model/tiny_model.h"

namespace kvguard::core {
namespace {

using kernels::KvDtype;
using kernels::WeightFormat;

// GreedyAdmission admits on the prompt's pages plus the reserve alone
// (EngineOptions::admission_ratio 0): the tests that need the pool to run dry mid-decode use it.
EngineOptions GreedyAdmission() {
  EngineOptions eo;
  eo.admission_ratio = eo.admission_ratio_min = eo.admission_ratio_decay = 0;
  return eo;
}

// Paused starts the engine with both workers paused (EngineOptions::start_paused): the test
// lines its requests up, then releases the workers (LetRun).
EngineOptions Paused(EngineOptions eo = {}) {
  eo.start_paused = true;
  return eo;
}

std::unique_ptr<Engine> MakeEngine(int pages, int max_batch = 64, EngineOptions eo = {}) {
  const TinyModel& s = Fp32Tiny();
  KvPoolOptions po;
  po.dtype = KvDtype::kFp32;
  po.budget_bytes = s.model->config().KvBytesPerToken(4) * 16 * size_t(pages);
  eo.max_batch = max_batch;
  eo.check_accounting = true;
  eo.threads = 2;
  return *Engine::Create(s.model, s.tokenizer, *KvPool::Create(s.model->config(), po), eo);
}

GenerationRequest Greedy(const std::string& prompt, int max_tokens) {
  GenerationRequest r;
  r.prompt = Fp32Tiny().tokenizer->Encode(prompt, /*add_bos=*/true);
  r.max_tokens = max_tokens;
  r.stop_at_eos = false;
  return r;
}

// LetRun releases a paused engine once its requests are lined up: the prefill worker first
// admits every request that admission lets in before the first decode step (so which requests
// share the first steps does not depend on how fast either thread runs), then both workers run
// without limit.
void LetRun(Engine& engine) {
  engine.Allow(EngineWork::kAdmissions, kUnlimitedWork);
  engine.WaitUntilSettled();
  engine.Allow(EngineWork::kDecodeSteps, kUnlimitedWork);
}

std::vector<int> RunAlone(const std::string& prompt, int max_tokens) {
  auto engine = MakeEngine(64);
  const RequestId id = *engine->Submit(Greedy(prompt, max_tokens));
  return engine->Wait(id)->tokens;
}

const std::vector<std::string> kPrompts = {"Once upon a time", "The robot", "kvguard", "a",
                                           "Paged attention reads FP8 pages"};

TEST(EngineTest, BatchedGreedyEqualsEachAlone) {
  std::vector<std::vector<int>> alone;
  for (const auto& p : kPrompts) alone.push_back(RunAlone(p, 24));
  auto engine = MakeEngine(64, 64, Paused());
  std::vector<RequestId> ids;
  for (const auto& p : kPrompts) ids.push_back(*engine->Submit(Greedy(p, 24)));
  LetRun(*engine);
  for (size_t i = 0; i < ids.size(); ++i) {
    const GenerationResult r = *engine->Wait(ids[i]);
    EXPECT_EQ(r.reason, FinishReason::kLength);
    EXPECT_EQ(r.tokens, alone[i]) << kPrompts[i];
    EXPECT_EQ(r.tokens.size(), 24u);
  }
  EXPECT_EQ(engine->stats().max_running, static_cast<int>(kPrompts.size()))
      << "every request was admitted before the first step: all share every step";
  EXPECT_EQ(engine->stats().free_pages, engine->stats().total_pages);
}

// What holds for the quantised formats: batching changes nothing there either. Each matmul
// column and each attention query is computed on its own, in the same order, whatever the
// batch, so FP8 KV with INT4 decode weights gives bit-identical tokens batched or alone.
// (Preemption is different: the recompute runs prefill with the prefill weights, FP8, so the
// recomputed K/V differ slightly from what the INT4 decode steps wrote, and later tokens may
// differ. With FP32 weights in both phases, recompute is exact; see the next test.)
TEST(EngineTest, QuantisedBatchedGreedyEqualsEachAlone) {
  static const std::shared_ptr<Model> model = [] {
    auto source = *MakeBuiltinSource("tiny", 1);
    auto m = std::shared_ptr<Model>(*Model::Load(*source, ModelOptions{}, nullptr));
    std::vector<std::vector<int>> prompts = {Fp32Tiny().tokenizer->Encode("calibrate me", true)};
    EXPECT_TRUE(m->CalibrateKvScales(prompts, nullptr).ok());
    return m;
  }();
  auto make = [&] {
    KvPoolOptions po;  // FP8 e4m3
    po.budget_bytes = model->config().KvBytesPerToken(1) * 16 * 64;
    EngineOptions eo = Paused();
    eo.check_accounting = true;
    return *Engine::Create(model, Fp32Tiny().tokenizer, *KvPool::Create(model->config(), po), eo);
  };
  std::vector<std::vector<int>> alone;
  for (const auto& p : kPrompts) {
    auto e = make();
    const RequestId id = *e->Submit(Greedy(p, 24));
    LetRun(*e);
    alone.push_back(e->Wait(id)->tokens);
  }
  auto engine = make();
  std::vector<RequestId> ids;
  for (const auto& p : kPrompts) ids.push_back(*engine->Submit(Greedy(p, 24)));
  LetRun(*engine);
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(engine->Wait(ids[i])->tokens, alone[i]);
  EXPECT_EQ(engine->stats().max_running, static_cast<int>(kPrompts.size()));
}

TEST(EngineTest, PreemptionAndRecomputeGiveTheSameTokens) {
  std::vector<std::vector<int>> alone;
  for (const auto& p : kPrompts) alone.push_back(RunAlone(p, 60));
  // 10 pages of 16 tokens cannot hold five sequences of up to ~90 tokens at once. Greedy
  // admission lets in, before the first decode step, every request whose prompt fits beside the
  // reserve; those then grow in lockstep, one token per step, and need more pages than the pool
  // has before any of them finishes, so the pool runs dry on every run.
  auto engine = MakeEngine(10, 64, Paused(GreedyAdmission()));
  std::vector<RequestId> ids;
  for (const auto& p : kPrompts) ids.push_back(*engine->Submit(Greedy(p, 60)));
  LetRun(*engine);
  int preempted = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const GenerationResult r = *engine->Wait(ids[i]);
    EXPECT_EQ(r.tokens, alone[i]) << kPrompts[i] << " " << r.status;
    preempted += r.preemptions;
  }
  EXPECT_GT(preempted, 0) << "the pool never ran dry: the test did not exercise preemption";
  EXPECT_EQ(engine->stats().preemptions, preempted);
  EXPECT_EQ(engine->stats().free_pages, engine->stats().total_pages);
}

// The same workload with logprobs and prompt logprobs: a preempted request's recomputed prefill
// reports nothing twice, and every entry is what it is when the request runs alone.
TEST(EngineTest, PreemptedRequestsReportEachLogprobOnce) {
  auto with_logprobs = [](const std::string& prompt) {
    GenerationRequest g = Greedy(prompt, 60);
    g.logprobs = 2;
    g.prompt_logprobs = true;
    return g;
  };
  std::vector<GenerationResult> alone;
  for (const auto& p : kPrompts) {
    auto engine = MakeEngine(64);
    alone.push_back(*engine->Wait(*engine->Submit(with_logprobs(p))));
  }
  auto engine = MakeEngine(10, 64, Paused(GreedyAdmission()));
  std::vector<RequestId> ids;
  for (const auto& p : kPrompts) ids.push_back(*engine->Submit(with_logprobs(p)));
  LetRun(*engine);
  int preempted = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const GenerationResult r = *engine->Wait(ids[i]);
    preempted += r.preemptions;
    EXPECT_EQ(r.tokens, alone[i].tokens) << kPrompts[i];
    ASSERT_EQ(r.logprobs.size(), r.tokens.size()) << kPrompts[i];
    ASSERT_EQ(r.prompt_logprobs.size(), alone[i].prompt_logprobs.size()) << kPrompts[i];
    for (size_t k = 0; k < r.logprobs.size(); ++k) {
      EXPECT_EQ(r.logprobs[k].token, alone[i].logprobs[k].token);
      EXPECT_NEAR(r.logprobs[k].logprob, alone[i].logprobs[k].logprob, 1e-5);
    }
    for (size_t k = 0; k < r.prompt_logprobs.size(); ++k) {
      EXPECT_EQ(r.prompt_logprobs[k].token, alone[i].prompt_logprobs[k].token);
      EXPECT_NEAR(r.prompt_logprobs[k].logprob, alone[i].prompt_logprobs[k].logprob, 1e-5);
    }
  }
  EXPECT_GT(preempted, 0) << "the pool never ran dry: the test did not exercise preemption";
}

// The same workload under admission with full growth reservation (ratio 1): a request is
// admitted only when the pool holds everything every admitted request may still grow into, so
// nothing is ever preempted, and the tokens are the same. In a pool of kPages, reservation
// lets some but not all five requests share the first steps; its twin, greedy admission lined
// up the same way in the same pool, admits all five and preempts.
TEST(EngineTest, GrowthReservationAvoidsPreemption) {
  constexpr int kPages = 12;
  std::vector<std::vector<int>> alone;
  for (const auto& p : kPrompts) alone.push_back(RunAlone(p, 60));
  for (const bool reserve : {true, false}) {
    SCOPED_TRACE(reserve ? "growth reservation" : "greedy admission (twin)");
    EngineOptions eo = Paused(reserve ? EngineOptions{} : GreedyAdmission());
    if (reserve) eo.admission_ratio = eo.admission_ratio_min = 1.0;
    auto engine = MakeEngine(kPages, 64, eo);
    std::vector<RequestId> ids;
    for (const auto& p : kPrompts) ids.push_back(*engine->Submit(Greedy(p, 60)));
    // What admission lets in before the first decode step.
    engine->Allow(EngineWork::kAdmissions, kUnlimitedWork);
    engine->WaitUntilSettled();
    const EngineStats lined_up = engine->stats();
    engine->Allow(EngineWork::kDecodeSteps, kUnlimitedWork);
    for (size_t i = 0; i < ids.size(); ++i) {
      const GenerationResult r = *engine->Wait(ids[i]);
      EXPECT_EQ(r.reason, FinishReason::kLength);
      EXPECT_EQ(r.tokens, alone[i]) << kPrompts[i];
    }
    const EngineStats stats = engine->stats();
    EXPECT_EQ(stats.free_pages, stats.total_pages);
    if (reserve) {
      // More than one (a reservation that serialised every request would fail here).
      EXPECT_GT(lined_up.running, 1) << "reservation must still let requests share steps";
      EXPECT_LT(lined_up.running, static_cast<int>(kPrompts.size()));
      EXPECT_EQ(stats.preemptions, 0);
    } else {
      EXPECT_EQ(lined_up.running, static_cast<int>(kPrompts.size()));
      EXPECT_GT(stats.preemptions, 0);
    }
  }
}

// A preemption raises the admission ratio to 1 (the raise then decays per step, here not at
// all); without one the ratio follows the usage estimate, which requests that run to max_tokens
// pull towards 1 by 1/16 of the gap per finish. A lone request whose growth exceeds the whole
// pool is still admitted: reservation applies only while others are in flight.
TEST(EngineTest, PreemptionMakesAdmissionConservative) {
  EngineOptions eo = Paused();
  eo.admission_ratio = eo.admission_ratio_min = 0.01;  // nearly greedy: the pool runs dry
  eo.admission_ratio_decay = 0;
  auto engine = MakeEngine(10, 64, eo);
  std::vector<RequestId> ids;
  for (const auto& p : kPrompts) ids.push_back(*engine->Submit(Greedy(p, 60)));
  LetRun(*engine);  // as in PreemptionAndRecomputeGiveTheSameTokens: dry on every run
  for (RequestId id : ids) EXPECT_EQ(engine->Wait(id)->reason, FinishReason::kLength);
  EXPECT_GT(engine->stats().preemptions, 0);
  EXPECT_EQ(engine->stats().admission_ratio, 1.0);
  // Twin: a roomy pool never preempts; the ratio is the usage estimate after five requests that
  // each used all of max_tokens.
  auto roomy = MakeEngine(64, 64, eo);
  ids.clear();
  for (const auto& p : kPrompts) ids.push_back(*roomy->Submit(Greedy(p, 60)));
  LetRun(*roomy);
  for (RequestId id : ids) EXPECT_EQ(roomy->Wait(id)->reason, FinishReason::kLength);
  EXPECT_EQ(roomy->stats().preemptions, 0);
  const double expected = 1.0 - 0.99 * std::pow(15.0 / 16.0, 5);
  EXPECT_NEAR(roomy->stats().admission_usage, expected, 1e-12);
  EXPECT_NEAR(roomy->stats().admission_ratio, expected, 1e-12);
  // Alone, with full reservation, a request that may grow past the pool is admitted and runs.
  EngineOptions full;
  full.admission_ratio = full.admission_ratio_min = 1.0;
  auto small = MakeEngine(4, 64, full);
  const GenerationResult r = *small->Wait(*small->Submit(Greedy("abc", 40)));
  EXPECT_EQ(r.reason, FinishReason::kLength);
  EXPECT_EQ(r.tokens.size(), 40u);
}

// Requests that stop well before max_tokens (here at a stop sequence a few tokens in) lower the
// usage estimate, so admission reserves less; requests that run to max_tokens keep it at 1.
TEST(EngineTest, EarlyFinishesLowerTheUsageEstimate) {
  auto probe = MakeEngine(64);
  const GenerationResult full = *probe->Wait(*probe->Submit(Greedy("The robot", 40)));
  ASSERT_GE(full.text.size(), 12u);
  EXPECT_EQ(probe->stats().admission_usage, 1.0) << "ran to max_tokens: the estimate stays 1";
  // A stop sequence from the greedy output a few characters in (whole characters: the text is
  // valid UTF-8, see StopSequenceEndsTheRequestAndIsNotReturned).
  std::vector<size_t> starts;
  for (size_t i = 0; i < full.text.size(); ++i) {
    if ((static_cast<unsigned char>(full.text[i]) & 0xC0) != 0x80) starts.push_back(i);
  }
  ASSERT_GE(starts.size(), 6u);
  const std::string stop = full.text.substr(starts[3], starts[5] - starts[3]);
  auto engine = MakeEngine(64);
  for (int i = 0; i < 4; ++i) {
    GenerationRequest r = Greedy("The robot", 40);
    r.stop = {stop};
    const GenerationResult g = *engine->Wait(*engine->Submit(std::move(r)));
    EXPECT_EQ(g.reason, FinishReason::kStop);
    EXPECT_LT(g.tokens.size(), 20u);
  }
  EXPECT_LT(engine->stats().admission_usage, 0.85);
  EXPECT_EQ(engine->stats().admission_ratio, engine->stats().admission_usage);
}

TEST(EngineTest, BadAdmissionRatiosAreRefused) {
  const TinyModel& s = Fp32Tiny();
  for (auto [ratio, min, decay] : {std::tuple{1.5, 0.1, 0.0},
                                   {0.5, 1.5, 0.0},
                                   {0.5, -0.1, 0.0},
                                   {0.5, 0.1, 2.0},
                                   {-0.5, 0.1, 0.0}}) {
    EngineOptions eo;
    eo.admission_ratio = ratio;
    eo.admission_ratio_min = min;
    eo.admission_ratio_decay = decay;
    KvPoolOptions po;
    po.dtype = KvDtype::kFp32;
    po.budget_bytes = s.model->config().KvBytesPerToken(4) * 16 * 8;
    EXPECT_FALSE(
        Engine::Create(s.model, s.tokenizer, *KvPool::Create(s.model->config(), po), eo).ok());
  }
  EXPECT_NE(MakeEngine(8, 64, EngineOptions{}), nullptr);  // the defaults are valid
}

TEST(EngineTest, MaxTokensStopsExactly) {
  auto engine = MakeEngine(16);
  for (int n : {1, 2, 17}) {
    const GenerationResult r = *engine->Wait(*engine->Submit(Greedy("abc", n)));
    EXPECT_EQ(r.reason, FinishReason::kLength);
    EXPECT_EQ(static_cast<int>(r.tokens.size()), n);
  }
}

TEST(EngineTest, StopSequenceEndsTheRequestAndIsNotReturned) {
  // Find the text greedy decoding produces (valid UTF-8: bytes the random model emits that
  // do not form characters come out as U+FFFD), then stop on its 4th and 5th characters.
  auto engine = MakeEngine(16);
  const GenerationResult full = *engine->Wait(*engine->Submit(Greedy("The robot", 30)));
  std::vector<size_t> starts;  // byte offsets where characters start
  for (size_t i = 0; i < full.text.size(); ++i) {
    if ((static_cast<unsigned char>(full.text[i]) & 0xC0) != 0x80) starts.push_back(i);
  }
  ASSERT_GE(starts.size(), 6u);
  const std::string stop = full.text.substr(starts[3], starts[5] - starts[3]);
  GenerationRequest req = Greedy("The robot", 30);
  req.stop = {stop};
  std::string streamed;
  req.on_text = [&](std::string_view t) { streamed += t; };
  const GenerationResult r = *engine->Wait(*engine->Submit(std::move(req)));
  EXPECT_EQ(r.reason, FinishReason::kStop);
  EXPECT_EQ(r.text, full.text.substr(0, full.text.find(stop)));
  EXPECT_EQ(streamed, r.text);
  // Positive twin: a stop sequence that never appears changes nothing.
  GenerationRequest other = Greedy("The robot", 30);
  other.stop = {"never in this text"};
  const GenerationResult r2 = *engine->Wait(*engine->Submit(std::move(other)));
  EXPECT_EQ(r2.reason, FinishReason::kLength);
  EXPECT_EQ(r2.tokens, full.tokens);
  EXPECT_EQ(r2.text, full.text);
}

TEST(EngineTest, CancelAtAnyMomentReleasesEverything) {
  // Greedy admission: growth reservation would admit only two of these 480-token requests.
  auto engine = MakeEngine(64, /*max_batch=*/4, Paused(GreedyAdmission()));
  // Six long requests, four running at most: cancel one while it is still queued, then the
  // rest after three decode steps, while four are mid-decode and one is still queued.
  std::vector<RequestId> ids;
  for (int i = 0; i < 6; ++i)
    ids.push_back(*engine->Submit(Greedy("cancel me " + std::to_string(i), 480)));
  engine->Cancel(ids[5]);
  engine->Allow(EngineWork::kAdmissions, kUnlimitedWork);
  engine->WaitUntilSettled();  // four admitted before the first step: each gets all three
  engine->Allow(EngineWork::kDecodeSteps, 3);
  engine->WaitUntilSettled();
  EngineStats mid = engine->stats();
  EXPECT_EQ(mid.running, 4);
  EXPECT_EQ(mid.queued, 1);
  EXPECT_EQ(mid.decode_steps, 3);
  // Still paused: cancelled requests leave without another step.
  // The queued one first: then the running ones' cancels must wake the paused worker themselves.
  for (int i : {4, 0, 1, 2, 3}) engine->Cancel(ids[i]);
  for (size_t i = 0; i < ids.size(); ++i) {
    const GenerationResult r = *engine->Wait(ids[i]);
    EXPECT_EQ(r.reason, FinishReason::kCancelled);
    // Running ones: the prefill token and three decode steps; queued ones: nothing.
    EXPECT_EQ(r.tokens.size(), i < 4 ? 4u : 0u) << i;
  }
  EXPECT_EQ(engine->stats().decode_steps, 3);
  EXPECT_EQ(engine->stats().free_pages, engine->stats().total_pages);
  engine->Cancel(12345);  // unknown ids are ignored
  // Positive twin: an uncancelled request in the same engine completes.
  engine->Allow(EngineWork::kDecodeSteps, kUnlimitedWork);
  EXPECT_EQ(engine->Wait(*engine->Submit(Greedy("done", 5)))->reason, FinishReason::kLength);
}

TEST(EngineTest, BadRequestsGetClearErrors) {
  auto engine = MakeEngine(8);
  GenerationRequest empty;
  empty.max_tokens = 4;
  const auto e1 = engine->Submit(empty);
  EXPECT_EQ(e1.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e1.status().message().find("empty prompt"), std::string::npos);

  GenerationRequest too_long = Greedy(std::string(600, 'x'), 4);  // context is 512
  const auto e2 = engine->Submit(too_long);
  EXPECT_EQ(e2.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e2.status().message().find("context"), std::string::npos);

  GenerationRequest negative = Greedy("x", -1);
  EXPECT_EQ(engine->Submit(negative).status().code(), absl::StatusCode::kInvalidArgument);

  GenerationRequest too_many_logprobs = Greedy("x", 3);
  too_many_logprobs.logprobs = kMaxTopLogprobs + 1;
  EXPECT_EQ(engine->Submit(too_many_logprobs).status().code(), absl::StatusCode::kInvalidArgument);
  too_many_logprobs.logprobs = kMaxTopLogprobs;  // the twin
  EXPECT_EQ(engine->Wait(*engine->Submit(too_many_logprobs))->logprobs.size(), 3u);

  GenerationRequest bad_token = Greedy("x", 3);
  bad_token.prompt.push_back(99999);
  EXPECT_EQ(engine->Submit(bad_token).status().code(), absl::StatusCode::kInvalidArgument);

  GenerationRequest bad_temp = Greedy("x", 3);
  bad_temp.sampling.temperature = -1;
  EXPECT_EQ(engine->Submit(bad_temp).status().code(), absl::StatusCode::kInvalidArgument);

  // 8 pages of 16 tokens, one kept in reserve: a 200-token prompt can never be admitted.
  const auto e3 = engine->Submit(Greedy(std::string(200, 'y'), 4));
  EXPECT_EQ(e3.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(e3.status().message().find("KV pages"), std::string::npos);

  // Nothing above disturbed the engine: a good request still runs.
  EXPECT_EQ(engine->Wait(*engine->Submit(Greedy("fine", 3)))->tokens.size(), 3u);
}

// LogSoftmax is the definition, in double: what every logprob the engine reports must match.
std::vector<double> LogSoftmax(const std::vector<float>& logits) {
  double max = -INFINITY, sum = 0;
  for (float x : logits) max = std::max(max, double{x});
  for (float x : logits) sum += std::exp(double{x} - max);
  std::vector<double> out;
  for (float x : logits) out.push_back(double{x} - max - std::log(sum));
  return out;
}

// ExpectLogprobsOfTheModel checks every reported entry of `r` (for `prompt` + r.tokens) against
// log_softmax of the reference decoder's logits at that position: the token there, its logprob
// and the top `top_n`, most likely first.
void ExpectLogprobsOfTheModel(const std::vector<int>& prompt, const GenerationResult& r,
                              int top_n) {
  auto ref = *testing::ReferenceDecoder::Load(**MakeBuiltinSource("tiny", 1));
  std::vector<int> seq = prompt;
  seq.insert(seq.end(), r.tokens.begin(), r.tokens.end());
  const size_t P = prompt.size();
  ASSERT_EQ(r.prompt_logprobs.size(), P - 1);
  ASSERT_EQ(r.logprobs.size(), r.tokens.size());
  for (size_t pos = 0; pos + 1 < seq.size(); ++pos) {
    const std::vector<double> want = LogSoftmax(ref.Forward(seq[pos], static_cast<int>(pos)));
    const TokenLogprobs& got = pos + 1 < P ? r.prompt_logprobs[pos] : r.logprobs[pos + 1 - P];
    EXPECT_EQ(got.token, seq[pos + 1]) << pos;
    EXPECT_NEAR(got.logprob, want[size_t(got.token)], 1e-3) << pos;
    ASSERT_EQ(got.top.size(), size_t(top_n)) << pos;
    if (top_n == 0) continue;
    const double best = *std::max_element(want.begin(), want.end());
    EXPECT_NEAR(got.top[0].logprob, best, 1e-3) << pos;
    for (size_t k = 0; k < got.top.size(); ++k) {
      EXPECT_NEAR(got.top[k].logprob, want[size_t(got.top[k].token)], 1e-3) << pos;
      if (k > 0) {
        EXPECT_LE(got.top[k].logprob, got.top[k - 1].logprob) << pos;
      }
    }
    // Greedy: each generated token is the most likely one.
    if (pos + 1 >= P) {
      EXPECT_EQ(got.top[0].token, got.token) << pos;
    }
  }
}

TEST(EngineTest, LogprobsAreTheModelsLogSoftmax) {
  // One prefill chunk, and a prompt prefilled in chunks of at most 16 tokens beside a decoding
  // request (each chunk's rows come out of its own forward pass).
  EngineOptions chunked;
  chunked.step_tokens = 16;
  chunked.partial_prefill_tokens = 16;
  for (const std::string& prompt :
       {std::string("Once upon a time"),
        std::string("A longer prompt, prefilled in chunks: ") + std::string(40, 'z')}) {
    auto engine = MakeEngine(64, 8, chunked);
    const RequestId other = *engine->Submit(Greedy("decoding beside it", 30));
    GenerationRequest g = Greedy(prompt, 6);
    g.logprobs = 3;
    g.prompt_logprobs = true;
    const GenerationResult r = *engine->Wait(*engine->Submit(g));
    EXPECT_EQ(r.reason, FinishReason::kLength);
    ExpectLogprobsOfTheModel(g.prompt, r, 3);
    // The twin without logprobs: the same tokens, nothing reported.
    const GenerationResult plain = *engine->Wait(*engine->Submit(Greedy(prompt, 6)));
    EXPECT_EQ(plain.tokens, r.tokens);
    EXPECT_TRUE(plain.logprobs.empty());
    EXPECT_TRUE(plain.prompt_logprobs.empty());
    EXPECT_EQ(engine->Wait(other)->tokens.size(), 30u);
  }
}

TEST(EngineTest, MaxTokensZeroScoresThePromptOnly) {
  auto engine = MakeEngine(64);
  GenerationRequest g = Greedy("Score this text", 0);
  g.logprobs = 0;
  g.prompt_logprobs = true;
  const GenerationResult r = *engine->Wait(*engine->Submit(g));
  EXPECT_EQ(r.reason, FinishReason::kLength);
  EXPECT_TRUE(r.tokens.empty());
  EXPECT_TRUE(r.text.empty());
  ExpectLogprobsOfTheModel(g.prompt, r, 0);
  // Generating from the same prompt reports the same prompt logprobs.
  g.max_tokens = 2;
  const GenerationResult more = *engine->Wait(*engine->Submit(g));
  ASSERT_EQ(more.prompt_logprobs.size(), r.prompt_logprobs.size());
  for (size_t i = 0; i < r.prompt_logprobs.size(); ++i) {
    EXPECT_EQ(more.prompt_logprobs[i].logprob, r.prompt_logprobs[i].logprob);
  }
  EXPECT_EQ(more.tokens.size(), 2u);
  // Without prompt_logprobs, max_tokens 0 prefills and returns nothing.
  const GenerationResult none = *engine->Wait(*engine->Submit(Greedy("Score this text", 0)));
  EXPECT_EQ(none.reason, FinishReason::kLength);
  EXPECT_TRUE(none.tokens.empty());
  EXPECT_TRUE(none.prompt_logprobs.empty());
  EXPECT_EQ(engine->stats().free_pages, engine->stats().total_pages);
}

TEST(EngineTest, SeededSamplingIsReproducible) {
  auto engine = MakeEngine(32);
  auto sampled = [&](uint64_t seed) {
    GenerationRequest r = Greedy("sample", 40);
    r.sampling.temperature = 1.0f;
    r.sampling.top_p = 0.9f;
    r.sampling.seed = seed;
    return engine->Wait(*engine->Submit(std::move(r)))->tokens;
  };
  EXPECT_EQ(sampled(7), sampled(7));
  EXPECT_NE(sampled(7), sampled(8));
}

TEST(EngineTest, FirstTokenAndGapsAreTimed) {
  auto engine = MakeEngine(16);
  const GenerationResult r = *engine->Wait(*engine->Submit(Greedy("time", 10)));
  EXPECT_GT(r.first_token_seconds, 0);
  EXPECT_EQ(r.token_seconds.size(), 9u);
}

// Waits from many threads while others submit (the request map rehashes meanwhile), and two
// Waits on one request: exactly one gets the result, the other NotFound, neither crashes.
TEST(EngineTest, ConcurrentWaitsAndSubmitsAreSafe) {
  auto engine = MakeEngine(64);
  const RequestId first = *engine->Submit(Greedy("shared", 30));
  std::atomic<int> got{0}, not_found{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&] {
      absl::StatusOr<GenerationResult> r = engine->Wait(first);
      (r.ok() ? got : not_found).fetch_add(1);
      if (!r.ok()) {
        EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
      }
    });
  }
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        const RequestId id = *engine->Submit(Greedy("r" + std::to_string(t * 100 + i), 3));
        EXPECT_EQ(engine->Wait(id)->tokens.size(), 3u);
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(got.load(), 1);
  EXPECT_EQ(not_found.load(), 1);
}

}  // namespace
}  // namespace kvguard::core
