// Tests of isolation/step_guard.h, the one owner of the step protocol: what Begin lets into a
// step per mode, that a failure is reported once and at once, that the pin holds released
// pages until Finish, that a page table changed during the step is caught at Finish (the
// re-verification, which the kernels' tag check cannot replace), that modes are read once,
// and that no step can end without Finish. Each negative case has its clean twin.
#include "isolation/step_guard.h"

#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "isolation/audit_sink.h"
#include "isolation/guard.h"
#include "isolation/ownership_table.h"
#include "isolation/tag_key.h"
#include "isolation/violation.h"

namespace kvguard::isolation {
namespace {

// Tenant ids follow the policy's order: acme 1 (strict), beta 2 (enforce), gamma 3 (off).
constexpr TenantId kAcme = 1, kBeta = 2, kGamma = 3;
constexpr Owner kAcme1{kAcme, 101}, kBeta1{kBeta, 201}, kGamma1{kGamma, 301};
constexpr Owner kStranger{kBeta, 999};

class StepGuardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    keys_ = std::shared_ptr<TagKeyRing>(*TagKeyRing::CreateEphemeral());
    table_ = std::make_unique<OwnershipTable>(16, keys_.get(), nullptr);
    sink_ = std::make_shared<MemoryAuditSink>();
    GuardOptions options;
    options.policy.tenants = {
        {"acme", Mode::kStrict, 3}, {"beta", Mode::kEnforce, 3}, {"gamma", Mode::kOff, 3}};
    options.sink = sink_;
    guard_ = *Guard::Create(options, table_.get(), keys_);
    steps_ = std::make_unique<StepGuard>(guard_.get());
  }

  std::vector<PageGrant> GrantPages(const Owner& owner, int n) {
    std::vector<PageGrant> out;
    EXPECT_TRUE(table_->GrantMany(owner, n, &out).ok());
    return out;
  }

  size_t Violations() const {
    size_t n = 0;
    for (const AuditEvent& e : sink_->events()) n += e.type == AuditEvent::Type::kViolation;
    return n;
  }

  std::shared_ptr<TagKeyRing> keys_;
  std::unique_ptr<OwnershipTable> table_;
  std::shared_ptr<MemoryAuditSink> sink_;
  std::unique_ptr<Guard> guard_;
  std::unique_ptr<StepGuard> steps_;
};

TEST_F(StepGuardTest, ACleanStepAcceptsEverySessionAndRecordsItsCost) {
  const std::vector<PageGrant> a = GrantPages(kAcme1, 2), b = GrantPages(kBeta1, 3),
                               g = GrantPages(kGamma1, 1);
  const std::vector<StepSession> sessions = {{kAcme1, a, 1}, {kBeta1, b, 2}, {kGamma1, g, 3}};
  StepGuard::Step step = steps_->Begin(sessions);
  EXPECT_EQ(step.mode(0), Mode::kStrict);
  EXPECT_EQ(step.mode(1), Mode::kEnforce);
  EXPECT_EQ(step.mode(2), Mode::kOff);
  for (size_t i = 0; i < step.size(); ++i) {
    EXPECT_TRUE(step.in(i)) << i;
    EXPECT_TRUE(step.check_tags(i)) << i << ": the kernels check every mode's tags";
    EXPECT_FALSE(step.accepted(i)) << i << ": nothing is accepted before Finish";
  }
  step.Finish();
  for (size_t i = 0; i < step.size(); ++i) EXPECT_TRUE(step.accepted(i)) << i;
  const GuardStats stats = guard_->stats();
  EXPECT_EQ(stats.steps, 1);
  EXPECT_EQ(stats.verifications, 2) << "acme and beta; gamma is off";
  EXPECT_EQ(stats.pages_verified, 5);
  EXPECT_EQ(Violations(), 0u);
}

TEST_F(StepGuardTest, AStalePageTableIsOutBeforeTheKernelsAndReportedOnce) {
  for (const bool stale : {false, true}) {
    SCOPED_TRACE(stale ? "stale" : "twin: current");
    std::vector<PageGrant> b = GrantPages(kBeta1, 2);
    const std::vector<PageGrant> g = GrantPages(kGamma1, 1);
    if (stale) {
      ASSERT_FALSE(table_->Release(kBeta1, b[1], false).has_value());  // b[1] is now stale
    }
    const size_t before = Violations();
    const std::vector<StepSession> sessions = {{kBeta1, b, 7}, {kGamma1, g, 8}};
    StepGuard::Step step = steps_->Begin(sessions);
    EXPECT_EQ(step.in(0), !stale);
    EXPECT_TRUE(step.in(1)) << "the other session is unaffected";
    EXPECT_EQ(Violations(), before + (stale ? 1 : 0)) << "reported at once, before the kernels";
    if (stale) {
      ASSERT_TRUE(step.violation(0).has_value());
      EXPECT_EQ(step.violation(0)->kind, ViolationKind::kStaleGeneration);
      EXPECT_EQ(step.violation(0)->page_index, 1);
    }
    step.Finish();
    EXPECT_EQ(step.accepted(0), !stale);
    EXPECT_TRUE(step.accepted(1));
    EXPECT_EQ(Violations(), before + (stale ? 1 : 0)) << "not reported again at Finish";
    if (stale) {
      EXPECT_EQ(sink_->events().back().request, 7u);
      ASSERT_FALSE(table_->Release(kBeta1, b[0], false).has_value());
    } else {
      for (const PageGrant& x : b) ASSERT_FALSE(table_->Release(kBeta1, x, false).has_value());
    }
    ASSERT_FALSE(table_->Release(kGamma1, g[0], false).has_value());
  }
}

// An `off` tenant's page table is not verified, so the kernels' tag check is what stops it; a
// kernel fault is reported at Finish with the page's current owner (for the auditor).
TEST_F(StepGuardTest, AKernelFaultTakesTheSessionOutAndIsReportedAtFinish) {
  for (const bool fault : {false, true}) {
    SCOPED_TRACE(fault ? "kernel fault" : "twin: none");
    const std::vector<PageGrant> g = GrantPages(kGamma1, 2);
    std::vector<PageGrant> presented = g;
    if (fault) {
      // g[1] goes to a stranger: gamma still presents its old grant.
      ASSERT_FALSE(table_->Release(kGamma1, g[1], false).has_value());
      presented[1] = g[1];
    }
    std::vector<PageGrant> taken;
    if (fault) taken = GrantPages(kStranger, table_->free_pages());
    const size_t before = Violations();
    const StepSession session{kGamma1, presented, 5};
    StepGuard::Step step = steps_->Begin(std::span(&session, 1));
    EXPECT_TRUE(step.in(0)) << "off: nothing is verified before the kernels";
    if (fault) step.KernelFault(0, 1);
    EXPECT_EQ(step.in(0), !fault);
    EXPECT_EQ(Violations(), before) << "kernel faults are reported at Finish";
    step.Finish();
    EXPECT_EQ(step.accepted(0), !fault);
    EXPECT_EQ(Violations(), before + (fault ? 1 : 0));
    if (fault) {
      const Violation& v = *step.violation(0);
      EXPECT_EQ(v.kind, ViolationKind::kKernelTagMismatch);
      EXPECT_EQ(v.page_index, 1);
      EXPECT_EQ(v.page, g[1].page);
      EXPECT_EQ(v.expected_generation, g[1].generation);
      EXPECT_EQ(v.actual_owner, kStranger) << "the auditor learns who holds the page now";
      for (const PageGrant& x : taken) ASSERT_FALSE(table_->Release(kStranger, x, false));
      ASSERT_FALSE(table_->Release(kGamma1, g[0], false).has_value());
    } else {
      for (const PageGrant& x : g) ASSERT_FALSE(table_->Release(kGamma1, x, false).has_value());
    }
  }
}

// The bug class "a step's post-step re-verification is dropped": a page table that changed
// during the step without the kernels noticing (here the grant is released mid-step; the
// kernels' check ran before) must still keep the step's result from leaving.
TEST_F(StepGuardTest, APageReleasedDuringTheStepIsCaughtAtFinish) {
  for (const bool release : {false, true}) {
    SCOPED_TRACE(release ? "released mid-step" : "twin: untouched");
    const std::vector<PageGrant> b = GrantPages(kBeta1, 2);
    const StepSession session{kBeta1, b, 9};
    StepGuard::Step step = steps_->Begin(std::span(&session, 1));
    ASSERT_TRUE(step.in(0));
    if (release) {
      ASSERT_FALSE(table_->Release(kBeta1, b[0], false).has_value());
      EXPECT_EQ(table_->limbo_pages(), 1) << "the pin holds the released page";
    }
    step.Finish();
    EXPECT_EQ(table_->limbo_pages(), 0) << "Finish unpins";
    EXPECT_EQ(step.accepted(0), !release);
    EXPECT_EQ(Violations(), release ? 1u : 0u);
    if (release) {
      EXPECT_EQ(step.violation(0)->kind, ViolationKind::kStaleGeneration);
      ASSERT_FALSE(table_->Release(kBeta1, b[1], false).has_value());
    } else {
      for (const PageGrant& x : b) ASSERT_FALSE(table_->Release(kBeta1, x, false).has_value());
    }
  }
}

// Modes are read once, at Begin: a change during the step applies from the next one, both for
// what Finish re-verifies and for what the step reports as the session's mode.
TEST_F(StepGuardTest, ModesAreReadOnceAtBegin) {
  const std::vector<PageGrant> b = GrantPages(kBeta1, 1), g = GrantPages(kGamma1, 1);
  const std::vector<StepSession> sessions = {{kBeta1, b, 1}, {kGamma1, g, 2}};
  StepGuard::Step step = steps_->Begin(sessions);
  ASSERT_TRUE(guard_->SetMode("beta", Mode::kOff, "test").ok());
  ASSERT_TRUE(guard_->SetMode("gamma", Mode::kEnforce, "test").ok());
  // Both page tables go stale mid-step: beta (enforce at Begin) is re-verified, gamma (off at
  // Begin) is not.
  ASSERT_FALSE(table_->Release(kBeta1, b[0], false).has_value());
  ASSERT_FALSE(table_->Release(kGamma1, g[0], false).has_value());
  EXPECT_EQ(step.mode(0), Mode::kEnforce);
  EXPECT_EQ(step.mode(1), Mode::kOff);
  step.Finish();
  EXPECT_FALSE(step.accepted(0));
  EXPECT_TRUE(step.accepted(1));
  // The next step reads the new modes.
  StepGuard::Step next = steps_->Begin(sessions);
  EXPECT_EQ(next.mode(0), Mode::kOff);
  EXPECT_EQ(next.mode(1), Mode::kEnforce);
  EXPECT_TRUE(next.in(0));
  EXPECT_FALSE(next.in(1));
  next.Finish();
}

// A strict tenant's failure is reported at Begin, so its session is quarantined before the
// kernels run: its other pages are out of everyone's reach at once.
TEST_F(StepGuardTest, AStrictFailureQuarantinesTheSessionBeforeTheKernels) {
  for (const bool stale : {false, true}) {
    SCOPED_TRACE(stale ? "stale" : "twin: current");
    std::vector<PageGrant> a = GrantPages(kAcme1, 2);
    if (stale) {
      ASSERT_FALSE(table_->Release(kAcme1, a[1], false).has_value());
    }
    const StepSession session{kAcme1, a, 4};
    StepGuard::Step step = steps_->Begin(std::span(&session, 1));
    EXPECT_EQ(step.in(0), !stale);
    EXPECT_EQ(table_->state(a[0].page), stale ? PageState::kQuarantined : PageState::kOwned);
    step.Finish();
    if (!stale) {
      for (const PageGrant& x : a) ASSERT_FALSE(table_->Release(kAcme1, x, false).has_value());
    }
  }
}

TEST_F(StepGuardTest, AStepCannotEndWithoutFinish) {
  const std::vector<PageGrant> b = GrantPages(kBeta1, 1);
  const StepSession session{kBeta1, b, 1};
  EXPECT_DEATH({ StepGuard::Step step = steps_->Begin(std::span(&session, 1)); },
               "without StepGuard::Step::Finish");
  // Twins: a finished step, and a moved-from one, end quietly; Finish is idempotent.
  {
    StepGuard::Step step = steps_->Begin(std::span(&session, 1));
    StepGuard::Step moved = std::move(step);
    moved.Finish();
    moved.Finish();
    EXPECT_TRUE(moved.accepted(0));
  }
  EXPECT_EQ(guard_->stats().steps, 1);
}

}  // namespace
}  // namespace kvguard::isolation
