#include "core/page_allocator.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

namespace kvguard::core {
namespace {

TEST(PageAllocatorTest, GrantsEveryPageOnceThenRunsDry) {
  PageAllocator a(8);
  std::set<int32_t> seen;
  for (int i = 0; i < 8; ++i) {
    absl::StatusOr<PageGrant> g = a.Grant(7);
    ASSERT_TRUE(g.ok());
    EXPECT_TRUE(seen.insert(g->page).second);
    EXPECT_TRUE(a.Owns(7, *g));
  }
  EXPECT_EQ(a.Grant(7).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(a.free_pages(), 0);
  EXPECT_EQ(a.used_pages(), 8);
  EXPECT_TRUE(a.CheckAccounting().ok());
}

TEST(PageAllocatorTest, GrantManyIsAllOrNothing) {
  PageAllocator a(4);
  std::vector<PageGrant> got;
  EXPECT_EQ(a.GrantMany(1, 5, &got).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(got.empty());
  EXPECT_EQ(a.free_pages(), 4);
  EXPECT_TRUE(a.GrantMany(1, 4, &got).ok());
  EXPECT_EQ(got.size(), 4u);
  EXPECT_TRUE(a.CheckAccounting().ok());
}

// Negative: a double release, a late release after reuse and a release by another session
// are refused and free nothing. Positive twin: the owner's first release succeeds.
TEST(PageAllocatorTest, StaleAndForeignReleasesAreRefused) {
  PageAllocator a(1);
  const PageGrant g1 = *a.Grant(1);
  EXPECT_EQ(a.Release(2, g1).code(), absl::StatusCode::kFailedPrecondition);  // foreign
  EXPECT_EQ(a.free_pages(), 0);
  EXPECT_TRUE(a.Release(1, g1).ok());                                         // the owner's release
  EXPECT_EQ(a.Release(1, g1).code(), absl::StatusCode::kFailedPrecondition);  // double
  const PageGrant g2 = *a.Grant(2);
  EXPECT_EQ(g2.page, g1.page);              // same physical page ...
  EXPECT_NE(g2.generation, g1.generation);  // ... new generation
  EXPECT_FALSE(a.Owns(1, g1));
  EXPECT_TRUE(a.Owns(2, g2));
  EXPECT_EQ(a.Release(1, g1).code(), absl::StatusCode::kFailedPrecondition);  // late, reused
  EXPECT_TRUE(a.Owns(2, g2));  // the new owner kept it
  EXPECT_EQ(a.Release(2, PageGrant{5, 1}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(a.CheckAccounting().ok());
}

TEST(PageAllocatorTest, GenerationsNeverRepeat) {
  PageAllocator a(1);
  std::set<uint64_t> gens;
  for (int i = 0; i < 100; ++i) {
    const PageGrant g = *a.Grant(1);
    EXPECT_TRUE(gens.insert(g.generation).second);
    ASSERT_TRUE(a.Release(1, g).ok());
  }
}

TEST(PageAllocatorTest, NoSessionIsRefused) {
  PageAllocator a(2);
  EXPECT_EQ(a.Grant(kNoSession).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(a.Grant(3).ok());
}

}  // namespace
}  // namespace kvguard::core
