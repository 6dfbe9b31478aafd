// isolation/ownership_table.h: the page ownership table, the one authority over who may touch
// which physical KV page. The engine reaches a page only through a PageGrant handed out here.
//
// For each physical page the table keeps its state, owner (tenant, session), generation and
// tag. The generation moves on (+1) at every grant and every release and is never reused, so
// every grant dies with its page's release. The tag is a keyed MAC over (key id, page,
// generation, tenant, session) (isolation/tag_key.h); the table keeps the current tag of every
// page in one array the attention kernels read for their own check (kernels/formats.h).
//
// The epoch rule (closes the verify-then-read race): a decode or prefill step pins an epoch
// before it verifies its grants and unpins when its kernels are done. A page released while
// any step that started before the release is still pinned is not free yet: it waits in
// limbo (unreadable: its tag is already zero, its state not owned) and is reclaimed, scrubbed
// first if its releaser asked for it, only when every such step has ended. So a step that
// verified a grant can never read the page after it went to someone else. Pages under an
// asynchronous copy (BeginCopy .. EndCopy) likewise stay out of circulation until the copy ends.
//
// Shared pages (prefix caching): a session's full, written page can be published into a cache
// domain (Publish). It becomes read-only and the domain's: its generation moves on (the private
// grant dies) and its tag is derived over (page, generation, domain) with session kNoSession,
// so it can never equal a private grant's tag. Sessions read it through read grants
// (AcquireRead .. ReleaseRead); the table keeps each shared page's readers, so its reader count
// is the number of sessions holding a read grant and a second release is refused, not counted.
// A shared page without readers stays cached until Evict, which, as Release does, moves the
// generation on and passes through limbo (the epoch rule): a step that verified a read grant
// never reads a page evicted under it. Which cache domains a session may read is the server's
// decision (isolation/README.md), passed as `readable`; the table checks it on every acquire
// and every verification. No write may land in a shared page (VerifyWritable).
//
// Thread-safe: one mutex; verification is a few loads and compares per page under it.
#ifndef KVGUARD_ISOLATION_OWNERSHIP_TABLE_H_
#define KVGUARD_ISOLATION_OWNERSHIP_TABLE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "isolation/tag_key.h"
#include "isolation/violation.h"
#include "kernels/formats.h"

namespace kvguard::isolation {

// DomainId names a cache domain: the set of sessions that may share pages. The server derives it
// from what it authenticated (a tenant's own domain, an operator-declared prefix's), never from a
// request's contents. kNoDomain is no domain.
using DomainId = uint64_t;
inline constexpr DomainId kNoDomain = 0;

// PageGrant is one entry of a session's page table: valid while the page is still owned by
// that session at that generation and carries that tag. A read grant (shared = true) is valid
// while the page is still shared at that generation with that tag, the session is one of its
// readers, and its domain is one the session may read.
struct PageGrant {
  int32_t page = -1;
  uint64_t generation = 0;
  kernels::PageTag tag;
  bool shared = false;
  friend bool operator==(const PageGrant&, const PageGrant&) = default;
};

enum class PageState : uint8_t { kFree, kOwned, kLimbo, kQuarantined, kShared };

#if KVGUARD_FAULT_INJECTION
// TableFaults make the table misbehave the ways real allocators have shipped (test and fuzz
// builds only). Verification must catch each before any wrong byte is read.
struct TableFaults {
  bool skip_generation_bump = false;  // release and the next grant leave the generation as is
  bool grant_owned_page = false;      // one grant hands out a page another session still owns
  bool accept_stale_release = false;  // a stale release frees the page anyway
  bool ignore_epoch = false;          // released pages are free at once, pinned steps or not
  bool ignore_copy_pins = false;      // released pages are free at once, copies in flight or not
  bool release_without_owner_check = false;  // a current grant is released by whoever presents it
  bool skip_scrub = false;       // a page released with scrub is reused without being zeroed
  bool skip_last_grant = false;  // Verify checks every grant of a page table but the last
};
#endif

class OwnershipTable {
 public:
  // OwnershipTable manages pages [0, num_pages) (>= 1). `keys` derives the tags and must
  // outlive the table. `scrub`, if set, zeroes one physical page; it is called (under the
  // table's lock) before a page released with scrub = true is free again.
  OwnershipTable(int num_pages, const TagKeyRing* keys, std::function<void(int32_t)> scrub);
  OwnershipTable(const OwnershipTable&) = delete;
  OwnershipTable& operator=(const OwnershipTable&) = delete;

  // GrantMany grants `count` free pages to `owner` (session != kNoSession) and appends their
  // grants to `out`, or grants none: ResourceExhausted when fewer are free, InvalidArgument
  // for a bad owner or count, or the key ring's error.
  absl::Status GrantMany(const Owner& owner, int count, std::vector<PageGrant>* out);
  absl::StatusOr<PageGrant> Grant(const Owner& owner);

  // Release returns the page of `grant` (owned by `owner`) to circulation; with `scrub` the
  // page is zeroed before anyone can be granted it. Returns nullopt on success, else the
  // violation and frees nothing: kStaleRelease for a grant that is no longer current (double
  // release, late release after reuse), kWrongOwner / kTagMismatch for a current grant
  // presented by another session or with another tag, kInvalidPage.
  std::optional<Violation> Release(const Owner& owner, const PageGrant& grant, bool scrub);

  // Verify checks every grant of one session's page table against the table: page in range,
  // page owned (not free, limbo or quarantined), by `owner`, at the grant's generation, with
  // the grant's tag (constant-time compare), and no other session's copy in flight. A read
  // grant is checked as AcquireRead checks it, and that `owner` is one of the page's readers
  // (kNoReadGrant). Returns nullopt if all pass, else the first violation. Without `readable`,
  // no shared page may be read.
  std::optional<Violation> Verify(const Owner& owner, std::span<const PageGrant> grants,
                                  std::span<const DomainId> readable = {}) const;

  // VerifyWritable checks a page a step is about to write: a current private grant of `owner`
  // (as Verify), never a shared page (kWriteIntoSharedPage, whatever grant is presented).
  std::optional<Violation> VerifyWritable(const Owner& owner, const PageGrant& grant) const;

  // Publish makes the page of `owner`'s current private grant a shared page of `domain` (see
  // the file comment) and returns `owner`'s read grant to it; `owner` is its first reader. The
  // private grant is checked as Release checks it (its violation is returned and nothing
  // changes; a quarantined page or one under a copy cannot be published). InvalidArgument for
  // kNoDomain or a read grant; the key ring's error if the tag cannot be derived.
  struct Published {
    std::optional<Violation> violation;
    PageGrant read;  // valid when violation is empty
  };
  absl::StatusOr<Published> Publish(const Owner& owner, const PageGrant& grant, DomainId domain);

  // AcquireRead makes `owner` a reader of the shared page that `entry` names (a read grant as
  // Publish returned it, kept by the cache's index): the page must still be shared at the
  // entry's generation (else kReadAfterEviction), with its tag (kTagMismatch), in a domain of
  // `readable` (kForeignDomainRead). On success `entry` is `owner`'s read grant. Acquiring a
  // page `owner` already reads is a no-op.
  std::optional<Violation> AcquireRead(const Owner& owner, const PageGrant& entry,
                                       std::span<const DomainId> readable);

  // ReleaseRead ends `owner`'s read grant: kStaleRelease if `owner` does not hold it (a second
  // release, or one after eviction), so the reader count never goes below the readers held.
  std::optional<Violation> ReleaseRead(const Owner& owner, const PageGrant& read);

  // Evict takes the shared page `entry` names out of the cache: FailedPrecondition while it
  // has readers, or if it is no longer that shared page. Like Release, the generation moves on
  // and the page waits out the epoch (and, with `scrub`, is zeroed) before it is free again.
  absl::Status Evict(const PageGrant& entry, bool scrub);

  // QuarantineSession takes every page `owner` holds out of reach: reads fail with
  // kQuarantinedPage; the pages still belong to the session until it releases them, after
  // which they are scrubbed before reuse. Returns how many pages were quarantined. Shared
  // pages are their domain's, not the session's, and stay readable by their other readers.
  int QuarantineSession(const Owner& owner);

  // StepPin is the epoch pin of one step (see the file comment). Move-only; unpins when
  // destroyed.
  class StepPin {
   public:
    StepPin() = default;
    StepPin(StepPin&& other) noexcept;
    StepPin& operator=(StepPin&& other) noexcept;
    ~StepPin();

   private:
    friend class OwnershipTable;
    StepPin(OwnershipTable* table, uint64_t ticket) : table_(table), ticket_(ticket) {}
    OwnershipTable* table_ = nullptr;
    uint64_t ticket_ = 0;
  };
  StepPin PinStep();

  // BeginCopy marks an asynchronous copy into or out of the page of `grant` as in flight: the
  // grant is verified first (its violation is returned and nothing is marked). Until EndCopy,
  // a release keeps the page out of circulation. EndCopy returns nullopt if the page is still
  // the same grant's, else kStaleGeneration (the page changed hands during the copy).
  std::optional<Violation> BeginCopy(const Owner& owner, const PageGrant& grant);
  std::optional<Violation> EndCopy(const Owner& owner, const PageGrant& grant);

  // tags returns the current tag of every page [num_pages], for the kernels' own check. A
  // page that is not owned has the all-zero tag.
  const kernels::PageTag* tags() const { return tags_.get(); }
  int num_pages() const { return static_cast<int>(pages_.size()); }
  int free_pages() const;
  // used_pages counts owned, quarantined and shared pages; limbo_pages those waiting out an
  // epoch or a copy after release or eviction; shared_pages the shared ones.
  int used_pages() const;
  int limbo_pages() const;
  int shared_pages() const;
  PageState state(int32_t page) const;
  // readers returns how many sessions hold a read grant to `page` (0 unless shared); domain its
  // cache domain (kNoDomain unless shared).
  int readers(int32_t page) const;
  DomainId domain(int32_t page) const;
  // pages_under_key counts owned, quarantined and shared pages whose tag was derived with key
  // `id`.
  int pages_under_key(KeyId id) const;

  // RetireKey retires key `id` of `ring` (the table's own ring) if no held page was granted
  // under it: FailedPrecondition naming how many are, else TagKeyRing::Retire's result. Under
  // the table's lock, so no grant can pick the key up in between.
  absl::Status RetireKey(TagKeyRing* ring, KeyId id);

  // CheckAccounting returns Internal when free + owned + quarantined + shared + limbo != total,
  // a page is on the free list twice or while not free, a page neither owned nor shared has a
  // non-zero tag, or a shared page has no domain (or another page readers or a domain).
  absl::Status CheckAccounting() const;

#if KVGUARD_FAULT_INJECTION
  void set_faults(const TableFaults& faults);
#endif

 private:
  struct Page {
    PageState state = PageState::kFree;
    Owner owner;
    uint64_t generation = 0;
    KeyId key_id = 0;
    kernels::PageTag tag;         // the grant's tag (tags_[page] is zero unless readable)
    uint32_t copies = 0;          // asynchronous copies in flight
    Owner copy_owner;             // whose copies
    bool scrub = false;           // zero before it is free again
    uint64_t retire_ticket = 0;   // limbo: steps with a ticket below this may still read it
    DomainId domain = kNoDomain;  // shared: its cache domain
    std::vector<Owner> readers;   // shared: the sessions holding a read grant
  };
  // ViolationAtLocked starts the violation `owner` gets for `grant` (entry `index` of its page
  // table): who, which page, the grant's and the table's generations, owner and domain. Its
  // kind is kInvalidPage for a page out of range, else for the caller to set.
  Violation ViolationAtLocked(const Owner& owner, const PageGrant& grant, int32_t index) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::optional<Violation> CheckLocked(const Owner& owner, const PageGrant& grant,
                                       int32_t index) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // CheckReadLocked checks a read grant (see AcquireRead); with `need_reader`, also that
  // `owner` is one of the page's readers.
  std::optional<Violation> CheckReadLocked(const Owner& owner, const PageGrant& grant,
                                           int32_t index, std::span<const DomainId> readable,
                                           bool need_reader) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RetireLocked moves a released or evicted page into limbo (see the file comment).
  void RetireLocked(int32_t p, bool scrub) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetTagLocked(int32_t page, const kernels::PageTag& tag) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ReclaimLocked frees every limbo page no pinned step or copy can still touch.
  void ReclaimLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Unpin(uint64_t ticket);

  const TagKeyRing* keys_;
  std::function<void(int32_t)> scrub_;
  // std::mutex rather than absl::Mutex: Debian's Abseil is not built with ThreadSanitizer.
  mutable std::mutex mu_;
  std::vector<Page> pages_ ABSL_GUARDED_BY(mu_);
  std::vector<int32_t> free_ ABSL_GUARDED_BY(mu_);   // LIFO: a just-freed page is reused first
  std::vector<int32_t> limbo_ ABSL_GUARDED_BY(mu_);  // released, not yet reclaimable
  std::unique_ptr<kernels::PageTag[]> tags_;         // [num_pages], written with atomic stores
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 1;
  std::set<uint64_t> pinned_ ABSL_GUARDED_BY(mu_);  // tickets of the steps in flight
#if KVGUARD_FAULT_INJECTION
  TableFaults faults_ ABSL_GUARDED_BY(mu_);
#endif
};

}  // namespace kvguard::isolation

#endif  // KVGUARD_ISOLATION_OWNERSHIP_TABLE_H_
