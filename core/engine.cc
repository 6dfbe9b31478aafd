#include "core/engine.h"

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

// ParkUntil waits on the engine's condition variable until `can_start` holds, with *parked
// set while it waits (Engine::WaitUntilSettled reads it). Waiters are woken once, when the
// worker parks, not on every spurious wake-up: two parked workers must not wake each other
// back and forth.
template <typename Pred>
void ParkUntil(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, bool* parked,
               Pred can_start) {
  if (can_start()) return;
  *parked = true;
  cv.notify_all();
  cv.wait(lock, can_start);
  *parked = false;
}

SchedulerOptions SchedulerOptionsOf(const EngineOptions& o) {
  SchedulerOptions s;
  s.max_batch = o.max_batch;
  s.reserve_pages = o.reserve_pages;
  s.admission_ratio = o.admission_ratio;
  s.admission_ratio_min = o.admission_ratio_min;
  s.admission_ratio_decay = o.admission_ratio_decay;
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

  enum class State { kWaiting, kPrefilling, kHandedOver, kRunning, kDone };

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
      prefill_pool_(options.prefill_threads),
      decode_pool_(options.decode_threads),
      scheduler_(SchedulerOptionsOf(options)) {
  stats_.total_pages = pool_->num_pages();
  if (options_.start_paused) prefill_allowance_ = decode_allowance_ = 0;
  prefill_thread_ = std::thread([this] { PrefillLoop(); });
  decode_thread_ = std::thread([this] { DecodeLoop(); });
}

Engine::~Engine() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    stopping_ = true;
    for (auto& [id, r] : requests_) r->cancelled = true;
    cv_.notify_all();
  }
  prefill_thread_.join();
  decode_thread_.join();
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
  if (request.max_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_tokens must be >= 1 (got ", request.max_tokens, ")"));
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
  // Prefilling, handed over or running: the worker that holds it finishes it (a paused decode
  // worker too: DecodeCanStartLocked).
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

void Engine::Allow(EngineWorker worker, int64_t units) {
  ABSL_RAW_CHECK(units >= kUnlimitedWork, "Engine::Allow: units must be >= 0 or kUnlimitedWork");
  std::unique_lock<std::mutex> lock(mu_);
  (worker == EngineWorker::kPrefill ? prefill_allowance_ : decode_allowance_) = units;
  cv_.notify_all();
}

void Engine::WaitUntilSettled() {
  std::unique_lock<std::mutex> lock(mu_);
  // A parked worker whose predicate has since become true is about to wake: not settled yet.
  cv_.wait(lock, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || (prefill_parked_ && !PrefillCanStartLocked() && decode_parked_ &&
                         !DecodeCanStartLocked());
  });
}

bool Engine::PrefillCanStartLocked() const {
  if (stopping_) return true;
  return prefill_allowance_ != 0 && NextAdmissionLocked().has_value();
}

std::optional<size_t> Engine::NextAdmissionLocked() const {
  if (waiting_.empty()) return std::nullopt;
  // Evaluated at every wake-up of the prefill worker (each decode step notifies): the
  // descriptions go into buffers kept across calls rather than fresh allocations.
  sched_waiting_.clear();
  sched_in_flight_.clear();
  for (const Request* r : waiting_) sched_waiting_.push_back(DescribeLocked(r));
  for (const auto* list : {&prefilling_, &handed_over_, &running_}) {
    for (const Request* r : *list) sched_in_flight_.push_back(DescribeLocked(r));
  }
  return scheduler_.Admit(sched_waiting_, sched_in_flight_, pool_->table().free_pages());
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
  return s;
}

bool Engine::DecodeCanStartLocked() const {
  if (stopping_) return true;
  if (decode_allowance_ != 0) return !running_.empty() || !handed_over_.empty();
  // Paused: no step, but cancelled requests still leave (a draining server cancels them).
  auto cancelled = [](const Request* r) { return r->cancelled; };
  return std::any_of(running_.begin(), running_.end(), cancelled) ||
         std::any_of(handed_over_.begin(), handed_over_.end(), cancelled);
}

EngineStats Engine::stats() const {
  std::unique_lock<std::mutex> lock(mu_);
  EngineStats s = stats_;
  s.queued = static_cast<int>(waiting_.size());
  s.prefilling = static_cast<int>(prefilling_.size());
  s.running = static_cast<int>(running_.size() + handed_over_.size());
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
                                    .handover_cancelled = faults_.handover_cancelled});
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
    scheduler_.Finished(r->generated, could);
  }
  r->result.reason = reason;
  r->result.status = std::move(status);
  r->state = Request::State::kDone;
  ++stats_.finished;
  cv_.notify_all();  // waiters on this request; the prefill worker (pages came free)
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

void Engine::PrefillLoop() {
  const ModelConfig& c = model_->config();
  std::vector<float> logits(c.vocab_size);
  for (;;) {
    Request* r = nullptr;
    int n = 0;
    {
      std::unique_lock<std::mutex> lock(mu_);
      ParkUntil(lock, cv_, &prefill_parked_,
                [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return PrefillCanStartLocked(); });
      if (stopping_) return;
      if (prefill_allowance_ > 0) --prefill_allowance_;
      const size_t next = *NextAdmissionLocked();  // PrefillCanStartLocked said there is one
      r = waiting_[next];
      waiting_.erase(waiting_.begin() + static_cast<ptrdiff_t>(next));
      scheduler_.Admitted(r->owner.tenant);
      n = r->PrefillLength();
      if (r->pages.PagesFor(n) + options_.reserve_pages > pool_->num_pages()) {
        FinishLocked(r, FinishReason::kError,
                     absl::ResourceExhaustedError("sequence outgrew the whole KV pool"));
        continue;
      }
      const absl::Status granted = r->pages.GrantFor(n);
      if (!granted.ok()) {  // e.g. the tag key failed: the request fails, the engine goes on
        FinishLocked(r, FinishReason::kError, granted);
        continue;
      }
      // Strict now, while it holds pages: its pages are scrubbed at release whatever the mode
      // then (the step below reads the mode again, for what it writes).
      r->ever_strict = r->ever_strict || guard_->mode(r->owner.tenant) == isolation::Mode::kStrict;
      r->state = Request::State::kPrefilling;
      prefilling_.push_back(r);
      if (!r->admitted_once) {
        r->admitted_once = true;
        r->result.queue_seconds = Seconds(r->submitted, Clock::now());
      }
    }
    // The model runs without the engine lock: only this thread touches r's pages meanwhile.
    // The step (isolation/step_guard.h) pins an epoch and verifies the fresh page table before
    // prefill writes into it; prefill checks each page's tag before every layer's writes,
    // whatever the mode, as the decode kernels do; Finish re-verifies before the first token
    // leaves.
    const isolation::StepSession session{r->owner, r->pages.grants(), r->id};
    isolation::StepGuard::Step step =
        step_guard_.Begin(std::span(&session, 1), isolation::StepKind::kPrefill);
    absl::Status status;
#if KVGUARD_FAULT_INJECTION
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (faults_.release_during_prefill == r->id && step.in(0)) {
        // The bug: a racing path releases a page the prefill is about to write into.
        pool_->table().Release(r->owner, r->pages.grants().front(), false);
      }
    }
#endif
    if (step.in(0)) {
      int32_t tag_fault = -1;
      status = model_->Prefill(std::span<const int>(r->tokens.data(), size_t(n)), r->pages.grants(),
                               *pool_, logits.data(), &prefill_pool_,
                               step.check_tags(0) ? &tag_fault : nullptr);
      if (tag_fault >= 0) step.KernelFault(0, tag_fault);
    }
    std::unique_lock<std::mutex> lock(mu_);
    step.Finish();
    // Scrub on release if the tenant was strict when this step wrote into the pages.
    r->ever_strict = r->ever_strict || step.mode(0) == isolation::Mode::kStrict;
    cv_.notify_all();  // unpinning may have freed pages others wait for
    prefilling_.clear();
#if KVGUARD_FAULT_INJECTION
    if (faults_.cancel_in_prefill == r->id) r->cancelled = true;
#endif
    if (!step.accepted(0)) {
      AbortLocked(r, *step.violation(0));
      continue;
    }
    // The handover consumes the cancel flag: a request cancelled during prefill releases its
    // pages there and finishes.
    std::vector<isolation::Violation> refused;
    const bool cancelled = std::exchange(r->cancelled, false);
    if (!r->pages.HandOver(cancelled, cancelled && ScrubOnReleaseLocked(r), &refused)) {
      for (const isolation::Violation& v : refused) guard_->Report(v, r->id);
      FinishLocked(r, FinishReason::kCancelled, {});
      continue;
    }
    if (!status.ok()) {
      FinishLocked(r, FinishReason::kError, status);
      continue;
    }
    r->pages.set_kv_len(n);
    // A new request samples its first token from the prefill logits; a recomputed one
    // already has its next input (the last token it generated).
    if (r->generated == 0 && AcceptTokenLocked(r, r->sampler.Sample(logits.data(), c.vocab_size))) {
      continue;
    }
    r->state = Request::State::kHandedOver;
    handed_over_.push_back(r);
    cv_.notify_all();
    if (options_.check_accounting) CheckAccountingLocked();
  }
}

void Engine::DecodeLoop() {
  const ModelConfig& c = model_->config();
  std::vector<float> logits(static_cast<size_t>(kMaxDecodeBatch) * c.vocab_size);
  std::vector<Model::DecodeItem> items;
  std::vector<Request*> batch;
  std::vector<int32_t> tag_faults;               // per item
  std::vector<isolation::StepSession> sessions;  // per batch entry
  std::vector<size_t> in_step;                   // item j is batch entry in_step[j]
  Clock::time_point step_start;
#if KVGUARD_FAULT_INJECTION
  // EngineFaults: request `id`, if it is in this step, loses its first page. Requires mu_.
  auto release_first_page_of = [&](uint64_t id) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    for (size_t b : in_step) {
      const Request* r = batch[b];
      if (r->id == id && r->pages.num_pages() > 0) {
        pool_->table().Release(r->owner, r->pages.grants().front(), false);
      }
    }
  };
#endif
  for (;;) {
    std::optional<isolation::StepGuard::Step> step;  // from verification to acceptance
    {
      std::unique_lock<std::mutex> lock(mu_);
      ParkUntil(lock, cv_, &decode_parked_,
                [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return DecodeCanStartLocked(); });
      if (stopping_) return;
      for (Request* r : handed_over_) {
        r->state = Request::State::kRunning;
        running_.push_back(r);
      }
      handed_over_.clear();
      // Cancelled requests leave before the step.
      for (size_t i = 0; i < running_.size();) {
        if (running_[i]->cancelled) {
          FinishLocked(running_[i], FinishReason::kCancelled, {});
          running_.erase(running_.begin() + static_cast<ptrdiff_t>(i));
        } else {
          ++i;
        }
      }
      if (decode_allowance_ == 0) continue;  // paused (Allow): only the cancelled left
      // Every request needs a slot for its next token. Oldest first; when the pool is dry
      // the newest running request is preempted (pages released, recomputed later).
      for (size_t i = 0; i < running_.size();) {
        Request* r = running_[i];
        const absl::Status grown = r->pages.GrowForNextToken();
        if (grown.ok()) {
          ++i;
          continue;
        }
        if (!absl::IsResourceExhausted(grown)) {  // not a dry pool: fail r alone
          FinishLocked(r, FinishReason::kError, grown);
          running_.erase(running_.begin() + static_cast<ptrdiff_t>(i));
          continue;
        }
        if (pool_->table().limbo_pages() > 0) {
          // Pages are coming back as soon as the step pinning them (a prefill) ends: wait for
          // them rather than throw away another request's KV.
          cv_.wait(lock, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
            return stopping_ || pool_->table().free_pages() > 0 ||
                   pool_->table().limbo_pages() == 0;
          });
          if (stopping_) return;
          continue;
        }
        std::vector<SchedRequest> described;
        for (const Request* x : running_) described.push_back(DescribeLocked(x));
        const size_t v = scheduler_.Victim(described);
        Request* victim = running_[v];
        running_.erase(running_.begin() + static_cast<ptrdiff_t>(v));
        if (v < i) --i;  // r moved down one
        ReleasePagesLocked(victim);
        victim->state = Request::State::kWaiting;
        ++victim->result.preemptions;
        ++stats_.preemptions;
        scheduler_.Preempted();
        waiting_.push_front(victim);
        cv_.notify_all();
        // If the victim was r itself, i now names the next request (or the end); otherwise r
        // tries again.
      }
      if (running_.empty()) continue;
      // The step (isolation/step_guard.h): pin the epoch, read modes once (a mode change
      // applies from the next step), verify every page table; a request that fails is
      // aborted alone, before any of its KV is read.
      step_start = Clock::now();
      batch = running_;
      sessions.clear();
      for (const Request* r : batch) sessions.push_back({r->owner, r->pages.grants(), r->id});
      step.emplace(step_guard_.Begin(sessions));
      items.clear();
      in_step.clear();
      for (size_t b = 0; b < batch.size(); ++b) {
        Request* r = batch[b];
        r->ever_strict = r->ever_strict || step->mode(b) == isolation::Mode::kStrict;
        if (!step->in(b)) {
          AbortLocked(r, *step->violation(b));
          running_.erase(std::find(running_.begin(), running_.end(), r));
          continue;
        }
        in_step.push_back(b);
      }
      if (in_step.empty()) {
        step->Finish();
        continue;
      }
      stats_.max_running = std::max(stats_.max_running, static_cast<int>(in_step.size()));
      if (decode_allowance_ > 0) --decode_allowance_;  // the step runs: it uses one unit
      tag_faults.assign(in_step.size(), -1);
      for (size_t j = 0; j < in_step.size(); ++j) {
        const Request* r = batch[in_step[j]];
        items.push_back(Model::DecodeItem{r->tokens.back(), r->pages.kv_len(), r->pages.grants(),
                                          step->check_tags(in_step[j]), &tag_faults[j]});
      }
#if KVGUARD_FAULT_INJECTION
      // The bug: a page is released (as by a racing cancel path) after verification, while
      // the step that reads it is in flight.
      release_first_page_of(faults_.release_during_step);
#endif
    }
    // The step runs without the engine lock. The batch's requests cannot finish or lose
    // pages meanwhile: only this thread finishes, preempts or grows running requests
    // (Cancel only flags them).
    const absl::Status status = model_->Decode(items, *pool_, logits.data(), &decode_pool_);
    std::unique_lock<std::mutex> lock(mu_);
#if KVGUARD_FAULT_INJECTION
    // The bug: the page goes back after the kernels read it, before the step's result is
    // accepted (the kernels' own check saw nothing wrong).
    release_first_page_of(faults_.release_after_kernels);
#endif
    for (size_t j = 0; j < in_step.size(); ++j) {
      if (tag_faults[j] >= 0) step->KernelFault(in_step[j], tag_faults[j]);
    }
    // Re-verify before any result leaves, then unpin (pages released from here on, as by
    // finished requests, are free at once) and report.
    step->Finish();
    cv_.notify_all();  // unpinning may have freed pages others wait for
    ++stats_.decode_steps;
    scheduler_.DecodeStep();
    stats_.decode_tokens += static_cast<int64_t>(items.size());
    for (const Model::DecodeItem& it : items) stats_.decode_kv_tokens += it.pos + 1;
    for (size_t j = 0; j < in_step.size(); ++j) {
      Request* r = batch[in_step[j]];
      bool done = false;
      if (!step->accepted(in_step[j])) {
        // The kernels' own check failed after verification passed (nothing of the page was
        // read or written), or the page table changed during the step: the token is dropped.
        // First, whatever the step's status: the violation is already on the record.
        AbortLocked(r, *step->violation(in_step[j]));
        done = true;
      } else if (!status.ok()) {
        FinishLocked(r, FinishReason::kError, status);
        done = true;
      } else {
        r->pages.set_kv_len(r->pages.kv_len() + 1);
        if (r->cancelled) {
          FinishLocked(r, FinishReason::kCancelled, {});
          done = true;
        } else {
          done = AcceptTokenLocked(
              r, r->sampler.Sample(&logits[j * static_cast<size_t>(c.vocab_size)], c.vocab_size));
        }
      }
      if (done) running_.erase(std::find(running_.begin(), running_.end(), r));
    }
    stats_.decode_seconds += Seconds(step_start, Clock::now());
    if (options_.check_accounting) CheckAccountingLocked();
  }
}

}  // namespace kvguard::core
