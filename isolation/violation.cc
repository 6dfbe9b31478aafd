#include "isolation/violation.h"

#include "absl/strings/str_cat.h"

namespace kvguard::isolation {

const char* ViolationKindName(ViolationKind kind) {
  switch (kind) {
    case ViolationKind::kWrongOwner:
      return "wrong_owner";
    case ViolationKind::kStaleGeneration:
      return "stale_generation";
    case ViolationKind::kTagMismatch:
      return "tag_mismatch";
    case ViolationKind::kPageNotOwned:
      return "page_not_owned";
    case ViolationKind::kQuarantinedPage:
      return "quarantined_page";
    case ViolationKind::kInvalidPage:
      return "invalid_page";
    case ViolationKind::kForeignCopyInFlight:
      return "foreign_copy_in_flight";
    case ViolationKind::kStaleRelease:
      return "stale_release";
    case ViolationKind::kKernelTagMismatch:
      return "kernel_tag_mismatch";
    case ViolationKind::kSessionQuarantined:
      return "session_quarantined";
    case ViolationKind::kTenantQuarantined:
      return "tenant_quarantined";
    case ViolationKind::kAuditUnavailable:
      return "audit_unavailable";
    case ViolationKind::kForeignDomainRead:
      return "foreign_domain_read";
    case ViolationKind::kNoReadGrant:
      return "no_read_grant";
    case ViolationKind::kReadAfterEviction:
      return "read_after_eviction";
    case ViolationKind::kWriteIntoSharedPage:
      return "write_into_shared_page";
  }
  return "unknown";
}

std::string DescribeViolation(const Violation& v) {
  std::string s = absl::StrCat(ViolationKindName(v.kind), ": tenant ", v.requester.tenant,
                               " session ", v.requester.session);
  if (v.page >= 0) {
    absl::StrAppend(&s, ", page ", v.page, " (table entry ", v.page_index, ")",
                    ", grant generation ", v.expected_generation, ", current ",
                    v.actual_generation);
    if (v.actual_owner.session != kNoSession) {
      absl::StrAppend(&s, ", owned by tenant ", v.actual_owner.tenant, " session ",
                      v.actual_owner.session);
    }
    if (v.actual_domain != 0) absl::StrAppend(&s, ", shared in cache domain ", v.actual_domain);
  }
  return s;
}

}  // namespace kvguard::isolation
