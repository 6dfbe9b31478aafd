// Tests of core/engine/session_pages.h: the page lifecycle the engine and the fuzz targets share.
#include "core/engine/session_pages.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "isolation/ownership_table.h"
#include "isolation/tag_key.h"

namespace kvguard::core {
namespace {

using isolation::Owner;
using isolation::OwnershipTable;
using isolation::ViolationKind;

struct Fixture {
  std::unique_ptr<isolation::TagKeyRing> keys = *isolation::TagKeyRing::CreateEphemeral();
  OwnershipTable table{6, keys.get(), nullptr};
};

TEST(SessionPagesTest, GrantsThePromptThenOnePagePerBoundary) {
  Fixture f;
  SessionPages s(&f.table, Owner{1, 1}, 4);
  ASSERT_TRUE(s.GrantFor(5).ok());
  EXPECT_EQ(s.num_pages(), 2);
  s.set_kv_len(5);
  EXPECT_FALSE(s.needs_page());
  ASSERT_TRUE(s.GrowForNextToken().ok());  // slot 5 is in page 1: nothing granted
  EXPECT_EQ(s.num_pages(), 2);
  s.set_kv_len(8);
  EXPECT_TRUE(s.needs_page());
  ASSERT_TRUE(s.GrowForNextToken().ok());
  EXPECT_EQ(s.num_pages(), 3);
  EXPECT_FALSE(f.table.Verify(s.owner(), s.grants()).has_value());
  EXPECT_TRUE(s.Release(false).empty());
  EXPECT_EQ(s.num_pages(), 0);
  EXPECT_EQ(f.table.free_pages(), 6);
}

TEST(SessionPagesTest, ADryPoolChangesNothing) {
  Fixture f;
  SessionPages a(&f.table, Owner{1, 1}, 4), b(&f.table, Owner{1, 2}, 4);
  EXPECT_TRUE(absl::IsResourceExhausted(a.GrantFor(28)));  // 7 pages of 6
  EXPECT_EQ(a.num_pages(), 0);
  ASSERT_TRUE(a.GrantFor(24).ok());  // twin: 6 pages fit
  b.set_kv_len(0);
  EXPECT_TRUE(absl::IsResourceExhausted(b.GrowForNextToken()));
  EXPECT_EQ(b.num_pages(), 0);
}

TEST(SessionPagesTest, ContinueUnlessCancelledReleasesACancelledRequestAndStopsIt) {
  for (const bool cancelled : {false, true}) {
    Fixture f;
    SessionPages s(&f.table, Owner{1, 1}, 4);
    ASSERT_TRUE(s.GrantFor(6).ok());
    std::vector<isolation::Violation> refused;
    EXPECT_EQ(s.ContinueUnlessCancelled(cancelled, /*scrub=*/false, &refused), !cancelled);
    EXPECT_TRUE(refused.empty());
    EXPECT_EQ(s.num_pages(), cancelled ? 0 : 2);
    EXPECT_EQ(f.table.free_pages(), cancelled ? 6 : 4);
  }
}

#if KVGUARD_FAULT_INJECTION
TEST(SessionPagesTest, FaultsMisbehaveAsDocumented) {
  Fixture f;
  SessionPages s(&f.table, Owner{1, 1}, 4);
  ASSERT_TRUE(s.GrantFor(6).ok());
  SessionFaults faults;
  faults.cancelled_continues = true;
  s.set_faults(faults);
  std::vector<isolation::Violation> refused;
  // The bug: it goes on although cancelled, with a page table that is no longer its own.
  EXPECT_TRUE(s.ContinueUnlessCancelled(true, false, &refused));
  ASSERT_EQ(s.num_pages(), 2);
  ASSERT_TRUE(f.table.Verify(s.owner(), s.grants()).has_value());
  faults = {};
  faults.double_release = true;
  s.set_faults(faults);
  const std::vector<isolation::Violation> second = s.Release(false);
  ASSERT_EQ(second.size(), 4u);  // both passes refused: the pages were already released
  for (const auto& v : second) EXPECT_EQ(v.kind, ViolationKind::kStaleRelease);
  EXPECT_EQ(f.table.free_pages(), 6);
}
#endif

}  // namespace
}  // namespace kvguard::core
