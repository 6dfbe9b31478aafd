// Tests of the shared pages of isolation/ownership_table.h (prefix caching): publication, read
// grants, readers, cache domains, eviction under the epoch rule, and the violations each misuse
// gets. Every negative test has its positive twin: the same legitimate operation passes.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "isolation/ownership_table.h"
#include "isolation/tag_key.h"
#include "isolation/violation.h"
#include "kernels/formats.h"
#include "tests/isolation/verdict.h"

namespace kvguard::isolation {
namespace {

using kvguard::tests::Kind;

using kernels::LoadPageTag;
using kernels::PageTag;

constexpr Owner kA{1, 11};
constexpr Owner kA2{1, 12};  // another session of A's tenant
constexpr Owner kB{2, 22};
constexpr DomainId kDomainA = 101;       // tenant A's own cache domain
constexpr DomainId kDomainB = 102;       // tenant B's
constexpr DomainId kDomainPrefix = 900;  // an operator-declared prefix A and B may both read

const DomainId kReadableByA[] = {kDomainA, kDomainPrefix};
const DomainId kReadableByB[] = {kDomainB, kDomainPrefix};

class SharedPagesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<TagKeyRing>> ring = TagKeyRing::CreateEphemeral();
    ASSERT_TRUE(ring.ok()) << ring.status();
    ring_ = *std::move(ring);
    table_ = std::make_unique<OwnershipTable>(4, ring_.get(),
                                              [this](int32_t p) { scrubbed_.push_back(p); });
  }

  PageGrant MustGrant(const Owner& owner) {
    absl::StatusOr<PageGrant> g = table_->Grant(owner);
    EXPECT_TRUE(g.ok()) << g.status();
    return g.ok() ? *g : PageGrant{};
  }
  // MustPublish grants `owner` a page and publishes it into `domain`; returns the read grant.
  PageGrant MustPublish(const Owner& owner, DomainId domain) {
    const PageGrant mine = MustGrant(owner);
    absl::StatusOr<OwnershipTable::Published> p = table_->Publish(owner, mine, domain);
    EXPECT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(Kind(p.ok() ? p->violation : std::nullopt), "ok");
    return p.ok() ? p->read : PageGrant{};
  }
  std::string Verify(const Owner& owner, const PageGrant& grant,
                     std::span<const DomainId> readable) const {
    return Kind(table_->Verify(owner, std::span<const PageGrant>(&grant, 1), readable));
  }
  std::string Acquire(const Owner& owner, const PageGrant& entry,
                      std::span<const DomainId> readable) {
    return Kind(table_->AcquireRead(owner, entry, readable));
  }
  void ExpectAccountingOk() const { EXPECT_TRUE(table_->CheckAccounting().ok()); }

  std::unique_ptr<TagKeyRing> ring_;
  std::vector<int32_t> scrubbed_;
  std::unique_ptr<OwnershipTable> table_;
};

TEST_F(SharedPagesTest, PublishedPageIsReadOnlyDomainTaggedAndReadByItsPublisher) {
  const PageGrant mine = MustGrant(kA);
  absl::StatusOr<OwnershipTable::Published> p = table_->Publish(kA, mine, kDomainA);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_FALSE(p->violation.has_value());
  const PageGrant read = p->read;
  EXPECT_TRUE(read.shared);
  EXPECT_EQ(read.page, mine.page);
  EXPECT_EQ(read.generation, mine.generation + 1);  // the private grant died
  // The tag binds (page, generation, domain) with no session: never a private grant's tag.
  absl::StatusOr<PageTag> want = ring_->Derive(
      ring_->active_id(),
      TagInput{static_cast<uint64_t>(read.page), read.generation, kDomainA, kNoSession});
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(read.tag, *want);
  EXPECT_EQ(LoadPageTag(table_->tags(), read.page), read.tag);  // what the kernels check
  EXPECT_EQ(table_->state(read.page), PageState::kShared);
  EXPECT_EQ(table_->domain(read.page), kDomainA);
  EXPECT_EQ(table_->readers(read.page), 1);
  EXPECT_EQ(table_->shared_pages(), 1);
  EXPECT_EQ(Verify(kA, read, kReadableByA), "ok");
  // The old private grant no longer verifies, and nothing may write the page.
  EXPECT_EQ(Verify(kA, mine, kReadableByA), "stale_generation");
  EXPECT_EQ(Kind(table_->VerifyWritable(kA, read)), "write_into_shared_page");
  EXPECT_EQ(Kind(table_->VerifyWritable(kA, mine)), "write_into_shared_page");
  ExpectAccountingOk();
}

TEST_F(SharedPagesTest, PrivatePageIsWritable) {  // positive twin of the write checks above
  const PageGrant mine = MustGrant(kA);
  EXPECT_EQ(Kind(table_->VerifyWritable(kA, mine)), "ok");
  EXPECT_EQ(Kind(table_->VerifyWritable(kB, mine)), "wrong_owner");
}

TEST_F(SharedPagesTest, AnotherSessionOfTheDomainReadsAfterAcquiring) {
  const PageGrant read = MustPublish(kA, kDomainA);
  // Holding the entry is not enough: the session must be a reader.
  EXPECT_EQ(Verify(kA2, read, kReadableByA), "no_read_grant");
  EXPECT_EQ(Acquire(kA2, read, kReadableByA), "ok");
  EXPECT_EQ(Verify(kA2, read, kReadableByA), "ok");
  EXPECT_EQ(table_->readers(read.page), 2);
  EXPECT_EQ(Acquire(kA2, read, kReadableByA), "ok");  // again: still one read grant
  EXPECT_EQ(table_->readers(read.page), 2);
  ExpectAccountingOk();
}

TEST_F(SharedPagesTest, ForeignDomainIsRefusedOnAcquireAndOnVerify) {
  const PageGrant read = MustPublish(kA, kDomainA);
  EXPECT_EQ(Acquire(kB, read, kReadableByB), "foreign_domain_read");
  EXPECT_EQ(table_->readers(read.page), 1);
  EXPECT_EQ(Verify(kB, read, kReadableByB), "foreign_domain_read");
  // The publisher itself, asked with a readable set that lacks the domain (a policy change,
  // or a caller that forgot it), is refused the same way; no readable set reads nothing.
  EXPECT_EQ(Verify(kA, read, kReadableByB), "foreign_domain_read");
  EXPECT_EQ(Kind(table_->Verify(kA, std::span<const PageGrant>(&read, 1))), "foreign_domain_read");
}

TEST_F(SharedPagesTest, DeclaredPrefixDomainIsReadByEveryTenantAllowedIt) {  // positive twin
  const PageGrant read = MustPublish(kA, kDomainPrefix);
  EXPECT_EQ(Acquire(kB, read, kReadableByB), "ok");
  EXPECT_EQ(Verify(kB, read, kReadableByB), "ok");
  EXPECT_EQ(Verify(kA, read, kReadableByA), "ok");
  EXPECT_EQ(table_->readers(read.page), 2);
}

TEST_F(SharedPagesTest, ForgedReadGrantsAreRefused) {
  const PageGrant read = MustPublish(kA, kDomainA);
  PageGrant forged = read;
  forged.tag.hi ^= 1;
  EXPECT_EQ(Acquire(kA2, forged, kReadableByA), "tag_mismatch");
  EXPECT_EQ(Verify(kA, forged, kReadableByA), "tag_mismatch");
  forged = read;
  forged.generation += 1;
  EXPECT_EQ(Verify(kA, forged, kReadableByA), "read_after_eviction");
  forged = read;
  forged.shared = false;  // the read grant presented as a private one
  EXPECT_EQ(Verify(kA, forged, kReadableByA), "wrong_owner");
  EXPECT_EQ(Kind(table_->AcquireRead(kA2, forged, kReadableByA)), "no_read_grant");
  forged = read;
  forged.page = 99;
  EXPECT_EQ(Verify(kA, forged, kReadableByA), "invalid_page");
  EXPECT_EQ(Verify(kA, read, kReadableByA), "ok");  // the genuine one still passes
}

TEST_F(SharedPagesTest, ReaderCountCannotGoBelowTheReadersHeld) {
  const PageGrant read = MustPublish(kA, kDomainA);
  ASSERT_EQ(Acquire(kA2, read, kReadableByA), "ok");
  EXPECT_EQ(Kind(table_->ReleaseRead(kA2, read)), "ok");
  EXPECT_EQ(table_->readers(read.page), 1);
  // A second release by the same session is refused, not counted: kA still reads the page.
  EXPECT_EQ(Kind(table_->ReleaseRead(kA2, read)), "stale_release");
  EXPECT_EQ(Kind(table_->ReleaseRead(kB, read)), "stale_release");
  EXPECT_EQ(table_->readers(read.page), 1);
  EXPECT_EQ(Verify(kA, read, kReadableByA), "ok");
  EXPECT_EQ(Verify(kA2, read, kReadableByA), "no_read_grant");  // its grant ended
  ExpectAccountingOk();
}

TEST_F(SharedPagesTest, EvictionWaitsForEveryReader) {
  const PageGrant read = MustPublish(kA, kDomainA);
  ASSERT_EQ(Acquire(kA2, read, kReadableByA), "ok");
  EXPECT_EQ(table_->Evict(read, false).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_EQ(Kind(table_->ReleaseRead(kA, read)), "ok");
  EXPECT_EQ(table_->Evict(read, false).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Verify(kA2, read, kReadableByA), "ok");
  ASSERT_EQ(Kind(table_->ReleaseRead(kA2, read)), "ok");
  // Cached without readers: still shared, evictable now.
  EXPECT_EQ(table_->state(read.page), PageState::kShared);
  EXPECT_TRUE(table_->Evict(read, false).ok());
  EXPECT_EQ(table_->state(read.page), PageState::kFree);
  EXPECT_EQ(table_->shared_pages(), 0);
  EXPECT_EQ(LoadPageTag(table_->tags(), read.page), PageTag{});
  // Evicting twice, or through a stale entry, is refused.
  EXPECT_EQ(table_->Evict(read, false).code(), absl::StatusCode::kFailedPrecondition);
  ExpectAccountingOk();
}

TEST_F(SharedPagesTest, StaleCacheEntryAfterEvictionAndReuseIsRefused) {
  const PageGrant read = MustPublish(kA, kDomainA);
  ASSERT_EQ(Kind(table_->ReleaseRead(kA, read)), "ok");
  ASSERT_TRUE(table_->Evict(read, false).ok());
  // The page goes to tenant B; an index entry still pointing at it must not read B's KV.
  PageGrant b;
  for (int i = 0; i < 4; ++i) {
    b = MustGrant(kB);
    if (b.page == read.page) break;
  }
  ASSERT_EQ(b.page, read.page);
  EXPECT_EQ(Acquire(kA2, read, kReadableByA), "read_after_eviction");
  EXPECT_EQ(Verify(kA, read, kReadableByA), "read_after_eviction");
  EXPECT_EQ(Kind(table_->ReleaseRead(kA, read)), "stale_release");
  EXPECT_EQ(Kind(table_->Verify(kB, std::span<const PageGrant>(&b, 1))), "ok");
}

TEST_F(SharedPagesTest, EvictedPageWaitsOutPinnedStepsAndIsScrubbedOnRequest) {
  const PageGrant read = MustPublish(kA, kDomainA);
  ASSERT_EQ(Kind(table_->ReleaseRead(kA, read)), "ok");
  {
    OwnershipTable::StepPin pin = table_->PinStep();  // a step that verified before eviction
    ASSERT_TRUE(table_->Evict(read, true).ok());
    EXPECT_EQ(table_->state(read.page), PageState::kLimbo);
    EXPECT_TRUE(scrubbed_.empty());
    ExpectAccountingOk();
  }
  EXPECT_EQ(table_->state(read.page), PageState::kFree);
  EXPECT_EQ(scrubbed_, std::vector<int32_t>{read.page});
  ExpectAccountingOk();
}

TEST_F(SharedPagesTest, EvictionWithoutScrubFreesAtOnceWhenNoStepIsPinned) {  // positive twin
  const PageGrant read = MustPublish(kA, kDomainA);
  ASSERT_EQ(Kind(table_->ReleaseRead(kA, read)), "ok");
  ASSERT_TRUE(table_->Evict(read, false).ok());
  EXPECT_EQ(table_->state(read.page), PageState::kFree);
  EXPECT_TRUE(scrubbed_.empty());
}

TEST_F(SharedPagesTest, OnlyTheOwnersCurrentPrivatePageCanBePublished) {
  const PageGrant mine = MustGrant(kA);
  absl::StatusOr<OwnershipTable::Published> p = table_->Publish(kB, mine, kDomainB);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(Kind(p->violation), "wrong_owner");
  EXPECT_EQ(table_->state(mine.page), PageState::kOwned);
  EXPECT_EQ(table_->Publish(kA, mine, kNoDomain).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A quarantined page cannot be published.
  ASSERT_EQ(table_->QuarantineSession(kA), 1);
  p = table_->Publish(kA, mine, kDomainA);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(Kind(p->violation), "quarantined_page");
  // Nor a page under a copy.
  const PageGrant other = MustGrant(kA2);
  ASSERT_EQ(Kind(table_->BeginCopy(kA2, other)), "ok");
  EXPECT_EQ(table_->Publish(kA2, other, kDomainA).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_EQ(Kind(table_->EndCopy(kA2, other)), "ok");
  p = table_->Publish(kA2, other, kDomainA);  // after the copy it can
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(Kind(p->violation), "ok");
  // A read grant cannot be published again.
  EXPECT_EQ(table_->Publish(kA2, p->read, kDomainB).status().code(),
            absl::StatusCode::kInvalidArgument);
  ExpectAccountingOk();
}

TEST_F(SharedPagesTest, QuarantineLeavesSharedPagesToTheirOtherReaders) {
  const PageGrant read = MustPublish(kA, kDomainA);
  ASSERT_EQ(Acquire(kA2, read, kReadableByA), "ok");
  EXPECT_EQ(table_->QuarantineSession(kA), 0);
  EXPECT_EQ(Verify(kA2, read, kReadableByA), "ok");
}

TEST_F(SharedPagesTest, SharedPagesHoldTheirKeyUntilEvicted) {
  const PageGrant read = MustPublish(kA, kDomainA);
  const KeyId old_key = ring_->active_id();
  ASSERT_TRUE(ring_->Rotate().ok());
  EXPECT_EQ(table_->pages_under_key(old_key), 1);
  EXPECT_EQ(table_->RetireKey(ring_.get(), old_key).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_EQ(Kind(table_->ReleaseRead(kA, read)), "ok");
  ASSERT_TRUE(table_->Evict(read, false).ok());
  EXPECT_TRUE(table_->RetireKey(ring_.get(), old_key).ok());
}

}  // namespace
}  // namespace kvguard::isolation
