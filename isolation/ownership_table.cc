#include "isolation/ownership_table.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/base/internal/raw_logging.h"
#include "absl/strings/str_cat.h"

namespace kvguard::isolation {
namespace {

// Holds says whether a page in `state` holds a tag derived at its grant or publication: owned,
// quarantined (owned, unreadable) or shared.
bool Holds(PageState state) {
  return state == PageState::kOwned || state == PageState::kQuarantined ||
         state == PageState::kShared;
}

}  // namespace

OwnershipTable::OwnershipTable(int num_pages, const TagKeyRing* keys,
                               std::function<void(int32_t)> scrub)
    : keys_(keys),
      scrub_(std::move(scrub)),
      pages_(static_cast<size_t>(num_pages)),
      tags_(new kernels::PageTag[static_cast<size_t>(num_pages)]()) {
  ABSL_RAW_CHECK(num_pages >= 1, "ownership table needs at least one page");
  ABSL_RAW_CHECK(keys != nullptr, "ownership table needs a key ring");
  free_.reserve(pages_.size());
  for (int32_t p = num_pages - 1; p >= 0; --p) free_.push_back(p);
}

void OwnershipTable::SetTagLocked(int32_t page, const kernels::PageTag& tag) {
  // Kernels load these with relaxed atomics while a faulty release may be rewriting them.
  __atomic_store_n(&tags_[page].lo, tag.lo, __ATOMIC_RELAXED);
  __atomic_store_n(&tags_[page].hi, tag.hi, __ATOMIC_RELAXED);
}

absl::StatusOr<PageGrant> OwnershipTable::Grant(const Owner& owner) {
  std::vector<PageGrant> one;
  if (absl::Status s = GrantMany(owner, 1, &one); !s.ok()) return s;
  return one.front();
}

absl::Status OwnershipTable::GrantMany(const Owner& owner, int count, std::vector<PageGrant>* out) {
  if (owner.session == kNoSession) return absl::InvalidArgumentError("grant to no session");
  if (count < 0) return absl::InvalidArgumentError("negative page count");
  std::lock_guard<std::mutex> lock(mu_);
  // Read under the lock, so a concurrent rotate-then-retire cannot retire it in between.
  const KeyId key_id = keys_->active_id();
  if (static_cast<size_t>(count) > free_.size()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV pool: ", count, " pages wanted, ", free_.size(), " free"));
  }
  const size_t first = out->size();
#if KVGUARD_FAULT_INJECTION
  // The grant_owned_page fault's page did not come off the free list: an undo restores it.
  size_t faulty_index = SIZE_MAX;
  Page faulty_before;
#endif
  for (int i = 0; i < count; ++i) {
    int32_t p = free_.back();
#if KVGUARD_FAULT_INJECTION
    if (faults_.grant_owned_page) {
      for (size_t q = 0; q < pages_.size(); ++q) {
        if (pages_[q].state == PageState::kOwned && !(pages_[q].owner == owner)) {
          p = static_cast<int32_t>(q);
          faulty_index = out->size();
          faulty_before = pages_[q];
          faults_.grant_owned_page = false;  // fires once, when another session owns a page
          break;
        }
      }
    }
#endif
    Page& page = pages_[static_cast<size_t>(p)];
    uint64_t generation = page.generation + 1;
#if KVGUARD_FAULT_INJECTION
    if (faults_.skip_generation_bump) generation = page.generation;
#endif
    absl::StatusOr<kernels::PageTag> tag = keys_->Derive(
        key_id, TagInput{static_cast<uint64_t>(p), generation, owner.tenant, owner.session});
    if (!tag.ok()) {
      // Undo this call's grants: nothing is granted on failure.
      for (size_t j = out->size(); j > first; --j) {
        const PageGrant& g = (*out)[j - 1];
        Page& undo = pages_[static_cast<size_t>(g.page)];
#if KVGUARD_FAULT_INJECTION
        if (j - 1 == faulty_index) {
          undo = faulty_before;
          SetTagLocked(g.page, faulty_before.tag);
          continue;
        }
#endif
        undo.state = PageState::kFree;
        undo.owner = Owner{};
        ++undo.generation;
        SetTagLocked(g.page, kernels::PageTag{});
        free_.push_back(g.page);
      }
      out->resize(first);
      return tag.status();
    }
    if (p == free_.back()) free_.pop_back();
    page.state = PageState::kOwned;
    page.owner = owner;
    page.generation = generation;
    page.key_id = key_id;
    page.tag = *tag;
    page.scrub = false;
    SetTagLocked(p, *tag);
    out->push_back(PageGrant{p, generation, *tag});
  }
  return absl::OkStatus();
}

Violation OwnershipTable::ViolationAtLocked(const Owner& owner, const PageGrant& grant,
                                            int32_t index) const {
  Violation v;
  v.requester = owner;
  v.page = grant.page;
  v.page_index = index;
  v.expected_generation = grant.generation;
  if (grant.page < 0 || static_cast<size_t>(grant.page) >= pages_.size()) {
    v.kind = ViolationKind::kInvalidPage;
    return v;
  }
  const Page& page = pages_[static_cast<size_t>(grant.page)];
  v.actual_generation = page.generation;
  v.actual_owner = page.owner;
  v.actual_domain = page.domain;
  return v;
}

std::optional<Violation> OwnershipTable::CheckLocked(const Owner& owner, const PageGrant& grant,
                                                     int32_t index) const {
  Violation v = ViolationAtLocked(owner, grant, index);
  if (v.kind == ViolationKind::kInvalidPage) return v;
  const Page& page = pages_[static_cast<size_t>(grant.page)];
  const bool current = page.generation == grant.generation;
  if (page.state == PageState::kFree || page.state == PageState::kLimbo) {
    v.kind = current ? ViolationKind::kPageNotOwned : ViolationKind::kStaleGeneration;
    return v;
  }
  // A shared page has no owner session: a private grant to it is another's (or stale).
  if (!(page.owner == owner)) {
    v.kind = current ? ViolationKind::kWrongOwner : ViolationKind::kStaleGeneration;
    return v;
  }
  if (!current) {
    v.kind = ViolationKind::kStaleGeneration;
    return v;
  }
  if (!TagsEqual(page.tag, grant.tag)) {
    v.kind = ViolationKind::kTagMismatch;
    return v;
  }
  if (page.state == PageState::kQuarantined) {
    v.kind = ViolationKind::kQuarantinedPage;
    return v;
  }
  if (page.copies > 0 && !(page.copy_owner == owner)) {
    v.kind = ViolationKind::kForeignCopyInFlight;
    return v;
  }
  return std::nullopt;
}

std::optional<Violation> OwnershipTable::Verify(const Owner& owner,
                                                std::span<const PageGrant> grants,
                                                std::span<const DomainId> readable) const {
  std::lock_guard<std::mutex> lock(mu_);
#if KVGUARD_FAULT_INJECTION
  if (faults_.skip_last_grant && !grants.empty()) grants = grants.first(grants.size() - 1);
#endif
  for (size_t i = 0; i < grants.size(); ++i) {
    const int32_t index = static_cast<int32_t>(i);
    std::optional<Violation> v = grants[i].shared
                                     ? CheckReadLocked(owner, grants[i], index, readable, true)
                                     : CheckLocked(owner, grants[i], index);
    if (v) return v;
  }
  return std::nullopt;
}

std::optional<Violation> OwnershipTable::CheckReadLocked(const Owner& owner, const PageGrant& grant,
                                                         int32_t index,
                                                         std::span<const DomainId> readable,
                                                         bool need_reader) const {
  Violation v = ViolationAtLocked(owner, grant, index);
  if (v.kind == ViolationKind::kInvalidPage) return v;
  const Page& page = pages_[static_cast<size_t>(grant.page)];
  if (!grant.shared) {
    v.kind = ViolationKind::kNoReadGrant;
    return v;
  }
  if (page.state != PageState::kShared || page.generation != grant.generation) {
    v.kind = ViolationKind::kReadAfterEviction;
    return v;
  }
  if (!TagsEqual(page.tag, grant.tag)) {
    v.kind = ViolationKind::kTagMismatch;
    return v;
  }
  if (std::find(readable.begin(), readable.end(), page.domain) == readable.end()) {
    v.kind = ViolationKind::kForeignDomainRead;
    return v;
  }
  if (need_reader &&
      std::find(page.readers.begin(), page.readers.end(), owner) == page.readers.end()) {
    v.kind = ViolationKind::kNoReadGrant;
    return v;
  }
  return std::nullopt;
}

std::optional<Violation> OwnershipTable::VerifyWritable(const Owner& owner,
                                                        const PageGrant& grant) const {
  std::lock_guard<std::mutex> lock(mu_);
  const bool in_range = grant.page >= 0 && static_cast<size_t>(grant.page) < pages_.size();
  if (grant.shared ||
      (in_range && pages_[static_cast<size_t>(grant.page)].state == PageState::kShared)) {
    Violation v = ViolationAtLocked(owner, grant, -1);
    v.kind = ViolationKind::kWriteIntoSharedPage;
    return v;
  }
  return CheckLocked(owner, grant, -1);
}

absl::StatusOr<OwnershipTable::Published> OwnershipTable::Publish(const Owner& owner,
                                                                  const PageGrant& grant,
                                                                  DomainId domain) {
  if (domain == kNoDomain) return absl::InvalidArgumentError("publish into no cache domain");
  if (grant.shared) return absl::InvalidArgumentError("publish through a read grant");
  std::lock_guard<std::mutex> lock(mu_);
  const KeyId key_id = keys_->active_id();
  if (std::optional<Violation> v = CheckLocked(owner, grant, -1)) return Published{v, {}};
  Page& page = pages_[static_cast<size_t>(grant.page)];
  if (page.copies > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("page ", grant.page, " has a copy in flight; publish it after the copy"));
  }
  const uint64_t generation = page.generation + 1;
  absl::StatusOr<kernels::PageTag> tag = keys_->Derive(
      key_id, TagInput{static_cast<uint64_t>(grant.page), generation, domain, kNoSession});
  if (!tag.ok()) return tag.status();
  page.state = PageState::kShared;
  page.owner = Owner{};
  page.generation = generation;
  page.key_id = key_id;
  page.tag = *tag;
  page.domain = domain;
  page.readers.assign(1, owner);
  page.scrub = false;
  SetTagLocked(grant.page, *tag);
  return Published{std::nullopt, PageGrant{grant.page, generation, *tag, true}};
}

std::optional<Violation> OwnershipTable::AcquireRead(const Owner& owner, const PageGrant& entry,
                                                     std::span<const DomainId> readable) {
  std::lock_guard<std::mutex> lock(mu_);
  if (std::optional<Violation> v = CheckReadLocked(owner, entry, -1, readable, false)) return v;
  std::vector<Owner>& readers = pages_[static_cast<size_t>(entry.page)].readers;
  if (std::find(readers.begin(), readers.end(), owner) == readers.end()) readers.push_back(owner);
  return std::nullopt;
}

std::optional<Violation> OwnershipTable::ReleaseRead(const Owner& owner, const PageGrant& read) {
  std::lock_guard<std::mutex> lock(mu_);
  Violation v = ViolationAtLocked(owner, read, -1);
  if (v.kind == ViolationKind::kInvalidPage) return v;
  Page& page = pages_[static_cast<size_t>(read.page)];
  const auto reader = std::find(page.readers.begin(), page.readers.end(), owner);
  if (!read.shared || page.state != PageState::kShared || page.generation != read.generation ||
      reader == page.readers.end()) {
    v.kind = ViolationKind::kStaleRelease;
    return v;
  }
  if (!TagsEqual(page.tag, read.tag)) {
    v.kind = ViolationKind::kTagMismatch;
    return v;
  }
  page.readers.erase(reader);
  return std::nullopt;
}

absl::Status OwnershipTable::Evict(const PageGrant& entry, bool scrub) {
  std::lock_guard<std::mutex> lock(mu_);
  if (entry.page < 0 || static_cast<size_t>(entry.page) >= pages_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("evict: no page ", entry.page));
  }
  const Page& page = pages_[static_cast<size_t>(entry.page)];
  if (!entry.shared || page.state != PageState::kShared || page.generation != entry.generation ||
      !TagsEqual(page.tag, entry.tag)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "evict: page ", entry.page, " is no longer that shared page (evicted or reused since)"));
  }
  if (!page.readers.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("evict: page ", entry.page, " has ", page.readers.size(), " readers"));
  }
  RetireLocked(entry.page, scrub);
  ReclaimLocked();
  return absl::OkStatus();
}

std::optional<Violation> OwnershipTable::Release(const Owner& owner, const PageGrant& grant,
                                                 bool scrub) {
  std::lock_guard<std::mutex> lock(mu_);
  std::optional<Violation> v = CheckLocked(owner, grant, -1);
  // A quarantined page is still its session's to release; a foreign copy does not stop the
  // owner releasing (the page then waits for the copy in limbo).
  if (v && (v->kind == ViolationKind::kQuarantinedPage ||
            v->kind == ViolationKind::kForeignCopyInFlight)) {
    v.reset();
  }
  // A grant that is no longer current is a stale release (double release, late release after
  // reuse); a current one presented by another owner or with another tag keeps its kind.
  if (v &&
      (v->kind == ViolationKind::kStaleGeneration || v->kind == ViolationKind::kPageNotOwned)) {
    v->kind = ViolationKind::kStaleRelease;
  }
#if KVGUARD_FAULT_INJECTION
  if (v && faults_.accept_stale_release && v->kind == ViolationKind::kStaleRelease) v.reset();
  if (v && faults_.release_without_owner_check &&
      (v->kind == ViolationKind::kWrongOwner || v->kind == ViolationKind::kTagMismatch)) {
    v.reset();
  }
#endif
  if (v) return v;
  RetireLocked(grant.page, scrub);
  ReclaimLocked();
  return std::nullopt;
}

void OwnershipTable::RetireLocked(int32_t p, bool scrub) {
  Page& page = pages_[static_cast<size_t>(p)];
  page.scrub = scrub || page.state == PageState::kQuarantined;
  page.state = PageState::kLimbo;
  page.owner = Owner{};
  page.tag = kernels::PageTag{};
  page.domain = kNoDomain;
  page.readers.clear();
#if KVGUARD_FAULT_INJECTION
  if (!faults_.skip_generation_bump) ++page.generation;
#else
  ++page.generation;
#endif
  page.retire_ticket = next_ticket_;
  SetTagLocked(p, kernels::PageTag{});
  limbo_.push_back(p);
}

void OwnershipTable::ReclaimLocked() {
  const uint64_t oldest = pinned_.empty() ? UINT64_MAX : *pinned_.begin();
  bool ignore_epoch = false, ignore_copies = false;
#if KVGUARD_FAULT_INJECTION
  ignore_epoch = faults_.ignore_epoch;
  ignore_copies = faults_.ignore_copy_pins;
#endif
  for (size_t i = 0; i < limbo_.size();) {
    const int32_t p = limbo_[i];
    Page& page = pages_[static_cast<size_t>(p)];
    // Steps pinned before the release hold tickets below retire_ticket.
    const bool epoch_clear = ignore_epoch || oldest >= page.retire_ticket;
    const bool copies_clear = ignore_copies || page.copies == 0;
    if (!epoch_clear || !copies_clear) {
      ++i;
      continue;
    }
    bool skip_scrub = false;
#if KVGUARD_FAULT_INJECTION
    skip_scrub = faults_.skip_scrub;
#endif
    if (page.scrub && scrub_ && !skip_scrub) scrub_(p);
    page.scrub = false;
    page.state = PageState::kFree;
    free_.push_back(p);
    limbo_[i] = limbo_.back();
    limbo_.pop_back();
  }
}

int OwnershipTable::QuarantineSession(const Owner& owner) {
  std::lock_guard<std::mutex> lock(mu_);
  int n = 0;
  for (size_t p = 0; p < pages_.size(); ++p) {
    Page& page = pages_[p];
    if (page.state == PageState::kOwned && page.owner == owner) {
      page.state = PageState::kQuarantined;
      SetTagLocked(static_cast<int32_t>(p), kernels::PageTag{});
      ++n;
    }
  }
  return n;
}

OwnershipTable::StepPin OwnershipTable::PinStep() {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t ticket = next_ticket_++;
  pinned_.insert(ticket);
  return StepPin(this, ticket);
}

void OwnershipTable::Unpin(uint64_t ticket) {
  std::lock_guard<std::mutex> lock(mu_);
  pinned_.erase(ticket);
  ReclaimLocked();
}

OwnershipTable::StepPin::StepPin(StepPin&& other) noexcept
    : table_(std::exchange(other.table_, nullptr)), ticket_(other.ticket_) {}

OwnershipTable::StepPin& OwnershipTable::StepPin::operator=(StepPin&& other) noexcept {
  if (this != &other) {
    if (table_ != nullptr) table_->Unpin(ticket_);
    table_ = std::exchange(other.table_, nullptr);
    ticket_ = other.ticket_;
  }
  return *this;
}

OwnershipTable::StepPin::~StepPin() {
  if (table_ != nullptr) table_->Unpin(ticket_);
}

std::optional<Violation> OwnershipTable::BeginCopy(const Owner& owner, const PageGrant& grant) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto v = CheckLocked(owner, grant, -1)) return v;
  Page& page = pages_[static_cast<size_t>(grant.page)];
  ++page.copies;
  page.copy_owner = owner;
  return std::nullopt;
}

std::optional<Violation> OwnershipTable::EndCopy(const Owner& owner, const PageGrant& grant) {
  std::lock_guard<std::mutex> lock(mu_);
  if (grant.page < 0 || static_cast<size_t>(grant.page) >= pages_.size()) {
    return Violation{
        ViolationKind::kInvalidPage, owner, grant.page, -1, grant.generation, 0, {}, 0};
  }
  Page& page = pages_[static_cast<size_t>(grant.page)];
  if (page.copies > 0 && page.copy_owner == owner) --page.copies;
  if (page.copies == 0) page.copy_owner = Owner{};
  std::optional<Violation> v;
  if (page.generation != grant.generation || !(page.owner == owner)) {
    v = Violation{ViolationKind::kStaleGeneration,
                  owner,
                  grant.page,
                  -1,
                  grant.generation,
                  page.generation,
                  page.owner,
                  page.domain};
  }
  ReclaimLocked();
  return v;
}

int OwnershipTable::free_pages() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(free_.size());
}

int OwnershipTable::used_pages() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(pages_.size() - free_.size() - limbo_.size());
}

int OwnershipTable::limbo_pages() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(limbo_.size());
}

int OwnershipTable::shared_pages() const {
  std::lock_guard<std::mutex> lock(mu_);
  int n = 0;
  for (const Page& page : pages_) n += page.state == PageState::kShared;
  return n;
}

int OwnershipTable::readers(int32_t page) const {
  std::lock_guard<std::mutex> lock(mu_);
  ABSL_RAW_CHECK(page >= 0 && static_cast<size_t>(page) < pages_.size(), "readers: invalid page");
  return static_cast<int>(pages_[static_cast<size_t>(page)].readers.size());
}

DomainId OwnershipTable::domain(int32_t page) const {
  std::lock_guard<std::mutex> lock(mu_);
  ABSL_RAW_CHECK(page >= 0 && static_cast<size_t>(page) < pages_.size(), "domain: invalid page");
  return pages_[static_cast<size_t>(page)].domain;
}

PageState OwnershipTable::state(int32_t page) const {
  std::lock_guard<std::mutex> lock(mu_);
  ABSL_RAW_CHECK(page >= 0 && static_cast<size_t>(page) < pages_.size(), "state: invalid page");
  return pages_[static_cast<size_t>(page)].state;
}

absl::Status OwnershipTable::RetireKey(TagKeyRing* ring, KeyId id) {
  ABSL_RAW_CHECK(ring == keys_, "RetireKey: not this table's key ring");
  std::lock_guard<std::mutex> lock(mu_);
  int held = 0;
  for (const Page& page : pages_) {
    held += Holds(page.state) && page.key_id == id;
  }
  if (held > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "key ", id, " still tags ", held, " held pages; retire it after they are released"));
  }
  return ring->Retire(id);
}

int OwnershipTable::pages_under_key(KeyId id) const {
  std::lock_guard<std::mutex> lock(mu_);
  int n = 0;
  for (const Page& page : pages_) {
    n += Holds(page.state) && page.key_id == id;
  }
  return n;
}

absl::Status OwnershipTable::CheckAccounting() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<uint8_t> listed(pages_.size(), 0);  // 1 free list, 2 limbo list
  for (int32_t p : free_) {
    if (p < 0 || static_cast<size_t>(p) >= pages_.size() || listed[static_cast<size_t>(p)]) {
      return absl::InternalError(absl::StrCat("free list holds page ", p, " twice or invalid"));
    }
    listed[static_cast<size_t>(p)] = 1;
  }
  for (int32_t p : limbo_) {
    if (p < 0 || static_cast<size_t>(p) >= pages_.size() || listed[static_cast<size_t>(p)]) {
      return absl::InternalError(absl::StrCat("limbo holds page ", p, " twice, or it is free"));
    }
    listed[static_cast<size_t>(p)] = 2;
  }
  for (size_t p = 0; p < pages_.size(); ++p) {
    const PageState s = pages_[p].state;
    const uint8_t want = s == PageState::kFree ? 1 : s == PageState::kLimbo ? 2 : 0;
    if (listed[p] != want) {
      return absl::InternalError(absl::StrCat("page ", p, " is on the wrong list for its state"));
    }
    if (s != PageState::kOwned && s != PageState::kShared && (tags_[p].lo | tags_[p].hi) != 0) {
      return absl::InternalError(
          absl::StrCat("page ", p, " is neither owned nor shared but has a tag"));
    }
    if ((s == PageState::kShared) != (pages_[p].domain != kNoDomain) ||
        (s != PageState::kShared && !pages_[p].readers.empty())) {
      return absl::InternalError(
          absl::StrCat("page ", p, ": a domain or readers without being shared, or the reverse"));
    }
  }
  return absl::OkStatus();
}

#if KVGUARD_FAULT_INJECTION
void OwnershipTable::set_faults(const TableFaults& faults) {
  std::lock_guard<std::mutex> lock(mu_);
  faults_ = faults;
}
#endif

}  // namespace kvguard::isolation
