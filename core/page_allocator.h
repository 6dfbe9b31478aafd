// core/page_allocator.h: the page-grant interface. The engine reaches a physical KV page only
// through a PageGrant handed out here, never through a raw index it made up itself.
//
// Every grant and every release moves the page's generation on (+1 each, never reused), so a
// grant that outlived its page (released, or released and granted again) no longer matches
// and is refused. The isolation layer (isolation/) builds its tags and ownership checks on
// this same handle.
#ifndef KVGUARD_CORE_PAGE_ALLOCATOR_H_
#define KVGUARD_CORE_PAGE_ALLOCATOR_H_

#include <cstdint>
#include <mutex>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvguard::core {

using SessionId = uint64_t;
inline constexpr SessionId kNoSession = 0;

// PageGrant is the ownership handle of one physical page: valid while the page's generation
// is still `generation` and it is owned by the session it was granted to.
struct PageGrant {
  int32_t page = -1;
  uint64_t generation = 0;
  friend bool operator==(const PageGrant&, const PageGrant&) = default;
};

class PageAllocator {
 public:
  explicit PageAllocator(int num_pages);

  // Grant hands a free page to `session` (!= kNoSession). Returns ResourceExhausted when no
  // page is free.
  absl::StatusOr<PageGrant> Grant(SessionId session);

  // GrantMany grants `count` pages at once or none (ResourceExhausted), appending to `out`.
  absl::Status GrantMany(SessionId session, int count, std::vector<PageGrant>* out);

  // Release returns `grant`'s page to the free list. FailedPrecondition, and nothing freed,
  // when the grant is stale (double release, late release after reuse) or `session` does
  // not own the page.
  absl::Status Release(SessionId session, const PageGrant& grant);

  // Owns returns whether `grant` is current and held by `session`.
  bool Owns(SessionId session, const PageGrant& grant) const;

  int total_pages() const { return static_cast<int>(pages_.size()); }
  int free_pages() const;
  int used_pages() const;

  // CheckAccounting returns Internal if free + in use != total, or a page is both free and
  // owned, or the free list holds a page twice.
  absl::Status CheckAccounting() const;

 private:
  struct Page {
    SessionId owner = kNoSession;
    uint64_t generation = 0;  // even: free; odd: granted
  };
  // std::mutex rather than absl::Mutex: Debian's Abseil is not built with ThreadSanitizer,
  // so TSan cannot see absl::Mutex's synchronisation and would report false races.
  mutable std::mutex mu_;
  std::vector<Page> pages_ ABSL_GUARDED_BY(mu_);
  std::vector<int32_t> free_ ABSL_GUARDED_BY(mu_);  // LIFO: a just-freed page is reused first
};

}  // namespace kvguard::core

#endif  // KVGUARD_CORE_PAGE_ALLOCATOR_H_
