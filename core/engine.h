// core/engine.h: continuous-batching decode engine over one shared paged KV pool.
//
// Two worker threads, as in disaggregated serving:
//   * the prefill worker admits waiting requests as the scheduler (core/scheduler.h) decides:
//     preempted ones first, then tenants in turn, when the pool holds pages for the prompt
//     plus a reserve (and the reserved growth); it runs prefill (prefill weights), samples the
//     first token and hands the request, with its pages, to the decode worker;
//   * the decode worker runs one batched decode step at a time over every running request
//     (up to max_batch), granting a new page whenever a request crosses a page boundary. When
//     the pool runs dry it preempts the running request the scheduler names (the newest): its
//     pages are released and it goes back to the queue, to be recomputed from its tokens.
// Every page a request holds comes from, and goes back to, the pool's ownership table
// (isolation/), granted to Owner{tenant, session = request id}. Each prefill and decode step
// goes through isolation::StepGuard, the one owner of the step protocol: it pins an epoch,
// verifies every request's page table (unless its tenant's mode is off), has the kernels check
// tags, re-verifies and reports; a request that fails is aborted alone
// (FinishReason::kAborted, with the violation) and reported to the audit sink. Nothing here throws;
// bad requests are refused at Submit.
#ifndef KVGUARD_CORE_ENGINE_H_
#define KVGUARD_CORE_ENGINE_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "core/kv_pool.h"
#include "core/model.h"
#include "core/sampler.h"
#include "core/scheduler.h"
#include "core/session_pages.h"
#include "core/tokenizer.h"
#include "isolation/guard.h"
#include "isolation/step_guard.h"
#include "kernels/cpu/thread_pool.h"

namespace kvguard::core {

using RequestId = uint64_t;

struct EngineOptions {
  // Scheduling (core/scheduler.h, SchedulerOptions, which explains each): requests in
  // flight at once (<= kMaxDecodeBatch), the admission reserve and the admission ratio.
  int max_batch = 64;
  int reserve_pages = 1;
  double admission_ratio = 1.0;
  double admission_ratio_min = 0.1;
  double admission_ratio_decay = 1e-3;
  int decode_threads = 2;   // threads of the decode worker's pool
  int prefill_threads = 2;  // threads of the prefill worker's pool
  // Both workers start paused (an allowance of 0, Engine::Allow): tests submit their requests
  // first and then let the workers run a known number of admissions and decode steps.
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
  uint64_t release_during_step = 0;  // this request's first page is released mid-step
  // ... or the next request of this tenant submitted from now on (armed inside Submit, so it
  // cannot finish before it is armed).
  std::string release_during_step_next_of_tenant;
  uint64_t release_during_prefill = 0;  // ... or after its prefill's verification, before
                                        // prefill writes into it
  uint64_t release_after_kernels = 0;   // ... or after a decode step's kernels ran, before
                                        // the step's re-verification: only that catches it
  uint64_t double_release = 0;          // this request's pages are released twice at finish
  bool handover_cancelled = false;      // a request cancelled in prefill is released and still
                                        // handed over to decode with its old page table
  uint64_t cancel_in_prefill = 0;       // timing, not a bug: this request is cancelled while its
                                        // prefill runs (deterministically)
};
#endif

// The engine's two workers, for pacing (Engine::Allow).
enum class EngineWorker { kPrefill, kDecode };
inline constexpr int64_t kUnlimitedWork = -1;

// kAborted: an isolation violation (GenerationResult::violation says which).
enum class FinishReason { kLength, kStop, kEos, kCancelled, kError, kAborted };
std::string FinishReasonName(FinishReason reason);

struct GenerationRequest {
  std::string tenant = "default";  // a tenant of the isolation policy
  std::vector<int> prompt;         // token ids, BOS included if the model wants one
  int max_tokens = 16;             // >= 1
  SamplingParams sampling;
  std::vector<std::string> stop;  // stop sequences (text), OpenAI semantics
  bool stop_at_eos = true;
  // on_text, if set, receives the text as it becomes final (valid UTF-8, stop sequences
  // removed), from an engine thread; it must not block for long or call into the engine.
  std::function<void(std::string_view)> on_text;
};

struct GenerationResult {
  RequestId id = 0;
  std::vector<int> tokens;  // generated ids (the stop sequence's tokens included)
  std::string text;         // generated text, stop sequence removed
  FinishReason reason = FinishReason::kError;
  absl::Status status;                            // OK unless reason == kError or kAborted
  std::optional<isolation::Violation> violation;  // kAborted: what verification found
  int preemptions = 0;
  double queue_seconds = 0;           // submit -> admitted (first admission)
  double first_token_seconds = 0;     // submit -> first token
  std::vector<double> token_seconds;  // gap before each token after the first
};

struct EngineStats {
  int64_t submitted = 0, finished = 0, preemptions = 0, decode_steps = 0, aborted = 0;
  int queued = 0, prefilling = 0, running = 0;
  int max_running = 0;  // most requests decoding at once so far
  int free_pages = 0, total_pages = 0;
  // Decode steps, summed: wall seconds from the step's verification to its tokens' acceptance
  // (the decode worker's busy time), requests stepped (= tokens decoded), and KV tokens the
  // steps' attention read (sum over stepped requests of their length).
  double decode_seconds = 0;
  int64_t decode_tokens = 0, decode_kv_tokens = 0;
  double admission_ratio = 0;  // the ratio admission uses now (EngineOptions::admission_ratio)
  double admission_usage = 0;  // the running estimate of the fraction of max_tokens used
};

class Engine {
 public:
  // Create starts the workers. `model` must have FP8 KV scales when pool is FP8.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(std::shared_ptr<Model> model,
                                                        std::shared_ptr<const Tokenizer> tokenizer,
                                                        std::unique_ptr<KvPool> pool,
                                                        const EngineOptions& options);
  ~Engine();  // cancels everything still running and joins the workers

  // Submit queues a request. InvalidArgument (and nothing queued) for an empty prompt, a
  // prompt that leaves no room in the context, max_tokens < 1, bad sampling parameters or
  // stop sequences, a token outside the vocabulary; ResourceExhausted if the whole pool
  // could never hold the prompt plus the reserve; NotFound for an unknown tenant,
  // PermissionDenied for a quarantined one, Unavailable for a strict one while the audit sink
  // cannot record.
  absl::StatusOr<RequestId> Submit(GenerationRequest request);

  // Cancel finishes request `id` with kCancelled at the next opportunity (queued, during
  // prefill, or between decode steps) and releases its pages. Unknown ids are ignored.
  void Cancel(RequestId id);

  // Wait blocks until `id` finishes and returns its result (once; NotFound after that).
  absl::StatusOr<GenerationResult> Wait(RequestId id);

  // Pacing, for tests and tools that must line work up whatever the threads' speed (the
  // service leaves both unlimited). Allow lets `worker` start `units` more units of work from
  // now on, replacing what it had left: admissions (a waiting request taken into prefill) for
  // kPrefill, decode steps (forward passes over the batch) for kDecode. kUnlimitedWork, the
  // default, lifts the limit; 0 pauses the worker once the unit in hand is done. A
  // paused decode worker still finishes the requests it holds as they are cancelled. CHECK:
  // units >= 0 or kUnlimitedWork.
  void Allow(EngineWorker worker, int64_t units);

  // WaitUntilSettled blocks until neither worker can start anything: each has used up its
  // allowance or has nothing it may start (no request to decode; no waiting request, or the
  // one the scheduler picks does not fit yet). Then no step is in flight and no page waits out an
  // epoch, and the engine stays so until a Submit, Cancel or Allow. Returns at once while stopping.
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
  void PrefillLoop();
  void DecodeLoop();
  // PrefillCanStartLocked: the prefill worker may admit the waiting request the scheduler
  // picks now (or the engine is stopping). DecodeCanStartLocked: the decode worker has
  // requests to step and allowance to step them, or (paused) cancelled requests to let go, or
  // the engine is stopping.
  bool PrefillCanStartLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool DecodeCanStartLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
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
  isolation::StepGuard step_guard_;  // every prefill and decode step goes through it
  EngineOptions options_;
  kernels::ThreadPool prefill_pool_;
  kernels::ThreadPool decode_pool_;

  // One lock and one condition variable for all engine state; every change that another
  // thread may wait for (queue, pool pages, handover, completion) notifies cv_. std::mutex
  // rather than absl::Mutex: Debian's Abseil is not built with ThreadSanitizer, so TSan
  // cannot see absl::Mutex's synchronisation and the tsan preset would report false races.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  RequestId next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<RequestId, std::unique_ptr<Request>> requests_ ABSL_GUARDED_BY(mu_);
  // Arrival order, preempted at the front; the scheduler picks which is admitted next.
  std::deque<Request*> waiting_ ABSL_GUARDED_BY(mu_);
  std::vector<Request*> handed_over_ ABSL_GUARDED_BY(mu_);  // prefilled, not yet running
  std::vector<Request*> running_ ABSL_GUARDED_BY(mu_);      // decode worker's batch
  std::vector<Request*> prefilling_ ABSL_GUARDED_BY(mu_);   // the prefill worker's (<= 1)
  // Engine::Allow: units of work each worker may still start (kUnlimitedWork: no limit), and
  // whether it is waiting for work it may start (WaitUntilSettled).
  int64_t prefill_allowance_ ABSL_GUARDED_BY(mu_) = kUnlimitedWork;
  int64_t decode_allowance_ ABSL_GUARDED_BY(mu_) = kUnlimitedWork;
  bool prefill_parked_ ABSL_GUARDED_BY(mu_) = false;
  bool decode_parked_ ABSL_GUARDED_BY(mu_) = false;
  // Admission, preemption and the admission ratio are decided here (no threads inside).
  Scheduler scheduler_ ABSL_GUARDED_BY(mu_);
  // NextAdmissionLocked's descriptions of the waiting and in-flight requests (scratch).
  mutable std::vector<SchedRequest> sched_waiting_ ABSL_GUARDED_BY(mu_);
  mutable std::vector<SchedRequest> sched_in_flight_ ABSL_GUARDED_BY(mu_);
  // NextAdmissionLocked: the index into waiting_ of the request to admit now, if any.
  std::optional<size_t> NextAdmissionLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // DescribeLocked: what the scheduler knows of r (waiting: its prefill ahead).
  SchedRequest DescribeLocked(const Request* r) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  EngineStats stats_ ABSL_GUARDED_BY(mu_);
#if KVGUARD_FAULT_INJECTION
  EngineFaults faults_ ABSL_GUARDED_BY(mu_);
#endif

  std::thread prefill_thread_;
  std::thread decode_thread_;
};

}  // namespace kvguard::core

#endif  // KVGUARD_CORE_ENGINE_H_
