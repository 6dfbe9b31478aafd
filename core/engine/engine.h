// core/engine/engine.h: continuous-batching engine over one shared paged KV pool.
//
// One engine thread runs steps. Each step is planned by the scheduler (core/engine/scheduler.h) as
// data: which running requests decode a token, which prompts compute their next chunk, which
// waiting requests are admitted (and with their first chunk), which are preempted when the
// pool runs dry (their pages go back; they are recomputed later from their tokens). The step
// is then one forward pass over that mixed batch (Model::Forward: decode tokens through the
// decode weights, prefill chunks through the prefill weights, all rows through one layer body,
// every chunk attending through the paged cache). HTTP threads only submit, cancel and wait.
//
// Every page a request holds comes from, and goes back to, the pool's ownership table
// (isolation/), granted to Owner{tenant, session = request id}. Each step goes through
// isolation::StepGuard, the one owner of the step protocol: it pins an epoch, verifies every
// request's page table (unless its tenant's mode is off), has the kernels check tags,
// re-verifies and reports; a request that fails is aborted alone (FinishReason::kAborted, with
// the violation) and reported to the audit sink. Nothing here throws; bad requests are refused
// at Submit.
#ifndef KVGUARD_CORE_ENGINE_ENGINE_H_
#define KVGUARD_CORE_ENGINE_ENGINE_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "core/engine/scheduler.h"
#include "core/engine/session_pages.h"
#include "core/model/kv_pool.h"
#include "core/model/model.h"
#include "core/text/logprobs.h"
#include "core/text/sampler.h"
#include "core/text/tokenizer.h"
#include "isolation/guard.h"
#include "isolation/step_guard.h"
#include "kernels/cpu/thread_pool.h"

namespace kvguard::core {

using RequestId = uint64_t;

struct EngineOptions {
  // Scheduling (core/engine/scheduler.h, SchedulerOptions, which explains each): requests in
  // flight at once (<= kMaxDecodeBatch), the admission reserve and the admission ratio.
  int max_batch = 64;
  int reserve_pages = 1;
  double admission_ratio = 1.0;
  double admission_ratio_min = 0.1;
  double admission_ratio_decay = 1e-3;
  // The step's token budget (SchedulerOptions::step_tokens): decode tokens plus prefill
  // chunk tokens; >= max_batch.
  int step_tokens = 256;
  // The most tokens partial prefills (long prompts' chunks) take in one step, all together, beside
  // other work (SchedulerOptions::partial_prefill_tokens); 0: no limit beyond step_tokens.
  int partial_prefill_tokens = 64;
  int threads = 2;  // threads of the engine's kernel pool (the engine thread among them)
  // The engine starts paused (allowances of 0, Engine::Allow): tests submit their requests
  // first and then let it run a known number of admissions and decode steps.
  bool start_paused = false;
  // CHECK pool accounting (free + in use == total, and pages held by requests == pages in
  // use) after every step: on in debug builds (and the asan preset), and in tests.
#ifdef NDEBUG
  bool check_accounting = false;
#else
  bool check_accounting = true;
#endif
  isolation::GuardOptions isolation;  // tenants, modes, audit sink
};

#if KVGUARD_FAULT_INJECTION
// EngineFaults make the scheduler misbehave the ways real engines have shipped (test and fuzz
// builds only; table-level faults are isolation::TableFaults). Verification must catch each.
struct EngineFaults {
  uint64_t release_during_step = 0;  // this request's first page is released mid-step (a step
                                     // in which it decodes)
  // ... or the next request of this tenant submitted from now on (armed inside Submit, so it
  // cannot finish before it is armed).
  std::string release_during_step_next_of_tenant;
  uint64_t release_during_prefill = 0;  // ... or after the verification of a step in which
                                        // it computes a prefill chunk, before the writes
  uint64_t release_after_kernels = 0;   // ... or after a decode step's kernels ran, before
                                        // the step's re-verification: only that catches it
  uint64_t double_release = 0;          // this request's pages are released twice at finish
  bool cancelled_continues = false;     // a cancelled request's pages are released at the step
                                        // boundary, yet it goes on with its old page table
  uint64_t cancel_in_prefill = 0;       // timing, not a bug: this request is cancelled while a
                                        // step computes its prefill (deterministically)
};
#endif

// What Engine::Allow paces: admissions (a waiting request taken in, its first chunk computed
// in that step) and decode steps (steps in which running requests decode a token).
enum class EngineWork { kAdmissions, kDecodeSteps };
inline constexpr int64_t kUnlimitedWork = -1;

// kAborted: an isolation violation (GenerationResult::violation says which).
enum class FinishReason { kLength, kStop, kEos, kCancelled, kError, kAborted };
std::string FinishReasonName(FinishReason reason);

struct GenerationRequest {
  std::string tenant = "default";  // a tenant of the isolation policy
  std::vector<int> prompt;         // token ids, BOS included if the model wants one
  // >= 0; 0: the prompt is prefilled (for prompt_logprobs) and nothing is generated.
  int max_tokens = 16;
  SamplingParams sampling;
  // logprobs >= 0: each generated token's logprob and its `logprobs` most likely alternatives
  // (<= kMaxTopLogprobs), of the raw logits it was sampled from (core/text/logprobs.h), go to
  // GenerationResult::logprobs; -1: none.
  int logprobs = -1;
  // prompt_logprobs: so do the prompt's tokens after the first (GenerationResult::
  // prompt_logprobs), from the logits of every prefill row (Model::Chunk::token_logits), with
  // max(logprobs, 0) alternatives.
  bool prompt_logprobs = false;
  std::vector<std::string> stop;  // stop sequences (text), OpenAI semantics
  bool stop_at_eos = true;
  // on_text, if set, receives the text as it becomes final (valid UTF-8, stop sequences
  // removed), from an engine thread; it must not block for long or call into the engine.
  std::function<void(std::string_view)> on_text;
  // on_logprobs, if set (with logprobs >= 0), receives each generated token's entry as it is
  // accepted, before the text it adds reaches on_text; same thread and rules.
  std::function<void(const TokenLogprobs&)> on_logprobs;
  // on_prompt_logprobs, if set (with prompt_logprobs), receives every prompt entry once the
  // prefill is done, before any generated token's; same thread and rules.
  std::function<void(std::span<const TokenLogprobs>)> on_prompt_logprobs;
};

struct GenerationResult {
  RequestId id = 0;
  std::vector<int> tokens;              // generated ids (the stop sequence's tokens included)
  std::vector<TokenLogprobs> logprobs;  // per generated token (request's logprobs >= 0)
  std::vector<TokenLogprobs> prompt_logprobs;  // prompt tokens 1.. (prompt_logprobs)
  std::string text;                            // generated text, stop sequence removed
  FinishReason reason = FinishReason::kError;
  absl::Status status;                            // OK unless reason == kError or kAborted
  std::optional<isolation::Violation> violation;  // kAborted: what verification found
  int preemptions = 0;
  double queue_seconds = 0;           // submit -> admitted (first admission)
  double first_token_seconds = 0;     // submit -> first token
  std::vector<double> token_seconds;  // gap before each token after the first
};

struct EngineStats {
  int64_t submitted = 0, finished = 0, preemptions = 0, aborted = 0;
  int64_t steps = 0;         // forward passes
  int64_t decode_steps = 0;  // ... of which decoded at least one token
  int queued = 0, prefilling = 0, running = 0;
  int max_running = 0;  // most requests in one step so far
  int free_pages = 0, total_pages = 0;
  // Steps that decoded, summed: wall seconds from the step's verification to its results'
  // acceptance (a mixed step's prefill chunks included), tokens decoded, and KV tokens the
  // decode tokens' attention read (sum over decoded requests of their length).
  double decode_seconds = 0;
  int64_t decode_tokens = 0, decode_kv_tokens = 0;
  int64_t prefill_tokens = 0;  // prompt tokens computed (recomputation after preemption included)
  double admission_ratio = 0;  // the ratio admission uses now (EngineOptions::admission_ratio)
  double admission_usage = 0;  // the running estimate of the fraction of max_tokens used
};

class Engine {
 public:
  // Create starts the engine thread. `model` must have FP8 KV scales when pool is FP8.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(std::shared_ptr<Model> model,
                                                        std::shared_ptr<const Tokenizer> tokenizer,
                                                        std::unique_ptr<KvPool> pool,
                                                        const EngineOptions& options);
  ~Engine();  // cancels everything still running and joins the engine thread

  // Submit queues a request. InvalidArgument (and nothing queued) for an empty prompt, a
  // prompt that leaves no room in the context, max_tokens < 0, logprobs outside
  // [-1, kMaxTopLogprobs], bad sampling parameters or
  // stop sequences, a token outside the vocabulary; ResourceExhausted if the whole pool
  // could never hold the prompt plus the reserve; NotFound for an unknown tenant,
  // PermissionDenied for a quarantined one, Unavailable for a strict one while the audit sink
  // cannot record.
  absl::StatusOr<RequestId> Submit(GenerationRequest request);

  // Cancel finishes request `id` with kCancelled at the next opportunity (at once if queued,
  // else after the step in flight) and releases its pages. Unknown ids are ignored.
  void Cancel(RequestId id);

  // Wait blocks until `id` finishes and returns its result (once; NotFound after that).
  absl::StatusOr<GenerationResult> Wait(RequestId id);

  // Pacing, for tests and tools that must line work up whatever the thread's speed (the
  // service leaves both unlimited). Allow lets the engine do `units` more of `work` from now
  // on, replacing what it had left: admissions (kAdmissions) or steps that decode
  // (kDecodeSteps). kUnlimitedWork, the default, lifts the limit; 0 stops that work once the
  // step in flight is done. With decode steps at 0, admitted requests still prefill (and
  // sample their first token), then hold their pages; cancelled requests still leave (a
  // draining server cancels them). CHECK: units >= 0 or kUnlimitedWork.
  void Allow(EngineWork work, int64_t units);

  // WaitUntilSettled blocks until the engine can start no step: it has nothing to run within
  // its allowances (nothing in flight may decode or prefill, and the request whose turn it is
  // does not fit yet, or no admission is allowed). Then no step is in flight and no page waits
  // out an epoch, and the engine stays so until a Submit, Cancel or Allow. Returns at once
  // while stopping.
  void WaitUntilSettled();

  EngineStats stats() const;
  const Model& model() const { return *model_; }
  const KvPool& pool() const { return *pool_; }
  // guard is the isolation layer: tenants and modes (SetMode), metrics, key rotation.
  isolation::Guard& guard() { return *guard_; }

#if KVGUARD_FAULT_INJECTION
  void set_faults(const EngineFaults& faults);
  KvPool& mutable_pool() { return *pool_; }
#endif
 private:
  struct Request;
  Engine(std::shared_ptr<Model> model, std::shared_ptr<const Tokenizer> tokenizer,
         std::unique_ptr<KvPool> pool, std::unique_ptr<isolation::Guard> guard,
         const EngineOptions& options);
  void StepLoop();
  // CanStepLocked: the engine thread has a step to run (PlanLocked plans something), or
  // cancelled requests to let go, or it is stopping.
  bool CanStepLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // PlanLocked asks the scheduler for the next step over in_flight_ and waiting_ (their
  // descriptions go into sched_running_ / sched_waiting_, kept across calls).
  StepPlan PlanLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // DescribeLocked: what the scheduler knows of r.
  SchedRequest DescribeLocked(const Request* r) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Admit takes waiting request r in (grants its prefill's pages); false if it failed, and
  // finished with the reason.
  bool AdmitLocked(Request* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PreemptLocked(Request* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Finish records the outcome, releases pages and wakes waiters. Requires mu_.
  void FinishLocked(Request* r, FinishReason reason, absl::Status status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleasePagesLocked(Request* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ScrubOnReleaseLocked says whether r's pages are zeroed when it releases them next.
  bool ScrubOnReleaseLocked(Request* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Abort finishes `r` with kAborted for violation `v`, which its step already reported to
  // the audit sink (isolation::StepGuard). Requires mu_.
  void AbortLocked(Request* r, const isolation::Violation& v) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Accept appends sampled token `token` to `r`; returns true if r is now finished.
  bool AcceptTokenLocked(Request* r, int token) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CheckAccountingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::shared_ptr<Model> model_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  std::unique_ptr<KvPool> pool_;
  std::unique_ptr<isolation::Guard> guard_;
  isolation::StepGuard step_guard_;  // every step goes through it
  EngineOptions options_;
  kernels::ThreadPool kernel_pool_;

  // One lock and one condition variable for all engine state; every change that another
  // thread may wait for (queue, pacing, cancellation, completion) notifies cv_. std::mutex
  // rather than absl::Mutex: Debian's Abseil is not built with ThreadSanitizer, so TSan
  // cannot see absl::Mutex's synchronisation and the tsan preset would report false races.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  RequestId next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<RequestId, std::unique_ptr<Request>> requests_ ABSL_GUARDED_BY(mu_);
  // Arrival order, preempted at the front; the scheduler picks which is admitted next.
  std::deque<Request*> waiting_ ABSL_GUARDED_BY(mu_);
  // Admitted and not finished, in admission order: prefilling (their prompt not all in the
  // cache yet) or decoding.
  std::vector<Request*> in_flight_ ABSL_GUARDED_BY(mu_);
  // Engine::Allow: admissions and decode steps the engine may still start (kUnlimitedWork: no
  // limit), and whether the engine thread waits for a step it may start (WaitUntilSettled).
  int64_t admission_allowance_ ABSL_GUARDED_BY(mu_) = kUnlimitedWork;
  int64_t decode_allowance_ ABSL_GUARDED_BY(mu_) = kUnlimitedWork;
  bool parked_ ABSL_GUARDED_BY(mu_) = false;
  // Every scheduling decision is made here (no threads inside).
  Scheduler scheduler_ ABSL_GUARDED_BY(mu_);
  mutable std::vector<SchedRequest> sched_running_ ABSL_GUARDED_BY(mu_);
  mutable std::vector<SchedRequest> sched_waiting_ ABSL_GUARDED_BY(mu_);
  EngineStats stats_ ABSL_GUARDED_BY(mu_);
#if KVGUARD_FAULT_INJECTION
  EngineFaults faults_ ABSL_GUARDED_BY(mu_);
#endif

  std::thread thread_;
};

}  // namespace kvguard::core

#endif  // KVGUARD_CORE_ENGINE_ENGINE_H_
