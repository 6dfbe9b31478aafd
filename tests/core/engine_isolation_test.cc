// The engine under the isolation layer: fault injection paired with fault-free twins, modes at
// run time, strict scrubbing and quarantine. Every fault must abort only the request it hits,
// with its typed reason, and leave every other request's tokens exactly as they are alone.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/engine.h"
#include "core/synthetic_model.h"
#include "isolation/audit_sink.h"
#include "tests/core/tiny_model.h"

namespace kvguard::core {
namespace {

using isolation::AuditEvent;
using isolation::Mode;
using isolation::ViolationKind;
using kernels::KvDtype;
using kernels::WeightFormat;

struct Harness {
  std::unique_ptr<Engine> engine;
  std::shared_ptr<isolation::MemoryAuditSink> sink;
};

// Tenants "a" and "b" (enforce unless told) and "s" (strict, quarantined after 2).
// greedy_admission: admit on the prompt's pages plus the reserve alone (no growth reservation,
// EngineOptions::admission_ratio 0), for tests that need the pool to run dry mid-decode.
Harness Make(int pages, Mode mode_a = Mode::kEnforce, bool check_accounting = true,
             bool greedy_admission = false) {
  const TinyModel& s = Fp32Tiny();
  KvPoolOptions po;
  po.dtype = KvDtype::kFp32;
  po.budget_bytes = s.model->config().KvBytesPerToken(4) * 16 * size_t(pages);
  EngineOptions eo;
  eo.check_accounting = check_accounting;
  if (greedy_admission) eo.admission_ratio = eo.admission_ratio_min = eo.admission_ratio_decay = 0;
  eo.decode_threads = 2;
  eo.prefill_threads = 1;
  Harness h;
  h.sink = std::make_shared<isolation::MemoryAuditSink>();
  eo.isolation.sink = h.sink;
  eo.isolation.policy.tenants = {
      {"a", mode_a, 3}, {"b", Mode::kEnforce, 3}, {"s", Mode::kStrict, 2}};
  h.engine = *Engine::Create(s.model, s.tokenizer, *KvPool::Create(s.model->config(), po), eo);
  return h;
}

GenerationRequest Greedy(const std::string& tenant, const std::string& prompt, int max_tokens) {
  GenerationRequest r;
  r.tenant = tenant;
  r.prompt = Fp32Tiny().tokenizer->Encode(prompt, /*add_bos=*/true);
  r.max_tokens = max_tokens;
  r.stop_at_eos = false;
  return r;
}

const std::vector<std::string> kPrompts = {"Once upon a time", "The robot", "kvguard isolation"};

std::vector<int> Alone(const std::string& prompt, int max_tokens) {
  Harness h = Make(64);
  const RequestId id = *h.engine->Submit(Greedy("a", prompt, max_tokens));
  return h.engine->Wait(id)->tokens;
}

std::vector<AuditEvent> Violations(const isolation::MemoryAuditSink& sink) {
  std::vector<AuditEvent> out;
  for (const AuditEvent& e : sink.events()) {
    if (e.type == AuditEvent::Type::kViolation) out.push_back(e);
  }
  return out;
}

// Runs kPrompts (ids 1, 2, 3) under `faults`; returns their results.
std::vector<GenerationResult> RunThree(Harness& h, const EngineFaults& faults, int max_tokens) {
  h.engine->set_faults(faults);
  std::vector<RequestId> ids;
  for (const auto& p : kPrompts) ids.push_back(*h.engine->Submit(Greedy("a", p, max_tokens)));
  std::vector<GenerationResult> results;
  for (RequestId id : ids) results.push_back(*h.engine->Wait(id));
  return results;
}

void ExpectPoolWhole(Engine& engine) {
  KvPool& pool = engine.mutable_pool();
  // Pages released during the last step wait out its epoch; the decode worker unpins right
  // after the step, so give it a moment.
  for (int i = 0; i < 200 && pool.table().limbo_pages() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(pool.table().CheckAccounting().ok()) << pool.table().CheckAccounting();
  EXPECT_EQ(pool.table().free_pages(), pool.num_pages());
}

TEST(EngineIsolationTest, ReleaseDuringStepIsCaughtBeforeTheReadAndAbortsOnlyThatRequest) {
  std::vector<std::vector<int>> alone;
  for (const auto& p : kPrompts) alone.push_back(Alone(p, 12));
  for (const bool fault : {false, true}) {
    SCOPED_TRACE(fault ? "with the fault" : "twin without it");
    Harness h = Make(64, Mode::kEnforce, /*check_accounting=*/!fault);
    EngineFaults f;
    if (fault) f.release_during_step = 2;
    const std::vector<GenerationResult> r = RunThree(h, f, 12);
    for (size_t i = 0; i < r.size(); ++i) {
      if (fault && i == 1) {
        EXPECT_EQ(r[i].reason, FinishReason::kAborted);
        ASSERT_TRUE(r[i].violation.has_value());
        EXPECT_EQ(r[i].violation->kind, ViolationKind::kKernelTagMismatch);
        EXPECT_EQ(r[i].violation->page_index, 0);
        EXPECT_TRUE(r[i].tokens.size() < alone[i].size());
      } else {
        EXPECT_EQ(r[i].reason, FinishReason::kLength);
        EXPECT_EQ(r[i].tokens, alone[i]) << kPrompts[i];
      }
    }
    EXPECT_EQ(Violations(*h.sink).size(), fault ? 1u : 0u);
    ExpectPoolWhole(*h.engine);
  }
}

// Prefill writes into its pages only while they still carry their grants' tags, whatever the
// mode: an `off` tenant's page table is not verified, so this check is what keeps its prefill
// from writing into a page that has gone to someone else (found writing the threat model).
TEST(EngineIsolationTest, PrefillNeverWritesIntoAPageReleasedUnderIt) {
  std::vector<std::vector<int>> alone;
  for (const auto& p : kPrompts) alone.push_back(Alone(p, 6));
  for (const Mode mode : {Mode::kOff, Mode::kEnforce}) {
    for (const bool fault : {false, true}) {
      SCOPED_TRACE(absl::StrCat(isolation::ModeName(mode), fault ? " with the fault" : " twin"));
      Harness h = Make(64, mode, /*check_accounting=*/!fault);
      EngineFaults f;
      if (fault) f.release_during_prefill = 2;
      const std::vector<GenerationResult> r = RunThree(h, f, 6);
      for (size_t i = 0; i < r.size(); ++i) {
        if (fault && i == 1) {
          EXPECT_EQ(r[i].reason, FinishReason::kAborted);
          ASSERT_TRUE(r[i].violation.has_value());
          EXPECT_EQ(r[i].violation->kind, ViolationKind::kKernelTagMismatch);
          EXPECT_EQ(r[i].violation->page_index, 0);
          EXPECT_TRUE(r[i].tokens.empty());
        } else {
          EXPECT_EQ(r[i].reason, FinishReason::kLength);
          EXPECT_EQ(r[i].tokens, alone[i]) << kPrompts[i];
        }
      }
      EXPECT_EQ(Violations(*h.sink).size(), fault ? 1u : 0u);
      ExpectPoolWhole(*h.engine);
    }
  }
}

TEST(EngineIsolationTest, DoubleReleaseIsRefusedReportedAndFreesNothingTwice) {
  std::vector<std::vector<int>> alone;
  for (const auto& p : kPrompts) alone.push_back(Alone(p, 8));
  for (const bool fault : {false, true}) {
    SCOPED_TRACE(fault ? "with the fault" : "twin without it");
    Harness h = Make(64);
    EngineFaults f;
    if (fault) f.double_release = 1;
    const std::vector<GenerationResult> r = RunThree(h, f, 8);
    for (size_t i = 0; i < r.size(); ++i) EXPECT_EQ(r[i].tokens, alone[i]) << kPrompts[i];
    const std::vector<AuditEvent> v = Violations(*h.sink);
    if (fault) {
      ASSERT_FALSE(v.empty());
      for (const AuditEvent& e : v) {
        EXPECT_EQ(e.violation->kind, ViolationKind::kStaleRelease);
        EXPECT_EQ(e.request, 1u);
        EXPECT_EQ(e.tenant, "a");
      }
    } else {
      EXPECT_TRUE(v.empty());
    }
    ExpectPoolWhole(*h.engine);
  }
}

TEST(EngineIsolationTest, HandoverOfACancelledRequestIsCaughtByVerification) {
  std::vector<std::vector<int>> alone;
  for (const auto& p : kPrompts) alone.push_back(Alone(p, 10));
  for (const bool fault : {false, true}) {
    SCOPED_TRACE(fault ? "with the fault" : "twin without it");
    Harness h = Make(64, Mode::kEnforce, /*check_accounting=*/!fault);
    EngineFaults f;
    f.cancel_in_prefill = 2;
    f.handover_cancelled = fault;
    const std::vector<GenerationResult> r = RunThree(h, f, 10);
    if (fault) {
      EXPECT_EQ(r[1].reason, FinishReason::kAborted);
      ASSERT_TRUE(r[1].violation.has_value());
      // Its pages went back to the pool (and maybe to someone else) before decode saw them.
      EXPECT_TRUE(r[1].violation->kind == ViolationKind::kStaleGeneration ||
                  r[1].violation->kind == ViolationKind::kPageNotOwned)
          << isolation::ViolationKindName(r[1].violation->kind);
    } else {
      EXPECT_EQ(r[1].reason, FinishReason::kCancelled);
      EXPECT_FALSE(r[1].violation.has_value());
    }
    EXPECT_TRUE(r[1].tokens.empty() || r[1].tokens.size() == 1u);  // at most the prefill token
    for (size_t i : {size_t{0}, size_t{2}}) {
      EXPECT_EQ(r[i].reason, FinishReason::kLength);
      EXPECT_EQ(r[i].tokens, alone[i]) << kPrompts[i];
    }
    ExpectPoolWhole(*h.engine);
  }
}

// The injected bug hands B a page A's in-flight step may be reading: a real data race (the
// "known limit" in isolation/README.md: A's output for that step is discarded by the
// post-step verification, but its kernel may load B's bytes). ThreadSanitizer rightly reports
// it, so under TSan this scenario is skipped; the default and ASan builds run it.
//
// Run with A in enforce and in off: an `off` tenant skips its own verification, but the
// kernels' tag check still stops it reading a page that now belongs to someone else.
TEST(EngineIsolationTest, APageGrantedToTwoSessionsAbortsTheOldOwnerAndSparesTheNewOne) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the injected double grant is a data race by design (see comment)";
#endif
  const std::vector<int> alone_b = Alone(kPrompts[1], 16);
  for (const Mode mode_a : {Mode::kEnforce, Mode::kOff})
    for (const bool fault : {false, true}) {
      SCOPED_TRACE(fault ? "with the fault" : "twin without it");
      SCOPED_TRACE(isolation::ModeName(mode_a));
      Harness h = Make(64, mode_a, /*check_accounting=*/!fault);
      // A runs long; once it decodes, B arrives and (with the fault) is granted one of A's pages.
      GenerationRequest a = Greedy("a", kPrompts[0], 400);
      const RequestId id_a = *h.engine->Submit(std::move(a));
      while (h.engine->stats().decode_steps < 3)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (fault) {
        isolation::TableFaults tf;
        tf.grant_owned_page = true;
        h.engine->mutable_pool().table().set_faults(tf);
      }
      const RequestId id_b = *h.engine->Submit(Greedy("b", kPrompts[1], 16));
      const GenerationResult rb = *h.engine->Wait(id_b);
      EXPECT_EQ(rb.reason, FinishReason::kLength);
      EXPECT_EQ(rb.tokens, alone_b);
      h.engine->Cancel(id_a);
      const GenerationResult ra = *h.engine->Wait(id_a);
      if (fault) {
        EXPECT_EQ(ra.reason, FinishReason::kAborted);
        ASSERT_TRUE(ra.violation.has_value());
        EXPECT_TRUE(ra.violation->kind == ViolationKind::kStaleGeneration ||
                    ra.violation->kind == ViolationKind::kKernelTagMismatch)
            << isolation::ViolationKindName(ra.violation->kind);
        if (mode_a == Mode::kOff) {
          EXPECT_EQ(ra.violation->kind, ViolationKind::kKernelTagMismatch);
        }
        // The client learns nothing about the page's new owner; the auditor learns all of it.
        EXPECT_EQ(ra.violation->actual_owner.session, 0u);
        EXPECT_EQ(ra.status.message().find("tenant"), std::string::npos) << ra.status;
        bool audited = false;
        for (const AuditEvent& e : Violations(*h.sink)) {
          if (e.request == id_a) {
            audited = true;
            EXPECT_EQ(e.violation->actual_owner.session, id_b);
            EXPECT_EQ(e.actual_tenant, "b");
          }
        }
        EXPECT_TRUE(audited);
      } else {
        EXPECT_TRUE(ra.reason == FinishReason::kCancelled || ra.reason == FinishReason::kLength);
      }
    }
}

// Table faults under a running engine, each with its twin: the faulty request is caught, the
// other requests' tokens are exactly what they are alone.
//  * skip_generation_bump + double release: request 1's second release finds its pages at
//    the same generations but (some) granted to others; it must free none of them.
//  * ignore_epoch + release during the step: the released page is free at once (and may be
//    granted while the step reads it); the kernels' check still aborts request 2 before it
//    reads the page.
TEST(EngineIsolationTest, TableFaultsUnderTheEngineAreCaughtAndSpareTheOthers) {
  std::vector<std::vector<int>> alone;
  for (const auto& p : kPrompts) alone.push_back(Alone(p, 12));
  struct Case {
    const char* name;
    isolation::TableFaults table;
    EngineFaults engine;
    int aborted;  // index into kPrompts of the request that must abort, -1 for none
  };
  std::vector<Case> cases;
  {
    Case c{"skip_generation_bump + double release", {}, {}, -1};
    c.table.skip_generation_bump = true;
    c.engine.double_release = 1;
    cases.push_back(c);
    Case twin{"double release alone (twin)", {}, {}, -1};
    twin.engine.double_release = 1;
    cases.push_back(twin);
  }
  {
    Case c{"ignore_epoch + release during the step", {}, {}, 1};
    c.table.ignore_epoch = true;
    c.engine.release_during_step = 2;
    cases.push_back(c);
    Case twin{"ignore_epoch alone (twin)", {}, {}, -1};
    twin.table.ignore_epoch = true;
    cases.push_back(twin);
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Harness h = Make(64, Mode::kEnforce, /*check_accounting=*/false);
    h.engine->mutable_pool().table().set_faults(c.table);
    const std::vector<GenerationResult> r = RunThree(h, c.engine, 12);
    for (size_t i = 0; i < r.size(); ++i) {
      if (static_cast<int>(i) == c.aborted) {
        EXPECT_EQ(r[i].reason, FinishReason::kAborted);
        ASSERT_TRUE(r[i].violation.has_value());
        EXPECT_EQ(r[i].violation->kind, ViolationKind::kKernelTagMismatch);
      } else {
        EXPECT_EQ(r[i].reason, FinishReason::kLength) << kPrompts[i];
        EXPECT_EQ(r[i].tokens, alone[i]) << kPrompts[i];
      }
    }
    if (c.engine.double_release != 0) {
      // Every second release was refused: nothing was freed twice.
      const std::vector<AuditEvent> v = Violations(*h.sink);
      EXPECT_FALSE(v.empty());
      for (const AuditEvent& e : v) EXPECT_EQ(e.request, 1u);
      EXPECT_TRUE(h.engine->mutable_pool().table().CheckAccounting().ok());
    }
  }
}

TEST(EngineIsolationTest, ModeChangesApplyFromTheNextStepAndAreRecorded) {
  const std::vector<int> alone = Alone(kPrompts[0], 400);
  Harness h = Make(64, Mode::kOff);
  const RequestId id = *h.engine->Submit(Greedy("a", kPrompts[0], 400));
  while (h.engine->stats().decode_steps < 5)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(h.engine->guard().stats().verifications, 0) << "mode off verifies nothing";
  ASSERT_TRUE(h.engine->guard().SetMode("a", Mode::kEnforce, "test-operator").ok());
  while (h.engine->guard().stats().verifications < 5) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // And back to off: verification stops (at most the step in flight still verifies).
  ASSERT_TRUE(h.engine->guard().SetMode("a", Mode::kOff, "test-operator").ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const int64_t after_off = h.engine->guard().stats().verifications;
  const int64_t steps_after_off = h.engine->stats().decode_steps;
  const GenerationResult r = *h.engine->Wait(id);
  EXPECT_EQ(r.tokens, alone);
  EXPECT_GT(h.engine->stats().decode_steps, steps_after_off + 5) << "the request kept running";
  EXPECT_LE(h.engine->guard().stats().verifications, after_off + 1);
  std::vector<AuditEvent> changes;
  for (const AuditEvent& e : h.sink->events()) {
    if (e.type == AuditEvent::Type::kModeChange) changes.push_back(e);
  }
  ASSERT_EQ(changes.size(), 2u);
  EXPECT_EQ(changes[0].tenant, "a");
  EXPECT_EQ(changes[0].mode_from, "off");
  EXPECT_EQ(changes[0].mode_to, "enforce");
  EXPECT_EQ(changes[0].actor, "test-operator");
  EXPECT_EQ(changes[1].mode_from, "enforce");
  EXPECT_EQ(changes[1].mode_to, "off");
}

// Reads the whole pool's bytes (test only: the pool's memory starts at layer 0's K view).
bool PoolIsAllZero(Engine& engine) {
  const KvPool& pool = engine.pool();
  const auto* base = static_cast<const uint8_t*>(pool.LayerView(0).k);
  const size_t bytes = pool.page_bytes() * static_cast<size_t>(pool.num_pages());
  for (size_t i = 0; i < bytes; ++i) {
    if (base[i] != 0) return false;
  }
  return true;
}

TEST(EngineIsolationTest, StrictTenantsPagesAreScrubbedOnReleaseEnforceTenantsAreNot) {
  for (const std::string tenant : {"s", "a"}) {
    SCOPED_TRACE(tenant);
    Harness h = Make(8);
    const RequestId id = *h.engine->Submit(Greedy(tenant, kPrompts[2], 20));
    EXPECT_EQ(h.engine->Wait(id)->reason, FinishReason::kLength);
    ExpectPoolWhole(*h.engine);
    EXPECT_EQ(PoolIsAllZero(*h.engine), tenant == "s");
  }
}

TEST(EngineIsolationTest, StrictTenantIsQuarantinedAtItsLimitEnforceTenantIsNot) {
  for (const std::string tenant : {"s", "a"}) {
    SCOPED_TRACE(tenant);
    Harness h = Make(64, Mode::kEnforce, /*check_accounting=*/false);
    // Two violations (tenant s's limit), from the release-during-step fault.
    for (RequestId id = 1; id <= 2; ++id) {
      EngineFaults f;
      f.release_during_step = id;
      h.engine->set_faults(f);
      const RequestId got = *h.engine->Submit(Greedy(tenant, kPrompts[0], 6));
      ASSERT_EQ(got, id);
      EXPECT_EQ(h.engine->Wait(got)->reason, FinishReason::kAborted);
    }
    h.engine->set_faults({});
    absl::StatusOr<RequestId> next = h.engine->Submit(Greedy(tenant, kPrompts[0], 6));
    if (tenant == "s") {
      EXPECT_EQ(next.status().code(), absl::StatusCode::kPermissionDenied) << next.status();
    } else {
      ASSERT_TRUE(next.ok()) << next.status();
      EXPECT_EQ(h.engine->Wait(*next)->reason, FinishReason::kLength);
    }
    // The other tenant is served either way.
    const RequestId other = *h.engine->Submit(Greedy("b", kPrompts[1], 6));
    EXPECT_EQ(h.engine->Wait(other)->reason, FinishReason::kLength);
  }
}

TEST(EngineIsolationTest, StrictTenantIsRefusedWhileTheAuditSinkCannotRecord) {
  Harness h = Make(64);
  h.sink->set_failing(true);
  EXPECT_EQ(h.engine->Submit(Greedy("s", "x", 2)).status().code(), absl::StatusCode::kUnavailable);
  const RequestId enforce = *h.engine->Submit(Greedy("a", "x", 2));  // twin: enforce is served
  EXPECT_EQ(h.engine->Wait(enforce)->reason, FinishReason::kLength);
  h.sink->set_failing(false);
  const RequestId strict = *h.engine->Submit(Greedy("s", "x", 2));
  EXPECT_EQ(h.engine->Wait(strict)->reason, FinishReason::kLength);
}

TEST(EngineIsolationTest, UnknownTenantIsRefusedKnownTenantServed) {
  Harness h = Make(16);
  EXPECT_EQ(h.engine->Submit(Greedy("nobody", "x", 2)).status().code(),
            absl::StatusCode::kNotFound);
  const RequestId id = *h.engine->Submit(Greedy("b", "x", 2));
  EXPECT_EQ(h.engine->Wait(id)->reason, FinishReason::kLength);
}

// Many clients of two tenants (enforce and strict) submit and cancel at random against a pool
// small enough that requests are preempted and recomputed: grants, releases, cancels,
// preemptions and decode steps all interleave across the client, prefill and decode threads.
// Invariants: verification never raises a false alarm (no violation, no abort), the engine's
// own accounting check holds after every step, and the pool is whole at the end. Runs under
// ThreadSanitizer in `make test`.
TEST(EngineIsolationTest, StressWithoutFaultsRaisesNoFalseAlarm) {
  // 8 pages of 16 tokens, greedy admission: a few requests at once, then preemption.
  Harness h = Make(8, Mode::kEnforce, true, /*greedy_admission=*/true);
  constexpr int kClients = 4, kPerClient = 12;
  std::vector<std::thread> clients;
  std::atomic<int> finished{0}, cancelled{0};
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      std::mt19937 rng(static_cast<uint32_t>(c + 1));
      for (int i = 0; i < kPerClient; ++i) {
        const std::string tenant = (c + i) % 2 == 0 ? "a" : "s";
        GenerationRequest r = Greedy(tenant, kPrompts[(c + i) % kPrompts.size()], 20 + rng() % 60);
        absl::StatusOr<RequestId> id = h.engine->Submit(std::move(r));
        ASSERT_TRUE(id.ok()) << id.status();
        if (rng() % 4 == 0) {
          std::this_thread::sleep_for(std::chrono::microseconds(rng() % 2000));
          h.engine->Cancel(*id);
        }
        const GenerationResult res = *h.engine->Wait(*id);
        EXPECT_NE(res.reason, FinishReason::kAborted)
            << isolation::DescribeViolation(res.violation.value_or(isolation::Violation{}));
        EXPECT_NE(res.reason, FinishReason::kError) << res.status;
        (res.reason == FinishReason::kCancelled ? cancelled : finished).fetch_add(1);
      }
    });
  }
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(finished + cancelled, kClients * kPerClient);
  EXPECT_TRUE(Violations(*h.sink).empty());
  EXPECT_EQ(h.engine->guard().stats().violations, 0);
  EXPECT_GT(h.engine->guard().stats().verifications, 0);
  EXPECT_GT(h.engine->stats().preemptions, 0) << "the pool was meant to run dry";
  ExpectPoolWhole(*h.engine);
}

}  // namespace
}  // namespace kvguard::core
