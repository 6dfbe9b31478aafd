// core/engine/session_pages.h: one request's page table, and every change the scheduler makes to
// it: the prompt's pages at admission, one more page when decoding crosses a page boundary, the
// release at finish or preemption, and the release of a cancelled request at a step boundary.
//
// The engine (core/engine/engine.cc) keeps one per request, and the fuzz targets (fuzz/) drive the
// same class, so the lifecycle they attack is the one that ships. Not thread-safe: the
// engine touches a request's pages under its own lock, or from the one worker that owns the
// request at that moment.
#ifndef KVGUARD_CORE_ENGINE_SESSION_PAGES_H_
#define KVGUARD_CORE_ENGINE_SESSION_PAGES_H_

#include <span>
#include <vector>

#include "absl/status/status.h"
#include "isolation/ownership_table.h"
#include "isolation/violation.h"

namespace kvguard::core {

#if KVGUARD_FAULT_INJECTION
// SessionFaults make this request's lifecycle misbehave the ways real schedulers have shipped
// (test and fuzz builds only). Verification must catch each.
struct SessionFaults {
  bool double_release = false;       // Release returns every page twice
  bool cancelled_continues = false;  // ContinueUnlessCancelled releases a cancelled request's
                                     // pages and lets it go on anyway, with its old page table
};
#endif

class SessionPages {
 public:
  // `table` must outlive this object; `page_size` is the pool's P (>= 1).
  SessionPages(isolation::OwnershipTable* table, isolation::Owner owner, int page_size);
  SessionPages(const SessionPages&) = delete;
  SessionPages& operator=(const SessionPages&) = delete;
  ~SessionPages() = default;

  const isolation::Owner& owner() const { return owner_; }
  // grants is the page table, in token order.
  std::span<const isolation::PageGrant> grants() const { return grants_; }
  int num_pages() const { return static_cast<int>(grants_.size()); }
  // kv_len is how many tokens have their K and V in the pages.
  int kv_len() const { return kv_len_; }
  void set_kv_len(int tokens) { kv_len_ = tokens; }

  // PagesFor is how many pages `tokens` tokens need.
  int PagesFor(int tokens) const { return (tokens + page_size_ - 1) / page_size_; }

  // GrantFor grants the pages for the first `tokens` tokens (prefill) to a request holding
  // none: the table's status (ResourceExhausted when too few are free; nothing granted).
  absl::Status GrantFor(int tokens);

  // needs_page says the next token (at kv_len) has no slot yet; GrowForNextToken grants that
  // page: OK (also when no page was needed), or the table's status (ResourceExhausted when
  // the pool is dry) with nothing changed.
  bool needs_page() const { return kv_len_ >= num_pages() * page_size_; }
  absl::Status GrowForNextToken();

  // Release returns every page to the table (zeroed before reuse if `scrub`) and forgets
  // them; kv_len becomes 0. Returns the violations of releases the table refused (a refused
  // release frees nothing).
  std::vector<isolation::Violation> Release(bool scrub);

  // ContinueUnlessCancelled is the engine's check at a step boundary: a request cancelled
  // (during its prefill or between steps) releases its pages here and must leave (false, with
  // the refused releases in `refused`); any other goes on with its page table unchanged
  // (true).
  bool ContinueUnlessCancelled(bool cancelled, bool scrub,
                               std::vector<isolation::Violation>* refused);

#if KVGUARD_FAULT_INJECTION
  void set_faults(const SessionFaults& faults) { faults_ = faults; }
#endif

 private:
  isolation::OwnershipTable* table_;
  isolation::Owner owner_;
  int page_size_;
  std::vector<isolation::PageGrant> grants_;
  int kv_len_ = 0;
#if KVGUARD_FAULT_INJECTION
  SessionFaults faults_;
#endif
};

}  // namespace kvguard::core

#endif  // KVGUARD_CORE_ENGINE_SESSION_PAGES_H_
