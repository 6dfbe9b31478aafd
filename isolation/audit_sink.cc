#include "isolation/audit_sink.h"

namespace kvguard::isolation {

const char* AuditEventTypeName(AuditEvent::Type type) {
  switch (type) {
    case AuditEvent::Type::kViolation:
      return "violation";
    case AuditEvent::Type::kSessionQuarantined:
      return "session_quarantined";
    case AuditEvent::Type::kTenantQuarantined:
      return "tenant_quarantined";
    case AuditEvent::Type::kModeChange:
      return "mode_change";
    case AuditEvent::Type::kKeyRotated:
      return "key_rotated";
    case AuditEvent::Type::kConfigChange:
      return "config_change";
  }
  return "unknown";
}

absl::Status MemoryAuditSink::Append(const AuditEvent& event) {
  std::lock_guard<std::mutex> lock(mu_);
  if (failing_) return absl::UnavailableError("audit sink is failing (fault injection)");
  if (capacity_ == 0) {
    ++dropped_;
    return absl::OkStatus();
  }
  if (events_.size() == capacity_) {
    events_.pop_front();
    ++dropped_;
  }
  events_.push_back(event);
  return absl::OkStatus();
}

absl::Status MemoryAuditSink::Healthy() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (failing_) return absl::UnavailableError("audit sink is failing (fault injection)");
  return absl::OkStatus();
}

std::vector<AuditEvent> MemoryAuditSink::events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {events_.begin(), events_.end()};
}

int64_t MemoryAuditSink::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

void MemoryAuditSink::set_failing(bool failing) {
  std::lock_guard<std::mutex> lock(mu_);
  failing_ = failing;
}

}  // namespace kvguard::isolation
