// isolation/audit_sink.h: where isolation reports what an auditor must see: every violation,
// every quarantine, every mode change, every key rotation. The durable, tamper-evident sink is
// audit/'s hash-chained log; MemoryAuditSink here keeps events in memory (tests, benchmarks,
// and the engine's default before a log is configured).
//
// No event ever carries a key or a full tag; key ids and short fingerprints only.
#ifndef KVGUARD_ISOLATION_AUDIT_SINK_H_
#define KVGUARD_ISOLATION_AUDIT_SINK_H_

#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "isolation/violation.h"

namespace kvguard::isolation {

struct AuditEvent {
  enum class Type : uint8_t {
    kViolation,           // a request was aborted (or a release refused)
    kSessionQuarantined,  // strict: a session's pages were quarantined
    kTenantQuarantined,   // strict: a tenant reached its violation limit
    kModeChange,          // a tenant's mode changed at run time
    kKeyRotated,          // a new tag key became active
    kConfigChange,        // an operator changed a tenant's keys or limits (detail: before -> after)
  };
  Type type = Type::kViolation;
  int64_t unix_nanos = 0;
  std::string tenant;         // tenant name ("" if none)
  std::string mode;           // the tenant's mode when it happened ("" if none)
  std::string actual_tenant;  // violations: the name of the tenant that owns the page, if any
  uint64_t request = 0;
  std::optional<Violation> violation;  // kViolation
  std::string mode_from, mode_to;      // kModeChange
  std::string actor;                   // who asked for a mode change or rotation
  std::string key_fingerprint;         // kKeyRotated: the new key's fingerprint
  std::string detail;                  // quarantines: what was held (pages, violation count)
  // durable: the sink returns OK only once the event is on stable storage (fsync'd), not in a
  // batch still to be written. Every operator change (mode change, key rotation, config
  // change) is durable: a crash must not lose the record of a weakening that then applied.
  bool durable = false;
};

// AuditEventTypeName returns the stable snake_case name of `type`.
const char* AuditEventTypeName(AuditEvent::Type type);

// AuditSink receives events from engine threads, one at a time per call (implementations are
// thread-safe). Append returns OK once the event is recorded, else why not; a strict tenant is
// refused service while its events cannot be recorded.
class AuditSink {
 public:
  virtual ~AuditSink() = default;
  virtual absl::Status Append(const AuditEvent& event) = 0;
  // Healthy returns OK if Append can record now (a cheap probe: a writable log, space left).
  virtual absl::Status Healthy() const { return absl::OkStatus(); }
};

// MemoryAuditSink keeps the last `capacity` events (older ones are dropped and counted).
class MemoryAuditSink final : public AuditSink {
 public:
  explicit MemoryAuditSink(size_t capacity = 100000) : capacity_(capacity) {}
  absl::Status Append(const AuditEvent& event) override;
  absl::Status Healthy() const override;

  std::vector<AuditEvent> events() const;
  int64_t dropped() const;
  // set_failing makes every Append fail with Unavailable (fault tests: an unrecordable log).
  void set_failing(bool failing);

 private:
  const size_t capacity_;
  mutable std::mutex mu_;
  std::deque<AuditEvent> events_ ABSL_GUARDED_BY(mu_);
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  bool failing_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace kvguard::isolation

#endif  // KVGUARD_ISOLATION_AUDIT_SINK_H_
