// Concurrency test of isolation/ownership_table.h (meant to run under ThreadSanitizer, so it
// synchronises with std:: primitives only). Several threads act as sessions of two tenants and
// grant, verify, release, quarantine, copy and run pinned steps at random on one small table,
// while a checker thread watches the pages those steps verified. Invariants (P1, P2, P6):
//   * a session's Verify of its own current grants passes unless the page was quarantined, and
//     of the grants it released always fails; releasing one of those again is refused;
//   * a page is in at most one session's live grant set, and is never handed out unscrubbed
//     after a scrubbing release;
//   * while a step that verified a grant is pinned, that page never becomes free and never
//     belongs to another session, whoever releases what meanwhile;
//   * at the end, with every grant released, the accounting is exact and every tag is zero.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
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

constexpr int kThreads = 4;
constexpr int kPages = 48;  // fewer than the sessions may hold together: grants contend
constexpr int kOpsPerThread = 5000;
constexpr size_t kMaxPagesPerSession = 8;
constexpr uint32_t kSeed = 0x15c0a7;

bool IsZero(const PageTag& t) { return t.lo == 0 && t.hi == 0; }

// Failures reports the first few failures from any thread (gtest's assertions are thread-safe)
// and counts the rest.
class Failures {
 public:
  void Add(const std::string& what) {
    if (count_.fetch_add(1) < 20) ADD_FAILURE() << what;
  }
  int count() const { return count_.load(); }

 private:
  std::atomic<int> count_{0};
};

struct Held {
  PageGrant grant;
  bool quarantined = false;
  bool copying = false;  // this session's copy of the page is in flight
};

struct Session {
  Owner owner;
  std::vector<Held> pages;
  std::vector<PageGrant> released_copies;  // released while its copy was in flight
  std::vector<PageGrant> retired;          // the last few grants it released
};

// Watch is a grant a pinned step verified: until the step unpins, the page must stay this
// owner's or wait in limbo.
struct Watch {
  Owner owner;
  PageGrant grant;
};

class IsolationStressTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<TagKeyRing>> ring = TagKeyRing::CreateEphemeral();
    ASSERT_TRUE(ring.ok()) << ring.status();
    ring_ = *std::move(ring);
    table_ = std::make_unique<OwnershipTable>(kPages, ring_.get(), [this](int32_t p) {
      // Runs under the table's lock, before the page is free again.
      needs_scrub_[static_cast<size_t>(p)].store(false);
      scrubs_.fetch_add(1);
    });
  }

  Session NewSession(TenantId tenant) {
    return Session{Owner{tenant, next_session_.fetch_add(1)}, {}, {}, {}};
  }

  void Grant(Session& s, std::mt19937& rng) {
    const int n = 1 + static_cast<int>(rng() % 3);
    if (s.pages.size() + static_cast<size_t>(n) > kMaxPagesPerSession) return;
    std::vector<PageGrant> out;
    const absl::Status st = table_->GrantMany(s.owner, n, &out);
    if (st.code() == absl::StatusCode::kResourceExhausted) {
      if (!out.empty()) failures_.Add("a refused GrantMany granted pages");
      return;
    }
    if (!st.ok()) return failures_.Add(absl::StrCat("GrantMany: ", st.ToString()));
    for (const PageGrant& g : out) {
      const size_t p = static_cast<size_t>(g.page);
      uint64_t expected = 0;
      if (!holder_[p].compare_exchange_strong(expected, s.owner.session)) {
        failures_.Add(absl::StrCat("page ", g.page, " granted to session ", s.owner.session,
                                   " while session ", expected, " holds it"));
      }
      if (needs_scrub_[p].load()) {
        failures_.Add(absl::StrCat("page ", g.page, " handed out before its scrub"));
      }
      s.pages.push_back(Held{g});
    }
  }

  // CheckOwn verifies each of the session's grants: ok, or quarantined_page if it was.
  void CheckOwn(const Session& s) {
    std::vector<PageGrant> live;
    for (const Held& h : s.pages) {
      const std::string got =
          Kind(table_->Verify(s.owner, std::span<const PageGrant>(&h.grant, 1)));
      const char* want = h.quarantined ? "quarantined_page" : "ok";
      if (got != want) {
        failures_.Add(absl::StrCat("session ", s.owner.session, " page ", h.grant.page, ": ", got,
                                   ", want ", want));
      }
      if (!h.quarantined) live.push_back(h.grant);
    }
    if (auto v = table_->Verify(s.owner, live)) {
      failures_.Add(absl::StrCat("own page table: ", DescribeViolation(*v)));
    }
    // P2: a released grant never verifies again, whoever holds its page now.
    for (const PageGrant& g : s.retired) {
      if (!table_->Verify(s.owner, std::span<const PageGrant>(&g, 1)).has_value()) {
        failures_.Add(absl::StrCat("released grant of page ", g.page, " verifies"));
      }
    }
  }

  // LateRelease releases a grant the session already released: refused, nothing freed (the
  // page may meanwhile belong to another session, which must not lose it).
  void LateRelease(Session& s, std::mt19937& rng) {
    if (s.retired.empty()) return;
    const PageGrant& g = s.retired[rng() % s.retired.size()];
    const std::string got = Kind(table_->Release(s.owner, g, rng() % 2 == 0));
    if (got != "stale_release") failures_.Add(absl::StrCat("late release: ", got));
  }

  // ReleaseAt releases the session's i-th page (scrubbing at random) and forgets it.
  void ReleaseAt(Session& s, size_t i, std::mt19937& rng) {
    const Held h = s.pages[i];
    s.pages.erase(s.pages.begin() + static_cast<std::ptrdiff_t>(i));
    const size_t p = static_cast<size_t>(h.grant.page);
    const bool scrub = rng() % 2 == 0;
    // Still ours until Release returns: nobody else can be granted it before these stores.
    holder_[p].store(0);
    if (scrub || h.quarantined) needs_scrub_[p].store(true);
    if (auto v = table_->Release(s.owner, h.grant, scrub)) {
      failures_.Add(absl::StrCat("own release refused: ", DescribeViolation(*v)));
      return;
    }
    if (scrub || h.quarantined) expected_scrubs_.fetch_add(1);
    if (h.copying) s.released_copies.push_back(h.grant);
    if (s.retired.size() == 8) s.retired.erase(s.retired.begin());
    s.retired.push_back(h.grant);
  }

  // Step pins an epoch, verifies the session's grants, reads their tags as a kernel would,
  // releases some of them mid-step, and checks until it unpins that they stay in limbo.
  void Step(Session& s, std::mt19937& rng, uint64_t step_id) {
    OwnershipTable::StepPin pin = table_->PinStep();
    std::vector<Watch> verified;
    for (const Held& h : s.pages) {
      if (h.quarantined) continue;
      if (auto v = table_->Verify(s.owner, std::span<const PageGrant>(&h.grant, 1))) {
        failures_.Add(absl::StrCat("step verify: ", DescribeViolation(*v)));
        continue;
      }
      verified.push_back(Watch{s.owner, h.grant});
    }
    {
      std::lock_guard<std::mutex> lock(watch_mu_);
      watches_[step_id] = verified;
    }
    for (const Watch& w : verified) {
      if (LoadPageTag(table_->tags(), w.grant.page) != w.grant.tag) {
        failures_.Add(absl::StrCat("verified page ", w.grant.page, " has another tag"));
      }
    }
    // Cancel part of the request mid-step: its pages must wait for this step.
    std::vector<int32_t> released;
    for (int k = static_cast<int>(rng() % 3); k > 0 && !s.pages.empty(); --k) {
      const size_t i = rng() % s.pages.size();
      const bool was_verified = !s.pages[i].quarantined;
      const int32_t page = s.pages[i].grant.page;
      ReleaseAt(s, i, rng);
      if (was_verified) released.push_back(page);
    }
    for (int poll = 0; poll < 4; ++poll) {
      for (int32_t p : released) {
        const PageState st = table_->state(p);
        if (st != PageState::kLimbo) {
          failures_.Add(absl::StrCat("page ", p, " released in a pinned step is in state ",
                                     static_cast<int>(st), ", not limbo"));
        }
        if (!IsZero(LoadPageTag(table_->tags(), p))) {
          failures_.Add(absl::StrCat("page ", p, " in limbo carries a tag"));
        }
      }
      std::this_thread::yield();
    }
    {
      std::lock_guard<std::mutex> lock(watch_mu_);
      watches_.erase(step_id);
    }
  }  // unpins

  void Quarantine(Session& s) {
    size_t want = 0;
    for (Held& h : s.pages) {
      if (!h.quarantined) ++want;
      h.quarantined = true;
    }
    const int n = table_->QuarantineSession(s.owner);
    if (static_cast<size_t>(n) != want) {
      failures_.Add(absl::StrCat("QuarantineSession took ", n, " pages, want ", want));
    }
  }

  void Copy(Session& s, std::mt19937& rng) {
    if (!s.released_copies.empty() && rng() % 2 == 0) {
      const PageGrant g = s.released_copies.back();
      s.released_copies.pop_back();
      const std::string got = Kind(table_->EndCopy(s.owner, g));
      if (got != "stale_generation") {
        failures_.Add(absl::StrCat("EndCopy after release: ", got));
      }
      return;
    }
    if (s.pages.empty()) return;
    Held& h = s.pages[rng() % s.pages.size()];
    if (h.copying) {
      const std::string got = Kind(table_->EndCopy(s.owner, h.grant));
      if (got != "ok") failures_.Add(absl::StrCat("EndCopy of a held page: ", got));
      h.copying = false;
    } else if (!h.quarantined) {
      const std::string got = Kind(table_->BeginCopy(s.owner, h.grant));
      if (got != "ok") failures_.Add(absl::StrCat("BeginCopy of a held page: ", got));
      h.copying = true;
    }
  }

  void Finish(Session& s, std::mt19937& rng) {
    for (Held& h : s.pages) {
      if (h.copying) {
        const std::string got = Kind(table_->EndCopy(s.owner, h.grant));
        if (got != "ok") failures_.Add(absl::StrCat("EndCopy at finish: ", got));
        h.copying = false;
      }
    }
    while (!s.pages.empty()) ReleaseAt(s, s.pages.size() - 1, rng);
    for (const PageGrant& g : s.released_copies) {
      const std::string got = Kind(table_->EndCopy(s.owner, g));
      if (got != "stale_generation") failures_.Add(absl::StrCat("EndCopy at finish: ", got));
    }
    s.released_copies.clear();
  }

  void Worker(int thread) {
    std::mt19937 rng(kSeed + static_cast<uint32_t>(thread));
    Session sessions[2] = {NewSession(1), NewSession(2)};
    int op = 0;
    for (; op < kOpsPerThread && failures_.count() < 20; ++op) {
      const int slot = static_cast<int>(rng() % 2);
      Session& s = sessions[slot];
      const uint32_t dice = rng() % 100;
      if (dice < 25) {
        Grant(s, rng);
      } else if (dice < 42) {
        CheckOwn(s);
      } else if (dice < 56) {
        if (!s.pages.empty()) ReleaseAt(s, rng() % s.pages.size(), rng);
      } else if (dice < 60) {
        LateRelease(s, rng);
      } else if (dice < 78) {
        Step(s, rng, static_cast<uint64_t>(thread) << 32 | static_cast<uint64_t>(op));
      } else if (dice < 82) {
        Quarantine(s);
      } else if (dice < 95) {
        Copy(s, rng);
      } else {
        Finish(s, rng);
        s = NewSession(static_cast<TenantId>(slot + 1));
      }
    }
    for (Session& s : sessions) Finish(s, rng);
    ops_.fetch_add(op);
  }

  // Checker polls every page a pinned step verified: the page is still that owner's (maybe
  // quarantined), or waits in limbo with a zero tag; never free, never someone else's.
  void Checker() {
    const Owner stranger{3, ~uint64_t{0}};
    while (!stop_.load()) {
      {
        std::lock_guard<std::mutex> lock(watch_mu_);
        for (const auto& [id, watched] : watches_) {
          for (const Watch& w : watched) {
            const std::span<const PageGrant> one(&w.grant, 1);
            if (!table_->Verify(stranger, one).has_value()) {
              failures_.Add(absl::StrCat("a stranger verified page ", w.grant.page));
            }
            const std::string got = Kind(table_->Verify(w.owner, one));
            if (got == "ok" || got == "quarantined_page") continue;
            const PageState st = table_->state(w.grant.page);
            if (st != PageState::kLimbo) {
              failures_.Add(absl::StrCat("page ", w.grant.page, " verified by a pinned step: ", got,
                                         " and state ", static_cast<int>(st)));
            } else if (!IsZero(LoadPageTag(table_->tags(), w.grant.page))) {
              failures_.Add(absl::StrCat("page ", w.grant.page, " in limbo carries a tag"));
            }
            checked_.fetch_add(1);
          }
        }
      }
      std::this_thread::yield();
    }
  }

  std::unique_ptr<TagKeyRing> ring_;
  std::unique_ptr<OwnershipTable> table_;
  std::array<std::atomic<uint64_t>, kPages> holder_{};  // live holder's session, 0 if none
  std::array<std::atomic<bool>, kPages> needs_scrub_{};
  std::atomic<int64_t> scrubs_{0}, expected_scrubs_{0};
  std::atomic<uint64_t> next_session_{1};
  std::mutex watch_mu_;
  std::map<uint64_t, std::vector<Watch>> watches_;  // by step
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> ops_{0}, checked_{0};
  Failures failures_;
};

TEST_F(IsolationStressTest, RandomSessionsKeepEveryInvariant) {
  const auto start = std::chrono::steady_clock::now();
  std::thread checker([this] { Checker(); });
  std::vector<std::thread> workers;
  for (int t = 0; t < kThreads; ++t) {
    workers.emplace_back([this, t] { Worker(t); });
  }
  for (std::thread& w : workers) w.join();
  stop_.store(true);
  checker.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%lld ops, %lld limbo pages seen by the checker, %lld scrubs, %.2f s\n",
              static_cast<long long>(ops_.load()), static_cast<long long>(checked_.load()),
              static_cast<long long>(scrubs_.load()), seconds);

  EXPECT_EQ(failures_.count(), 0);
  // Every worker runs all its operations (a fixed count, not a time budget: the verdict must
  // not depend on how fast the threads run) unless failures cut it short.
  EXPECT_EQ(ops_.load(), kThreads * kOpsPerThread);
  EXPECT_TRUE(table_->CheckAccounting().ok()) << table_->CheckAccounting();
  EXPECT_EQ(table_->free_pages(), kPages);
  EXPECT_EQ(table_->limbo_pages(), 0);
  EXPECT_EQ(table_->used_pages(), 0);
  EXPECT_EQ(scrubs_.load(), expected_scrubs_.load());
  EXPECT_GT(expected_scrubs_.load(), 0);
  for (int p = 0; p < kPages; ++p) {
    EXPECT_EQ(holder_[static_cast<size_t>(p)].load(), 0u) << p;
    EXPECT_EQ(table_->state(p), PageState::kFree) << p;
    EXPECT_TRUE(IsZero(LoadPageTag(table_->tags(), p))) << p;
  }
}

}  // namespace
}  // namespace kvguard::isolation
