#include "core/engine/engine.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

#include "absl/base/internal/raw_logging.h"
#include "absl/strings/str_cat.h"

namespace kvguard::core {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

SchedulerOptions SchedulerOptionsOf(const EngineOptions& o) {
  SchedulerOptions s;
  s.max_batch = o.max_batch;
  s.reserve_pages = o.reserve_pages;
  s.admission_ratio = o.admission_ratio;
  s.admission_ratio_min = o.admission_ratio_min;
  s.admission_ratio_decay = o.admission_ratio_decay;
  s.step_tokens = o.step_tokens;
  s.partial_prefill_tokens = o.partial_prefill_tokens;
  return s;
}

}  // namespace

std::string FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kEos:
      return "eos";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
    case FinishReason::kAborted:
      return "aborted";
  }
  return "?";
}

struct Engine::Request {
  Request(RequestId id, GenerationRequest r, isolation::Owner owner,
          isolation::OwnershipTable* table, int page_size)
      : id(id),
        req(std::move(r)),
        owner(owner),
        tokens(req.prompt),
        prompt_len(static_cast<int>(req.prompt.size())),
        pages(table, owner, page_size),
        sampler(req.sampling),
        stop(*StopMatcher::Create(req.stop)) {}  // validated by Submit

  enum class State { kWaiting, kPrefilling, kRunning, kDone };

  RequestId id;
  GenerationRequest req;
  isolation::Owner owner;   // session = id
  std::vector<int> tokens;  // the whole sequence: prompt, then every generated token
  int prompt_len;
  int generated = 0;
  SessionPages pages;  // its page table and kv_len
  Sampler sampler;
  Utf8StreamDecoder utf8;
  StopMatcher stop;
  State state = State::kWaiting;
  bool cancelled = false;
  bool admitted_once = false;
  bool ever_strict = false;  // its tenant was strict at some point while it held pages
  Clock::time_point submitted = Clock::now();
  Clock::time_point last_token;
  GenerationResult result;

  // PrefillLength is how many tokens prefill must place in the cache: the prompt for a new
  // request; for a preempted one every token but the last, which is the next decode input.
  int PrefillLength() const {
    return generated == 0 ? prompt_len : static_cast<int>(tokens.size()) - 1;
  }
  // PrefillLeft: prompt tokens not yet in the cache (prefilling; 0 once it decodes).
  int PrefillLeft() const {
    return state == State::kPrefilling ? PrefillLength() - pages.kv_len() : 0;
  }
  // WantsTokenLogits: a prefill chunk at positions [pos, pos + n) must return every row's
  // logits: its request asked for prompt logprobs, and some row predicts a prompt token not yet
  // reported (row p predicts token p + 1; a prefill recomputed after a preemption reports
  // nothing twice).
  bool WantsTokenLogits(int pos, int n) const {
    const int reported = static_cast<int>(result.prompt_logprobs.size());  // tokens 1..reported
    return req.prompt_logprobs && generated == 0 && pos + n > reported && pos < prompt_len - 1;
  }
};

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(std::shared_ptr<Model> model,
                                                       std::shared_ptr<const Tokenizer> tokenizer,
                                                       std::unique_ptr<KvPool> pool,
                                                       const EngineOptions& options) {
  if (model == nullptr || tokenizer == nullptr || pool == nullptr) {
    return absl::InvalidArgumentError("engine needs a model, a tokenizer and a KV pool");
  }
  if (options.max_batch < 1 || options.max_batch > kMaxDecodeBatch) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_batch ", options.max_batch, " must be in [1, ", kMaxDecodeBatch, "]"));
  }
  if (absl::Status st = SchedulerOptionsOf(options).Validate(); !st.ok()) return st;
  if (options.threads < 1 || options.threads > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("threads ", options.threads, " must be in [1, 256]"));
  }
  if (pool->dtype() == kernels::KvDtype::kFp8E4m3 && !pool->has_fp8_scales()) {
    if (model->fp8_k_scales().empty()) {
      return absl::FailedPreconditionError(
          "FP8 KV cache without calibrated scales (run Model::CalibrateKvScales)");
    }
    if (absl::Status s = pool->SetFp8Scales(model->fp8_k_scales(), model->fp8_v_scales());
        !s.ok()) {
      return s;
    }
  }
  absl::StatusOr<std::unique_ptr<isolation::Guard>> guard =
      isolation::Guard::Create(options.isolation, &pool->table(), pool->tag_keys());
  if (!guard.ok()) return guard.status();
  return std::unique_ptr<Engine>(new Engine(std::move(model), std::move(tokenizer), std::move(pool),
                                            std::move(*guard), options));
}

Engine::Engine(std::shared_ptr<Model> model, std::shared_ptr<const Tokenizer> tokenizer,
               std::unique_ptr<KvPool> pool, std::unique_ptr<isolation::Guard> guard,
               const EngineOptions& options)
    : model_(std::move(model)),
      tokenizer_(std::move(tokenizer)),
      pool_(std::move(pool)),
      guard_(std::move(guard)),
      step_guard_(guard_.get()),
      options_(options),
      kernel_pool_(options.threads),
      scheduler_(SchedulerOptionsOf(options)) {
  stats_.total_pages = pool_->num_pages();
  if (options_.start_paused) admission_allowance_ = decode_allowance_ = 0;
  thread_ = std::thread([this] { StepLoop(); });
}

Engine::~Engine() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    stopping_ = true;
    for (auto& [id, r] : requests_) r->cancelled = true;
    cv_.notify_all();
  }
  thread_.join();
  std::unique_lock<std::mutex> lock(mu_);
  for (auto& [id, r] : requests_) {
    if (r->state != Request::State::kDone) FinishLocked(r.get(), FinishReason::kCancelled, {});
  }
}

absl::StatusOr<RequestId> Engine::Submit(GenerationRequest request) {
  const ModelConfig& c = model_->config();
  const int n = static_cast<int>(request.prompt.size());
  if (n == 0) return absl::InvalidArgumentError("empty prompt: nothing to continue from");
  if (n >= c.max_context) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt of ", n, " tokens leaves no room in the context of ", c.max_context, " tokens"));
  }
  if (request.max_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_tokens must be >= 0 (got ", request.max_tokens, ")"));
  }
  if (request.logprobs < -1 || request.logprobs > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(absl::StrCat("logprobs must be in [-1, ", kMaxTopLogprobs,
                                                   "] (got ", request.logprobs, ")"));
  }
  for (int t : request.prompt) {
    if (t < 0 || t >= c.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt token id ", t, " outside the vocabulary of ", c.vocab_size));
    }
  }
  if (absl::Status s = request.sampling.Validate(); !s.ok()) return s;
  if (absl::Status s = StopMatcher::Validate(request.stop); !s.ok()) return s;
  absl::StatusOr<isolation::TenantId> tenant = guard_->ResolveTenant(request.tenant);
  if (!tenant.ok()) return tenant.status();
  if (absl::Status s = guard_->Admit(*tenant); !s.ok()) return s;
  const int P = pool_->page_size();
  const int need = (n + P - 1) / P + options_.reserve_pages;
  if (need > pool_->num_pages()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "prompt of ", n, " tokens needs ", need, " KV pages with the reserve; the pool has ",
        pool_->num_pages(), " (", pool_->capacity_tokens(), " tokens)"));
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (stopping_) return absl::UnavailableError("engine is shutting down");
  const RequestId id = next_id_++;
#if KVGUARD_FAULT_INJECTION
  if (!faults_.release_during_step_next_of_tenant.empty() &&
      faults_.release_during_step_next_of_tenant == request.tenant) {
    faults_.release_during_step_next_of_tenant.clear();
    faults_.release_during_step = id;
  }
#endif
  auto r = std::make_unique<Request>(id, std::move(request), isolation::Owner{*tenant, id},
                                     &pool_->table(), pool_->page_size());
  r->result.id = id;
  waiting_.push_back(r.get());
  requests_[id] = std::move(r);
  ++stats_.submitted;
  cv_.notify_all();
  return id;
}

void Engine::Cancel(RequestId id) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  Request* r = it->second.get();
  if (r->state == Request::State::kDone) return;
  r->cancelled = true;
  if (r->state == Request::State::kWaiting) {
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), r));
    FinishLocked(r, FinishReason::kCancelled, {});
  }
  // In flight: the engine thread finishes it before its next step (paused too: CanStepLocked).
  cv_.notify_all();
}

absl::StatusOr<GenerationResult> Engine::Wait(RequestId id) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!requests_.contains(id)) return absl::NotFoundError(absl::StrCat("no request ", id));
  // Look the request up again on every wake-up: other threads insert (which may rehash the
  // map, so no iterator survives the wait) and another Wait on the same id may have taken the
  // result and destroyed the request.
  cv_.wait(lock, [this, id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = requests_.find(id);
    return it == requests_.end() || it->second->state == Request::State::kDone;
  });
  auto it = requests_.find(id);
  if (it == requests_.end()) {
    return absl::NotFoundError(absl::StrCat("request ", id, ": result already taken"));
  }
  GenerationResult result = std::move(it->second->result);
  requests_.erase(it);
  return result;
}

void Engine::Allow(EngineWork work, int64_t units) {
  ABSL_RAW_CHECK(units >= kUnlimitedWork, "Engine::Allow: units must be >= 0 or kUnlimitedWork");
  std::unique_lock<std::mutex> lock(mu_);
  (work == EngineWork::kAdmissions ? admission_allowance_ : decode_allowance_) = units;
  cv_.notify_all();
}

void Engine::WaitUntilSettled() {
  std::unique_lock<std::mutex> lock(mu_);
  // Parked, but with a step it may now start: about to wake, not settled yet.
  cv_.wait(lock, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || (parked_ && !CanStepLocked());
  });
}

bool Engine::CanStepLocked() const {
  if (stopping_) return true;
  if (std::any_of(in_flight_.begin(), in_flight_.end(),
                  [](const Request* r) { return r->cancelled; })) {
    return true;
  }
  if (in_flight_.empty() && (waiting_.empty() || admission_allowance_ == 0)) return false;
  const StepPlan plan = PlanLocked();
  return plan.runs() || !plan.preempt.empty();
}

StepPlan Engine::PlanLocked() const {
  // Evaluated at every wake-up of the engine thread: the descriptions go into buffers kept
  // across calls rather than fresh allocations.
  sched_running_.clear();
  sched_waiting_.clear();
  for (const Request* r : in_flight_) sched_running_.push_back(DescribeLocked(r));
  if (admission_allowance_ != 0) {
    for (const Request* r : waiting_) sched_waiting_.push_back(DescribeLocked(r));
  }
  return scheduler_.Schedule(
      sched_running_, sched_waiting_, pool_->table().free_pages(),
      StepLimits{.decode = decode_allowance_ != 0, .admissions = admission_allowance_});
}

SchedRequest Engine::DescribeLocked(const Request* r) const {
  SchedRequest s;
  s.id = r->id;
  s.tenant = r->owner.tenant;
  s.preempted = r->state == Request::State::kWaiting && r->result.preemptions > 0;
  s.held_pages = r->pages.num_pages();
  s.prefill_pages = r->pages.PagesFor(r->PrefillLength());
  s.most_pages =
      r->pages.PagesFor(std::min(r->prompt_len + r->req.max_tokens, model_->config().max_context));
  s.prefill_tokens = r->state == Request::State::kWaiting ? r->PrefillLength() : r->PrefillLeft();
  s.grow_pages = r->state == Request::State::kRunning && r->pages.needs_page() ? 1 : 0;
  return s;
}

EngineStats Engine::stats() const {
  std::unique_lock<std::mutex> lock(mu_);
  EngineStats s = stats_;
  s.queued = static_cast<int>(waiting_.size());
  for (const Request* r : in_flight_) {
    (r->state == Request::State::kPrefilling ? s.prefilling : s.running) += 1;
  }
  s.free_pages = pool_->table().free_pages();
  s.admission_ratio = scheduler_.ratio();
  s.admission_usage = scheduler_.usage();
  return s;
}

bool Engine::ScrubOnReleaseLocked(Request* r) {
  // Scrub if the tenant is strict now or was while these pages were held: a switch to
  // enforce must not leave a strict tenant's KV behind.
  const bool scrub = r->ever_strict || guard_->mode(r->owner.tenant) == isolation::Mode::kStrict;
  r->ever_strict = false;
#if KVGUARD_FAULT_INJECTION
  r->pages.set_faults(SessionFaults{.double_release = faults_.double_release == r->id,
                                    .cancelled_continues = faults_.cancelled_continues});
#endif
  return scrub;
}

void Engine::ReleasePagesLocked(Request* r) {
  const bool scrub = ScrubOnReleaseLocked(r);
  // A refused release frees nothing. After an abort, refusals are the reported violation's
  // consequences (its pages went stale), not news for the auditor.
  for (const isolation::Violation& v : r->pages.Release(scrub)) {
    if (r->result.reason != FinishReason::kAborted) guard_->Report(v, r->id);
  }
}

void Engine::AbortLocked(Request* r, const isolation::Violation& v) {
  // What the client may learn: the kind and its own page, never who owns the page now or
  // how often it has changed hands (that would leak other tenants' activity).
  isolation::Violation own;
  own.kind = v.kind;
  own.requester = v.requester;
  own.page = v.page;
  own.page_index = v.page_index;
  own.expected_generation = v.expected_generation;
  r->result.violation = own;
  r->result.reason = FinishReason::kAborted;  // before the release: see ReleasePagesLocked
  ++stats_.aborted;
  FinishLocked(r, FinishReason::kAborted,
               absl::PermissionDeniedError(absl::StrCat("request aborted by isolation: ",
                                                        isolation::ViolationKindName(v.kind))));
}

#if KVGUARD_FAULT_INJECTION
void Engine::set_faults(const EngineFaults& faults) {
  std::unique_lock<std::mutex> lock(mu_);
  faults_ = faults;
}
#endif

void Engine::FinishLocked(Request* r, FinishReason reason, absl::Status status) {
  ReleasePagesLocked(r);
  if (reason != FinishReason::kStop && reason != FinishReason::kError &&
      reason != FinishReason::kAborted) {
    // Whatever text was held back (an incomplete UTF-8 tail, a possible stop prefix) is final.
    std::string tail = r->stop.Feed(r->utf8.Flush()).emit;
    tail += r->stop.Flush();
    if (!tail.empty()) {
      r->result.text += tail;
      if (r->req.on_text) r->req.on_text(tail);
    }
  }
  if (reason == FinishReason::kLength || reason == FinishReason::kStop ||
      reason == FinishReason::kEos) {
    // How much of what it could have generated this request used (admission's estimate).
    const int could =
        std::min(r->prompt_len + r->req.max_tokens, model_->config().max_context) - r->prompt_len;
    if (could > 0) scheduler_.Finished(r->generated, could);  // max_tokens 0 says nothing
  }
  r->result.reason = reason;
  r->result.status = std::move(status);
  r->state = Request::State::kDone;
  ++stats_.finished;
  cv_.notify_all();  // waiters on this request
}

bool Engine::AcceptTokenLocked(Request* r, int token) {
  const Clock::time_point now = Clock::now();
  if (r->generated == 0) {
    r->result.first_token_seconds = Seconds(r->submitted, now);
  } else {
    r->result.token_seconds.push_back(Seconds(r->last_token, now));
  }
  r->last_token = now;
  r->tokens.push_back(token);
  r->result.tokens.push_back(token);
  ++r->generated;

  const bool eos = r->req.stop_at_eos && token == tokenizer_->eos_id();
  if (!eos) {
    const StopMatcher::Result m = r->stop.Feed(r->utf8.Push(tokenizer_->DecodeToken(token)));
    if (!m.emit.empty()) {
      r->result.text += m.emit;
      if (r->req.on_text) r->req.on_text(m.emit);
    }
    if (m.stopped) {
      FinishLocked(r, FinishReason::kStop, {});
      return true;
    }
  }
  if (eos) {
    FinishLocked(r, FinishReason::kEos, {});
  } else if (r->generated >= r->req.max_tokens ||
             static_cast<int>(r->tokens.size()) >= model_->config().max_context) {
    FinishLocked(r, FinishReason::kLength, {});
  }
  return r->state == Request::State::kDone;
}

void Engine::CheckAccountingLocked() {
  const absl::Status s = pool_->table().CheckAccounting();
  if (!s.ok()) ABSL_RAW_LOG(FATAL, "%s", std::string(s.message()).c_str());
  int held = 0;
  for (const auto& [id, r] : requests_) held += r->pages.num_pages();
  ABSL_RAW_CHECK(held == pool_->table().used_pages(),
                 "pages held by requests != pages in use in the pool");
}

bool Engine::AdmitLocked(Request* r) {
  scheduler_.Admitted(r->owner.tenant);
  const int n = r->PrefillLength();
  if (r->pages.PagesFor(n) + options_.reserve_pages > pool_->num_pages()) {
    FinishLocked(r, FinishReason::kError,
                 absl::ResourceExhaustedError("sequence outgrew the whole KV pool"));
    return false;
  }
  // Pages for the whole prefill at once (admission counted them all); its chunks fill them.
  const absl::Status granted = r->pages.GrantFor(n);
  if (!granted.ok()) {  // e.g. the tag key failed: the request fails, the engine goes on
    FinishLocked(r, FinishReason::kError, granted);
    return false;
  }
  // Strict now, while it holds pages: its pages are scrubbed at release whatever the mode
  // then (each step reads the mode again, for what it writes).
  r->ever_strict = r->ever_strict || guard_->mode(r->owner.tenant) == isolation::Mode::kStrict;
  r->state = Request::State::kPrefilling;
  if (!r->admitted_once) {
    r->admitted_once = true;
    r->result.queue_seconds = Seconds(r->submitted, Clock::now());
  }
  return true;
}

void Engine::PreemptLocked(Request* r) {
  ReleasePagesLocked(r);
  r->state = Request::State::kWaiting;
  ++r->result.preemptions;
  ++stats_.preemptions;
  scheduler_.Preempted();
  waiting_.push_front(r);
}

void Engine::StepLoop() {
  const ModelConfig& c = model_->config();
  const size_t V = static_cast<size_t>(c.vocab_size);
  std::vector<float> logits;
  // One entry per request in the step: its chunk of the forward pass, its session for the
  // step guard, its tag fault.
  std::vector<Request*> batch;
  std::vector<Model::Chunk> chunks;
  std::vector<isolation::StepSession> sessions;
  std::vector<int32_t> tag_faults;
  std::vector<int> sampled;  // the token sampled from each row's logits (-1: none)
  // With logprobs: the sampled token's entry per row, and each chunk's prompt tokens' entries
  // (prompt_logprobs), from the logits of all its rows (token_logits, at token_rows_at[j]).
  std::vector<TokenLogprobs> sampled_logprobs;
  std::vector<std::vector<TokenLogprobs>> prompt_logprobs;
  std::vector<float> token_rows;
  std::vector<size_t> token_rows_at;
  // The prompt rows to report, (chunk j, row t), spread over the kernel pool: a long prompt's
  // rows do not hold up the step's other requests for longer than their share.
  std::vector<std::pair<size_t, int>> prompt_rows;
  std::vector<size_t> in_step;  // chunk j of the forward pass is batch entry in_step[j]
  std::vector<Model::Chunk> run;
  // The plan's requests, resolved before carrying it out changes in_flight_ and waiting_.
  std::vector<Request*> admitted, preempted, decoding, continuing;
#if KVGUARD_FAULT_INJECTION
  // EngineFaults: request `id`, if it is in this step as a decode token (prefill: a prefill
  // chunk), loses its first page. Requires mu_.
  auto release_first_page_of = [&](uint64_t id, bool prefill) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    for (size_t j = 0; j < in_step.size(); ++j) {
      const Request* r = batch[in_step[j]];
      if (r->id == id && run[j].prefill == prefill && r->pages.num_pages() > 0) {
        pool_->table().Release(r->owner, r->pages.grants().front(), false);
      }
    }
  };
#endif
  for (;;) {
    std::optional<isolation::StepGuard::Step> step;  // from verification to acceptance
    Clock::time_point step_start;
    bool decodes = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (!CanStepLocked()) {
        parked_ = true;
        cv_.notify_all();  // WaitUntilSettled
        cv_.wait(lock, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return CanStepLocked(); });
        parked_ = false;
      }
      if (stopping_) return;
      // Cancelled requests leave at the step boundary (the check consumes the flag).
      for (size_t i = 0; i < in_flight_.size();) {
        Request* r = in_flight_[i];
        std::vector<isolation::Violation> refused;
        const bool cancelled = std::exchange(r->cancelled, false);
        if (!cancelled ||
            r->pages.ContinueUnlessCancelled(true, ScrubOnReleaseLocked(r), &refused)) {
          ++i;
          continue;
        }
        for (const isolation::Violation& v : refused) guard_->Report(v, r->id);
        FinishLocked(r, FinishReason::kCancelled, {});
        in_flight_.erase(in_flight_.begin() + static_cast<ptrdiff_t>(i));
      }
      const StepPlan plan = PlanLocked();
      // Carry the plan out: preemptions first (their pages go back), then the decoding
      // requests' next pages, the chunks of prefills under way, and the admissions.
      batch.clear();
      chunks.clear();
      admitted.clear();
      for (const StepPlan::Chunk& a : plan.admit) admitted.push_back(waiting_[a.index]);
      decoding.clear();
      for (size_t i : plan.decode) decoding.push_back(in_flight_[i]);
      continuing.clear();
      for (const StepPlan::Chunk& p : plan.prefill) continuing.push_back(in_flight_[p.index]);
      for (size_t i : plan.preempt) preempted.push_back(in_flight_[i]);
      for (Request* r : preempted) {
        in_flight_.erase(std::find(in_flight_.begin(), in_flight_.end(), r));
        PreemptLocked(r);
      }
      preempted.clear();
      for (Request* r : decoding) {
        const absl::Status grown = r->pages.GrowForNextToken();
        if (!grown.ok()) {  // the table failed r (the plan counted the pages): r fails alone
          FinishLocked(r, FinishReason::kError, grown);
          continue;
        }
        batch.push_back(r);
        chunks.push_back(Model::Chunk{.tokens = std::span(&r->tokens.back(), 1),
                                      .pos = r->pages.kv_len(),
                                      .pages = {},  // the grants, once the step begins
                                      .prefill = false});
      }
      auto add_chunk = [&](Request* r, int n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        const int done = r->pages.kv_len();
        batch.push_back(r);
        chunks.push_back(Model::Chunk{
            .tokens = std::span<const int>(r->tokens.data() + done, static_cast<size_t>(n)),
            .pos = done,
            .pages = {},
            .prefill = true,
            .logits =
                done + n == r->PrefillLength() && r->generated == 0 && r->req.max_tokens > 0});
      };
      for (size_t k = 0; k < continuing.size(); ++k)
        add_chunk(continuing[k], plan.prefill[k].tokens);
      for (size_t k = 0; k < admitted.size(); ++k) {
        Request* r = admitted[k];
        waiting_.erase(std::find(waiting_.begin(), waiting_.end(), r));
        if (admission_allowance_ > 0) --admission_allowance_;
        if (!AdmitLocked(r)) continue;
        in_flight_.push_back(r);
        add_chunk(r, plan.admit[k].tokens);
      }
      // Requests that failed above are done: out of in_flight_.
      std::erase_if(in_flight_, [](const Request* r) { return r->state == Request::State::kDone; });
      if (batch.empty()) {
        if (options_.check_accounting) CheckAccountingLocked();
        continue;
      }
      // The step (isolation/step_guard.h): pin the epoch, read modes once (a mode change
      // applies from the next step), verify every page table; a request that fails is
      // aborted alone, before any of its KV is read or written.
      step_start = Clock::now();
      sessions.clear();
      for (const Request* r : batch) sessions.push_back({r->owner, r->pages.grants(), r->id});
      step.emplace(step_guard_.Begin(sessions));
      run.clear();
      in_step.clear();
      for (size_t b = 0; b < batch.size(); ++b) {
        Request* r = batch[b];
        r->ever_strict = r->ever_strict || step->mode(b) == isolation::Mode::kStrict;
        if (!step->in(b)) {
          AbortLocked(r, *step->violation(b));
          in_flight_.erase(std::find(in_flight_.begin(), in_flight_.end(), r));
          continue;
        }
        in_step.push_back(b);
      }
      if (in_step.empty()) {
        step->Finish();
        if (options_.check_accounting) CheckAccountingLocked();
        continue;
      }
      tag_faults.assign(in_step.size(), -1);
      for (size_t j = 0; j < in_step.size(); ++j) {
        Model::Chunk ch = chunks[in_step[j]];
        ch.pages = batch[in_step[j]]->pages.grants();
        ch.check_tags = step->check_tags(in_step[j]);
        ch.tag_fault = &tag_faults[j];
        decodes = decodes || !ch.prefill;
        run.push_back(ch);
      }
      stats_.max_running = std::max(stats_.max_running, static_cast<int>(in_step.size()));
      if (decodes && decode_allowance_ > 0) --decode_allowance_;
#if KVGUARD_FAULT_INJECTION
      // The bugs: a page is released (as by a racing cancel path) after verification, while
      // the step that reads (or writes) it is in flight.
      release_first_page_of(faults_.release_during_step, false);
      release_first_page_of(faults_.release_during_prefill, true);
#endif
    }
    // The step runs without the engine lock. Its requests cannot finish or lose pages
    // meanwhile: only this thread finishes, preempts or grows them (Cancel only flags them).
    logits.resize(run.size() * V);
    // Every row's logits for the chunks whose requests report prompt logprobs (echo).
    constexpr size_t kNone = ~size_t{0};
    token_rows_at.assign(run.size(), kNone);
    size_t token_row_count = 0;
    for (size_t j = 0; j < run.size(); ++j) {
      const Model::Chunk& ch = run[j];
      const int n = static_cast<int>(ch.tokens.size());
      if (ch.prefill && batch[in_step[j]]->WantsTokenLogits(ch.pos, n)) {
        token_rows_at[j] = token_row_count;
        token_row_count += size_t(n);
      }
    }
    token_rows.resize(token_row_count * V);
    prompt_logprobs.resize(run.size());
    prompt_rows.clear();
    for (size_t j = 0; j < run.size(); ++j) {
      prompt_logprobs[j].clear();
      if (token_rows_at[j] == kNone) continue;
      run[j].token_logits = &token_rows[token_rows_at[j] * V];
      // Row t (position pos + t) predicts token pos + t + 1: report the prompt tokens after
      // those already reported.
      const Request* r = batch[in_step[j]];
      const int reported = static_cast<int>(r->result.prompt_logprobs.size());
      const size_t before = prompt_rows.size();
      for (int t = std::max(reported - run[j].pos, 0);
           t < static_cast<int>(run[j].tokens.size()) && run[j].pos + t + 1 < r->prompt_len; ++t) {
        prompt_rows.emplace_back(j, t);
      }
      prompt_logprobs[j].resize(prompt_rows.size() - before);
    }
    const absl::Status status = model_->Forward(run, *pool_, logits.data(), &kernel_pool_);
    // Sample each row that asked for logits, before taking the lock and over the kernel pool:
    // a request's sampler is its own, and only this thread steps it. A row whose token the step
    // does not accept (a violation, a cancel, an error) has drawn for nothing, and its request
    // ends there. Rows whose chunk met a foreign page are not sampled: their logits mean nothing.
    // Logprobs, where asked for, likewise: of the raw logits (core/text/logprobs.h).
    sampled.assign(run.size(), -1);
    sampled_logprobs.resize(run.size());
    if (status.ok() && !prompt_rows.empty()) {
      kernel_pool_.ParallelFor(
          static_cast<int64_t>(prompt_rows.size()), 1, [&](int64_t b, int64_t e) {
            for (int64_t k = b; k < e; ++k) {
              const auto [j, t] = prompt_rows[size_t(k)];
              if (tag_faults[j] >= 0) continue;
              const Request* r = batch[in_step[j]];
              const int first =
                  std::max(static_cast<int>(r->result.prompt_logprobs.size()) - run[j].pos, 0);
              const float* row = &token_rows[(token_rows_at[j] + size_t(t)) * V];
              prompt_logprobs[j][size_t(t - first)] =
                  LogprobsOf(std::span(row, V), r->tokens[size_t(run[j].pos + t) + 1],
                             std::max(r->req.logprobs, 0));
            }
          });
    }
    if (status.ok()) {
      kernel_pool_.ParallelFor(static_cast<int64_t>(run.size()), 1, [&](int64_t b, int64_t e) {
        for (int64_t jj = b; jj < e; ++jj) {
          const size_t j = size_t(jj);
          if (tag_faults[j] >= 0) continue;
          const Request* r = batch[in_step[j]];
          const int top_n = std::max(r->req.logprobs, 0);
          if (!run[j].logits) continue;
          sampled[j] = batch[in_step[j]]->sampler.Sample(&logits[j * V], c.vocab_size);
          if (r->req.logprobs >= 0) {
            sampled_logprobs[j] = LogprobsOf(std::span(&logits[j * V], V), sampled[j], top_n);
          }
        }
      });
    }
    std::unique_lock<std::mutex> lock(mu_);
#if KVGUARD_FAULT_INJECTION
    // The bug: the page goes back after the kernels read it, before the step's result is
    // accepted (the kernels' own check saw nothing wrong).
    release_first_page_of(faults_.release_after_kernels, false);
#endif
    for (size_t j = 0; j < in_step.size(); ++j) {
      if (tag_faults[j] >= 0) step->KernelFault(in_step[j], tag_faults[j]);
    }
    // Re-verify before any result leaves, then unpin (pages released from here on, as by
    // finished requests, are free at once) and report.
    step->Finish();
    ++stats_.steps;
    if (decodes) {
      ++stats_.decode_steps;
      scheduler_.DecodeStep();
    }
    for (size_t j = 0; j < in_step.size(); ++j) {
      Request* r = batch[in_step[j]];
      const Model::Chunk& ch = run[j];
      const int n = static_cast<int>(ch.tokens.size());
      if (ch.prefill) {
        stats_.prefill_tokens += n;
      } else {
        ++stats_.decode_tokens;
        stats_.decode_kv_tokens += ch.pos + 1;
      }
#if KVGUARD_FAULT_INJECTION
      if (ch.prefill && faults_.cancel_in_prefill == r->id) r->cancelled = true;
#endif
      if (!step->accepted(in_step[j])) {
        // Verification or the kernels' own check failed (nothing of a foreign page was read
        // or written), or the page table changed during the step: the results are dropped.
        // First, whatever the step's status: the violation is already on the record.
        AbortLocked(r, *step->violation(in_step[j]));
      } else if (!status.ok()) {
        FinishLocked(r, FinishReason::kError, status);
      } else if (r->pages.set_kv_len(r->pages.kv_len() + n); r->cancelled) {
        // It leaves at the step boundary, before the next step, with nothing more accepted.
      } else {
        std::vector<TokenLogprobs>& reported = r->result.prompt_logprobs;
        reported.insert(reported.end(), std::make_move_iterator(prompt_logprobs[j].begin()),
                        std::make_move_iterator(prompt_logprobs[j].end()));
        if (!ch.prefill || r->pages.kv_len() == r->PrefillLength()) {
          // A decode token, or a prefill's last chunk: the request decodes from now on. A new
          // request samples its first token from the last chunk's logits; a recomputed one
          // already has its next input (the last token it generated). With max_tokens 0 it
          // is done.
          r->state = Request::State::kRunning;
          if (ch.prefill && r->generated == 0 && r->req.on_prompt_logprobs) {
            r->req.on_prompt_logprobs(r->result.prompt_logprobs);
          }
          if (r->req.max_tokens == 0) {
            FinishLocked(r, FinishReason::kLength, {});
          } else if (ch.logits) {
            ABSL_RAW_CHECK(sampled[j] >= 0, "an accepted row was not sampled");
            if (r->req.logprobs >= 0) {
              r->result.logprobs.push_back(std::move(sampled_logprobs[j]));
              if (r->req.on_logprobs) r->req.on_logprobs(r->result.logprobs.back());
            }
            AcceptTokenLocked(r, sampled[j]);
          }
        }
      }
    }
    std::erase_if(in_flight_, [](const Request* r) { return r->state == Request::State::kDone; });
    if (decodes) stats_.decode_seconds += Seconds(step_start, Clock::now());
    cv_.notify_all();  // unpinning may have freed pages; results and stats changed
    if (options_.check_accounting) CheckAccountingLocked();
  }
}

}  // namespace kvguard::core
