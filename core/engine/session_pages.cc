#include "core/engine/session_pages.h"

#include <optional>
#include <utility>

#include "absl/base/internal/raw_logging.h"
#include "absl/status/statusor.h"

namespace kvguard::core {

using isolation::PageGrant;
using isolation::Violation;

SessionPages::SessionPages(isolation::OwnershipTable* table, isolation::Owner owner, int page_size)
    : table_(table), owner_(owner), page_size_(page_size) {
  ABSL_RAW_CHECK(table != nullptr, "SessionPages needs a table");
  ABSL_RAW_CHECK(page_size >= 1, "SessionPages: page size < 1");
}

absl::Status SessionPages::GrantFor(int tokens) {
  ABSL_RAW_CHECK(grants_.empty(), "GrantFor on a request that holds pages");
  return table_->GrantMany(owner_, PagesFor(tokens), &grants_);
}

absl::Status SessionPages::GrowForNextToken() {
  if (!needs_page()) return absl::OkStatus();
  absl::StatusOr<PageGrant> g = table_->Grant(owner_);
  if (!g.ok()) return g.status();
  grants_.push_back(*g);
  return absl::OkStatus();
}

std::vector<Violation> SessionPages::Release(bool scrub) {
  std::vector<Violation> refused;
  int passes = 1;
#if KVGUARD_FAULT_INJECTION
  if (faults_.double_release) passes = 2;
#endif
  for (int pass = 0; pass < passes; ++pass) {
    for (const PageGrant& g : grants_) {
      if (std::optional<Violation> v = table_->Release(owner_, g, scrub)) refused.push_back(*v);
    }
  }
  grants_.clear();
  kv_len_ = 0;
  return refused;
}

bool SessionPages::ContinueUnlessCancelled(bool cancelled, bool scrub,
                                           std::vector<Violation>* refused) {
  if (!cancelled) return true;
#if KVGUARD_FAULT_INJECTION
  if (faults_.cancelled_continues) {
    // The bug: the pages go back to the pool, yet the request goes on stepping with its old
    // page table.
    for (const PageGrant& g : grants_) {
      if (std::optional<Violation> v = table_->Release(owner_, g, scrub)) refused->push_back(*v);
    }
    return true;
  }
#endif
  std::vector<Violation> r = Release(scrub);
  refused->insert(refused->end(), r.begin(), r.end());
  return false;
}

}  // namespace kvguard::core
