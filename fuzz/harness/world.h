// fuzz/harness/world.h: the shared world of the isolation fuzz targets (page_ops,
// realloc_race): a real KV pool, ownership table, tag key ring and guard, requests that go
// through the engine's page lifecycle (core/engine/session_pages.h) one atomic action at a time,
// and a shadow model that knows who should own what and checks every answer the real code gives.
//
// An action is one call into shared isolation or pool state (a grant, a verification, one
// page read or write, a release, a pin, a copy, a key or mode change), so an interleaving of
// actions is exactly an interleaving of the accesses a real multi-threaded engine makes.
//
// The oracles (a violated one prints its name and the detail, then aborts, which libFuzzer
// reports as a crash; with KVGUARD_FUZZ_TRACE=1 every action is printed as it happens):
//   access-let-through   a page read or written after verification and the kernel's tag check
//                        passed is not the requester's current page, or a read finds bytes the
//                        reader did not write
//   legit-read-rejected  verification (or the kernel check) refused a page table the shadow
//                        says is entirely the requester's
//   release-outcome      a release was accepted that the shadow says must be refused, or the
//                        reverse (double release, stale release, another session's grant)
//   grant-while-readable a page was granted again while a pinned step or a copy that started
//                        before its release may still read it, or while someone owns it
//   freed-while-readable a page went back to the free list while such a step or copy may
//                        still read it (found before anyone is granted it)
//   generation-reused    a grant repeats a generation its page already had
//   unscrubbed-reuse     a page released with scrub was granted again with bytes left in it
//   scheduler-violation  a request no injected fault touched hit a violation: the scheduler's
//                        own lifecycle presented a bad page table (e.g. a cancelled request
//                        that went on stepping)
//   accounting           the table's own accounting check failed, or its free / limbo / used
//                        counts differ from the shadow's
//   copy-outcome, key-retire, admission, mode, grant: the copy verdicts, a key retired while
//                        pages it tagged are held, a quarantined tenant admitted, a mode read
//                        that is not the one set, a grant failing other than for a dry pool
//
// Injected faults are misbehaving callers (a release mid-step, a double release, a stale or
// forged page table, another session's release, a cancelled request that goes on): the
// isolation layer
// must contain each, so they taint only the request they hit. Planted bugs (fuzz/README.md)
// are the opposite: a broken isolation layer or scheduler that the oracles must expose.
#ifndef KVGUARD_FUZZ_HARNESS_WORLD_H_
#define KVGUARD_FUZZ_HARNESS_WORLD_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/engine/scheduler.h"
#include "core/engine/session_pages.h"
#include "core/model/kv_pool.h"
#include "isolation/guard.h"
#include "isolation/ownership_table.h"
#include "isolation/step_guard.h"

namespace kvguard::fuzz {

struct WorldOptions {
  int num_pages = 10;
  int page_size = 4;
  int max_requests = 16;  // requests opened over the world's life (ids 1..)
  // A planted bug (fuzz/README.md) switched on in the real code for the world's life: one of
  // no_epoch_pin, no_generation_bump, release_without_owner_check, unscrubbed_reuse,
  // skip_last_page_verify, cancelled_continues, copy_pin_ignored, stale_release_accepted,
  // page_granted_twice, no_step_reverify; "" for none.
  std::string planted;
};

// Faults a fuzz input may inject (see the file comment). Each taints the request it hits.
enum class Fault : uint8_t {
  kReleaseMidStep,      // one of the request's pages is released while its step is in flight
  kDoubleRelease,       // a grant the request already released is released again
  kStalePageTable,      // one entry of its page table is replaced by a grant it released
  kForgedPageTable,     // one entry is replaced by a made-up page, generation and tag
  kForeignRelease,      // it releases another request's current grant
  kCancelledContinues,  // cancelled during prefill, it goes on to decode anyway
  kCount,
};

class World {
 public:
  // Request phases. A request runs prefill (verify, write each page, finish; a cancelled one
  // leaves there), then
  // decode steps (grow, verify, read each page, write, finish) until it is done.
  enum class Phase : uint8_t {
    kPrefillVerify,
    kPrefillWrite,
    kPrefillFinish,
    kDecodeGrow,
    kDecodeVerify,
    kDecodeRead,
    kDecodeWrite,
    kDecodeFinish,
    kDone,
  };

  explicit World(const WorldOptions& options = {});
  ~World();
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  // ---- Actions. Each returns false when it does not apply now (nothing happened). ----
  // Open admits a new request of tenant `tenant` (0..2: enforce, strict, off at start) with a
  // prompt of `prompt` tokens that generates up to `gen` more, and grants its prompt pages.
  bool Open(int tenant, int prompt, int gen);
  // Advance runs the next action of request `r`'s lifecycle (one phase, or one page of a
  // write or read phase).
  bool Advance(int r);
  // Cancel flags request `r` (it leaves at the end of its prefill or at its next decode step).
  bool Cancel(int r);
  // Preempt releases a decoding request's pages between its steps; it is prefilled again.
  bool Preempt(int r);
  // Copy starts, runs or ends an asynchronous copy of one page of request `r` (the copy
  // engine's offload of a page): BeginCopy, then the copy reads the page, then EndCopy.
  bool CopyStep(int r, int page_index);
  bool RotateKey();
  bool RetireOldKeys();
  bool SetMode(int tenant, isolation::Mode mode);
  // Inject applies fault `f` to request `r` (`arg` picks a page, a victim or a made-up value).
  bool Inject(Fault f, int r, uint32_t arg);

  // ---- Queries for the drivers. ----
  int num_requests() const { return static_cast<int>(requests_.size()); }
  bool live(int r) const;  // opened and not done
  Phase phase(int r) const;
  bool in_step(int r) const;    // between a verify and its finish
  bool waiting(int r) const;    // not admitted yet, or preempted: to be prefilled (again)
  bool cancelled(int r) const;  // Cancel flagged it
  int num_pages_of(int r) const;
  bool has_copy(int r) const;  // an asynchronous copy of one of its pages is in flight
  // Describe says what the engine's scheduler (core/engine/scheduler.h) knows of live request
  // `r`, so that a driver takes its scheduling decisions (whom to admit, whom to preempt) from
  // the real Scheduler. admitted_at orders requests by their latest admission (0: waiting).
  core::SchedRequest Describe(int r) const;
  uint64_t admitted_at(int r) const;
  int free_pages() const;
  // CheckInvariants runs the accounting oracle (after every action of the drivers).
  void CheckInvariants();
  // Finish cancels every live request and drives it to done, then checks that the pool is
  // whole again.
  void Finish();

  // set_echo prints every action to stderr as it happens (KVGUARD_FUZZ_TRACE=1).
  void set_echo(bool echo) { echo_ = echo; }

 private:
  struct Request;
  struct ShadowPage;
  struct Copy;

  Request* Get(int r);
  const Request* Get(int r) const;
  void Log(const std::string& line);
  [[noreturn]] void Fail(const char* oracle, const std::string& detail) const;

  // Shadow bookkeeping around the real calls.
  void OnGranted(Request& q, size_t first);
  bool ShadowReleasable(const isolation::Owner& o, const isolation::PageGrant& g) const;
  void ShadowRelease(const isolation::PageGrant& g, bool scrub);
  void ShadowReclaim();
  std::optional<isolation::ViolationKind> ShadowVerify(const Request& q) const;
  bool ShadowKernelCheck(const Request& q, int page_index) const;
  void ShadowQuarantine(const Request& q);

  // Steps of the lifecycle.
  std::vector<isolation::PageGrant> Presented(const Request& q) const;
  void RefreshPresented(Request& q);  // after an injection changed the table mid-step
  void BeginStep(Request& q);
  // KernelCheck runs the attention kernel's tag check on one page of q's page table, checks
  // its verdict against the shadow's, and aborts q on a mismatch (returns false).
  bool KernelCheck(Request& q, const isolation::PageGrant& g, int page_index, int tokens,
                   const char* access);
  void KernelCheckAndRead(Request& q, int page_index);
  void KernelCheckAndWrite(Request& q, int position);
  void EndStep(Request& q, bool prefill);
  void Violated(Request& q, const isolation::Violation& v);
  void Report(Request& q, const isolation::Violation& v);          // guard_->Report + the shadow
  void ShadowReported(Request& q, const isolation::Violation& v);  // the shadow's part
  // AbortInStep ends q once its finished step took it out (the step guard reported why).
  void AbortInStep(Request& q);
  void EndShadowStep(Request& q);  // the shadow's unpin
  void ReleaseAll(Request& q);
  bool ScrubOnRelease(Request& q);
  void Complete(Request& q);

  WorldOptions options_;
  std::shared_ptr<isolation::TagKeyRing> keys_;
  std::unique_ptr<core::KvPool> pool_;
  std::shared_ptr<isolation::MemoryAuditSink> sink_;
  std::unique_ptr<isolation::Guard> guard_;
  std::unique_ptr<isolation::StepGuard> step_guard_;  // the engine's step protocol
  std::vector<std::unique_ptr<Request>> requests_;
  std::vector<ShadowPage> shadow_;
  std::vector<uint64_t> pins_;  // tickets of the steps in flight (the shadow's copy)
  uint64_t next_ticket_ = 1;
  uint64_t admissions_ = 0;  // admitted_at's clock
  struct ShadowTenant {
    isolation::Mode mode;
    int strict_violations = 0;
    bool quarantined = false;
  };
  std::vector<ShadowTenant> tenants_;
  std::vector<Copy> copies_;
  core::SessionFaults planted_session_;
  bool echo_ = false;
  uint64_t checks_ = 0;
};

}  // namespace kvguard::fuzz

#endif  // KVGUARD_FUZZ_HARNESS_WORLD_H_
