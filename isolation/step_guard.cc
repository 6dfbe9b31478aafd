#include "isolation/step_guard.h"

#include <chrono>
#include <utility>

#include "absl/base/internal/raw_logging.h"

namespace kvguard::isolation {
namespace {

int64_t NanosSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                              start)
      .count();
}

}  // namespace

StepGuard::Step::Step(Guard* guard, std::span<const StepSession> sessions, StepKind kind)
    : guard_(guard),
      sessions_(sessions.begin(), sessions.end()),
      entries_(sessions.size()),
      kind_(kind) {
  // Pin first: what verification sees must stay true for the kernels.
  pin_ = guard_->table().PinStep();
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < sessions_.size(); ++i) {
    const StepSession& s = sessions_[i];
    Entry& e = entries_[i];
    e.mode = guard_->mode(s.owner.tenant);
    if (e.mode != Mode::kOff) {
      ++verified_;
      pages_verified_ += static_cast<int64_t>(s.grants.size());
    }
    e.violation = guard_->Verify(s.owner, s.grants, e.mode);
    // Reported at once (fail closed): a strict tenant that reaches its violation limit here is
    // quarantined before its next session in this batch is verified.
    if (e.violation) guard_->Report(*e.violation, s.request);
  }
  verify_ns_ = NanosSince(start);
}

StepGuard::Step::Step(Step&& other) noexcept
    : guard_(std::exchange(other.guard_, nullptr)),
      sessions_(std::move(other.sessions_)),
      entries_(std::move(other.entries_)),
      pin_(std::move(other.pin_)),
      verify_ns_(other.verify_ns_),
      verified_(other.verified_),
      pages_verified_(other.pages_verified_),
      finished_(other.finished_),
      kind_(other.kind_)
#if KVGUARD_FAULT_INJECTION
      ,
      faults_(other.faults_)
#endif
{
}

StepGuard::Step::~Step() {
  ABSL_RAW_CHECK(guard_ == nullptr || finished_,
                 "a step ended without StepGuard::Step::Finish: its results were never verified");
}

void StepGuard::Step::KernelFault(size_t i, int32_t page_index) {
  ABSL_RAW_CHECK(!finished_, "KernelFault after Finish");
  Entry& e = entries_[i];
  if (e.violation) return;  // already out: the kernels should not have run it
  const StepSession& s = sessions_[i];
  ABSL_RAW_CHECK(page_index >= 0 && static_cast<size_t>(page_index) < s.grants.size(),
                 "a kernel fault names a page outside the session's page table");
  const PageGrant& g = s.grants[static_cast<size_t>(page_index)];
  // The table's view of the page fills in its current owner and generation.
  Violation v =
      guard_->table().Verify(s.owner, std::span<const PageGrant>(&g, 1)).value_or(Violation{});
  v.kind = ViolationKind::kKernelTagMismatch;
  v.requester = s.owner;
  v.page_index = page_index;
  v.page = g.page;
  v.expected_generation = g.generation;
  e.violation = v;
  e.report_at_finish = true;
}

void StepGuard::Step::Finish() {
  if (finished_) return;
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < sessions_.size(); ++i) {
    Entry& e = entries_[i];
    if (e.violation || e.mode == Mode::kOff) continue;
#if KVGUARD_FAULT_INJECTION
    if (faults_.skip_reverify) continue;
#endif
    if (std::optional<Violation> v =
            guard_->table().Verify(sessions_[i].owner, sessions_[i].grants)) {
      e.violation = std::move(v);
      e.report_at_finish = true;
    }
  }
  verify_ns_ += NanosSince(start);
  // The kernels are done: pages released from here on need not wait for this step.
  pin_ = {};
  finished_ = true;
  for (size_t i = 0; i < sessions_.size(); ++i) {
    if (entries_[i].report_at_finish) guard_->Report(*entries_[i].violation, sessions_[i].request);
  }
  if (kind_ == StepKind::kDecode) guard_->RecordStep(verify_ns_, verified_, pages_verified_);
}

}  // namespace kvguard::isolation
