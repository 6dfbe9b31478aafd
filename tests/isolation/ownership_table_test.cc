// Tests of isolation/ownership_table.h: grants and releases, generations, byte-flipped grants,
// release rules, the epoch rule, quarantine, copy pins, each TableFaults fault caught, and
// shared pages (publication, read grants, readers, cache domains, eviction).
// Every negative test has its positive twin: the same legitimate operation passes.
#include "isolation/ownership_table.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

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
constexpr Owner kC{3, 33};

std::unique_ptr<TagKeyRing> NewRing() {
  absl::StatusOr<std::unique_ptr<TagKeyRing>> ring = TagKeyRing::CreateEphemeral();
  EXPECT_TRUE(ring.ok()) << ring.status();
  return ring.ok() ? *std::move(ring) : nullptr;
}

// FlipByte returns `v` with byte `i` of its object representation XORed with 0x42.
template <typename T>
T FlipByte(T v, size_t i) {
  unsigned char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));
  bytes[i] ^= 0x42;
  std::memcpy(&v, bytes, sizeof(T));
  return v;
}

bool IsZero(const PageTag& t) { return t.lo == 0 && t.hi == 0; }

class OwnershipTableTest : public ::testing::Test {
 protected:
  void Make(int pages) {
    table_ = std::make_unique<OwnershipTable>(pages, ring_.get(),
                                              [this](int32_t p) { scrubbed_.push_back(p); });
  }

  std::string Verify(const Owner& owner, const PageGrant& grant) const {
    return Kind(table_->Verify(owner, std::span<const PageGrant>(&grant, 1)));
  }
  std::string Release(const Owner& owner, const PageGrant& grant, bool scrub = false) {
    return Kind(table_->Release(owner, grant, scrub));
  }
  PageGrant MustGrant(const Owner& owner) {
    absl::StatusOr<PageGrant> g = table_->Grant(owner);
    EXPECT_TRUE(g.ok()) << g.status();
    return g.ok() ? *g : PageGrant{};
  }
  PageTag Derive(const PageGrant& g, const Owner& owner) const {
    absl::StatusOr<PageTag> t = ring_->Derive(
        ring_->active_id(),
        TagInput{static_cast<uint64_t>(g.page), g.generation, owner.tenant, owner.session});
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? *t : PageTag{};
  }
  PageTag TagOf(int32_t page) const { return LoadPageTag(table_->tags(), page); }
  void ExpectAccountingOk() const { EXPECT_TRUE(table_->CheckAccounting().ok()); }

  std::unique_ptr<TagKeyRing> ring_ = NewRing();
  std::vector<int32_t> scrubbed_;  // pages the scrub callback zeroed, in order
  std::unique_ptr<OwnershipTable> table_;
};

// ---- Grants and releases ------------------------------------------------------------------

TEST_F(OwnershipTableTest, GrantsEveryPageOnceThenResourceExhausted) {
  Make(8);
  std::set<int32_t> pages;
  std::vector<PageGrant> grants;
  for (int i = 0; i < 8; ++i) {
    const PageGrant g = MustGrant(i % 2 ? kA : kB);
    EXPECT_TRUE(pages.insert(g.page).second) << "page " << g.page << " granted twice";
    EXPECT_EQ(table_->state(g.page), PageState::kOwned);
    EXPECT_EQ(g.tag, Derive(g, i % 2 ? kA : kB));
    grants.push_back(g);
    ExpectAccountingOk();
  }
  EXPECT_EQ(pages, (std::set<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(table_->free_pages(), 0);
  EXPECT_EQ(table_->used_pages(), 8);
  EXPECT_EQ(table_->Grant(kC).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(table_->free_pages(), 0);
  ExpectAccountingOk();

  // Twin: once one page comes back, the same grant succeeds, with that page.
  ASSERT_EQ(Release(kB, grants[0]), "ok");
  const PageGrant again = MustGrant(kC);
  EXPECT_EQ(again.page, grants[0].page);
  EXPECT_EQ(Verify(kC, again), "ok");
  ExpectAccountingOk();
}

TEST_F(OwnershipTableTest, GrantManyIsAllOrNothing) {
  Make(6);
  const PageGrant sentinel{-7, 99, PageTag{1, 2}};
  std::vector<PageGrant> out{sentinel};
  ASSERT_TRUE(table_->GrantMany(kA, 4, &out).ok());
  ASSERT_EQ(out.size(), 5u);
  EXPECT_EQ(out[0], sentinel);
  EXPECT_EQ(Kind(table_->Verify(kA, std::span<const PageGrant>(out).subspan(1))), "ok");

  // Three wanted, two free: none granted, `out` untouched.
  EXPECT_EQ(table_->GrantMany(kB, 3, &out).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(out.size(), 5u);
  EXPECT_EQ(table_->free_pages(), 2);
  ExpectAccountingOk();

  // Bad owner or count: InvalidArgument, nothing granted.
  EXPECT_EQ(table_->GrantMany(Owner{2, kNoSession}, 1, &out).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(table_->GrantMany(kB, -1, &out).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(table_->Grant(Owner{2, kNoSession}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out.size(), 5u);
  EXPECT_EQ(table_->free_pages(), 2);

  // Twin: exactly what is free is granted; zero pages is a no-op.
  ASSERT_TRUE(table_->GrantMany(kB, 0, &out).ok());
  EXPECT_EQ(out.size(), 5u);
  ASSERT_TRUE(table_->GrantMany(kB, 2, &out).ok());
  ASSERT_EQ(out.size(), 7u);
  EXPECT_EQ(Kind(table_->Verify(kB, std::span<const PageGrant>(out).subspan(5))), "ok");
  EXPECT_EQ(table_->free_pages(), 0);
  ExpectAccountingOk();
}

TEST_F(OwnershipTableTest, GenerationsStrictlyIncreaseAndTagsNeverRepeat) {
  Make(3);
  const Owner owners[] = {kA, kA2, kB, kC};
  std::mt19937 rng(1234);
  std::map<int32_t, uint64_t> last_generation;  // per page, the newest generation seen
  std::set<std::pair<uint64_t, uint64_t>> tags_seen;
  std::vector<std::pair<Owner, PageGrant>> live;
  for (int step = 0; step < 600; ++step) {
    const bool grant = live.empty() || (live.size() < 3 && rng() % 2 == 0);
    if (grant) {
      const Owner& o = owners[rng() % 4];
      const PageGrant g = MustGrant(o);
      auto it = last_generation.find(g.page);
      if (it != last_generation.end()) {
        // A release moved it on once and this grant once more: never reused, never back.
        EXPECT_GT(g.generation, it->second) << "page " << g.page;
      }
      last_generation[g.page] = g.generation;
      EXPECT_TRUE(tags_seen.insert({g.tag.lo, g.tag.hi}).second)
          << "tag repeated at page " << g.page << " generation " << g.generation;
      live.push_back({o, g});
    } else {
      const size_t i = rng() % live.size();
      ASSERT_EQ(Release(live[i].first, live[i].second), "ok");
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    }
    ExpectAccountingOk();
  }
  EXPECT_GE(tags_seen.size(), 300u);
}

TEST_F(OwnershipTableTest, TagsDifferAcrossGenerationsSessionsAndTenants) {
  Make(1);
  // The same page granted in turn to A, A again, A's tenant's other session, and B.
  std::vector<PageGrant> grants;
  for (const Owner& o : {kA, kA, kA2, kB}) {
    const PageGrant g = MustGrant(o);
    EXPECT_EQ(g.page, 0);
    EXPECT_EQ(g.tag, Derive(g, o));
    grants.push_back(g);
    ASSERT_EQ(Release(o, g), "ok");
  }
  for (size_t i = 0; i < grants.size(); ++i) {
    for (size_t j = i + 1; j < grants.size(); ++j) {
      EXPECT_NE(grants[i].generation, grants[j].generation);
      EXPECT_NE(grants[i].tag, grants[j].tag) << i << " vs " << j;
    }
  }
  // At one (page, generation), every field of the owner changes the tag.
  const PageGrant& g = grants[0];
  EXPECT_NE(Derive(g, kA), Derive(g, kA2));
  EXPECT_NE(Derive(g, kA), Derive(g, kB));
  EXPECT_NE(Derive(g, kA), Derive(g, Owner{kB.tenant, kA.session}));
  EXPECT_EQ(Derive(g, kA), Derive(g, kA));  // twin: deterministic
}

TEST_F(OwnershipTableTest, TagArrayIsZeroForFreePagesAndTheGrantTagForOwnedPages) {
  Make(4);
  std::map<int32_t, PageTag> owned;
  auto check = [&] {
    for (int32_t p = 0; p < 4; ++p) {
      auto it = owned.find(p);
      if (it == owned.end()) {
        EXPECT_TRUE(IsZero(TagOf(p))) << "page " << p;
        EXPECT_NE(table_->state(p), PageState::kOwned);
      } else {
        EXPECT_EQ(TagOf(p), it->second) << "page " << p;
        EXPECT_FALSE(IsZero(TagOf(p)));
      }
    }
    ExpectAccountingOk();
  };
  check();
  const PageGrant a = MustGrant(kA);
  owned[a.page] = a.tag;
  check();
  const PageGrant b = MustGrant(kB);
  owned[b.page] = b.tag;
  check();
  ASSERT_EQ(Release(kA, a), "ok");
  owned.erase(a.page);
  check();
  const PageGrant c = MustGrant(kC);  // most likely a's page again, at a new generation
  owned[c.page] = c.tag;
  check();
  EXPECT_NE(c.tag, a.tag);
}

// ---- Byte flips: every byte of every field of a grant is protected ------------------------

TEST_F(OwnershipTableTest, FlippingAnyTagByteIsTagMismatch) {
  Make(4);
  MustGrant(kB);
  const PageGrant g = MustGrant(kA);
  ASSERT_EQ(Verify(kA, g), "ok");
  for (size_t i = 0; i < sizeof(PageTag); ++i) {
    PageGrant bad = g;
    bad.tag = FlipByte(g.tag, i);
    EXPECT_EQ(Verify(kA, bad), "tag_mismatch") << "tag byte " << i;
  }
  EXPECT_EQ(Verify(kA, g), "ok");  // twin, and the flips changed nothing
  ExpectAccountingOk();
}

TEST_F(OwnershipTableTest, FlippingAnyGenerationByteIsStaleGeneration) {
  Make(4);
  const PageGrant g = MustGrant(kA);
  ASSERT_EQ(Verify(kA, g), "ok");
  for (size_t i = 0; i < sizeof(g.generation); ++i) {
    PageGrant bad = g;
    bad.generation = FlipByte(g.generation, i);
    // Owner matches, generation does not: the only kind the table gives is stale_generation.
    EXPECT_EQ(Verify(kA, bad), "stale_generation") << "generation byte " << i;
  }
  EXPECT_EQ(Verify(kA, g), "ok");
}

TEST_F(OwnershipTableTest, FlippingAnyOwnerByteIsWrongOwner) {
  Make(4);
  const PageGrant g = MustGrant(kA);
  ASSERT_EQ(Verify(kA, g), "ok");
  for (size_t i = 0; i < sizeof(TenantId); ++i) {
    const Owner forged{FlipByte(kA.tenant, i), kA.session};
    EXPECT_EQ(Verify(forged, g), "wrong_owner") << "tenant byte " << i;
    // A tag made for the forged owner does not pass as the real owner's either.
    PageGrant reforged = g;
    reforged.tag = Derive(g, forged);
    EXPECT_EQ(Verify(kA, reforged), "tag_mismatch") << "tenant byte " << i;
  }
  for (size_t i = 0; i < sizeof(SessionId); ++i) {
    const Owner forged{kA.tenant, FlipByte(kA.session, i)};
    EXPECT_EQ(Verify(forged, g), "wrong_owner") << "session byte " << i;
    PageGrant reforged = g;
    reforged.tag = Derive(g, forged);
    EXPECT_EQ(Verify(kA, reforged), "tag_mismatch") << "session byte " << i;
  }
  EXPECT_EQ(Verify(kA, g), "ok");
  EXPECT_EQ(Derive(g, kA), g.tag);
}

TEST_F(OwnershipTableTest, AnyOtherPageIdIsDetected) {
  Make(8);
  std::vector<PageGrant> mine;
  for (int i = 0; i < 3; ++i) mine.push_back(MustGrant(kA));
  for (int i = 0; i < 3; ++i) MustGrant(kB);
  const PageGrant g = mine[0];
  // Every byte of the page id flipped lands outside an 8-page pool.
  for (size_t i = 0; i < sizeof(g.page); ++i) {
    PageGrant bad = g;
    bad.page = FlipByte(g.page, i);
    EXPECT_EQ(Verify(kA, bad), "invalid_page") << "page byte " << i;
  }
  // Every other page in range: owned by me (another tag), by B, or free.
  for (int32_t q = 0; q < 8; ++q) {
    if (q == g.page) continue;
    PageGrant bad = g;
    bad.page = q;
    EXPECT_NE(Verify(kA, bad), "ok") << "page " << q;
  }
  EXPECT_EQ(Kind(table_->Verify(kA, mine)), "ok");
}

TEST_F(OwnershipTableTest, TagFromAnotherKeyIsTagMismatch) {
  Make(2);
  const PageGrant g = MustGrant(kA);
  std::unique_ptr<TagKeyRing> other = NewRing();
  ASSERT_NE(other, nullptr);
  const TagInput in{static_cast<uint64_t>(g.page), g.generation, kA.tenant, kA.session};
  absl::StatusOr<PageTag> foreign = other->Derive(other->active_id(), in);
  ASSERT_TRUE(foreign.ok());
  EXPECT_EQ(Verify(kA, PageGrant{g.page, g.generation, *foreign}), "tag_mismatch");
  // Twin: the table's own ring derives the very tag that verifies.
  absl::StatusOr<PageTag> own = ring_->Derive(ring_->active_id(), in);
  ASSERT_TRUE(own.ok());
  EXPECT_EQ(Verify(kA, PageGrant{g.page, g.generation, *own}), "ok");
}

TEST_F(OwnershipTableTest, VerifyReportsTheFirstBadEntryOfAPageTable) {
  Make(4);
  std::vector<PageGrant> grants;
  ASSERT_TRUE(table_->GrantMany(kA, 3, &grants).ok());
  ASSERT_FALSE(table_->Verify(kA, grants).has_value());
  grants[2].tag = FlipByte(grants[2].tag, 5);
  std::optional<Violation> v = table_->Verify(kA, grants);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->kind, ViolationKind::kTagMismatch);
  EXPECT_EQ(v->page_index, 2);
  EXPECT_EQ(v->page, grants[2].page);
  EXPECT_EQ(v->requester, kA);
}

// ---- Release rules ------------------------------------------------------------------------

TEST_F(OwnershipTableTest, DoubleReleaseIsStaleAndFreesNothing) {
  Make(3);
  const PageGrant g = MustGrant(kA);
  ASSERT_EQ(Release(kA, g), "ok");  // twin: the first release is fine
  const int free_before = table_->free_pages();
  EXPECT_EQ(Release(kA, g), "stale_release");
  EXPECT_EQ(Release(kA, g, /*scrub=*/true), "stale_release");
  EXPECT_EQ(table_->free_pages(), free_before);
  EXPECT_EQ(table_->limbo_pages(), 0);
  EXPECT_TRUE(scrubbed_.empty());
  ExpectAccountingOk();
}

TEST_F(OwnershipTableTest, LateReleaseAfterRegrantIsRefused) {
  Make(1);
  const PageGrant a = MustGrant(kA);
  ASSERT_EQ(Release(kA, a), "ok");
  const PageGrant b = MustGrant(kB);
  ASSERT_EQ(b.page, a.page);
  EXPECT_EQ(Release(kA, a), "stale_release");
  EXPECT_EQ(table_->state(b.page), PageState::kOwned);
  EXPECT_EQ(Verify(kB, b), "ok");
  EXPECT_EQ(TagOf(b.page), b.tag);
  ExpectAccountingOk();
  EXPECT_EQ(Release(kB, b), "ok");  // twin: the rightful owner's release
  EXPECT_EQ(table_->free_pages(), 1);
}

TEST_F(OwnershipTableTest, ReleaseByWrongOwnerIsRefused) {
  Make(2);
  const PageGrant a = MustGrant(kA);
  for (const Owner& o : {kB, kA2, Owner{kB.tenant, kA.session}, Owner{kA.tenant, kB.session}}) {
    EXPECT_EQ(Release(o, a), "wrong_owner") << o.tenant << "/" << o.session;
  }
  PageGrant forged = a;
  forged.tag = FlipByte(a.tag, 0);
  EXPECT_EQ(Release(kA, forged), "tag_mismatch");
  EXPECT_EQ(Verify(kA, a), "ok");
  EXPECT_EQ(table_->free_pages(), 1);
  ExpectAccountingOk();
  EXPECT_EQ(Release(kA, a), "ok");  // twin
  EXPECT_EQ(table_->free_pages(), 2);
}

// A refused release keeps its reason: a current grant presented by another session is an
// attempt on someone else's page (wrong_owner), or with another tag a forgery (tag_mismatch);
// only a grant that is no longer current is a stale_release. (Regression: Release once
// rewrote every refusal to stale_release, so the audit log mislabelled cross-session releases.)
TEST_F(OwnershipTableTest, RefusedReleaseOfACurrentGrantKeepsItsReason) {
  Make(2);
  const PageGrant a = MustGrant(kA);
  EXPECT_EQ(Release(kB, a), "wrong_owner");
  EXPECT_EQ(Release(kA2, a), "wrong_owner");
  EXPECT_EQ(Release(kA, PageGrant{a.page, a.generation, FlipByte(a.tag, 9)}), "tag_mismatch");
  EXPECT_EQ(table_->state(a.page), PageState::kOwned);
  // Twin: a really stale grant is stale_release.
  ASSERT_EQ(Release(kA, a), "ok");
  EXPECT_EQ(Release(kA, a), "stale_release");
}

TEST_F(OwnershipTableTest, ReleaseOfAnInvalidPageIsInvalidPage) {
  Make(2);
  const PageGrant a = MustGrant(kA);
  for (int32_t p : {-1, 2, 1 << 30}) {
    PageGrant bad = a;
    bad.page = p;
    EXPECT_EQ(Release(kA, bad), "invalid_page") << p;
    EXPECT_EQ(Verify(kA, bad), "invalid_page") << p;
  }
  EXPECT_EQ(Release(kA, a), "ok");
  ExpectAccountingOk();
}

// ---- The epoch rule -----------------------------------------------------------------------

TEST_F(OwnershipTableTest, PageReleasedDuringAPinnedStepWaitsInLimbo) {
  Make(2);
  const PageGrant a = MustGrant(kA);
  {
    OwnershipTable::StepPin pin = table_->PinStep();
    ASSERT_EQ(Verify(kA, a), "ok");
    ASSERT_EQ(Release(kA, a), "ok");
    EXPECT_EQ(table_->state(a.page), PageState::kLimbo);
    EXPECT_TRUE(IsZero(TagOf(a.page)));
    EXPECT_EQ(table_->limbo_pages(), 1);
    EXPECT_EQ(table_->free_pages(), 1);
    EXPECT_NE(Verify(kA, a), "ok");
    ExpectAccountingOk();
    // The next grant gets the other page; then there is none.
    const PageGrant b = MustGrant(kB);
    EXPECT_NE(b.page, a.page);
    EXPECT_EQ(table_->Grant(kC).status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_EQ(table_->state(a.page), PageState::kLimbo);
  }
  // Twin: once the step is over the page is free and grantable.
  EXPECT_EQ(table_->state(a.page), PageState::kFree);
  EXPECT_EQ(table_->limbo_pages(), 0);
  const PageGrant c = MustGrant(kC);
  EXPECT_EQ(c.page, a.page);
  EXPECT_EQ(Verify(kC, c), "ok");
  ExpectAccountingOk();
}

TEST_F(OwnershipTableTest, OnlyPageInLimboIsNotGrantable) {
  Make(1);
  const PageGrant a = MustGrant(kA);
  OwnershipTable::StepPin pin = table_->PinStep();
  ASSERT_EQ(Release(kA, a), "ok");
  EXPECT_EQ(table_->Grant(kB).status().code(), absl::StatusCode::kResourceExhausted);
  pin = OwnershipTable::StepPin();  // unpins
  EXPECT_TRUE(table_->Grant(kB).ok());
}

TEST_F(OwnershipTableTest, PinTakenAfterTheReleaseDoesNotBlockReclaim) {
  Make(1);
  const PageGrant a = MustGrant(kA);
  auto before = std::make_unique<OwnershipTable::StepPin>(table_->PinStep());
  ASSERT_EQ(Release(kA, a), "ok");
  OwnershipTable::StepPin after = table_->PinStep();  // could never have verified `a`
  EXPECT_EQ(table_->state(a.page), PageState::kLimbo);
  before.reset();
  EXPECT_EQ(table_->state(a.page), PageState::kFree);
  EXPECT_TRUE(table_->Grant(kB).ok());
  ExpectAccountingOk();
}

TEST_F(OwnershipTableTest, EveryPinTakenBeforeTheReleaseBlocksReclaim) {
  // Twin of the above: two steps that started before the release both hold the page.
  Make(1);
  const PageGrant a = MustGrant(kA);
  auto first = std::make_unique<OwnershipTable::StepPin>(table_->PinStep());
  auto second = std::make_unique<OwnershipTable::StepPin>(table_->PinStep());
  ASSERT_EQ(Release(kA, a), "ok");
  first.reset();
  EXPECT_EQ(table_->state(a.page), PageState::kLimbo);
  EXPECT_FALSE(table_->Grant(kB).ok());
  second.reset();
  EXPECT_EQ(table_->state(a.page), PageState::kFree);
  EXPECT_TRUE(table_->Grant(kB).ok());
}

TEST_F(OwnershipTableTest, MovedPinKeepsPinning) {
  Make(1);
  const PageGrant a = MustGrant(kA);
  OwnershipTable::StepPin outer;
  {
    OwnershipTable::StepPin inner = table_->PinStep();
    ASSERT_EQ(Release(kA, a), "ok");
    outer = std::move(inner);
  }  // the moved-from pin unpins nothing
  EXPECT_EQ(table_->state(a.page), PageState::kLimbo);
  OwnershipTable::StepPin moved(std::move(outer));
  EXPECT_EQ(table_->state(a.page), PageState::kLimbo);
  moved = table_->PinStep();  // assigning over a pin ends the old one
  EXPECT_EQ(table_->state(a.page), PageState::kFree);
}

TEST_F(OwnershipTableTest, ScrubRunsOnceOnlyForScrubReleasesAndOnlyAfterPinsDrain) {
  Make(3);
  const PageGrant s = MustGrant(kA);
  const PageGrant n = MustGrant(kA);
  {
    OwnershipTable::StepPin pin = table_->PinStep();
    ASSERT_EQ(Release(kA, s, /*scrub=*/true), "ok");
    ASSERT_EQ(Release(kA, n, /*scrub=*/false), "ok");
    EXPECT_TRUE(scrubbed_.empty()) << "scrubbed while a step may still read the page";
  }
  EXPECT_EQ(scrubbed_, std::vector<int32_t>{s.page});
  // Reuse without scrub, and further pins and releases, never scrub again.
  const PageGrant again = MustGrant(kB);
  ASSERT_EQ(again.page, n.page);  // LIFO: the last page reclaimed
  { OwnershipTable::StepPin pin = table_->PinStep(); }
  ASSERT_EQ(Release(kB, again, /*scrub=*/false), "ok");
  EXPECT_EQ(scrubbed_, std::vector<int32_t>{s.page});
  // Without a pin, a scrub release scrubs at once.
  const PageGrant t = MustGrant(kC);
  ASSERT_EQ(Release(kC, t, /*scrub=*/true), "ok");
  EXPECT_EQ(scrubbed_, (std::vector<int32_t>{s.page, t.page}));
  ExpectAccountingOk();
}

// ---- Quarantine ---------------------------------------------------------------------------

TEST_F(OwnershipTableTest, QuarantinedPagesFailVerifyAndAreScrubbedBeforeReuse) {
  Make(3);
  const PageGrant a1 = MustGrant(kA);
  const PageGrant a2 = MustGrant(kA);
  const PageGrant b = MustGrant(kB);
  EXPECT_EQ(table_->QuarantineSession(kC), 0);
  EXPECT_EQ(table_->QuarantineSession(kA), 2);
  for (const PageGrant& g : {a1, a2}) {
    EXPECT_EQ(Verify(kA, g), "quarantined_page");
    EXPECT_EQ(table_->state(g.page), PageState::kQuarantined);
    EXPECT_TRUE(IsZero(TagOf(g.page)));
  }
  EXPECT_EQ(table_->used_pages(), 3);
  // Twin: another session's pages are untouched.
  EXPECT_EQ(Verify(kB, b), "ok");
  EXPECT_EQ(TagOf(b.page), b.tag);
  ExpectAccountingOk();
  // Quarantine does not transfer the page: others still cannot use it.
  EXPECT_EQ(Verify(kB, a1), "wrong_owner");
  EXPECT_EQ(Release(kB, a1), "wrong_owner");
  // The session can still release; the pages are zeroed before anyone gets them.
  EXPECT_EQ(Release(kA, a1, /*scrub=*/false), "ok");
  EXPECT_EQ(Release(kA, a2, /*scrub=*/false), "ok");
  EXPECT_EQ(scrubbed_, (std::vector<int32_t>{a1.page, a2.page}));
  const PageGrant c = MustGrant(kC);
  EXPECT_TRUE(c.page == a1.page || c.page == a2.page);
  EXPECT_EQ(Verify(kC, c), "ok");
  ExpectAccountingOk();
}

TEST_F(OwnershipTableTest, QuarantinedPageReleasedDuringAStepIsScrubbedAfterIt) {
  Make(1);
  const PageGrant a = MustGrant(kA);
  ASSERT_EQ(table_->QuarantineSession(kA), 1);
  {
    OwnershipTable::StepPin pin = table_->PinStep();
    ASSERT_EQ(Release(kA, a), "ok");
    EXPECT_TRUE(scrubbed_.empty());
    EXPECT_FALSE(table_->Grant(kB).ok());
  }
  EXPECT_EQ(scrubbed_, std::vector<int32_t>{a.page});
  EXPECT_TRUE(table_->Grant(kB).ok());
}

// ---- Copy pins ----------------------------------------------------------------------------

TEST_F(OwnershipTableTest, CopyKeepsAReleasedPageInLimboUntilEndCopy) {
  Make(1);
  const PageGrant a = MustGrant(kA);
  ASSERT_EQ(Kind(table_->BeginCopy(kA, a)), "ok");
  EXPECT_EQ(Verify(kA, a), "ok");  // one's own copy is no violation
  ASSERT_EQ(Release(kA, a, /*scrub=*/true), "ok");
  EXPECT_EQ(table_->state(a.page), PageState::kLimbo);
  EXPECT_EQ(table_->Grant(kB).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(scrubbed_.empty());
  ExpectAccountingOk();
  // The copy ends after its page was released: the copier learns its data is stale.
  EXPECT_EQ(Kind(table_->EndCopy(kA, a)), "stale_generation");
  EXPECT_EQ(table_->state(a.page), PageState::kFree);
  EXPECT_EQ(scrubbed_, std::vector<int32_t>{a.page});
  const PageGrant b = MustGrant(kB);
  EXPECT_EQ(Verify(kB, b), "ok");
  ExpectAccountingOk();
}

TEST_F(OwnershipTableTest, CopyThatEndsOnAnUnchangedPageIsFine) {
  // Twin of the above.
  Make(1);
  const PageGrant a = MustGrant(kA);
  ASSERT_EQ(Kind(table_->BeginCopy(kA, a)), "ok");
  ASSERT_EQ(Kind(table_->BeginCopy(kA, a)), "ok");
  EXPECT_EQ(Kind(table_->EndCopy(kA, a)), "ok");
  EXPECT_EQ(Kind(table_->EndCopy(kA, a)), "ok");
  EXPECT_EQ(Verify(kA, a), "ok");
  ASSERT_EQ(Release(kA, a), "ok");
  EXPECT_EQ(table_->state(a.page), PageState::kFree);  // no copy left to wait for
}

TEST_F(OwnershipTableTest, CopyAndPinBothHoldTheReleasedPage) {
  Make(1);
  const PageGrant a = MustGrant(kA);
  ASSERT_EQ(Kind(table_->BeginCopy(kA, a)), "ok");
  {
    OwnershipTable::StepPin pin = table_->PinStep();
    ASSERT_EQ(Release(kA, a), "ok");
    EXPECT_EQ(Kind(table_->EndCopy(kA, a)), "stale_generation");
    EXPECT_EQ(table_->state(a.page), PageState::kLimbo);  // the pin still holds it
  }
  EXPECT_EQ(table_->state(a.page), PageState::kFree);
}

TEST_F(OwnershipTableTest, BeginCopyWithAStaleOrForgedGrantIsRefused) {
  Make(1);
  const PageGrant a = MustGrant(kA);
  ASSERT_EQ(Release(kA, a), "ok");
  EXPECT_EQ(Kind(table_->BeginCopy(kA, a)), "stale_generation");  // free page
  const PageGrant b = MustGrant(kB);
  ASSERT_EQ(b.page, a.page);
  EXPECT_EQ(Kind(table_->BeginCopy(kA, a)), "stale_generation");  // now B's page
  EXPECT_EQ(Kind(table_->BeginCopy(kA, b)), "wrong_owner");       // B's grant, A asking
  PageGrant forged = b;
  forged.tag = FlipByte(b.tag, 3);
  EXPECT_EQ(Kind(table_->BeginCopy(kB, forged)), "tag_mismatch");
  // None of the refused copies was marked: B's page has no foreign copy in flight, and B's
  // release frees it at once.
  EXPECT_EQ(Verify(kB, b), "ok");
  // Twin: B's own copy is accepted.
  EXPECT_EQ(Kind(table_->BeginCopy(kB, b)), "ok");
  EXPECT_EQ(Kind(table_->EndCopy(kB, b)), "ok");
  ASSERT_EQ(Release(kB, b), "ok");
  EXPECT_EQ(table_->state(b.page), PageState::kFree);
  ExpectAccountingOk();
}

TEST_F(OwnershipTableTest, BeginCopyOfAQuarantinedPageIsRefused) {
  Make(1);
  const PageGrant a = MustGrant(kA);
  ASSERT_EQ(table_->QuarantineSession(kA), 1);
  EXPECT_EQ(Kind(table_->BeginCopy(kA, a)), "quarantined_page");
  ASSERT_EQ(Release(kA, a), "ok");
  EXPECT_EQ(table_->state(a.page), PageState::kFree);  // no copy was marked
}

// ---- TableFaults: each misbehaviour is caught before a wrong byte is read ------------------

TEST_F(OwnershipTableTest, SkippedGenerationBumpStillFailsTheOldOwner) {
  Make(1);
  table_->set_faults(TableFaults{.skip_generation_bump = true});
  const PageGrant a = MustGrant(kA);
  ASSERT_EQ(Release(kA, a), "ok");
  const PageGrant b = MustGrant(kB);
  ASSERT_EQ(b.page, a.page);
  ASSERT_EQ(b.generation, a.generation) << "the fault did not fire";
  // Same page, same generation: owner and tag still tell A's grant from B's.
  EXPECT_EQ(Verify(kA, a), "wrong_owner");
  EXPECT_EQ(Verify(kB, PageGrant{a.page, a.generation, a.tag}), "tag_mismatch");
  EXPECT_NE(a.tag, b.tag);
  EXPECT_NE(TagOf(a.page), a.tag);
  EXPECT_EQ(Verify(kB, b), "ok");
}

TEST_F(OwnershipTableTest, SkippedGenerationBumpTwinWithoutFault) {
  Make(1);
  const PageGrant a = MustGrant(kA);
  ASSERT_EQ(Release(kA, a), "ok");
  const PageGrant b = MustGrant(kB);
  ASSERT_EQ(b.page, a.page);
  EXPECT_EQ(b.generation, a.generation + 2);
  EXPECT_EQ(Verify(kA, a), "stale_generation");
  EXPECT_EQ(Verify(kB, b), "ok");
}

// Documents what only the generation protects: without the bump, a session's own stale grant
// comes back to life when the same page is granted to the same session again (P2 leans on the
// generation alone there). Not a table bug: the fault removes the bump on purpose.
TEST_F(OwnershipTableTest, SkippedGenerationBumpRevivesTheSameSessionsStaleGrant) {
  Make(1);
  table_->set_faults(TableFaults{.skip_generation_bump = true});
  const PageGrant old = MustGrant(kA);
  ASSERT_EQ(Release(kA, old), "ok");
  const PageGrant renewed = MustGrant(kA);
  EXPECT_EQ(renewed, old);
  EXPECT_EQ(Verify(kA, old), "ok");
  // Twin: with the bump, the old grant is dead.
  table_->set_faults(TableFaults{});
  ASSERT_EQ(Release(kA, renewed), "ok");
  const PageGrant fresh = MustGrant(kA);
  EXPECT_EQ(Verify(kA, old), "stale_generation");
  EXPECT_EQ(Verify(kA, fresh), "ok");
}

TEST_F(OwnershipTableTest, GrantOfAnOwnedPageFailsTheOwnerBeforeAnyRead) {
  Make(2);
  const PageGrant a = MustGrant(kA);
  table_->set_faults(TableFaults{.grant_owned_page = true});
  const PageGrant b = MustGrant(kB);
  ASSERT_EQ(b.page, a.page) << "the fault did not fire";
  EXPECT_NE(Verify(kA, a), "ok");
  EXPECT_EQ(Verify(kA, a), "stale_generation");
  EXPECT_NE(TagOf(a.page), a.tag);  // the kernels' check fails too
  EXPECT_EQ(Verify(kB, b), "ok");
}

TEST_F(OwnershipTableTest, GrantOfAnOwnedPageTwinWithoutFault) {
  Make(2);
  const PageGrant a = MustGrant(kA);
  const PageGrant b = MustGrant(kB);
  EXPECT_NE(b.page, a.page);
  EXPECT_EQ(Verify(kA, a), "ok");
  EXPECT_EQ(TagOf(a.page), a.tag);
  EXPECT_EQ(Verify(kB, b), "ok");
}

TEST_F(OwnershipTableTest, AcceptedDoubleReleaseBreaksAccounting) {
  Make(2);
  table_->set_faults(TableFaults{.accept_stale_release = true});
  const PageGrant a = MustGrant(kA);
  ASSERT_EQ(Release(kA, a), "ok");
  ASSERT_EQ(Release(kA, a), "ok") << "the fault did not fire";
  EXPECT_FALSE(table_->CheckAccounting().ok());
  // The page is now on the free list twice: two sessions are granted it, and the first
  // one's verification fails.
  const PageGrant b = MustGrant(kB);
  const PageGrant c = MustGrant(kC);
  EXPECT_EQ(b.page, c.page);
  EXPECT_NE(Verify(kB, b), "ok");
  EXPECT_EQ(Verify(kC, c), "ok");
}

TEST_F(OwnershipTableTest, AcceptedLateReleaseFailsTheRightfulOwner) {
  Make(1);
  table_->set_faults(TableFaults{.accept_stale_release = true});
  const PageGrant a = MustGrant(kA);
  ASSERT_EQ(Release(kA, a), "ok");
  const PageGrant b = MustGrant(kB);
  ASSERT_EQ(b.page, a.page);
  ASSERT_EQ(Release(kA, a), "ok") << "the fault did not fire";
  // B's page was taken from it: B's next verification fails before any read.
  EXPECT_NE(Verify(kB, b), "ok");
  EXPECT_NE(TagOf(b.page), b.tag);
}

TEST_F(OwnershipTableTest, StaleReleaseTwinWithoutFault) {
  Make(1);
  const PageGrant a = MustGrant(kA);
  ASSERT_EQ(Release(kA, a), "ok");
  EXPECT_EQ(Release(kA, a), "stale_release");
  ExpectAccountingOk();
  const PageGrant b = MustGrant(kB);
  EXPECT_EQ(Release(kA, a), "stale_release");
  EXPECT_EQ(Verify(kB, b), "ok");
  ExpectAccountingOk();
}

TEST_F(OwnershipTableTest, IgnoredEpochFailsTheReleasingStepsGrant) {
  Make(1);
  table_->set_faults(TableFaults{.ignore_epoch = true});
  const PageGrant a = MustGrant(kA);
  OwnershipTable::StepPin pin = table_->PinStep();
  ASSERT_EQ(Verify(kA, a), "ok");
  ASSERT_EQ(Release(kA, a), "ok");
  const PageGrant b = MustGrant(kB);  // re-granted during the step: the fault
  ASSERT_EQ(b.page, a.page);
  EXPECT_EQ(Verify(kA, a), "stale_generation");
  // The kernels' own check would refuse the read: the page carries B's tag now.
  EXPECT_NE(LoadPageTag(table_->tags(), a.page), a.tag);
  EXPECT_EQ(LoadPageTag(table_->tags(), a.page), b.tag);
}

TEST_F(OwnershipTableTest, IgnoredEpochTwinWithoutFault) {
  Make(1);
  const PageGrant a = MustGrant(kA);
  OwnershipTable::StepPin pin = table_->PinStep();
  ASSERT_EQ(Verify(kA, a), "ok");
  ASSERT_EQ(Release(kA, a), "ok");
  EXPECT_EQ(table_->Grant(kB).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(IsZero(LoadPageTag(table_->tags(), a.page)));
}

TEST_F(OwnershipTableTest, IgnoredCopyPinIsForeignCopyInFlight) {
  Make(1);
  table_->set_faults(TableFaults{.ignore_copy_pins = true});
  const PageGrant a = MustGrant(kA);
  ASSERT_EQ(Kind(table_->BeginCopy(kA, a)), "ok");
  ASSERT_EQ(Release(kA, a), "ok");
  const PageGrant b = MustGrant(kB);
  ASSERT_EQ(b.page, a.page) << "the fault did not fire";
  EXPECT_EQ(Verify(kB, b), "foreign_copy_in_flight");
  EXPECT_EQ(Kind(table_->BeginCopy(kB, b)), "foreign_copy_in_flight");
  // A's copy ends: it learns the page changed hands, and B may read from then on.
  EXPECT_EQ(Kind(table_->EndCopy(kA, a)), "stale_generation");
  EXPECT_EQ(Verify(kB, b), "ok");
  EXPECT_EQ(Release(kB, b), "ok");
  ExpectAccountingOk();
}

TEST_F(OwnershipTableTest, OwnerMayReleaseDespiteAForeignCopyInFlight) {
  Make(1);
  table_->set_faults(TableFaults{.ignore_copy_pins = true});
  const PageGrant a = MustGrant(kA);
  ASSERT_EQ(Kind(table_->BeginCopy(kA, a)), "ok");
  ASSERT_EQ(Release(kA, a), "ok");
  const PageGrant b = MustGrant(kB);
  ASSERT_EQ(b.page, a.page);
  table_->set_faults(TableFaults{});
  // B cannot read while A's copy is in flight, but may give the page back; it then waits in
  // limbo for the copy.
  ASSERT_EQ(Verify(kB, b), "foreign_copy_in_flight");
  EXPECT_EQ(Release(kB, b), "ok");
  EXPECT_EQ(table_->state(b.page), PageState::kLimbo);
  EXPECT_EQ(Kind(table_->EndCopy(kA, a)), "stale_generation");
  EXPECT_EQ(table_->state(b.page), PageState::kFree);
  ExpectAccountingOk();
}

TEST_F(OwnershipTableTest, IgnoredCopyPinTwinWithoutFault) {
  Make(1);
  const PageGrant a = MustGrant(kA);
  ASSERT_EQ(Kind(table_->BeginCopy(kA, a)), "ok");
  ASSERT_EQ(Release(kA, a), "ok");
  EXPECT_EQ(table_->Grant(kB).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Kind(table_->EndCopy(kA, a)), "stale_generation");
  const PageGrant b = MustGrant(kB);
  EXPECT_EQ(Verify(kB, b), "ok");
}

// ---- Shared pages (prefix caching): publication, read grants, readers, cache domains,
// eviction under the epoch rule, and the violations each misuse gets ----------------------

constexpr DomainId kDomainA = 101;       // tenant A's own cache domain
constexpr DomainId kDomainB = 102;       // tenant B's
constexpr DomainId kDomainPrefix = 900;  // an operator-declared prefix A and B may both read

const DomainId kReadableByA[] = {kDomainA, kDomainPrefix};
const DomainId kReadableByB[] = {kDomainB, kDomainPrefix};

// SharedPagesTest: the table's fixture over 4 pages, with publication and reads at hand.
class SharedPagesTest : public OwnershipTableTest {
 protected:
  void SetUp() override { Make(4); }

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
