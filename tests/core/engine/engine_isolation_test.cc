// The engine under the isolation layer: fault injection paired with fault-free twins, modes at
// run time, strict scrubbing and quarantine. Every fault must abort only the request it hits,
// with its typed reason, and leave every other request's tokens exactly as they are alone.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/engine/engine.h"
#include "core/model/synthetic_model.h"
#include "isolation/audit_sink.h"
#include "tests/core/model/tiny_model.h"

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

struct Setup {
  int pages = 64;                // KV pages of 16 tokens
  Mode mode_a = Mode::kEnforce;  // tenant a's mode
  bool check_accounting = true;  // off where a fault breaks the accounting on purpose
  // Admit on the prompt's pages plus the reserve alone (no growth reservation,
  // EngineOptions::admission_ratio 0), for tests that need the pool to run dry mid-decode.
  bool greedy_admission = false;
  bool paused = false;  // EngineOptions::start_paused: the test paces the workers
  int max_batch = 64;
};

// Tenants "a" and "b" (enforce unless told) and "s" (strict, quarantined after 2).
Harness Make(const Setup& setup) {
  const TinyModel& s = Fp32Tiny();
  KvPoolOptions po;
  po.dtype = KvDtype::kFp32;
  po.budget_bytes = s.model->config().KvBytesPerToken(4) * 16 * size_t(setup.pages);
  EngineOptions eo;
  eo.check_accounting = setup.check_accounting;
  if (setup.greedy_admission) {
    eo.admission_ratio = eo.admission_ratio_min = eo.admission_ratio_decay = 0;
  }
  eo.start_paused = setup.paused;
  eo.max_batch = setup.max_batch;
  eo.threads = 2;
  Harness h;
  h.sink = std::make_shared<isolation::MemoryAuditSink>();
  eo.isolation.sink = h.sink;
  eo.isolation.policy.tenants = {
      {"a", setup.mode_a, 3}, {"b", Mode::kEnforce, 3}, {"s", Mode::kStrict, 2}};
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
  Harness h = Make({});
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
  // Settled, no step is in flight: pages released during the last one have waited out its
  // epoch.
  engine.WaitUntilSettled();
  EXPECT_EQ(pool.table().limbo_pages(), 0);
  EXPECT_TRUE(pool.table().CheckAccounting().ok()) << pool.table().CheckAccounting();
  EXPECT_EQ(pool.table().free_pages(), pool.num_pages());
}

// FaultAbortsOnlyRequestTwo runs kPrompts (ids 1, 2, 3) with `fault` set to request 2, and
// its fault-free twin: request 2 is aborted with `kind` at its page 0 and then holds the tokens
// `tokens_left` allows, the others' tokens are exactly what they are alone, and the audit sink
// has one violation.
void FaultAbortsOnlyRequestTwo(
    uint64_t EngineFaults::*fault, ViolationKind kind,
    const std::function<bool(size_t tokens, size_t alone)>& tokens_left) {
  std::vector<std::vector<int>> alone;
  for (const auto& p : kPrompts) alone.push_back(Alone(p, 12));
  for (const bool faulty : {false, true}) {
    SCOPED_TRACE(faulty ? "with the fault" : "twin without it");
    Harness h = Make({.check_accounting = !faulty});
    EngineFaults f;
    if (faulty) f.*fault = 2;
    const std::vector<GenerationResult> r = RunThree(h, f, 12);
    for (size_t i = 0; i < r.size(); ++i) {
      if (faulty && i == 1) {
        EXPECT_EQ(r[i].reason, FinishReason::kAborted);
        ASSERT_TRUE(r[i].violation.has_value());
        EXPECT_EQ(r[i].violation->kind, kind) << isolation::ViolationKindName(r[i].violation->kind);
        EXPECT_EQ(r[i].violation->page_index, 0);
        EXPECT_TRUE(tokens_left(r[i].tokens.size(), alone[i].size())) << r[i].tokens.size();
      } else {
        EXPECT_EQ(r[i].reason, FinishReason::kLength);
        EXPECT_EQ(r[i].tokens, alone[i]) << kPrompts[i];
      }
    }
    EXPECT_EQ(Violations(*h.sink).size(), faulty ? 1u : 0u);
    ExpectPoolWhole(*h.engine);
  }
}

TEST(EngineIsolationTest, ReleaseDuringStepIsCaughtBeforeTheReadAndAbortsOnlyThatRequest) {
  FaultAbortsOnlyRequestTwo(&EngineFaults::release_during_step, ViolationKind::kKernelTagMismatch,
                            [](size_t tokens, size_t alone) { return tokens < alone; });
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
      Harness h = Make({.mode_a = mode, .check_accounting = !fault});
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
    Harness h = Make({});
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

// A request cancelled while a step computes its prefill leaves at the next step boundary: its
// pages go back whole, nothing of it decodes, and the requests beside it are untouched. The
// injected bug releases its pages there and lets it go on with its old page table: the next
// step's verification must abort it before it reads a page that may be someone else's by then.
TEST(EngineIsolationTest, ACancelledRequestThatGoesOnIsCaughtByVerification) {
  std::vector<std::vector<int>> alone;
  for (const auto& p : kPrompts) alone.push_back(Alone(p, 10));
  for (const bool fault : {false, true}) {
    SCOPED_TRACE(fault ? "with the fault" : "twin without it");
    Harness h = Make({.check_accounting = !fault});
    EngineFaults f;
    f.cancel_in_prefill = 2;
    f.cancelled_continues = fault;
    const std::vector<GenerationResult> r = RunThree(h, f, 10);
    if (fault) {
      EXPECT_EQ(r[1].reason, FinishReason::kAborted);
      ASSERT_TRUE(r[1].violation.has_value());
      EXPECT_TRUE(r[1].violation->kind == ViolationKind::kStaleGeneration ||
                  r[1].violation->kind == ViolationKind::kPageNotOwned)
          << isolation::ViolationKindName(r[1].violation->kind);
    } else {
      EXPECT_EQ(r[1].reason, FinishReason::kCancelled);
      EXPECT_FALSE(r[1].violation.has_value());
    }
    EXPECT_TRUE(r[1].tokens.empty()) << "nothing of a cancelled request is accepted";
    for (size_t i : {size_t{0}, size_t{2}}) {
      EXPECT_EQ(r[i].reason, FinishReason::kLength);
      EXPECT_EQ(r[i].tokens, alone[i]) << kPrompts[i];
    }
    ExpectPoolWhole(*h.engine);
  }
}

// The injected bug hands B one of A's pages while A is between decode steps. A's next step
// must abort A before it reads the page and spare B. The test paces the workers so that B's
// grant lands at the same point on every run: A is prefilled and decodes three steps, B is
// submitted and prefilled while A waits, then both decode. (When the double grant lands while
// A's step is in flight, A's kernels may load B's bytes; isolation/README.md states that known
// limit, and the release-during-step tests cover mid-step changes.)
//
// Run with A in enforce and in off: an `off` tenant skips its own verification, but the
// kernels' tag check still stops it reading a page that now belongs to someone else.
TEST(EngineIsolationTest, APageGrantedToTwoSessionsAbortsTheOldOwnerAndSparesTheNewOne) {
  const std::vector<int> alone_b = Alone(kPrompts[1], 16);
  for (const Mode mode_a : {Mode::kEnforce, Mode::kOff})
    for (const bool fault : {false, true}) {
      SCOPED_TRACE(fault ? "with the fault" : "twin without it");
      SCOPED_TRACE(isolation::ModeName(mode_a));
      Harness h = Make({.mode_a = mode_a, .check_accounting = !fault, .paused = true});
      Engine& engine = *h.engine;
      const RequestId id_a = *engine.Submit(Greedy("a", kPrompts[0], 400));
      engine.Allow(EngineWork::kAdmissions, kUnlimitedWork);
      engine.Allow(EngineWork::kDecodeSteps, 3);
      engine.WaitUntilSettled();
      if (fault) {
        isolation::TableFaults tf;
        tf.grant_owned_page = true;
        engine.mutable_pool().table().set_faults(tf);
      }
      const RequestId id_b = *engine.Submit(Greedy("b", kPrompts[1], 16));
      engine.WaitUntilSettled();  // B prefilled (with the fault, into one of A's pages)
      EXPECT_EQ(engine.stats().running, 2);
      // B's 15 decode steps (its first token came from prefill); then A is cancelled.
      engine.Allow(EngineWork::kDecodeSteps, 15);
      const GenerationResult rb = *engine.Wait(id_b);
      EXPECT_EQ(rb.reason, FinishReason::kLength);
      EXPECT_EQ(rb.tokens, alone_b);
      engine.WaitUntilSettled();
      engine.Cancel(id_a);
      engine.Allow(EngineWork::kDecodeSteps, kUnlimitedWork);
      const GenerationResult ra = *engine.Wait(id_a);
      if (fault) {
        EXPECT_EQ(ra.reason, FinishReason::kAborted);
        ASSERT_TRUE(ra.violation.has_value());
        // Enforce: the table verification before A's next step finds the page's new
        // generation. Off: no table verification, so the kernels' tag check finds it.
        EXPECT_EQ(ra.violation->kind, mode_a == Mode::kOff ? ViolationKind::kKernelTagMismatch
                                                           : ViolationKind::kStaleGeneration)
            << isolation::ViolationKindName(ra.violation->kind);
        EXPECT_EQ(ra.tokens.size(), 4u) << "A decoded nothing after the double grant";
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
        EXPECT_EQ(ra.reason, FinishReason::kCancelled);
        EXPECT_EQ(ra.tokens.size(), 1u + 3 + 15) << "prefill's token, then 3 + 15 decode steps";
        EXPECT_TRUE(Violations(*h.sink).empty());
      }
      ExpectPoolWhole(engine);
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
    Harness h = Make({.check_accounting = false});
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

// Modes are read once per step, before verification: a change applies from the next step. The
// workers are paced so that each phase runs an exact number of decode steps of the one request
// (one page table verification per verified step).
TEST(EngineIsolationTest, ModeChangesApplyFromTheNextStepAndAreRecorded) {
  const std::vector<int> alone = Alone(kPrompts[0], 400);
  Harness h = Make({.mode_a = Mode::kOff, .paused = true});
  Engine& engine = *h.engine;
  const RequestId id = *engine.Submit(Greedy("a", kPrompts[0], 400));
  engine.Allow(EngineWork::kAdmissions, kUnlimitedWork);
  engine.Allow(EngineWork::kDecodeSteps, 5);
  engine.WaitUntilSettled();
  EXPECT_EQ(engine.stats().decode_steps, 5);
  EXPECT_EQ(engine.guard().stats().verifications, 0) << "mode off verifies nothing";
  ASSERT_TRUE(engine.guard().SetMode("a", Mode::kEnforce, "test-operator").ok());
  engine.Allow(EngineWork::kDecodeSteps, 7);
  engine.WaitUntilSettled();
  EXPECT_EQ(engine.stats().decode_steps, 12);
  EXPECT_EQ(engine.guard().stats().verifications, 7) << "every enforce step verifies";
  // And back to off: verification stops from the next step on.
  ASSERT_TRUE(engine.guard().SetMode("a", Mode::kOff, "test-operator").ok());
  engine.Allow(EngineWork::kDecodeSteps, kUnlimitedWork);
  const GenerationResult r = *engine.Wait(id);
  EXPECT_EQ(r.tokens, alone);
  EXPECT_EQ(engine.stats().decode_steps, 399) << "prefill gave the first of the 400 tokens";
  EXPECT_EQ(engine.guard().stats().verifications, 7);
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

// The bug class "a step's re-verification is dropped": a page released after the kernels read
// it, before the step's token is accepted. The kernels' check cannot see it; only the step's
// re-verification (isolation::StepGuard::Step::Finish) keeps the token from leaving.
TEST(EngineIsolationTest, APageReleasedAfterTheKernelsIsCaughtBeforeTheTokenLeaves) {
  // The prefill token only: the first decode step's token was dropped.
  FaultAbortsOnlyRequestTwo(&EngineFaults::release_after_kernels, ViolationKind::kStaleGeneration,
                            [](size_t tokens, size_t) { return tokens == 1; });
}

// FreePagesAreZero says whether every free page of the pool is all zero bytes (test only: page
// p's bytes start p pages after layer 0's K view).
bool FreePagesAreZero(Engine& engine) {
  const KvPool& pool = engine.pool();
  const auto* base = static_cast<const uint8_t*>(pool.LayerView(0).k);
  for (int p = 0; p < pool.num_pages(); ++p) {
    if (pool.table().state(p) != isolation::PageState::kFree) continue;
    const uint8_t* page = base + pool.page_bytes() * static_cast<size_t>(p);
    for (size_t i = 0; i < pool.page_bytes(); ++i) {
      if (page[i] != 0) return false;
    }
  }
  return true;
}

// The bug class "a preempted strict tenant's pages are released unscrubbed": four strict
// requests lined up in a pool too small for them, decoded one step at a time; after every
// step, every free page is zero (a strict tenant's pages are scrubbed on every release,
// preemption included). The twin, the same workload of an enforce tenant, leaves KV in free
// pages.
TEST(EngineIsolationTest, PreemptedStrictPagesAreScrubbedEnforcePagesAreNot) {
  for (const std::string tenant : {"s", "a"}) {
    SCOPED_TRACE(tenant);
    Harness h = Make({.pages = 8, .greedy_admission = true, .paused = true});
    Engine& engine = *h.engine;
    std::vector<RequestId> ids;
    for (int i = 0; i < 4; ++i) {
      ids.push_back(*engine.Submit(Greedy(tenant, kPrompts[size_t(i) % kPrompts.size()], 60)));
    }
    engine.Allow(EngineWork::kAdmissions, kUnlimitedWork);
    engine.WaitUntilSettled();
    bool always_zero = true;
    int64_t steps = 0;
    while (engine.stats().finished < static_cast<int64_t>(ids.size())) {
      engine.Allow(EngineWork::kDecodeSteps, 1);
      engine.WaitUntilSettled();
      always_zero = always_zero && FreePagesAreZero(engine);
      ASSERT_LT(++steps, 10000) << "the workload never finished";
    }
    for (RequestId id : ids) EXPECT_EQ(engine.Wait(id)->reason, FinishReason::kLength);
    EXPECT_GT(engine.stats().preemptions, 0) << "the pool was meant to run dry";
    EXPECT_EQ(always_zero, tenant == "s");
  }
}

// The bug class "a session that was strict while it held its pages is released unscrubbed
// after a switch to enforce": tenant a decodes in enforce, one step in strict, then in
// enforce to the end; its pages are scrubbed at release. Twin: never strict, not scrubbed.
TEST(EngineIsolationTest, PagesHeldWhileStrictAreScrubbedAfterASwitchBack) {
  for (const bool strict_step : {true, false}) {
    SCOPED_TRACE(strict_step ? "one strict step" : "twin: enforce throughout");
    Harness h = Make({.paused = true});
    Engine& engine = *h.engine;
    const RequestId id = *engine.Submit(Greedy("a", kPrompts[0], 40));
    engine.Allow(EngineWork::kAdmissions, kUnlimitedWork);
    engine.Allow(EngineWork::kDecodeSteps, 3);
    engine.WaitUntilSettled();
    if (strict_step) {
      ASSERT_TRUE(engine.guard().SetMode("a", Mode::kStrict, "test").ok());
    }
    engine.Allow(EngineWork::kDecodeSteps, 1);
    engine.WaitUntilSettled();
    if (strict_step) {
      ASSERT_TRUE(engine.guard().SetMode("a", Mode::kEnforce, "test").ok());
    }
    engine.Allow(EngineWork::kDecodeSteps, kUnlimitedWork);
    EXPECT_EQ(engine.Wait(id)->reason, FinishReason::kLength);
    ExpectPoolWhole(engine);
    EXPECT_EQ(FreePagesAreZero(engine), strict_step);
  }
}

// Tenants take turns at admission (core/engine/scheduler.h): with one request in flight at a time,
// tenant b's one request is served second although tenant a queued three before it. The twin
// is the first admission: a's oldest, as in arrival order.
TEST(EngineIsolationTest, TenantsTakeTurnsAtAdmission) {
  Harness h = Make({.paused = true, .max_batch = 1});
  Engine& engine = *h.engine;
  std::vector<RequestId> ids;
  for (const char* tenant : {"a", "a", "a", "b"}) {
    ids.push_back(*engine.Submit(Greedy(tenant, kPrompts[0], 3)));
  }
  engine.Allow(EngineWork::kDecodeSteps, kUnlimitedWork);
  for (int admission = 0; admission < 2; ++admission) {
    engine.Allow(EngineWork::kAdmissions, 1);
    engine.WaitUntilSettled();  // admitted, prefilled and decoded to its end
  }
  EXPECT_EQ(engine.stats().finished, 2);
  for (RequestId id : ids) engine.Cancel(id);
  std::vector<FinishReason> reasons;
  for (RequestId id : ids) reasons.push_back(engine.Wait(id)->reason);
  EXPECT_EQ(reasons, (std::vector<FinishReason>{FinishReason::kLength, FinishReason::kCancelled,
                                                FinishReason::kCancelled, FinishReason::kLength}));
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
    Harness h = Make({.pages = 8});
    const RequestId id = *h.engine->Submit(Greedy(tenant, kPrompts[2], 20));
    EXPECT_EQ(h.engine->Wait(id)->reason, FinishReason::kLength);
    ExpectPoolWhole(*h.engine);
    EXPECT_EQ(PoolIsAllZero(*h.engine), tenant == "s");
  }
}

TEST(EngineIsolationTest, StrictTenantIsQuarantinedAtItsLimitEnforceTenantIsNot) {
  for (const std::string tenant : {"s", "a"}) {
    SCOPED_TRACE(tenant);
    Harness h = Make({.check_accounting = false});
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
  Harness h = Make({});
  h.sink->set_failing(true);
  EXPECT_EQ(h.engine->Submit(Greedy("s", "x", 2)).status().code(), absl::StatusCode::kUnavailable);
  const RequestId enforce = *h.engine->Submit(Greedy("a", "x", 2));  // twin: enforce is served
  EXPECT_EQ(h.engine->Wait(enforce)->reason, FinishReason::kLength);
  h.sink->set_failing(false);
  const RequestId strict = *h.engine->Submit(Greedy("s", "x", 2));
  EXPECT_EQ(h.engine->Wait(strict)->reason, FinishReason::kLength);
}

TEST(EngineIsolationTest, UnknownTenantIsRefusedKnownTenantServed) {
  Harness h = Make({.pages = 16});
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
//
// Preemption must happen on every run, whatever the threads' speed: before the clients start,
// four long requests are lined up while the engine is paused and admitted together (greedy
// admission); growing in lockstep they need more than the pool's 8 pages before any finishes.
TEST(EngineIsolationTest, StressWithoutFaultsRaisesNoFalseAlarm) {
  Harness h = Make({.pages = 8, .greedy_admission = true, .paused = true});
  Engine& engine = *h.engine;
  std::vector<RequestId> lined_up;
  for (int i = 0; i < 4; ++i) {
    lined_up.push_back(
        *engine.Submit(Greedy(i % 2 ? "s" : "a", kPrompts[i % kPrompts.size()], 80)));
  }
  engine.Allow(EngineWork::kAdmissions, kUnlimitedWork);
  engine.WaitUntilSettled();
  ASSERT_GE(engine.stats().running, 3) << "three requests of 80 tokens outgrow 8 pages";
  engine.Allow(EngineWork::kDecodeSteps, kUnlimitedWork);

  constexpr int kClients = 4, kPerClient = 12;
  std::vector<std::thread> clients;
  std::atomic<int> finished{0}, cancelled{0};
  auto check = [&](const GenerationResult& res) {
    EXPECT_NE(res.reason, FinishReason::kAborted)
        << isolation::DescribeViolation(res.violation.value_or(isolation::Violation{}));
    EXPECT_NE(res.reason, FinishReason::kError) << res.status;
    (res.reason == FinishReason::kCancelled ? cancelled : finished).fetch_add(1);
  };
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      std::mt19937 rng(static_cast<uint32_t>(c + 1));
      for (int i = 0; i < kPerClient; ++i) {
        const std::string tenant = (c + i) % 2 == 0 ? "a" : "s";
        GenerationRequest r = Greedy(tenant, kPrompts[(c + i) % kPrompts.size()], 20 + rng() % 60);
        absl::StatusOr<RequestId> id = engine.Submit(std::move(r));
        ASSERT_TRUE(id.ok()) << id.status();
        if (rng() % 4 == 0) {
          // Cancel at a varying point of the request's life (queued, prefilling, decoding or
          // already done); the verdicts below hold at every one of them.
          for (uint32_t n = rng() % 64; n > 0; --n) std::this_thread::yield();
          engine.Cancel(*id);
        }
        check(*engine.Wait(*id));
      }
    });
  }
  for (RequestId id : lined_up) check(*engine.Wait(id));
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(finished + cancelled, kClients * kPerClient + static_cast<int>(lined_up.size()));
  EXPECT_TRUE(Violations(*h.sink).empty());
  EXPECT_EQ(engine.guard().stats().violations, 0);
  EXPECT_GT(engine.guard().stats().verifications, 0);
  EXPECT_GT(engine.stats().preemptions, 0);
  ExpectPoolWhole(engine);
}

}  // namespace
}  // namespace kvguard::core
