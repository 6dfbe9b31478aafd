// Tests of core/engine/scheduler.h, decision by decision and step by step, without threads: who is
// admitted (order, tenant turns, preempted first, nothing overtakes a request that does not
// fit), when (reserve, growth reservation, batch room), what each step computes (decode
// tokens, chunked prefill within the token budget), who is preempted, and how the admission
// ratio moves. Each refusal has its twin that admits.
#include "core/engine/scheduler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <tuple>
#include <vector>

namespace kvguard::core {
namespace {

// A waiting request of `tenant` whose prefill needs `prefill` pages and that may grow to
// `most` pages.
SchedRequest Waiting(uint64_t id, isolation::TenantId tenant, int prefill = 1, int most = 1) {
  SchedRequest r;
  r.id = id;
  r.tenant = tenant;
  r.prefill_pages = prefill;
  r.most_pages = most;
  return r;
}

SchedRequest InFlight(uint64_t id, int held, int most) {
  SchedRequest r;
  r.id = id;
  r.tenant = 1;
  r.held_pages = held;
  r.most_pages = most;
  return r;
}

SchedulerOptions Greedy() {
  SchedulerOptions o;
  o.admission_ratio = o.admission_ratio_min = o.admission_ratio_decay = 0;
  return o;
}

// Admits from `waiting` until nothing more is admitted (plenty of pages, nothing in flight
// counted), returning the ids in admission order: the order the queue is served in.
std::vector<uint64_t> ServeOrder(Scheduler& s, std::vector<SchedRequest> waiting) {
  std::vector<uint64_t> order;
  while (std::optional<size_t> i = s.Admit(waiting, {}, 1000)) {
    order.push_back(waiting[*i].id);
    s.Admitted(waiting[*i].tenant);
    waiting.erase(waiting.begin() + static_cast<std::ptrdiff_t>(*i));
  }
  return order;
}

TEST(SchedulerTest, OneTenantIsServedInArrivalOrder) {
  Scheduler s(Greedy());
  EXPECT_EQ(ServeOrder(s, {Waiting(1, 1), Waiting(2, 1), Waiting(3, 1)}),
            (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(s.Admit({}, {}, 1000), std::nullopt) << "nothing waits";
}

// Tenant 1 queued many requests before tenant 2 and 3 sent theirs: the tenants take turns, so
// tenant 2's and 3's first requests do not wait behind all of tenant 1's.
TEST(SchedulerTest, TenantsTakeTurnsSoNoQueueStarvesAnother) {
  Scheduler s(Greedy());
  const std::vector<SchedRequest> q = {Waiting(1, 1), Waiting(2, 1), Waiting(3, 1), Waiting(4, 1),
                                       Waiting(5, 2), Waiting(6, 3), Waiting(7, 2)};
  EXPECT_EQ(ServeOrder(s, q), (std::vector<uint64_t>{1, 5, 6, 2, 7, 3, 4}));
}

TEST(SchedulerTest, PreemptedRequestsGoFirstWhateverTheTurn) {
  Scheduler s(Greedy());
  s.Admitted(1);  // tenant 2's turn next
  SchedRequest back = Waiting(9, 1);
  back.preempted = true;
  EXPECT_EQ(ServeOrder(s, {Waiting(1, 2), back, Waiting(3, 1)}), (std::vector<uint64_t>{9, 1, 3}));
}

TEST(SchedulerTest, AloneTheRequestNeedsItsPrefillPagesAndTheReserve) {
  SchedulerOptions o;  // ratio 1: full growth reservation, which applies only beside others
  o.reserve_pages = 2;
  Scheduler s(o);
  const std::vector<SchedRequest> q = {Waiting(1, 1, /*prefill=*/3, /*most=*/50)};
  EXPECT_EQ(s.Admit(q, {}, 4), std::nullopt) << "3 + 2 reserve > 4";
  EXPECT_EQ(s.Admit(q, {}, 5), 0u) << "twin: exactly enough, its growth is not reserved alone";
}

TEST(SchedulerTest, BesideOthersTheWholeGrowthIsReservedAtRatioOne) {
  SchedulerOptions o;
  o.admission_ratio = o.admission_ratio_min = 1.0;
  Scheduler s(o);
  // In flight: holds 2 of its 6 pages (4 to grow). The candidate: 1 prefill page, up to 3
  // (2 to grow). Need: 1 + 1 reserve + 4 + 2 = 8.
  const std::vector<SchedRequest> q = {Waiting(2, 1, 1, 3)};
  const std::vector<SchedRequest> f = {InFlight(1, 2, 6)};
  EXPECT_EQ(s.Admit(q, f, 7), std::nullopt);
  EXPECT_EQ(s.Admit(q, f, 8), 0u);
  // Greedy admission reserves no growth: 1 + 1 fits in 2.
  Scheduler g(Greedy());
  EXPECT_EQ(g.Admit(q, f, 2), 0u);
  EXPECT_EQ(g.Admit(q, f, 1), std::nullopt);
}

TEST(SchedulerTest, AtHalfRatioHalfTheGrowthIsReservedRoundedUp) {
  SchedulerOptions o;
  o.admission_ratio = o.admission_ratio_min = 0.5;
  Scheduler s(o);
  ASSERT_DOUBLE_EQ(s.ratio(), 0.5);
  // Growth 4 + 1 = 5, half is 2.5, rounded up 3: need 1 + 1 + 3 = 5.
  const std::vector<SchedRequest> q = {Waiting(2, 1, 1, 2)};
  const std::vector<SchedRequest> f = {InFlight(1, 2, 6)};
  EXPECT_EQ(s.Admit(q, f, 4), std::nullopt);
  EXPECT_EQ(s.Admit(q, f, 5), 0u);
}

TEST(SchedulerTest, AFullBatchAdmitsNothing) {
  SchedulerOptions o = Greedy();
  o.max_batch = 2;
  Scheduler s(o);
  const std::vector<SchedRequest> q = {Waiting(3, 1)};
  const std::vector<SchedRequest> two = {InFlight(1, 1, 1), InFlight(2, 1, 1)};
  const std::vector<SchedRequest> one = {InFlight(1, 1, 1)};
  EXPECT_EQ(s.Admit(q, two, 100), std::nullopt);
  EXPECT_EQ(s.Admit(q, one, 100), 0u);
}

// The request whose turn it is but that does not fit yet waits, and a smaller request behind
// it (of any tenant) does not overtake it: a long prompt is not starved by short ones.
TEST(SchedulerTest, NothingOvertakesTheRequestWhoseTurnItIs) {
  Scheduler s(Greedy());
  const std::vector<SchedRequest> q = {Waiting(1, 1, /*prefill=*/8), Waiting(2, 2, 1),
                                       Waiting(3, 1, 1)};
  EXPECT_EQ(s.Admit(q, {}, 5), std::nullopt);
  EXPECT_EQ(s.Admit(q, {}, 9), 0u) << "twin: with room, it is admitted first";
}

TEST(SchedulerTest, TheVictimIsTheRequestAdmittedLast) {
  Scheduler s(Greedy());
  EXPECT_EQ(
      s.Victim(std::vector<SchedRequest>{InFlight(1, 3, 9), InFlight(2, 1, 9), InFlight(3, 2, 9)}),
      2u);
  EXPECT_EQ(s.Victim(std::vector<SchedRequest>{InFlight(7, 1, 1)}), 0u);
}

// A running request (decoding) that holds `held` pages and needs `grow` more for its next token.
SchedRequest Decoding(uint64_t id, int held, int grow = 0) {
  SchedRequest r = InFlight(id, held, 100);
  r.grow_pages = grow;
  return r;
}

// A request admitted earlier whose prompt still has `left` tokens to compute.
SchedRequest Prefilling(uint64_t id, int held, int left) {
  SchedRequest r = InFlight(id, held, 100);
  r.prefill_tokens = left;
  return r;
}

SchedRequest Prompt(uint64_t id, isolation::TenantId tenant, int tokens, int pages) {
  SchedRequest r = Waiting(id, tenant, pages, pages);
  r.prefill_tokens = tokens;
  return r;
}

// Budget: the token budget alone (no cap on partial prefills: see Capped).
SchedulerOptions Budget(int step_tokens, int max_batch = 4) {
  SchedulerOptions o = Greedy();
  o.reserve_pages = 0;
  o.max_batch = max_batch;
  o.step_tokens = step_tokens;
  o.partial_prefill_tokens = 0;
  return o;
}

using Chunks = std::vector<StepPlan::Chunk>;

// A 100-token prompt with a budget of 40 tokens a step: it is admitted with its first 40, then
// computes 40 and the last 20 in the next two steps (the engine reports what is left).
TEST(SchedulerTest, ALongPromptIsPrefilledInChunksOfTheBudget) {
  Scheduler s(Budget(40));
  StepPlan p = s.Schedule({}, std::vector{Prompt(1, 1, 100, 7)}, 10);
  EXPECT_EQ(p.admit, (Chunks{{0, 40}}));
  EXPECT_EQ(p.tokens(), 40);
  p = s.Schedule(std::vector{Prefilling(1, 7, 60)}, {}, 3);
  EXPECT_EQ(p.prefill, (Chunks{{0, 40}}));
  p = s.Schedule(std::vector{Prefilling(1, 7, 20)}, {}, 3);
  EXPECT_EQ(p.prefill, (Chunks{{0, 20}}));
  EXPECT_TRUE(p.decode.empty());
  // Twin: with a budget as large as the prompt it is computed whole in one step.
  Scheduler whole(Budget(100));
  EXPECT_EQ(whole.Schedule({}, std::vector{Prompt(1, 1, 100, 7)}, 10).admit, (Chunks{{0, 100}}));
}

// Decode tokens are never held back by the budget, and they take their share of it first;
// then a waiting prompt is admitted (a short prompt does not wait behind a long one under way),
// and the prefill under way gets what is left.
TEST(SchedulerTest, DecodeTokensComeFirstThenAdmissionsThenPrefillUnderWay) {
  Scheduler s(Budget(8));
  const std::vector<SchedRequest> running = {Decoding(1, 1), Prefilling(2, 3, 30), Decoding(3, 1)};
  const StepPlan p = s.Schedule(running, std::vector{Prompt(4, 2, 5, 1)}, 10);
  EXPECT_EQ(p.decode, (std::vector<size_t>{0, 2}));
  EXPECT_EQ(p.admit, (Chunks{{0, 5}}));
  EXPECT_EQ(p.prefill, (Chunks{{1, 1}})) << "8 - 2 decode tokens - 5 admitted";
  EXPECT_EQ(p.tokens(), 8);
  // Twin: with nothing waiting, the prefill under way gets all that decoding leaves.
  const StepPlan q = s.Schedule(running, {}, 10);
  EXPECT_TRUE(q.admit.empty());
  EXPECT_EQ(q.prefill, (Chunks{{1, 6}}));
}

// A prompt that a step could hold whole is not started with the few tokens left after a long
// one's chunk: it waits one step and is then computed whole (admissions come first), instead of
// queueing as a prefill under way behind the long prompt.
TEST(SchedulerTest, AShortPromptIsComputedWholeInOneStep) {
  Scheduler s(Budget(10));
  const std::vector<SchedRequest> q = {Prompt(1, 1, 30, 3), Prompt(2, 2, 6, 1)};
  const StepPlan p = s.Schedule({}, q, 10);
  EXPECT_EQ(p.admit, (Chunks{{0, 10}})) << "the long one takes the step; the short one waits";
  s.Admitted(1);
  const StepPlan next =
      s.Schedule(std::vector{Prefilling(1, 3, 20)}, std::vector{Prompt(2, 2, 6, 1)}, 7);
  EXPECT_EQ(next.admit, (Chunks{{0, 6}})) << "whole, first";
  EXPECT_EQ(next.prefill, (Chunks{{0, 4}}));
  // Twin: a prompt longer than a whole step starts with what is left.
  const StepPlan long_one =
      s.Schedule(std::vector{Prefilling(1, 3, 20)}, std::vector{Prompt(3, 2, 16, 2)}, 7);
  EXPECT_EQ(long_one.admit, (Chunks{{0, 10}}));
  EXPECT_TRUE(long_one.prefill.empty());
}

// Two prefills under way: the older gets its chunk first, the newer what is left.
TEST(SchedulerTest, PrefillsUnderWayGoOldestFirst) {
  Scheduler s(Budget(10));
  const StepPlan p =
      s.Schedule(std::vector{Prefilling(1, 3, 7), Prefilling(2, 3, 20)}, {}, /*free_pages=*/0);
  EXPECT_EQ(p.prefill, (Chunks{{0, 7}, {1, 3}}));
}

// Short prompts beside a long one: one step admits several (each tenant in turn), as far as the
// budget and the batch allow.
TEST(SchedulerTest, OneStepAdmitsManyPromptsWithinBudgetAndBatch) {
  Scheduler s(Budget(64, /*max_batch=*/3));
  const std::vector<SchedRequest> q = {Prompt(1, 1, 10, 1), Prompt(2, 1, 10, 1),
                                       Prompt(3, 2, 10, 1), Prompt(4, 2, 10, 1)};
  const StepPlan p = s.Schedule({}, q, 10);
  EXPECT_EQ(p.admit, (Chunks{{0, 10}, {2, 10}, {1, 10}})) << "turns: 1, 2, 1; batch of 3";
  EXPECT_EQ(s.Schedule(std::vector{Decoding(9, 1)}, q, 10).admit.size(), 2u)
      << "one in flight: room for two more";
}

// When the next token's page is not there, the newest request in flight (here one still
// prefilling) gives its pages back, and nothing is admitted in that step.
TEST(SchedulerTest, ADryPoolPreemptsTheNewestAndAdmitsNothing) {
  Scheduler s(Budget(64));
  const std::vector<SchedRequest> running = {Decoding(1, 2, 1), Decoding(2, 2, 1),
                                             Prefilling(3, 3, 9)};
  const StepPlan p = s.Schedule(running, std::vector{Prompt(4, 1, 3, 1)}, 1);
  EXPECT_EQ(p.preempt, (std::vector<size_t>{2}));
  EXPECT_EQ(p.decode, (std::vector<size_t>{0, 1}));
  EXPECT_TRUE(p.prefill.empty());
  EXPECT_TRUE(p.admit.empty());
  // Twin: with two free pages nobody is preempted, and the prefill goes on.
  const StepPlan q = s.Schedule(running, {}, 2);
  EXPECT_TRUE(q.preempt.empty());
  EXPECT_EQ(q.decode, (std::vector<size_t>{0, 1}));
  EXPECT_EQ(q.prefill, (Chunks{{2, 9}}));
}

// The victim may be the request that needs the page itself, when it is the newest: then it does
// not decode either, and the older ones still do.
TEST(SchedulerTest, TheNewestMayPreemptItself) {
  Scheduler s(Budget(64));
  const StepPlan p =
      s.Schedule(std::vector{Decoding(1, 2, 0), Decoding(2, 2, 1)}, {}, /*free_pages=*/0);
  EXPECT_EQ(p.preempt, (std::vector<size_t>{1}));
  EXPECT_EQ(p.decode, (std::vector<size_t>{0}));
  // Two need a page: the newest gives its page to the oldest, then the second preempts itself.
  const StepPlan q = s.Schedule(std::vector{Decoding(1, 2, 1), Decoding(2, 1, 1), Decoding(3, 1)},
                                {}, /*free_pages=*/0);
  EXPECT_EQ(q.preempt, (std::vector<size_t>{2, 1}));
  EXPECT_EQ(q.decode, (std::vector<size_t>{0}));
}

// Pacing (Engine::Allow): with decoding paused nothing decodes, yet prefill goes on and
// admissions come in; an admission limit admits that many.
TEST(SchedulerTest, LimitsPauseDecodingAndCountAdmissions) {
  Scheduler s(Budget(64));
  const std::vector<SchedRequest> running = {Decoding(1, 1, 1), Prefilling(2, 1, 5)};
  const std::vector<SchedRequest> q = {Prompt(3, 1, 4, 1), Prompt(4, 1, 4, 1)};
  StepPlan p = s.Schedule(running, q, 10, StepLimits{.decode = false, .admissions = 1});
  EXPECT_TRUE(p.decode.empty());
  EXPECT_EQ(p.prefill, (Chunks{{1, 5}}));
  EXPECT_EQ(p.admit, (Chunks{{0, 4}}));
  p = s.Schedule(running, q, 10, StepLimits{.decode = true, .admissions = 0});
  EXPECT_EQ(p.decode, (std::vector<size_t>{0}));
  EXPECT_TRUE(p.admit.empty());
  EXPECT_EQ(s.Schedule(running, q, 10).admit.size(), 2u) << "twin: no limits";
}

// Schedule is const: the turn moves only when the engine reports the admission.
TEST(SchedulerTest, TheTurnMovesWhenAnAdmissionIsReported) {
  Scheduler s(Budget(4));
  const std::vector<SchedRequest> q = {Prompt(1, 1, 4, 1), Prompt(2, 2, 4, 1)};
  EXPECT_EQ(s.Schedule({}, q, 10).admit, (Chunks{{0, 4}}));
  EXPECT_EQ(s.Schedule({}, q, 10).admit, (Chunks{{0, 4}})) << "same plan again";
  s.Admitted(1);
  EXPECT_EQ(s.Schedule({}, q, 10).admit, (Chunks{{1, 4}})) << "tenant 2's turn";
}

TEST(SchedulerTest, TheRatioFollowsUsageAndIsRaisedByPreemptions) {
  SchedulerOptions o;
  o.admission_ratio = 1.0;
  o.admission_ratio_min = 0.1;
  o.admission_ratio_decay = 0.25;
  Scheduler s(o);
  EXPECT_DOUBLE_EQ(s.ratio(), 1.0) << "starts at admission_ratio";
  s.Finished(10, 100);  // used 0.1: the estimate moves 1/16 of the way
  EXPECT_DOUBLE_EQ(s.usage(), 1.0 + (0.1 - 1.0) / 16);
  EXPECT_DOUBLE_EQ(s.ratio(), s.usage());
  for (int i = 0; i < 200; ++i) s.Finished(0, 100);
  EXPECT_LT(s.usage(), 0.1);
  EXPECT_DOUBLE_EQ(s.ratio(), 0.1) << "never below admission_ratio_min";
  s.Preempted();
  EXPECT_DOUBLE_EQ(s.ratio(), 1.0);
  s.DecodeStep();
  EXPECT_DOUBLE_EQ(s.ratio(), 0.75) << "the raise decays per decode step";
  s.DecodeStep();
  s.DecodeStep();
  s.DecodeStep();
  EXPECT_DOUBLE_EQ(s.ratio(), 0.1);
  const double before = s.usage();
  s.Finished(500, 100);  // more than it could: counted as all of it
  EXPECT_DOUBLE_EQ(s.usage(), before + (1.0 - before) / 16);
}

TEST(SchedulerTest, GreedyAdmissionKeepsARatioOfZero) {
  Scheduler s(Greedy());
  s.Preempted();
  EXPECT_EQ(s.ratio(), 0.0);
}

TEST(SchedulerTest, BadOptionsAreRefused) {
  for (auto [batch, reserve, ratio, min, decay] : {std::tuple{0, 1, 0.5, 0.1, 0.0},
                                                   {64, -1, 0.5, 0.1, 0.0},
                                                   {64, 1, 1.5, 0.1, 0.0},
                                                   {64, 1, 0.5, -0.1, 0.0},
                                                   {64, 1, 0.5, 0.1, 2.0},
                                                   {64, 1, std::nan(""), 0.1, 0.0}}) {
    SchedulerOptions o;
    o.max_batch = batch;
    o.reserve_pages = reserve;
    o.admission_ratio = ratio;
    o.admission_ratio_min = min;
    o.admission_ratio_decay = decay;
    EXPECT_FALSE(o.Validate().ok()) << batch << " " << reserve << " " << ratio;
  }
  EXPECT_TRUE(SchedulerOptions{}.Validate().ok()) << "the defaults are valid";
  SchedulerOptions small_budget;
  small_budget.step_tokens = small_budget.max_batch - 1;
  EXPECT_FALSE(small_budget.Validate().ok()) << "a budget below the batch";
  small_budget.step_tokens = small_budget.max_batch;
  EXPECT_TRUE(small_budget.Validate().ok()) << "twin: a budget of the batch";
  SchedulerOptions cap;
  cap.partial_prefill_tokens = -1;
  EXPECT_FALSE(cap.Validate().ok()) << "a negative partial prefill cap";
  cap.partial_prefill_tokens = 0;
  EXPECT_TRUE(cap.Validate().ok()) << "twin: no cap";
}

// A long prompt alone (nothing decodes, nothing waits) takes the whole budget: the cap only
// protects other requests' latency. Twin: with one request decoding, the cap applies.
TEST(SchedulerTest, ALongPromptAloneIsNotCapped) {
  SchedulerOptions o = Budget(100);
  o.partial_prefill_tokens = 20;
  Scheduler s(o);
  EXPECT_EQ(s.Schedule(std::vector{Prefilling(1, 3, 300)}, {}, 10).prefill, (Chunks{{0, 100}}));
  EXPECT_EQ(s.Schedule({}, std::vector{Prompt(1, 1, 300, 19)}, 40).admit, (Chunks{{0, 100}}));
  EXPECT_EQ(s.Schedule(std::vector{Prefilling(1, 3, 300), Decoding(2, 0)}, {}, 10).prefill,
            (Chunks{{0, 20}}));
}

SchedulerOptions Capped(int step_tokens, int cap) {
  SchedulerOptions o = Budget(step_tokens);
  o.partial_prefill_tokens = cap;
  return o;
}

// Prefills under way share the cap, oldest first, and leave the rest of the budget unused: the
// step stays short. Twin: without a cap they take all that decoding leaves.
TEST(SchedulerTest, PartialPrefillsTakeAtMostTheirCapTogether) {
  const std::vector<SchedRequest> running = {Decoding(1, 1), Prefilling(2, 3, 300),
                                             Prefilling(3, 3, 300)};
  const StepPlan capped = Scheduler(Capped(100, 30)).Schedule(running, {}, 10);
  EXPECT_EQ(capped.prefill, (Chunks{{1, 30}}));
  EXPECT_EQ(capped.tokens(), 31);
  const StepPlan twin = Scheduler(Capped(100, 0)).Schedule(running, {}, 10);
  EXPECT_EQ(twin.prefill, (Chunks{{1, 99}}));
}

// A long prompt's first chunk counts against the cap; a prompt that one step holds whole is
// not limited by it.
TEST(SchedulerTest, TheCapLimitsLongPromptsNotWholeOnes) {
  Scheduler s(Capped(100, 20));
  const std::vector<SchedRequest> running = {Decoding(4, 1)};
  const StepPlan whole = s.Schedule(running, std::vector{Prompt(2, 1, 50, 4)}, 10);
  EXPECT_EQ(whole.admit, (Chunks{{0, 50}})) << "whole, above the cap";
  const StepPlan long_one = s.Schedule(running, std::vector{Prompt(3, 1, 500, 32)}, 40);
  EXPECT_EQ(long_one.admit, (Chunks{{0, 20}})) << "its first chunk is capped";
}

// Prefills under way have the first claim on the cap: a new long prompt starts only with what
// they leave, so the oldest long prompts finish first. Twin: with the one under way nearly done,
// the new one starts with the rest.
TEST(SchedulerTest, PrefillsUnderWayComeFirstForTheCap) {
  Scheduler s(Capped(100, 20));
  const std::vector<SchedRequest> q = {Prompt(2, 1, 500, 32)};
  const StepPlan busy = s.Schedule(std::vector{Prefilling(1, 32, 300), Decoding(3, 1)}, q, 40);
  EXPECT_TRUE(busy.admit.empty()) << "the cap is the older prompt's";
  EXPECT_EQ(busy.prefill, (Chunks{{0, 20}}));
  const StepPlan rest = s.Schedule(std::vector{Prefilling(1, 32, 5), Decoding(3, 1)}, q, 40);
  EXPECT_EQ(rest.admit, (Chunks{{0, 15}}));
  EXPECT_EQ(rest.prefill, (Chunks{{0, 5}}));
}

// A long prompt that cannot start (the cap spent) does not hold up the whole prompts behind it,
// its own tenant's included; it is offered first again when its tenant's turn comes. Twin: in
// the next step, with the cap free, it starts before its tenant's later prompts.
TEST(SchedulerTest, ALongPromptWaitingForTheCapHoldsUpNoWholePrompt) {
  Scheduler s(Capped(100, 20));
  const std::vector<SchedRequest> q = {Prompt(1, 1, 500, 32), Prompt(2, 2, 500, 32),
                                       Prompt(3, 2, 10, 1), Prompt(4, 3, 10, 1)};
  const StepPlan p = s.Schedule({}, q, 100);
  EXPECT_EQ(p.admit, (Chunks{{0, 20}, {2, 10}, {3, 10}}))
      << "tenant 1's long prompt takes the cap; tenant 2's long one waits, its short one goes";
  s.Admitted(1);
  s.Admitted(2);
  s.Admitted(3);
  const std::vector<SchedRequest> next_q = {Prompt(2, 2, 500, 32), Prompt(5, 2, 10, 1)};
  const StepPlan next =
      s.Schedule(std::vector{Prefilling(1, 32, 20), Decoding(3, 1), Decoding(4, 1)}, next_q, 60);
  EXPECT_EQ(next.admit, (Chunks{{1, 10}})) << "the cap is the prompt under way's this step";
  EXPECT_EQ(next.prefill, (Chunks{{0, 20}}));
  const StepPlan later = s.Schedule(std::vector{Decoding(3, 1), Decoding(4, 1)}, next_q, 60);
  EXPECT_EQ(later.admit, (Chunks{{0, 20}, {1, 10}})) << "its turn and the cap: it starts first";
}

}  // namespace
}  // namespace kvguard::core
