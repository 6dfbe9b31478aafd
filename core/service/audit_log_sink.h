// core/service/audit_log_sink.h: the isolation layer's AuditSink written to the durable audit log.
// isolation/ and audit/ know nothing of each other; this adapter maps one onto the other:
// each isolation::AuditEvent becomes one audit::Event record, durable (fsync'd before the
// request gets its error) when it concerns a strict tenant.
#ifndef KVGUARD_CORE_SERVICE_AUDIT_LOG_SINK_H_
#define KVGUARD_CORE_SERVICE_AUDIT_LOG_SINK_H_

#include <memory>

#include "audit/log.h"
#include "isolation/audit_sink.h"

namespace kvguard::core {

// ToAuditRecord maps one isolation event to the audit record that stands for it.
audit::Event ToAuditRecord(const isolation::AuditEvent& event);

class AuditLogSink final : public isolation::AuditSink {
 public:
  explicit AuditLogSink(std::shared_ptr<audit::AuditLog> log) : log_(std::move(log)) {}
  absl::Status Append(const isolation::AuditEvent& event) override;
  absl::Status Healthy() const override { return log_->Healthy(); }
  audit::AuditLog& log() { return *log_; }

 private:
  std::shared_ptr<audit::AuditLog> log_;
};

}  // namespace kvguard::core

#endif  // KVGUARD_CORE_SERVICE_AUDIT_LOG_SINK_H_
