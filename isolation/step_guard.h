// isolation/step_guard.h: the one owner of the per-step isolation protocol.
//
// Every forward pass that reads or writes the KV cache (a decode step, a prefill, a mixed
// batch) goes through this sequence, in this order, and the engine (core/engine/engine.cc) and the
// fuzz harness (fuzz/harness/world.cc) both drive it through this class, so the protocol the
// fuzzers attack is the one that ships:
//   1. Begin pins the table's epoch (a page released from then on is not granted again until
//      the step ends), reads each session's tenant mode once (a mode change applies from the
//      next step), verifies the page table of every session whose mode is not off, and
//      reports each failure to the audit sink at once. A session that failed is out of the step:
//      the kernels must not touch its pages.
//   2. The kernels run the sessions still in, checking every page's tag against its grant's
//      as they load it, for every session whatever its mode (check_tags): a page an `off`
//      tenant reads may by then belong to a strict one. A failed check is KernelFault.
//   3. Finish re-verifies every session still in whose mode is not off (only a broken
//      allocator can change a grant under the epoch rule; the step's output is then
//      discarded), unpins, reports the kernel faults and the failed re-verifications, and
//      (decode steps) adds the step's verification cost to the guard's metrics. After Finish,
//      accepted(i) says whether session i's results may leave the step.
// A Step destroyed without Finish is a CHECK failure: no step's result may leave unverified.
#ifndef KVGUARD_ISOLATION_STEP_GUARD_H_
#define KVGUARD_ISOLATION_STEP_GUARD_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "isolation/guard.h"
#include "isolation/ownership_table.h"
#include "isolation/violation.h"

namespace kvguard::isolation {

// StepSession is one session's part of a step: its owner, its page table as the kernels will
// read it (in token order; while the session is in the step, the span must stay valid and
// unchanged until Finish, which verifies it again), and the request id its audit records
// name.
// A prefill verifies one page table per prompt; the guard's step metrics (GuardStats::steps,
// verify time, pages verified; /metrics) count decode steps, whose cost is paid per token.
enum class StepKind { kDecode, kPrefill };

struct StepSession {
  Owner owner;
  std::span<const PageGrant> grants;
  uint64_t request = 0;
};

#if KVGUARD_FAULT_INJECTION
// StepFaults break the protocol the way a careless refactoring would (test and fuzz builds
// only: the fuzzers' planted bug no_step_reverify). The oracles must catch it.
struct StepFaults {
  bool skip_reverify = false;  // Finish accepts every session still in without re-verifying
};
#endif

class StepGuard {
 public:
  // `guard` (not owned) must outlive every Step begun here.
  explicit StepGuard(Guard* guard) : guard_(guard) {}

  class Step {
   public:
    Step(Step&& other) noexcept;
    Step& operator=(Step&& other) = delete;
    Step(const Step&) = delete;
    Step& operator=(const Step&) = delete;
    ~Step();  // CHECK: Finish ran (or the step was moved from)

    size_t size() const { return sessions_.size(); }
    // mode is session i's tenant mode, read once at Begin.
    Mode mode(size_t i) const { return entries_[i].mode; }
    // check_tags says whether the kernels check session i's tags: always, whatever the mode.
    bool check_tags(size_t) const { return true; }
    // in says whether session i is still in the step: before Finish, whether the kernels may
    // run it; after Finish, whether its results may be accepted (also accepted()).
    bool in(size_t i) const { return !entries_[i].violation.has_value(); }
    bool accepted(size_t i) const { return finished_ && in(i); }
    // violation is what took session i out of the step (verification, kernel check or
    // re-verification): the full description, as reported to the audit sink.
    const std::optional<Violation>& violation(size_t i) const { return entries_[i].violation; }

    // KernelFault records that the kernels' tag check failed on page `page_index` of session
    // i's page table: i is out of the step, and Finish reports the fault with the page's
    // current owner and generation. Ignored for a session already out; CHECK: the page is in
    // its page table.
    void KernelFault(size_t i, int32_t page_index);

    // Finish re-verifies, unpins, reports and records the step's cost (see the file comment).
    // Idempotent.
    void Finish();

   private:
    friend class StepGuard;
    struct Entry {
      Mode mode = Mode::kEnforce;
      std::optional<Violation> violation;
      bool report_at_finish = false;  // a kernel fault, described at Finish
    };
    Step(Guard* guard, std::span<const StepSession> sessions, StepKind kind);

    Guard* guard_ = nullptr;  // null once moved from
    std::vector<StepSession> sessions_;
    std::vector<Entry> entries_;
    OwnershipTable::StepPin pin_;
    int64_t verify_ns_ = 0, verified_ = 0, pages_verified_ = 0;
    bool finished_ = false;
    StepKind kind_ = StepKind::kDecode;
#if KVGUARD_FAULT_INJECTION
    StepFaults faults_;
#endif
  };

  // Begin starts a step over `sessions` (step 1 of the file comment). Begin with no sessions
  // is allowed and still pins.
  Step Begin(std::span<const StepSession> sessions, StepKind kind = StepKind::kDecode) {
    Step step(guard_, sessions, kind);
#if KVGUARD_FAULT_INJECTION
    step.faults_ = faults_;
#endif
    return step;
  }

#if KVGUARD_FAULT_INJECTION
  void set_faults(const StepFaults& faults) { faults_ = faults; }
#endif

 private:
  Guard* guard_;
#if KVGUARD_FAULT_INJECTION
  StepFaults faults_;
#endif
};

}  // namespace kvguard::isolation

#endif  // KVGUARD_ISOLATION_STEP_GUARD_H_
