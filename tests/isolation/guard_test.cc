// Tests of isolation/guard.h: tenants and modes, what Verify reports per mode, what Report
// records and (strict) quarantines, admission while the audit sink fails, mode changes and key
// rotations on the record, and that no audit event ever carries a key or a tag (P4).
#include "isolation/guard.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "isolation/audit_sink.h"
#include "isolation/ownership_table.h"
#include "isolation/tag_key.h"
#include "isolation/tenant_policy.h"
#include "isolation/violation.h"
#include "kernels/formats.h"
#include "tests/isolation/verdict.h"
#include "tests/temp_dir.h"

namespace kvguard::isolation {
namespace {

using kvguard::tests::Kind;

using kernels::PageTag;
using Type = AuditEvent::Type;

// Tenant ids follow the policy's order: acme 1 (strict), beta 2 (enforce), gamma 3 (off).
constexpr TenantId kAcme = 1, kBeta = 2, kGamma = 3;
constexpr Owner kAcme1{kAcme, 101};
constexpr Owner kAcme2{kAcme, 102};
constexpr Owner kBeta1{kBeta, 201};
constexpr Owner kGamma1{kGamma, 301};

TenantPolicy Policy() {
  TenantPolicy p;
  p.tenants = {{"acme", Mode::kStrict, 3}, {"beta", Mode::kEnforce, 3}, {"gamma", Mode::kOff, 3}};
  return p;
}

std::vector<AuditEvent> OfType(const std::vector<AuditEvent>& events, Type type) {
  std::vector<AuditEvent> out;
  for (const AuditEvent& e : events) {
    if (e.type == type) out.push_back(e);
  }
  return out;
}

class GuardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = tests::NewTempDir("guard_test");
    // A key file rather than an ephemeral ring: the test can then read the keys and look for
    // them in every audit event.
    absl::StatusOr<std::unique_ptr<TagKeyRing>> ring = TagKeyRing::LoadOrCreate(KeyPath());
    ASSERT_TRUE(ring.ok()) << ring.status();
    keys_ = std::shared_ptr<TagKeyRing>(*std::move(ring));
    table_ = std::make_unique<OwnershipTable>(16, keys_.get(),
                                              [this](int32_t p) { scrubbed_.push_back(p); });
    sink_ = std::make_shared<MemoryAuditSink>();
    MakeGuard(sink_);
  }
  // MakeGuard (re)creates guard_ over the table and ring, reporting to `sink`.
  void MakeGuard(std::shared_ptr<AuditSink> sink) {
    guard_.reset();
    GuardOptions options;
    options.policy = Policy();
    options.sink = std::move(sink);
    absl::StatusOr<std::unique_ptr<Guard>> guard =
        Guard::Create(std::move(options), table_.get(), keys_);
    ASSERT_TRUE(guard.ok()) << guard.status();
    guard_ = *std::move(guard);
  }
  void TearDown() override {
    guard_.reset();
    std::filesystem::remove_all(dir_);
  }

  std::string KeyPath() const { return dir_ + "/tag.keys"; }

  PageGrant MustGrant(const Owner& owner) {
    absl::StatusOr<PageGrant> g = table_->Grant(owner);
    EXPECT_TRUE(g.ok()) << g.status();
    if (g.ok()) granted_.push_back(*g);
    return g.ok() ? *g : PageGrant{};
  }
  std::string Verify(const Owner& owner, const PageGrant& grant, Mode mode) const {
    return Kind(guard_->Verify(owner, std::span<const PageGrant>(&grant, 1), mode));
  }
  // Forge returns `g` with one tag byte changed.
  static PageGrant Forge(PageGrant g) {
    g.tag.lo ^= 0x42;
    return g;
  }
  // ViolationOf returns the table's verdict on `owner` presenting `grant` (which must fail).
  Violation ViolationOf(const Owner& owner, const PageGrant& grant) const {
    std::optional<Violation> v = table_->Verify(owner, std::span<const PageGrant>(&grant, 1));
    EXPECT_TRUE(v.has_value());
    return v.value_or(Violation{});
  }

  std::string dir_;
  std::shared_ptr<TagKeyRing> keys_;
  std::vector<int32_t> scrubbed_;
  std::unique_ptr<OwnershipTable> table_;
  std::shared_ptr<MemoryAuditSink> sink_;
  std::unique_ptr<Guard> guard_;
  std::vector<PageGrant> granted_;  // every grant this test made, for the leak scan
};

TEST_F(GuardTest, CreateRefusesAnEmptyPolicyOrAMissingTableOrRing) {
  GuardOptions empty;
  empty.policy.tenants.clear();
  EXPECT_EQ(Guard::Create(empty, table_.get(), keys_).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Guard::Create(GuardOptions{}, nullptr, keys_).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Guard::Create(GuardOptions{}, table_.get(), nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Twin: defaults (one "default" tenant, a memory sink) are fine.
  absl::StatusOr<std::unique_ptr<Guard>> g = Guard::Create(GuardOptions{}, table_.get(), keys_);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ((*g)->ResolveTenant("default").value_or(0), 1u);
  EXPECT_TRUE((*g)->sink().Healthy().ok());
}

TEST_F(GuardTest, ResolveTenantKnownAndUnknown) {
  EXPECT_EQ(guard_->ResolveTenant("acme").value_or(0), kAcme);
  EXPECT_EQ(guard_->ResolveTenant("beta").value_or(0), kBeta);
  EXPECT_EQ(guard_->ResolveTenant("gamma").value_or(0), kGamma);
  for (const char* name : {"", "ACME", "acme ", "delta", "default"}) {
    EXPECT_EQ(guard_->ResolveTenant(name).status().code(), absl::StatusCode::kNotFound) << name;
  }
  EXPECT_EQ(guard_->TenantName(kBeta), "beta");
  EXPECT_EQ(guard_->TenantName(0), "?");
  EXPECT_EQ(guard_->TenantName(4), "?");
  EXPECT_EQ(guard_->mode(kAcme), Mode::kStrict);
  EXPECT_EQ(guard_->mode(kGamma), Mode::kOff);
  EXPECT_EQ(guard_->mode(99), Mode::kEnforce);  // unknown: fail closed
  EXPECT_EQ(guard_->tenants().size(), 3u);
}

TEST_F(GuardTest, ModeOffNeverReportsEvenForForgedGrantsEnforceDoes) {
  const PageGrant mine = MustGrant(kGamma1);
  const PageGrant theirs = MustGrant(kBeta1);
  const PageGrant forged[] = {Forge(mine), theirs, PageGrant{-1, 1, mine.tag},
                              PageGrant{mine.page, mine.generation + 1, mine.tag}};
  for (const PageGrant& g : forged) {
    EXPECT_EQ(Verify(kGamma1, g, Mode::kOff), "ok");
    EXPECT_NE(Verify(kGamma1, g, Mode::kEnforce), "ok");
    EXPECT_NE(Verify(kGamma1, g, Mode::kStrict), "ok");
  }
  EXPECT_EQ(Verify(kGamma1, Forge(mine), Mode::kEnforce), "tag_mismatch");
  EXPECT_EQ(Verify(kGamma1, theirs, Mode::kEnforce), "wrong_owner");
  // Twin: the real grant passes in every mode.
  for (Mode m : {Mode::kOff, Mode::kEnforce, Mode::kStrict}) {
    EXPECT_EQ(Verify(kGamma1, mine, m), "ok") << ModeName(m);
  }
  // Verify never reports by itself.
  EXPECT_TRUE(sink_->events().empty());
  EXPECT_EQ(guard_->stats().violations, 0);
}

TEST_F(GuardTest, ReportWritesAViolationEventAndCountsItByTenantAndReason) {
  const PageGrant g = MustGrant(kBeta1);
  const Violation v = ViolationOf(kBeta1, Forge(g));
  guard_->Report(v, 42);
  std::vector<AuditEvent> events = sink_->events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].type, Type::kViolation);
  EXPECT_EQ(events[0].tenant, "beta");
  EXPECT_EQ(events[0].request, 42u);
  EXPECT_GT(events[0].unix_nanos, 0);
  ASSERT_TRUE(events[0].violation.has_value());
  EXPECT_EQ(events[0].violation->kind, ViolationKind::kTagMismatch);
  EXPECT_EQ(events[0].violation->requester, kBeta1);
  EXPECT_EQ(events[0].violation->page, g.page);

  guard_->Report(ViolationOf(kBeta1, PageGrant{g.page, g.generation + 5, g.tag}), 43);
  guard_->Report(v, 44);
  const GuardStats s = guard_->stats();
  EXPECT_EQ(s.violations, 3);
  EXPECT_EQ(s.unrecorded, 0);
  EXPECT_EQ((s.by_tenant_reason.at({"beta", "tag_mismatch"})), 2);
  EXPECT_EQ((s.by_tenant_reason.at({"beta", "stale_generation"})), 1);
  EXPECT_EQ(s.by_tenant_reason.size(), 2u);
  // Enforce: the session's pages are not quarantined, the tenant still admitted.
  EXPECT_EQ(Verify(kBeta1, g, Mode::kEnforce), "ok");
  EXPECT_TRUE(guard_->Admit(kBeta).ok());
  EXPECT_TRUE(OfType(sink_->events(), Type::kSessionQuarantined).empty());
}

TEST_F(GuardTest, ReportForAnUnknownTenantIsStillRecorded) {
  Violation v;
  v.kind = ViolationKind::kWrongOwner;
  v.requester = Owner{77, 7};
  guard_->Report(v, 1);
  std::vector<AuditEvent> events = sink_->events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].tenant, "?");
  EXPECT_EQ((guard_->stats().by_tenant_reason.at({"?", "wrong_owner"})), 1);
}

TEST_F(GuardTest, StrictReportQuarantinesTheSessionsPages) {
  const PageGrant a1 = MustGrant(kAcme1);
  const PageGrant a2 = MustGrant(kAcme1);
  const PageGrant other = MustGrant(kAcme2);
  const PageGrant beta = MustGrant(kBeta1);
  guard_->Report(ViolationOf(kAcme1, Forge(a1)), 7);
  for (const PageGrant& g : {a1, a2}) {
    // The session is served no more; beneath that, its pages are held out of reach.
    EXPECT_EQ(Verify(kAcme1, g, Mode::kStrict), "session_quarantined");
    EXPECT_EQ(Kind(table_->Verify(kAcme1, std::span<const PageGrant>(&g, 1))), "quarantined_page");
    EXPECT_EQ(table_->state(g.page), PageState::kQuarantined);
  }
  std::vector<AuditEvent> q = OfType(sink_->events(), Type::kSessionQuarantined);
  ASSERT_EQ(q.size(), 1u);
  EXPECT_EQ(q[0].tenant, "acme");
  EXPECT_EQ(q[0].request, 7u);
  ASSERT_TRUE(q[0].violation.has_value());
  EXPECT_EQ(q[0].violation->requester, kAcme1);
  EXPECT_NE(q[0].detail.find('2'), std::string::npos) << q[0].detail;
  // Twin: the tenant's other session and other tenants are untouched; one violation is below
  // the tenant's limit.
  EXPECT_EQ(Verify(kAcme2, other, Mode::kStrict), "ok");
  EXPECT_EQ(Verify(kBeta1, beta, Mode::kEnforce), "ok");
  EXPECT_TRUE(guard_->Admit(kAcme).ok());
  EXPECT_TRUE(OfType(sink_->events(), Type::kTenantQuarantined).empty());
  // The session's pages are zeroed when it gives them back, even without asking.
  ASSERT_FALSE(table_->Release(kAcme1, a1, /*scrub=*/false).has_value());
  ASSERT_FALSE(table_->Release(kAcme1, a2, /*scrub=*/false).has_value());
  EXPECT_EQ(scrubbed_, (std::vector<int32_t>{a1.page, a2.page}));
}

TEST_F(GuardTest, StrictTenantIsQuarantinedAtItsLimit) {
  const PageGrant g = MustGrant(kAcme1);
  const Violation v = ViolationOf(kAcme1, Forge(g));
  guard_->Report(v, 1);
  guard_->Report(v, 2);
  EXPECT_TRUE(guard_->Admit(kAcme).ok());  // 2 < 3
  EXPECT_TRUE(OfType(sink_->events(), Type::kTenantQuarantined).empty());
  guard_->Report(v, 3);
  std::vector<AuditEvent> q = OfType(sink_->events(), Type::kTenantQuarantined);
  ASSERT_EQ(q.size(), 1u);
  EXPECT_EQ(q[0].tenant, "acme");
  EXPECT_EQ(q[0].request, 3u);
  EXPECT_NE(q[0].detail.find('3'), std::string::npos) << q[0].detail;
  const absl::Status admit = guard_->Admit(kAcme);
  EXPECT_EQ(admit.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(admit.message().find("acme"), absl::string_view::npos) << admit;
  // A new session's fresh, valid grant is refused too.
  const Owner fresh{kAcme, 199};
  const PageGrant f = MustGrant(fresh);
  EXPECT_EQ(Verify(fresh, f, Mode::kStrict), "tenant_quarantined");
  // More violations do not quarantine it again.
  guard_->Report(v, 4);
  EXPECT_EQ(OfType(sink_->events(), Type::kTenantQuarantined).size(), 1u);
}

TEST_F(GuardTest, EnforceTenantIsNeverQuarantined) {
  // Twin of the above: the same violations, ten times over, for an enforce tenant.
  const PageGrant g = MustGrant(kBeta1);
  const Violation v = ViolationOf(kBeta1, Forge(g));
  for (int i = 0; i < 10; ++i) guard_->Report(v, static_cast<uint64_t>(i));
  EXPECT_TRUE(guard_->Admit(kBeta).ok());
  EXPECT_EQ(Verify(kBeta1, g, Mode::kEnforce), "ok");
  const PageGrant f = MustGrant(Owner{kBeta, 299});
  EXPECT_EQ(Verify(Owner{kBeta, 299}, f, Mode::kEnforce), "ok");
  EXPECT_TRUE(OfType(sink_->events(), Type::kTenantQuarantined).empty());
  EXPECT_TRUE(OfType(sink_->events(), Type::kSessionQuarantined).empty());
  EXPECT_EQ(OfType(sink_->events(), Type::kViolation).size(), 10u);
  EXPECT_EQ(guard_->stats().violations, 10);
}

TEST_F(GuardTest, StrictTenantIsRefusedWhileTheSinkCannotRecord) {
  EXPECT_TRUE(guard_->Admit(kAcme).ok());
  sink_->set_failing(true);
  EXPECT_EQ(guard_->Admit(kAcme).code(), absl::StatusCode::kUnavailable);
  // Twin: enforce and off tenants are admitted regardless.
  EXPECT_TRUE(guard_->Admit(kBeta).ok());
  EXPECT_TRUE(guard_->Admit(kGamma).ok());
  // A violation reported meanwhile is counted as unrecorded.
  const PageGrant g = MustGrant(kBeta1);
  guard_->Report(ViolationOf(kBeta1, Forge(g)), 1);
  EXPECT_EQ(guard_->stats().violations, 1);
  EXPECT_EQ(guard_->stats().unrecorded, 1);
  sink_->set_failing(false);
  EXPECT_TRUE(guard_->Admit(kAcme).ok());
  EXPECT_EQ(guard_->Admit(99).code(), absl::StatusCode::kNotFound);
}

TEST_F(GuardTest, SetModeIsRecordedAndTakesEffect) {
  ASSERT_TRUE(guard_->SetMode("beta", Mode::kStrict, "ops@example").ok());
  EXPECT_EQ(guard_->mode(kBeta), Mode::kStrict);
  std::vector<AuditEvent> events = sink_->events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].type, Type::kModeChange);
  EXPECT_EQ(events[0].tenant, "beta");
  EXPECT_EQ(events[0].mode_from, "enforce");
  EXPECT_EQ(events[0].mode_to, "strict");
  EXPECT_EQ(events[0].actor, "ops@example");
  // It takes effect: beta is now strict, so refused while the sink fails, and quarantined at
  // its limit.
  sink_->set_failing(true);
  EXPECT_EQ(guard_->Admit(kBeta).code(), absl::StatusCode::kUnavailable);
  sink_->set_failing(false);
  const PageGrant g = MustGrant(kBeta1);
  guard_->Report(ViolationOf(kBeta1, Forge(g)), 1);
  EXPECT_EQ(Verify(kBeta1, g, Mode::kStrict), "session_quarantined");

  ASSERT_TRUE(guard_->SetMode("gamma", Mode::kEnforce, "root").ok());
  EXPECT_EQ(guard_->mode(kGamma), Mode::kEnforce);
  EXPECT_EQ(sink_->events().back().mode_from, "off");
  EXPECT_EQ(guard_->SetMode("nobody", Mode::kOff, "root").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(OfType(sink_->events(), Type::kModeChange).size(), 2u);
}

TEST_F(GuardTest, SetModeIsRefusedWhenItCannotBeRecorded) {
  sink_->set_failing(true);
  const absl::Status s = guard_->SetMode("acme", Mode::kOff, "attacker");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ(guard_->mode(kAcme), Mode::kStrict);
  sink_->set_failing(false);
  EXPECT_TRUE(sink_->events().empty());
  // Twin: recorded, applied.
  EXPECT_TRUE(guard_->SetMode("acme", Mode::kOff, "ops").ok());
  EXPECT_EQ(guard_->mode(kAcme), Mode::kOff);
  EXPECT_EQ(sink_->events().size(), 1u);
}

TEST_F(GuardTest, RotateKeyIsRecordedAndOldGrantsStillVerify) {
  const PageGrant old = MustGrant(kBeta1);
  ASSERT_EQ(keys_->active_id(), 1u);
  absl::StatusOr<KeyId> id = guard_->RotateKey("ops");
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(*id, 2u);
  EXPECT_EQ(keys_->active_id(), 2u);
  std::vector<AuditEvent> r = OfType(sink_->events(), Type::kKeyRotated);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].actor, "ops");
  ASSERT_EQ(r[0].key_fingerprint.size(), 16u);
  for (char c : r[0].key_fingerprint) {
    EXPECT_TRUE((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')) << r[0].key_fingerprint;
  }
  EXPECT_EQ(r[0].key_fingerprint, keys_->Fingerprint(2).value_or(""));
  EXPECT_NE(r[0].key_fingerprint, keys_->Fingerprint(1).value_or(""));
  // Old grants stay valid; new ones are derived with the new key.
  EXPECT_EQ(Verify(kBeta1, old, Mode::kEnforce), "ok");
  const PageGrant fresh = MustGrant(kBeta1);
  EXPECT_EQ(Verify(kBeta1, fresh, Mode::kEnforce), "ok");
  const TagInput in{static_cast<uint64_t>(fresh.page), fresh.generation, kBeta1.tenant,
                    kBeta1.session};
  EXPECT_EQ(keys_->Derive(2, in).value_or(PageTag{}), fresh.tag);
  EXPECT_NE(keys_->Derive(1, in).value_or(PageTag{}), fresh.tag);
  const TagInput old_in{static_cast<uint64_t>(old.page), old.generation, kBeta1.tenant,
                        kBeta1.session};
  EXPECT_EQ(keys_->Derive(1, old_in).value_or(PageTag{}), old.tag);
}

TEST_F(GuardTest, RecordStepAddsUpTheVerificationCost) {
  guard_->RecordStep(100, 2, 5);
  guard_->RecordStep(300, 1, 1);
  guard_->RecordStep(999, 0, 0);  // nothing verified: not a step
  const GuardStats s = guard_->stats();
  EXPECT_EQ(s.steps, 2);
  EXPECT_EQ(s.verifications, 3);
  EXPECT_EQ(s.pages_verified, 6);
  EXPECT_EQ(s.verify_ns_total, 400);
  EXPECT_EQ(s.verify_ns_max, 300);
}

// KeysInFile returns the hex keys of the key file at `path`.
std::vector<std::string> KeysInFile(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> keys;
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    const size_t space = line.find(' ');
    if (space != std::string::npos) keys.push_back(line.substr(space + 1));
  }
  return keys;
}

// Spellings returns the ways a tag could show up in text: its 16 bytes in hex (either case),
// each half as a hex or decimal number.
std::vector<std::string> Spellings(const PageTag& t) {
  std::vector<std::string> out;
  unsigned char bytes[sizeof(PageTag)];
  std::memcpy(bytes, &t, sizeof(bytes));
  std::string hex;
  for (unsigned char b : bytes) absl::StrAppend(&hex, absl::Hex(b, absl::kZeroPad2));
  out.push_back(hex);
  for (uint64_t half : {t.lo, t.hi}) {
    out.push_back(absl::StrCat(absl::Hex(half, absl::kZeroPad16)));
    out.push_back(absl::StrCat(half));
  }
  const size_t n = out.size();
  for (size_t i = 0; i < n; ++i) out.push_back(absl::AsciiStrToUpper(out[i]));
  return out;
}

TEST_F(GuardTest, NoEventCarriesAKeyOrATag) {
  // Every kind of event, with violations of every kind a table can give.
  const PageGrant a = MustGrant(kAcme1);
  const PageGrant b = MustGrant(kBeta1);
  const PageGrant c = MustGrant(kGamma1);
  guard_->Report(ViolationOf(kBeta1, Forge(b)), 1);
  guard_->Report(ViolationOf(kBeta1, a), 2);
  guard_->Report(ViolationOf(kBeta1, PageGrant{b.page, b.generation + 1, b.tag}), 3);
  ASSERT_TRUE(guard_->RotateKey("ops").ok());
  const PageGrant b2 = MustGrant(kBeta1);
  ASSERT_FALSE(table_->Release(kBeta1, b2, false).has_value());
  guard_->Report(*table_->Release(kBeta1, b2, false), 4);
  ASSERT_TRUE(guard_->SetMode("gamma", Mode::kStrict, "ops").ok());
  for (int i = 0; i < 3; ++i) guard_->Report(ViolationOf(kAcme1, Forge(a)), 10 + i);
  guard_->Report(ViolationOf(kGamma1, Forge(c)), 20);
  Violation tq;
  tq.kind = ViolationKind::kTenantQuarantined;
  tq.requester = kAcme1;
  guard_->Report(tq, 21);

  std::vector<std::string> secrets = KeysInFile(KeyPath());
  ASSERT_EQ(secrets.size(), 2u) << "expected both keys in the key file";
  for (size_t i = 0, n = secrets.size(); i < n; ++i) {
    ASSERT_EQ(secrets[i].size(), 64u);
    secrets.push_back(absl::AsciiStrToUpper(secrets[i]));
    secrets.push_back(secrets[i].substr(0, 16));  // even a quarter of a key is too much
    secrets.push_back(secrets[i].substr(48));
  }
  for (const PageGrant& g : granted_) {
    for (const std::string& s : Spellings(g.tag)) secrets.push_back(s);
  }

  const std::vector<AuditEvent> events = sink_->events();
  for (Type t : {Type::kViolation, Type::kSessionQuarantined, Type::kTenantQuarantined,
                 Type::kModeChange, Type::kKeyRotated}) {
    EXPECT_FALSE(OfType(events, t).empty()) << AuditEventTypeName(t);
  }
  for (const AuditEvent& e : events) {
    const std::string fields[] = {e.tenant,
                                  e.mode_from,
                                  e.mode_to,
                                  e.actor,
                                  e.key_fingerprint,
                                  e.detail,
                                  e.violation ? DescribeViolation(*e.violation) : ""};
    for (const std::string& f : fields) {
      for (const std::string& s : secrets) {
        EXPECT_EQ(f.find(s), std::string::npos)
            << AuditEventTypeName(e.type) << " event field '" << f << "' contains a secret";
      }
    }
  }
  // Twin: the scan does find a secret where there is one.
  const std::string planted = "detail " + Spellings(b.tag)[0];
  bool found = false;
  for (const std::string& s : secrets) found = found || planted.find(s) != std::string::npos;
  EXPECT_TRUE(found);
}

// GateSink records every event; once armed, it holds the next Append, after recording it, until
// Open() is called, so a test can run another call in between.
class GateSink final : public AuditSink {
 public:
  absl::Status Append(const AuditEvent& event) override {
    std::unique_lock<std::mutex> lock(mu_);
    events_.push_back(event);
    if (armed_) {
      armed_ = false;
      held_ = true;
      cv_.notify_all();
      cv_.wait(lock, [this] { return open_; });
    }
    return absl::OkStatus();
  }
  void Arm() {
    std::lock_guard<std::mutex> lock(mu_);
    armed_ = true;
  }
  void WaitUntilHeld() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return held_; });
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  std::vector<AuditEvent> events() const {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<AuditEvent> events_;
  bool armed_ = false, held_ = false, open_ = false;
};

// Two admins changing one tenant's mode at once: the changes must be applied in the order the
// audit log recorded them, so that replaying the log gives the mode the tenant runs in.
// (Regression: SetMode once recorded and applied in separate critical sections, so alice's
// "enforce -> off", recorded first, could be applied after bob's "enforce -> strict": the log
// said strict while the tenant ran with checks off.) The sink holds alice's call between record
// and apply while bob's runs.
TEST(GuardModeChangeTest, ConcurrentModeChangesAreAppliedInTheOrderRecorded) {
  absl::StatusOr<std::unique_ptr<TagKeyRing>> ring = TagKeyRing::CreateEphemeral();
  ASSERT_TRUE(ring.ok());
  std::shared_ptr<TagKeyRing> keys(*std::move(ring));
  OwnershipTable table(4, keys.get(), nullptr);
  auto sink = std::make_shared<GateSink>();
  GuardOptions options;
  options.policy = Policy();
  options.sink = sink;
  absl::StatusOr<std::unique_ptr<Guard>> guard = Guard::Create(options, &table, keys);
  ASSERT_TRUE(guard.ok());
  Guard& g = **guard;

  sink->Arm();
  absl::Status alice_status, bob_status;
  std::thread alice([&] { alice_status = g.SetMode("beta", Mode::kOff, "alice"); });
  sink->WaitUntilHeld();  // alice's change is on the record, not yet applied
  std::mutex mu;
  std::condition_variable cv;
  bool bob_done = false;
  std::thread bob([&] {
    bob_status = g.SetMode("beta", Mode::kStrict, "bob");
    std::lock_guard<std::mutex> lock(mu);
    bob_done = true;
    cv.notify_all();
  });
  {
    // A guard that serialises mode changes makes bob wait for alice: give up waiting then
    // (an unserialised bob finishes in well under a millisecond).
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, std::chrono::milliseconds(300), [&] { return bob_done; });
  }
  sink->Open();
  alice.join();
  bob.join();
  ASSERT_TRUE(alice_status.ok()) << alice_status;
  ASSERT_TRUE(bob_status.ok()) << bob_status;

  std::vector<AuditEvent> changes = OfType(sink->events(), Type::kModeChange);
  ASSERT_EQ(changes.size(), 2u);
  // Replaying the log must give the mode the tenant actually runs in.
  EXPECT_EQ(changes.back().mode_to, ModeName(g.mode(kBeta)))
      << "the log's last change is " << changes.back().actor << "'s";
  EXPECT_EQ(changes[1].mode_from, changes[0].mode_to);
}

TEST_F(GuardTest, RetireKeyWaitsUntilNoHeldPageWasGrantedUnderIt) {
  const PageGrant old = MustGrant(kAcme1);
  const KeyId first = guard_->keys().active_id();
  ASSERT_TRUE(guard_->RotateKey("root").ok());
  EXPECT_EQ(guard_->RetireKey(first).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Verify(kAcme1, old, Mode::kEnforce), "ok");
  ASSERT_FALSE(table_->Release(kAcme1, old, false).has_value());
  EXPECT_TRUE(guard_->RetireKey(first).ok());  // twin: nothing held under it any more
}

TEST_F(GuardTest, RotateKeyIsRefusedWhileItCannotBeRecorded) {
  const KeyId before = guard_->keys().active_id();
  sink_->set_failing(true);
  EXPECT_EQ(guard_->RotateKey("root").status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(guard_->keys().active_id(), before);
  sink_->set_failing(false);
  ASSERT_TRUE(guard_->RotateKey("root").ok());  // twin
  EXPECT_NE(guard_->keys().active_id(), before);
}

// P3, fail closed: once a strict tenant's violation could not be recorded, strict requests
// are refused and aborted until the sink records again; enforce tenants are served throughout.
TEST_F(GuardTest, StrictTenantIsServedNoMoreAfterAnUnrecordedViolation) {
  const PageGrant g = MustGrant(kAcme1);
  const PageGrant other = MustGrant(kAcme2);
  sink_->set_failing(true);
  guard_->Report(ViolationOf(kAcme1, Forge(g)), 1);
  sink_->set_failing(false);  // the probe passes again, but nothing has been recorded since
  EXPECT_EQ(guard_->Admit(kAcme).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Verify(kAcme2, other, Mode::kStrict), "audit_unavailable");
  EXPECT_TRUE(guard_->Admit(kBeta).ok());  // twin: an enforce tenant is served
  EXPECT_EQ(Verify(kBeta1, MustGrant(kBeta1), Mode::kEnforce), "ok");
  // The next event that is recorded (here an operator's mode change) lifts it.
  ASSERT_TRUE(guard_->SetMode("beta", Mode::kEnforce, "root").ok());
  EXPECT_TRUE(guard_->Admit(kAcme).ok());
  EXPECT_EQ(Verify(kAcme2, other, Mode::kStrict), "ok");
}

}  // namespace
}  // namespace kvguard::isolation

namespace kvguard::isolation {
namespace {

// FailNthSink records events like MemoryAuditSink but fails the `n`th Append (1-based) while
// reporting itself healthy: a write that fails although the probe said it would not.
class FailNthSink final : public AuditSink {
 public:
  explicit FailNthSink(int n) : n_(n) {}
  absl::Status Append(const AuditEvent& event) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (++calls_ == n_) return absl::UnavailableError("disk full (injected)");
    events_.push_back(event);
    return absl::OkStatus();
  }
  std::vector<AuditEvent> events() const {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }

 private:
  const int n_;
  mutable std::mutex mu_;
  int calls_ = 0;
  std::vector<AuditEvent> events_;
};

// OperatorChangeTest: GuardTest's guard over its key file, reporting to a FailNthSink.
class OperatorChangeTest : public GuardTest {
 protected:
  void Make(int fail_at) {
    fail_sink_ = std::make_shared<FailNthSink>(fail_at);
    MakeGuard(fail_sink_);
  }
  std::string KeyFile() const {
    std::ifstream in(KeyPath());
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  // Changes: acme strict -> off, beta enforce -> off, and a config record for gamma.
  absl::Status Apply(int* applied) {
    const std::vector<Guard::ModeChange> modes = {{"acme", Mode::kOff}, {"beta", Mode::kOff}};
    AuditEvent config;
    config.type = Type::kConfigChange;
    config.tenant = "gamma";
    config.actor = "admin:reload";
    config.detail = "limits.concurrent_requests 4 -> 8";
    return guard_->ApplyChanges(modes, {config}, "admin:reload", [applied] { ++*applied; });
  }

  std::shared_ptr<FailNthSink> fail_sink_;
};

// A reload whose second record fails applies nothing, neither the mode already on the record
// nor the caller's part, and says so; the record already written is followed by one saying it
// was not applied. (Regression: reload applied each tenant's change as it was recorded, so a
// later failure left the earlier ones applied under a "not applied" reply.)
TEST_F(OperatorChangeTest, ApplyChangesWithAFailedRecordAppliesNothing) {
  Make(/*fail_at=*/2);
  int applied = 0;
  const absl::Status s = Apply(&applied);
  ASSERT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(std::string(s.message()).find("record 2 of 3 failed"), std::string::npos) << s;
  EXPECT_NE(std::string(s.message()).find("nothing was applied"), std::string::npos) << s;
  EXPECT_EQ(applied, 0);
  EXPECT_EQ(guard_->mode(kAcme), Mode::kStrict);
  EXPECT_EQ(guard_->mode(kBeta), Mode::kEnforce);
  std::vector<AuditEvent> events = fail_sink_->events();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].type, Type::kModeChange);
  EXPECT_EQ(events[0].tenant, "acme");
  EXPECT_EQ(events[1].type, Type::kConfigChange);
  EXPECT_NE(events[1].detail.find("none of them was applied"), std::string::npos);
}

TEST_F(OperatorChangeTest, ApplyChangesRecordsEveryChangeDurablyThenAppliesThemAll) {
  Make(/*fail_at=*/0);  // twin: nothing fails
  int applied = 0;
  ASSERT_TRUE(Apply(&applied).ok());
  EXPECT_EQ(applied, 1);
  EXPECT_EQ(guard_->mode(kAcme), Mode::kOff);
  EXPECT_EQ(guard_->mode(kBeta), Mode::kOff);
  std::vector<AuditEvent> events = fail_sink_->events();
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].tenant, "acme");
  EXPECT_EQ(events[0].mode_to, "off");
  EXPECT_EQ(events[1].tenant, "beta");
  EXPECT_EQ(events[2].type, Type::kConfigChange);
  for (const AuditEvent& e : events) EXPECT_TRUE(e.durable) << AuditEventTypeName(e.type);
  // An unknown tenant: NotFound, nothing recorded, nothing applied.
  const Guard::ModeChange bad[] = {{"gamma", Mode::kStrict}, {"nobody", Mode::kOff}};
  EXPECT_EQ(guard_->ApplyChanges(bad, {}, "x", [&] { ++applied; }).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(applied, 1);
  EXPECT_EQ(guard_->mode(kGamma), Mode::kOff);
  EXPECT_EQ(fail_sink_->events().size(), 3u);
}

// Downgrades are fsync'd before they apply: SetMode marks the record durable whatever the
// modes (a downgrade between two non-strict modes included).
TEST_F(OperatorChangeTest, ADowngradeIsRecordedDurably) {
  Make(/*fail_at=*/0);
  ASSERT_TRUE(guard_->SetMode("beta", Mode::kOff, "ops").ok());
  std::vector<AuditEvent> events = fail_sink_->events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].mode_from, "enforce");
  EXPECT_EQ(events[0].mode_to, "off");
  EXPECT_TRUE(events[0].durable);
}

// A rotation whose record fails is rolled back: the new key is never active, never in the
// key file. (Regression: RotateKey kept a rotation whose audit record had failed.)
TEST_F(OperatorChangeTest, ARotationWhoseRecordFailsNeverTakesEffect) {
  Make(/*fail_at=*/1);
  const std::string file_before = KeyFile();
  absl::StatusOr<KeyId> id = guard_->RotateKey("ops");
  ASSERT_EQ(id.status().code(), absl::StatusCode::kUnavailable) << id.status();
  EXPECT_NE(std::string(id.status().message()).find("not applied"), std::string::npos);
  EXPECT_EQ(keys_->active_id(), 1u);
  EXPECT_EQ(keys_->key_ids(), std::vector<KeyId>{1});
  EXPECT_EQ(KeyFile(), file_before);
  EXPECT_TRUE(fail_sink_->events().empty());
  // Twin: the next rotation is recorded (durably, with the key's fingerprint) and applied.
  id = guard_->RotateKey("ops");
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(keys_->active_id(), *id);
  EXPECT_NE(KeyFile(), file_before);
  std::vector<AuditEvent> events = fail_sink_->events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].type, Type::kKeyRotated);
  EXPECT_TRUE(events[0].durable);
  EXPECT_EQ(events[0].key_fingerprint, keys_->Fingerprint(*id).value_or("?"));
}

// A rotation recorded in the log whose key file then cannot be written is rolled back, and a
// second record says it was not applied (the log never shows a key that did not take effect
// without the record taking it back). The twin: the same rotation once the file can be written.
TEST_F(OperatorChangeTest, ARotationWhoseKeyFileFailsAfterTheRecordIsTakenBackInTheLog) {
  Make(/*fail_at=*/0);  // every record succeeds
  const std::string file_before = KeyFile();
  const std::string tmp = KeyPath() + ".tmp";
  std::filesystem::create_directories(tmp + "/blocker");  // the stale-tmp unlink now fails
  absl::StatusOr<KeyId> id = guard_->RotateKey("ops");
  ASSERT_FALSE(id.ok());
  EXPECT_NE(std::string(id.status().message()).find("recorded but not applied"), std::string::npos)
      << id.status();
  EXPECT_NE(std::string(id.status().message()).find("a record saying so follows it"),
            std::string::npos)
      << id.status();
  EXPECT_EQ(keys_->active_id(), 1u);
  EXPECT_EQ(KeyFile(), file_before);
  std::vector<AuditEvent> events = fail_sink_->events();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].type, Type::kKeyRotated);
  EXPECT_EQ(events[1].type, Type::kKeyRotated);
  EXPECT_TRUE(events[1].durable);
  EXPECT_EQ(events[1].detail.rfind("not applied: ", 0), 0u) << events[1].detail;
  std::filesystem::remove_all(tmp);
  id = guard_->RotateKey("ops");  // twin
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(keys_->active_id(), *id);
  EXPECT_EQ(fail_sink_->events().size(), 3u);
}

}  // namespace
}  // namespace kvguard::isolation
