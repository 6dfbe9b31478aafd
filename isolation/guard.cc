#include "isolation/guard.h"

#include <chrono>

#include "absl/strings/str_cat.h"

namespace kvguard::isolation {
namespace {

int64_t UnixNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Guard>> Guard::Create(GuardOptions options, OwnershipTable* table,
                                                     std::shared_ptr<TagKeyRing> keys) {
  if (options.policy.tenants.empty()) {
    return absl::InvalidArgumentError("isolation: the tenant policy names no tenant");
  }
  if (table == nullptr || keys == nullptr) {
    return absl::InvalidArgumentError("isolation: no ownership table or key ring");
  }
  std::unique_ptr<Guard> g(new Guard());
  g->keys_ = std::move(keys);
  g->sink_ =
      options.sink != nullptr ? std::move(options.sink) : std::make_shared<MemoryAuditSink>();
  g->table_ = table;
  for (TenantSettings& s : options.policy.tenants) g->tenants_.push_back(Tenant{std::move(s)});
  return g;
}

const Guard::Tenant* Guard::FindLocked(TenantId tenant) const {
  if (tenant < 1 || tenant > tenants_.size()) return nullptr;
  return &tenants_[tenant - 1];
}

Guard::Tenant* Guard::FindLocked(TenantId tenant) {
  if (tenant < 1 || tenant > tenants_.size()) return nullptr;
  return &tenants_[tenant - 1];
}

absl::StatusOr<TenantId> Guard::ResolveTenant(std::string_view name) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < tenants_.size(); ++i) {
    if (tenants_[i].settings.name == name) return static_cast<TenantId>(i + 1);
  }
  return absl::NotFoundError(absl::StrCat("unknown tenant '", std::string(name), "'"));
}

std::string Guard::TenantName(TenantId tenant) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Tenant* t = FindLocked(tenant);
  return t == nullptr ? "?" : t->settings.name;
}

std::vector<TenantSettings> Guard::tenants() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<TenantSettings> out;
  for (const Tenant& t : tenants_) out.push_back(t.settings);
  return out;
}

Mode Guard::mode(TenantId tenant) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Tenant* t = FindLocked(tenant);
  return t == nullptr ? Mode::kEnforce : t->settings.mode;
}

absl::Status Guard::Append(AuditEvent event) {
  event.unix_nanos = UnixNanos();
  absl::Status s = sink_->Append(event);
  // An accepted event may still be waiting for the disk: only a healthy sink lifts strict's
  // fail-closed state.
  if (s.ok() && sink_->Healthy().ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    strict_unrecorded_ = false;  // the sink records again
  }
  return s;
}

absl::Status Guard::SetMode(std::string_view tenant, Mode mode, std::string_view actor) {
  const ModeChange change{std::string(tenant), mode};
  absl::Status s = ApplyChanges({&change, 1}, {}, actor, [] {});
  if (s.ok() || absl::IsNotFound(s)) return s;
  return absl::Status(s.code(),
                      absl::StrCat("mode change not recorded, so not applied: ", s.message()));
}

absl::Status Guard::ApplyChanges(std::span<const ModeChange> modes, std::vector<AuditEvent> records,
                                 std::string_view actor, absl::FunctionRef<void()> apply) {
  std::lock_guard<std::mutex> serial(mode_change_mu_);
  // Validate everything before recording anything.
  std::vector<std::pair<TenantId, Mode>> to_apply;
  std::vector<AuditEvent> events;
  for (const ModeChange& c : modes) {
    absl::StatusOr<TenantId> id = ResolveTenant(c.tenant);
    if (!id.ok()) return id.status();
    const Mode before = this->mode(*id);
    to_apply.emplace_back(*id, c.mode);
    AuditEvent e;
    e.type = AuditEvent::Type::kModeChange;
    e.tenant = c.tenant;
    e.mode_from = ModeName(before);
    e.mode_to = ModeName(c.mode);
    e.mode = ModeName(c.mode == Mode::kStrict ? c.mode : before);
    e.actor = std::string(actor);
    events.push_back(std::move(e));
  }
  for (AuditEvent& e : records) events.push_back(std::move(e));
  for (size_t i = 0; i < events.size(); ++i) {
    events[i].durable = true;
    const absl::Status s = Append(events[i]);
    if (s.ok()) continue;
    if (i == 0) return s;
    // Records 1..i are in the log and describe changes that will not happen: say so there too,
    // if the sink takes it, and in the error in any case.
    AuditEvent note;
    note.type = AuditEvent::Type::kConfigChange;
    note.actor = std::string(actor);
    note.durable = true;
    note.detail = absl::StrCat("not applied: the ", i, " change record(s) just before this one (",
                               std::string(actor), ") were written, then record ", i + 1, " of ",
                               events.size(), " failed, so none of them was applied");
    const bool noted = Append(std::move(note)).ok();
    return absl::Status(
        s.code(),
        absl::StrCat("record ", i + 1, " of ", events.size(), " failed (", s.message(),
                     "), so nothing was applied; the ", i,
                     " record(s) before it were written and describe changes that were not made",
                     noted ? " (a record saying so follows them)" : ""));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, mode] : to_apply) tenants_[id - 1].settings.mode = mode;
  }
  apply();
  return absl::OkStatus();
}

absl::StatusOr<KeyId> Guard::RotateKey(std::string_view actor) {
  if (absl::Status s = sink_->Healthy(); !s.ok()) {
    return absl::UnavailableError(
        absl::StrCat("key rotation refused: the audit log cannot record it (", s.message(), ")"));
  }
  std::lock_guard<std::mutex> serial(mode_change_mu_);
  bool recorded = false;
  absl::StatusOr<KeyId> id = keys_->Rotate([&](KeyId next,
                                               const std::string& fingerprint) -> absl::Status {
    AuditEvent e;
    e.type = AuditEvent::Type::kKeyRotated;
    e.actor = std::string(actor);
    e.key_fingerprint = fingerprint;
    e.detail = absl::StrCat("key id ", next);
    e.durable = true;
    if (absl::Status s = Append(std::move(e)); !s.ok()) {
      return absl::UnavailableError(absl::StrCat(
          "key rotation not recorded, so not applied (the new key was discarded): ", s.message()));
    }
    recorded = true;
    return absl::OkStatus();
  });
  if (!id.ok() && recorded) {
    // The key_rotated record is in the log but the rotation was rolled back (the key file
    // could not be written): say so there too, as ApplyChanges does, so the log never shows a
    // key that did not take effect without the record that takes it back.
    AuditEvent note;
    note.type = AuditEvent::Type::kKeyRotated;
    note.actor = std::string(actor);
    note.durable = true;
    note.detail = absl::StrCat(
        "not applied: the key rotation recorded just before this one was "
        "rolled back (",
        id.status().message(), "); the old key stays active");
    const bool noted = Append(std::move(note)).ok();
    return absl::Status(
        id.status().code(),
        absl::StrCat("the key rotation was recorded but not applied (the old key "
                     "stays active",
                     noted ? "; a record saying so follows it" : "", "): ", id.status().message()));
  }
  return id;
}

absl::Status Guard::RetireKey(KeyId id) { return table_->RetireKey(keys_.get(), id); }

absl::Status Guard::Admit(TenantId tenant) const {
  Mode mode;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const Tenant* t = FindLocked(tenant);
    if (t == nullptr) return absl::NotFoundError(absl::StrCat("unknown tenant id ", tenant));
    if (t->quarantined) {
      return absl::PermissionDeniedError(absl::StrCat("tenant '", t->settings.name,
                                                      "' is quarantined after ", t->violations,
                                                      " isolation violations"));
    }
    mode = t->settings.mode;
  }
  if (mode == Mode::kStrict) {
    bool unrecorded;
    {
      std::lock_guard<std::mutex> lock(mu_);
      unrecorded = strict_unrecorded_;
    }
    if (unrecorded) {
      return absl::UnavailableError(
          "strict tenant refused: a violation could not be recorded in the audit log");
    }
    if (absl::Status s = sink_->Healthy(); !s.ok()) {
      return absl::UnavailableError(absl::StrCat(
          "strict tenant refused: the audit log cannot record violations (", s.message(), ")"));
    }
  }
  return absl::OkStatus();
}

std::optional<Violation> Guard::Verify(const Owner& owner, std::span<const PageGrant> grants,
                                       Mode mode) const {
  if (mode == Mode::kOff) return std::nullopt;
  if (mode == Mode::kStrict) {
    std::lock_guard<std::mutex> lock(mu_);
    const Tenant* t = FindLocked(owner.tenant);
    const bool tenant_out = t != nullptr && t->quarantined;
    const bool session_out = quarantined_sessions_.contains(owner.session);
    if (tenant_out || session_out || strict_unrecorded_) {
      Violation v;
      v.kind = tenant_out    ? ViolationKind::kTenantQuarantined
               : session_out ? ViolationKind::kSessionQuarantined
                             : ViolationKind::kAuditUnavailable;
      v.requester = owner;
      return v;
    }
  }
  return table_->Verify(owner, grants);
}

void Guard::Report(const Violation& v, uint64_t request) {
  std::string name, actual;
  Mode mode = Mode::kEnforce;
  bool quarantine_tenant = false;
  int violations = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.violations;
    Tenant* t = FindLocked(v.requester.tenant);
    name = t == nullptr ? "?" : t->settings.name;
    if (v.actual_owner.session != kNoSession) {
      const Tenant* owner = FindLocked(v.actual_owner.tenant);
      actual = owner == nullptr ? "?" : owner->settings.name;
    }
    if (t != nullptr) mode = t->settings.mode;
    ++stats_.by_tenant_reason[{name, ViolationKindName(v.kind)}];
    const bool repeat = v.kind == ViolationKind::kTenantQuarantined ||
                        v.kind == ViolationKind::kSessionQuarantined ||
                        v.kind == ViolationKind::kAuditUnavailable;
    if (t != nullptr && !repeat) {
      ++t->violations;
      if (mode == Mode::kStrict) {
        quarantined_sessions_.insert(v.requester.session);
        violations = ++t->strict_violations;
        if (!t->quarantined && violations >= t->settings.quarantine_after) {
          t->quarantined = quarantine_tenant = true;
        }
      }
    }
  }
  AuditEvent e;
  e.type = AuditEvent::Type::kViolation;
  e.tenant = name;
  e.mode = ModeName(mode);
  e.actual_tenant = actual;
  e.request = request;
  e.violation = v;
  const bool repeat = v.kind == ViolationKind::kTenantQuarantined ||
                      v.kind == ViolationKind::kSessionQuarantined ||
                      v.kind == ViolationKind::kAuditUnavailable;
  int unrecorded = !Append(e).ok();
  if (mode == Mode::kStrict && !repeat) {
    const int pages = table_->QuarantineSession(v.requester);
    AuditEvent q;
    q.type = AuditEvent::Type::kSessionQuarantined;
    q.tenant = name;
    q.mode = e.mode;
    q.request = request;
    q.violation = v;
    q.detail = absl::StrCat(pages, " pages quarantined");
    unrecorded += !Append(std::move(q)).ok();
  }
  if (quarantine_tenant) {
    AuditEvent q;
    q.type = AuditEvent::Type::kTenantQuarantined;
    q.tenant = name;
    q.mode = e.mode;
    q.request = request;
    q.detail = absl::StrCat(violations, " violations");
    unrecorded += !Append(std::move(q)).ok();
  }
  if (unrecorded > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.unrecorded += unrecorded;
    // Fail closed (P3): strict tenants are served no more until the sink records again.
    if (mode == Mode::kStrict) strict_unrecorded_ = true;
  }
}

void Guard::RecordStep(int64_t verify_ns, int64_t verifications, int64_t pages) {
  if (verifications == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.steps;
  stats_.verifications += verifications;
  stats_.pages_verified += pages;
  stats_.verify_ns_total += verify_ns;
  stats_.verify_ns_max = std::max(stats_.verify_ns_max, verify_ns);
}

GuardStats Guard::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace kvguard::isolation
