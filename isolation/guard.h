// isolation/guard.h: the isolation layer as the engine sees it: the ownership table, the
// tenants and their modes, the audit sink, the metrics, and what a violation does.
//
// The engine's side of the contract (core/engine/engine.cc):
//   * every page a request holds is granted by table() to Owner{tenant, session};
//   * each step pins an epoch (table().PinStep()), then, for each request whose tenant's
//     mode (read once per step) is not off, calls Verify before any of its KV is read and
//     passes the grants' tags to the kernels; a violation aborts that request alone;
//   * every violation, wherever found (verification, kernel check, release), goes to Report.
#ifndef KVGUARD_ISOLATION_GUARD_H_
#define KVGUARD_ISOLATION_GUARD_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "isolation/audit_sink.h"
#include "isolation/ownership_table.h"
#include "isolation/tag_key.h"
#include "isolation/tenant_policy.h"
#include "isolation/violation.h"

namespace kvguard::isolation {

struct GuardOptions {
  TenantPolicy policy = TenantPolicy::Default();
  std::shared_ptr<AuditSink> sink;  // null: a MemoryAuditSink
};

// GuardStats are the isolation metrics (exported by the service as /metrics).
struct GuardStats {
  int64_t steps = 0;            // steps that verified at least one request
  int64_t verifications = 0;    // page tables verified
  int64_t pages_verified = 0;   // grants checked
  int64_t verify_ns_total = 0;  // time spent verifying, over all steps
  int64_t verify_ns_max = 0;    // the slowest step's verification
  int64_t violations = 0;
  int64_t unrecorded = 0;  // violations the sink failed to record
  std::map<std::pair<std::string, std::string>, int64_t> by_tenant_reason;  // (tenant, kind)
};

class Guard {
 public:
  // Create guards the pages of `table` (owned by the KV pool, which must outlive the guard),
  // whose tags `keys` derives. InvalidArgument for an empty policy or a null table or ring.
  static absl::StatusOr<std::unique_ptr<Guard>> Create(GuardOptions options, OwnershipTable* table,
                                                       std::shared_ptr<TagKeyRing> keys);

  OwnershipTable& table() { return *table_; }
  const OwnershipTable& table() const { return *table_; }
  TagKeyRing& keys() { return *keys_; }
  AuditSink& sink() { return *sink_; }

  // ResolveTenant returns the id of tenant `name`; NotFound for an unknown name.
  absl::StatusOr<TenantId> ResolveTenant(std::string_view name) const;
  // TenantName returns the name of `tenant` ("?" if unknown).
  std::string TenantName(TenantId tenant) const;
  std::vector<TenantSettings> tenants() const;

  // mode returns the tenant's current mode (enforce for an unknown id: fail closed).
  Mode mode(TenantId tenant) const;

  // SetMode changes a tenant's mode at run time; the engine applies it from its next step.
  // The change is recorded first, durably (AuditEvent::durable): if the sink cannot record it,
  // nothing changes (the sink's error). NotFound for an unknown tenant.
  absl::Status SetMode(std::string_view tenant, Mode mode, std::string_view actor);

  // ModeChange is one tenant's new mode, for ApplyChanges.
  struct ModeChange {
    std::string tenant;
    Mode mode = Mode::kEnforce;
  };

  // ApplyChanges applies an operator's changes all together or not at all: first it records,
  // in order and each durably, a mode_change (actor `actor`) for each of `modes` (a mode
  // that stays the same included: the caller leaves out what it does not want recorded), then each
  // of `records` (changes the caller applies itself, such as its config_change records; marked
  // durable here); only once every record is in does it set the modes and call `apply` (the
  // caller's own part), all under the lock that serialises mode changes, so no other change can
  // interleave. NotFound, with nothing recorded, for an unknown tenant. If a record fails nothing
  // is applied, and the error says so and how many of the records had been written before it (those
  // describe changes that did not happen; a record saying so follows them if the sink takes one).
  absl::Status ApplyChanges(std::span<const ModeChange> modes, std::vector<AuditEvent> records,
                            std::string_view actor, absl::FunctionRef<void()> apply);

  // RotateKey makes a new tag key active (new grants use it; old tags stay valid until their
  // pages are released) once its rotation, with the new key's fingerprint, is durably
  // recorded. If the record fails the new key is discarded and never used: Unavailable, and the
  // ring is unchanged. (If the key file cannot be written after the record, the error says
  // the rotation was recorded but not applied.)
  absl::StatusOr<KeyId> RotateKey(std::string_view actor);

  // RetireKey forgets an old key: FailedPrecondition while any page granted under it is still
  // held (its stored tag would outlive the key's audit trail), else TagKeyRing::Retire's result.
  absl::Status RetireKey(KeyId id);

  // Admit returns OK if `tenant` may start a new request: PermissionDenied if the tenant is
  // quarantined; Unavailable for a strict tenant while the audit sink cannot record.
  absl::Status Admit(TenantId tenant) const;

  // Verify checks one session's page table if its tenant's `mode` (as read at the start of
  // the step) asks for it: nullopt if the mode is off or every grant checks out, else the
  // violation (also for a strict tenant already quarantined). Does not Report.
  std::optional<Violation> Verify(const Owner& owner, std::span<const PageGrant> grants,
                                  Mode mode) const;

  // Report records a violation found anywhere (verification, kernel check, release) against
  // `request`: an audit event, the counters, and for a strict tenant the quarantine of the
  // session (its pages are held out of reach and scrubbed) and, at the limit, of the tenant.
  void Report(const Violation& v, uint64_t request);

  // RecordStep adds one step's verification cost to the metrics.
  void RecordStep(int64_t verify_ns, int64_t verifications, int64_t pages);

  GuardStats stats() const;

 private:
  struct Tenant {
    TenantSettings settings;
    int violations = 0;         // all, whatever the mode
    int strict_violations = 0;  // those while strict: what quarantine_after counts
    bool quarantined = false;
  };
  Guard() = default;
  const Tenant* FindLocked(TenantId tenant) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Tenant* FindLocked(TenantId tenant) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Append records `event`, counting a failure. Requires mu_ not held (sinks may be slow).
  absl::Status Append(AuditEvent event);

  std::shared_ptr<TagKeyRing> keys_;
  std::shared_ptr<AuditSink> sink_;
  OwnershipTable* table_ = nullptr;
  // Serialises SetMode calls, so that modes are applied in the order their changes were
  // recorded (taken before mu_, never while holding it).
  std::mutex mode_change_mu_;
  mutable std::mutex mu_;
  std::vector<Tenant> tenants_ ABSL_GUARDED_BY(mu_);  // id = index + 1
  // Strict sessions quarantined at their first violation: served no more.
  absl::flat_hash_set<SessionId> quarantined_sessions_ ABSL_GUARDED_BY(mu_);
  // A strict tenant's violation could not be recorded: strict requests are refused and
  // aborted (kAuditUnavailable) until an append succeeds again.
  bool strict_unrecorded_ ABSL_GUARDED_BY(mu_) = false;
  GuardStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvguard::isolation

#endif  // KVGUARD_ISOLATION_GUARD_H_
