#include "core/service/audit_log_sink.h"

#include "isolation/violation.h"

namespace kvguard::core {

audit::Event ToAuditRecord(const isolation::AuditEvent& e) {
  using Type = isolation::AuditEvent::Type;
  audit::Event r;
  r.time_ns = e.unix_nanos;
  switch (e.type) {
    case Type::kViolation:
      r.type = e.violation && e.violation->kind == isolation::ViolationKind::kStaleRelease
                   ? "release_rejected"
                   : "violation";
      break;
    case Type::kSessionQuarantined:
      r.type = "session_quarantined";
      break;
    case Type::kTenantQuarantined:
      r.type = "tenant_quarantined";
      break;
    case Type::kModeChange:
      r.type = "mode_change";
      break;
    case Type::kKeyRotated:
      r.type = "key_rotated";
      break;
    case Type::kConfigChange:
      r.type = "config_change";
      break;
  }
  if (!e.tenant.empty()) r.tenant = e.tenant;
  if (!e.mode.empty()) r.mode = e.mode;
  if (e.request != 0) r.request = e.request;
  if (e.violation) {
    const isolation::Violation& v = *e.violation;
    r.reason = isolation::ViolationKindName(v.kind);
    r.session = v.requester.session;
    if (v.page >= 0) {
      r.page = v.page;
      r.expected_generation = v.expected_generation;
      r.actual_generation = v.actual_generation;
    }
    if (v.actual_owner.session != isolation::kNoSession) {
      r.actual_session = v.actual_owner.session;
      if (!e.actual_tenant.empty()) r.actual_tenant = e.actual_tenant;
    }
  }
  if (!e.mode_from.empty()) r.mode_from = e.mode_from;
  if (!e.mode_to.empty()) r.mode_to = e.mode_to;
  if (!e.actor.empty()) r.actor = e.actor;
  if (!e.key_fingerprint.empty()) r.key_fingerprint = e.key_fingerprint;
  if (!e.detail.empty()) r.detail = e.detail;
  r.durable = e.durable || e.mode == "strict" || e.mode_from == "strict" || e.mode_to == "strict";
  return r;
}

absl::Status AuditLogSink::Append(const isolation::AuditEvent& event) {
  return log_->Append(ToAuditRecord(event));
}

}  // namespace kvguard::core
