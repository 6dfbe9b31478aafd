// isolation/violation.h: the catalogue of isolation violations, one typed reason each.
//
// A violation is a verdict on one request (or one release), not an error of the service: the
// request is aborted alone, one audit record is written, and everything else goes on. Every
// place that detects one builds a Violation with its kind from this list; nothing else in
// isolation/ invents a reason string.
#ifndef KVGUARD_ISOLATION_VIOLATION_H_
#define KVGUARD_ISOLATION_VIOLATION_H_

#include <cstdint>
#include <string>

namespace kvguard::isolation {

using TenantId = uint64_t;
using SessionId = uint64_t;
inline constexpr SessionId kNoSession = 0;

// Owner is who a page is granted to: a session of a tenant. Sessions are unique across
// tenants (the engine numbers them), so (tenant, session) is redundant by design: a page
// table entry that names the right session under the wrong tenant is still caught.
struct Owner {
  TenantId tenant = 0;
  SessionId session = kNoSession;
  friend bool operator==(const Owner&, const Owner&) = default;
};

enum class ViolationKind : uint8_t {
  kWrongOwner,           // the page is owned, by another (tenant, session)
  kStaleGeneration,      // the page was released (and maybe granted again) since this grant
  kTagMismatch,          // owner and generation match but the tag does not (forged or corrupt)
  kPageNotOwned,         // the page is free, or waiting out an epoch after release
  kQuarantinedPage,      // the page is held out of circulation after a violation
  kInvalidPage,          // the page id is outside the pool
  kForeignCopyInFlight,  // an asynchronous copy for another session still touches the page
  kStaleRelease,         // a release through a grant that is no longer current (double or late)
  kKernelTagMismatch,    // the attention kernel's own tag check failed (after verification)
  kSessionQuarantined,   // (strict) the session had a violation before; it is served no more
  kTenantQuarantined,    // (strict) the tenant reached its violation limit
  kAuditUnavailable,     // (strict) a violation could not be recorded: served no more until one is
  // Shared (prefix-cache) pages, isolation/ownership_table.h:
  kForeignDomainRead,    // a shared page of a cache domain the session's tenant may not read
  kNoReadGrant,          // a shared page the session holds no read grant for
  kReadAfterEviction,    // a read grant (or cache entry) for a shared page evicted since
  kWriteIntoSharedPage,  // a write aimed at a shared, read-only page
};

// ViolationKindName returns the stable snake_case name used in audit records and metrics.
const char* ViolationKindName(ViolationKind kind);

// Violation describes one detected violation. Never holds key material or full tags.
struct Violation {
  ViolationKind kind = ViolationKind::kTagMismatch;
  Owner requester;                   // who tried to read or release
  int32_t page = -1;                 // physical page, -1 if none
  int32_t page_index = -1;           // index in the requester's page table, -1 if none
  uint64_t expected_generation = 0;  // the grant's generation
  uint64_t actual_generation = 0;    // the table's generation at detection
  Owner actual_owner;                // the table's owner at detection (zero if none)
  uint64_t actual_domain = 0;        // the shared page's cache domain at detection (0 if none)
};

// DescribeViolation returns a one-line, log-safe description (no tags, no keys).
std::string DescribeViolation(const Violation& v);

}  // namespace kvguard::isolation

#endif  // KVGUARD_ISOLATION_VIOLATION_H_
