// Real-thread stress of the page lifecycle the fuzz targets drive (fuzz/README.md, "Real
// threads"): meant for ThreadSanitizer, which the fuzzing engines cannot run under. Worker
// threads each run requests through core::SessionPages as the engine does (grant the prompt,
// pin + verify, write a page, grow at a boundary, read back, re-verify, release; sometimes
// an asynchronous copy around a release), while a rotator thread rotates and retires tag keys
// and a mode thread flips tenants between enforce and strict. Invariants: no verification of
// a request's own page table ever fails; every byte a request reads back is its own; at the
// end every page is free and the accounting is exact.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/engine/session_pages.h"
#include "core/model/kv_pool.h"
#include "isolation/guard.h"

namespace kvguard::core {
namespace {

using isolation::Mode;
using isolation::Owner;

TEST(SessionPagesStressTest, ConcurrentLifecyclesNeverSeeAForeignPage) {
  constexpr int kHeadDim = 64, kPage = 4, kWorkers = 4, kRequestsEach = 1500;
  ModelConfig c;
  c.name = "stress";
  c.dim = kHeadDim;
  c.n_heads = 1;
  c.n_kv_heads = 1;
  c.head_dim = kHeadDim;
  c.n_layers = 1;
  c.ffn_dim = kHeadDim;
  c.vocab_size = 16;
  c.max_context = 1024;
  KvPoolOptions po;
  po.dtype = kernels::KvDtype::kFp32;
  po.page_size = kPage;
  po.budget_bytes = 24 * c.KvBytesPerToken(4) * kPage;
  std::unique_ptr<KvPool> pool = *KvPool::Create(c, po);
  isolation::GuardOptions go;
  go.policy.tenants = {{"a", Mode::kEnforce, 1000}, {"b", Mode::kStrict, 1000}};
  std::unique_ptr<isolation::Guard> guard =
      *isolation::Guard::Create(go, &pool->table(), pool->tag_keys());
  std::atomic<bool> stop{false};
  std::atomic<int> failures{0}, completed{0};

  auto worker = [&](int w) {
    std::mt19937 rng(static_cast<uint32_t>(w) + 1);
    const kernels::PagedKvView view = pool->LayerView(0);
    for (int i = 0; i < kRequestsEach; ++i) {
      const isolation::TenantId tenant = 1 + static_cast<isolation::TenantId>(i % 2);
      const Owner owner{tenant, static_cast<uint64_t>(w) * 100000 + static_cast<uint64_t>(i) + 1};
      SessionPages pages(&pool->table(), owner, kPage);
      const int prompt = 1 + static_cast<int>(rng() % 9);
      // At most 4 workers x 4 pages are held at once out of 24: a dry pool is transient
      // (pages waiting out another worker's pin), so every request gets its pages in the end.
      while (!pages.GrantFor(prompt).ok()) std::this_thread::yield();
      bool ever_strict = false;
      const int total = prompt + 1 + static_cast<int>(rng() % 6);
      bool ok = true;
      for (int pos = 0; pos < total && ok; ++pos) {
        if (pos >= prompt) {
          pages.set_kv_len(pos);
          while (!pages.GrowForNextToken().ok()) std::this_thread::yield();
        }
        isolation::OwnershipTable::StepPin pin = pool->table().PinStep();
        const Mode mode = guard->mode(owner.tenant);
        ever_strict = ever_strict || mode == Mode::kStrict;
        if (guard->Verify(owner, pages.grants(), mode).has_value()) {
          ok = false;
          break;
        }
        const isolation::PageGrant& g = pages.grants()[static_cast<size_t>(pos / kPage)];
        float k[kHeadDim] = {}, v[kHeadDim] = {};
        k[0] = v[0] = static_cast<float>(owner.session);
        k[1] = v[1] = static_cast<float>(pos + 1);
        pool->WriteToken(0, g, pos % kPage, k, v);
        for (int p = 0; p <= pos; ++p) {
          const isolation::PageGrant& r = pages.grants()[static_cast<size_t>(p / kPage)];
          const float* kp = static_cast<const float*>(view.k) + r.page * view.page_stride;
          if (kp[p % kPage] != static_cast<float>(owner.session) ||
              kp[kPage + p % kPage] != static_cast<float>(p + 1)) {
            ok = false;
          }
        }
        if (pool->table().Verify(owner, pages.grants()).has_value()) ok = false;
      }
      // Now and then an asynchronous copy spans the release: the page must wait for it.
      std::optional<isolation::PageGrant> copied;
      if (ok && rng() % 4 == 0 && pages.num_pages() > 0) {
        copied = pages.grants().front();
        if (pool->table().BeginCopy(owner, *copied).has_value()) ok = false;
      }
      const bool scrub = ever_strict || guard->mode(owner.tenant) == Mode::kStrict;
      if (!pages.Release(scrub).empty()) ok = false;
      if (copied && !pool->table().EndCopy(owner, *copied).has_value()) {
        ok = false;  // the page was released during the copy: EndCopy must say it went stale
      }
      if (!ok) ++failures;
      ++completed;
    }
  };
  auto rotator = [&] {
    while (!stop.load()) {
      absl::StatusOr<isolation::KeyId> id = guard->RotateKey("stress");
      if (!id.ok()) ++failures;
      for (isolation::KeyId old : guard->keys().key_ids()) {
        if (old != guard->keys().active_id()) (void)guard->RetireKey(old);  // refused while held
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  };
  auto modes = [&] {
    int n = 0;
    while (!stop.load()) {
      if (!guard->SetMode("a", n++ % 2 ? Mode::kStrict : Mode::kEnforce, "stress").ok()) {
        ++failures;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  };
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) threads.emplace_back(worker, w);
  std::thread r(rotator), m(modes);
  for (std::thread& t : threads) t.join();
  stop = true;
  r.join();
  m.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(completed.load(), kWorkers * kRequestsEach);
  EXPECT_TRUE(pool->table().CheckAccounting().ok());
  EXPECT_EQ(pool->table().free_pages(), pool->table().num_pages());
  EXPECT_EQ(guard->stats().violations, 0);
}

}  // namespace
}  // namespace kvguard::core
