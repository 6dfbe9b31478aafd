#include "core/page_allocator.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace kvguard::core {

PageAllocator::PageAllocator(int num_pages) : pages_(static_cast<size_t>(num_pages)) {
  free_.reserve(pages_.size());
  for (int32_t p = num_pages - 1; p >= 0; --p) free_.push_back(p);
}

absl::StatusOr<PageGrant> PageAllocator::Grant(SessionId session) {
  std::vector<PageGrant> one;
  if (absl::Status s = GrantMany(session, 1, &one); !s.ok()) return s;
  return one.front();
}

absl::Status PageAllocator::GrantMany(SessionId session, int count, std::vector<PageGrant>* out) {
  if (session == kNoSession) return absl::InvalidArgumentError("grant to no session");
  if (count < 0) return absl::InvalidArgumentError("negative page count");
  std::lock_guard<std::mutex> lock(mu_);
  if (static_cast<size_t>(count) > free_.size()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV pool: ", count, " pages wanted, ", free_.size(), " free"));
  }
  for (int i = 0; i < count; ++i) {
    const int32_t p = free_.back();
    free_.pop_back();
    Page& page = pages_[static_cast<size_t>(p)];
    page.owner = session;
    ++page.generation;
    out->push_back(PageGrant{p, page.generation});
  }
  return absl::OkStatus();
}

absl::Status PageAllocator::Release(SessionId session, const PageGrant& grant) {
  std::lock_guard<std::mutex> lock(mu_);
  if (grant.page < 0 || static_cast<size_t>(grant.page) >= pages_.size()) {
    return absl::FailedPreconditionError(absl::StrCat("release of invalid page ", grant.page));
  }
  Page& page = pages_[static_cast<size_t>(grant.page)];
  if (page.generation != grant.generation || page.owner != session) {
    return absl::FailedPreconditionError(absl::StrCat("stale or foreign release of page ",
                                                      grant.page, " (generation ", grant.generation,
                                                      ", current ", page.generation, ")"));
  }
  page.owner = kNoSession;
  ++page.generation;
  free_.push_back(grant.page);
  return absl::OkStatus();
}

bool PageAllocator::Owns(SessionId session, const PageGrant& grant) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (grant.page < 0 || static_cast<size_t>(grant.page) >= pages_.size()) return false;
  const Page& page = pages_[static_cast<size_t>(grant.page)];
  return session != kNoSession && page.owner == session && page.generation == grant.generation;
}

int PageAllocator::free_pages() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(free_.size());
}

int PageAllocator::used_pages() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(pages_.size() - free_.size());
}

absl::Status PageAllocator::CheckAccounting() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<bool> on_free_list(pages_.size(), false);
  for (int32_t p : free_) {
    if (p < 0 || static_cast<size_t>(p) >= pages_.size() || on_free_list[static_cast<size_t>(p)]) {
      return absl::InternalError(absl::StrCat("free list holds page ", p, " twice or invalid"));
    }
    on_free_list[static_cast<size_t>(p)] = true;
  }
  size_t owned = 0;
  for (size_t p = 0; p < pages_.size(); ++p) {
    const bool is_owned = pages_[p].owner != kNoSession;
    if (is_owned == on_free_list[p] || is_owned != (pages_[p].generation % 2 == 1)) {
      return absl::InternalError(absl::StrCat("page ", p, " is both free and owned, or neither"));
    }
    owned += is_owned;
  }
  if (owned + free_.size() != pages_.size()) {
    return absl::InternalError(absl::StrCat("pool accounting: ", free_.size(), " free + ", owned,
                                            " in use != ", pages_.size(), " total"));
  }
  return absl::OkStatus();
}

}  // namespace kvguard::core
