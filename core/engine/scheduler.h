// core/engine/scheduler.h: the engine's scheduling decisions, as data. No threads, no clock and no
// pages inside: the engine describes its requests and its pool, the scheduler answers with a
// plan for one step, and its tests call it directly, step by step (vLLM v1's scheduler is the
// model).
//
// A step (Schedule) is one forward pass over a mixed batch, planned in this order:
//   1. Decode: every running request whose prompt is in the cache decodes one token, oldest
//      first, each taking the page its next token needs. When the pool runs dry the request
//      admitted last (in flight, decoding or still prefilling) is preempted: its pages go
//      back and it waits again, to be recomputed from its tokens (it has the least work to
//      recompute, and the oldest finish first). Decode tokens are never held back by the
//      token budget.
//   2. Admission, while the step's token budget (SchedulerOptions::step_tokens) less the decode
//      tokens, batch room and pages last, and no request was preempted in this step: preempted
//      requests come first, in queue order (their KV was thrown away and they hold the user's
//      partial output); then tenants take turns: round robin over the tenants with a waiting
//      request, starting after the tenant admitted last, each offering its oldest request, so
//      one tenant's queue cannot starve another's. The request so chosen is admitted when the
//      pool holds its whole prefill's pages plus the reserve and, while other requests are in
//      flight, ceil(ratio x the pages they and it may still grow into). If it does not fit it
//      waits, and nothing overtakes it: a long prompt is never starved by short ones. A prompt that
//      the step's budget (less the decode tokens) could hold whole is admitted only when it
//      fits whole in what is left, and then computed in this step; a longer one starts with
//      what is left (chunked prefill).
//   3. Prefill that goes on: requests admitted in earlier steps whose prompt is not all in the
//      cache compute their next chunk, oldest first, with the budget left: a long prompt
//      spreads over several steps (chunked prefill).
//   Partial prefills (a long prompt's first chunk in 2., the chunks in 3.) together take at most
//   SchedulerOptions::partial_prefill_tokens of the budget while the step decodes or a short
//   prompt waits, prefills under way first: a long prompt starts with what they leave, or waits
//   (without holding up the whole prompts behind it) while they use all of it.
//   Admission comes before the chunks of prefills under way, so a short prompt waits at most
//   one step behind long ones (head-of-line blocking), and a step's length stays bounded by
//   the budget; the prefills under way take every token admissions leave, and admissions are
//   bounded by the batch and the pool, so they always progress.
//   * The admission ratio (SchedulerOptions::admission_ratio): the estimate of how much of
//     max_tokens requests use, raised to 1 by every preemption.
#ifndef KVGUARD_CORE_ENGINE_SCHEDULER_H_
#define KVGUARD_CORE_ENGINE_SCHEDULER_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "isolation/violation.h"

namespace kvguard::core {

struct SchedulerOptions {
  int max_batch = 64;     // requests in flight (prefilling or decoding) at once
  int reserve_pages = 1;  // admission needs the prefill's pages plus this many
  // Admission control against preemption: while other requests are in flight, a request is
  // admitted only when the pool also holds ceil(ratio x the pages that it and every in-flight
  // request may still grow into, up to prompt + max_tokens within the context). The ratio is
  // the estimate of how much of max_tokens requests actually use: it starts at
  // admission_ratio and follows an average (weight 1/16) of generated / (tokens it could have
  // generated) over finished requests, never below admission_ratio_min. Every preemption raises
  // it to 1 for a while (the raise falls by admission_ratio_decay per decode step): a preempted
  // request's KV is recomputed, work thrown away. (SGLang's "new token ratio" does the same with
  // a fixed decay; following the observed usage keeps a workload whose requests run to
  // max_tokens from being over-admitted over and over. Measured on `small`, context 2048, BF16
  // KV, 32 clients: greedy admission preempted 16 times and halved throughput.) With no other
  // request in flight the prefill's pages plus the reserve suffice, so nothing starves.
  // admission_ratio 0: greedy admission (prefill pages plus reserve only), always.
  double admission_ratio = 1.0;
  double admission_ratio_min = 0.1;
  double admission_ratio_decay = 1e-3;
  // The step's token budget: decode tokens plus prefill chunk tokens. Prefill chunks take what
  // the decode tokens leave. Larger steps amortise reading the weights over more tokens;
  // smaller ones bound how long a step (and so every running request's next token) takes.
  int step_tokens = 256;
  // The most tokens that partial prefills (chunks of prompts longer than what one step holds,
  // and those prompts' later chunks) take in one step, all together, while the step has decode
  // tokens or a prompt it could hold whole waits; 0: no limit beyond the budget. Whole prompts and
  // decode tokens are not limited by it, and long prompts with nothing else to do take the whole
  // budget. A long prompt's chunk is the costliest row of a step (it attends over everything before
  // it), and a step's length is every running request's time between tokens and every waiting short
  // prompt's wait: the cap keeps steps short while long prompts are prefilled beside others
  // (vLLM's long_prefill_token_threshold has the same purpose), at the cost of the long prompts'
  // own time to first token. 64 measured best of 0 / 64 / 128 on the head-of-line experiment
  // (bench/results/serve-load-hol.md).
  int partial_prefill_tokens = 64;

  // Validate: InvalidArgument unless max_batch >= 1, reserve_pages >= 0, the three ratio
  // parameters are in [0, 1], step_tokens >= max_batch (so that a prefill in flight always
  // has budget beside the decode tokens) and partial_prefill_tokens >= 0.
  absl::Status Validate() const;
};

// SchedRequest is what the scheduler knows of one request, in pages of the pool.
struct SchedRequest {
  uint64_t id = 0;
  isolation::TenantId tenant = 0;
  bool preempted = false;  // waiting again after a preemption
  int held_pages = 0;      // in flight: pages it holds now
  int prefill_pages = 0;   // waiting: pages its (re)prefill needs
  int most_pages = 0;      // pages it may ever hold (prompt + max_tokens within the context)
  // In flight: prompt tokens not yet in the cache (0: it decodes). Waiting: tokens its
  // (re)prefill computes.
  int prefill_tokens = 0;
  int grow_pages = 0;  // in flight and decoding: pages its next token needs (0 or 1)
  // GrowthPages: pages it may still need beyond what it holds (waiting: beyond its prefill).
  int GrowthPages(bool waiting) const;
};

// StepPlan is one step, as Schedule decides it. Indices are into Schedule's `running` and
// `waiting`.
struct StepPlan {
  struct Chunk {
    size_t index = 0;
    int tokens = 0;  // prompt tokens this step computes
    bool operator==(const Chunk&) const = default;
  };
  std::vector<size_t> preempt;  // running requests preempted (in this order), before the rest
  std::vector<size_t> decode;   // running requests that decode one token
  std::vector<Chunk> prefill;   // running requests whose prefill goes on
  std::vector<Chunk> admit;     // waiting requests admitted, in admission order
  int tokens() const;           // decode tokens plus chunk tokens
  bool runs() const { return !decode.empty() || !prefill.empty() || !admit.empty(); }
};

// StepLimits pace a step (Engine::Allow): what Schedule may plan beyond what it would anyway.
struct StepLimits {
  bool decode = true;       // false: no request decodes (prefill chunks and admissions go on)
  int64_t admissions = -1;  // at most this many admissions; -1: no limit
};

class Scheduler {
 public:
  explicit Scheduler(const SchedulerOptions& options);  // options must Validate

  // Schedule plans the next step (see the file comment) from `running` (every request in
  // flight, in admission order, oldest first), `waiting` (queue order) and the pool's free
  // pages, within `limits` (pacing: Engine::Allow). Const: the engine carries the plan out and
  // reports each admission (Admitted), which moves the tenants' turn.
  StepPlan Schedule(std::span<const SchedRequest> running, std::span<const SchedRequest> waiting,
                    int free_pages, StepLimits limits = {}) const;

  // Admit returns the index into `waiting` (queue order: oldest first) of the request to admit
  // now, or nullopt (nothing waits, the batch is full, or the chosen request does not fit in
  // `free_pages` yet). `in_flight` holds every admitted request that has not finished.
  std::optional<size_t> Admit(std::span<const SchedRequest> waiting,
                              std::span<const SchedRequest> in_flight, int free_pages) const;
  // Admitted records that `tenant`'s request was admitted: the turn moves past it.
  void Admitted(isolation::TenantId tenant) { last_tenant_ = tenant; }

  // Victim returns the index into `running` (admission order, oldest first; not empty) of the
  // request to preempt when the pool is dry.
  size_t Victim(std::span<const SchedRequest> running) const { return running.size() - 1; }

  // Finished records a request that ended by itself (length, stop, EOS) after generating
  // `generated` of the `could` tokens it might have; Preempted records a preemption;
  // DecodeStep records one decode step (the raise decays).
  void Finished(int generated, int could);
  void Preempted() { raise_ = 1.0; }
  void DecodeStep();

  // ratio is the admission ratio in force now; usage the running estimate of the fraction of
  // max_tokens used.
  double ratio() const;
  double usage() const { return usage_; }

 private:
  // Candidate returns the index of the request admission considers next (see the file
  // comment), or nullopt if nothing waits.
  std::optional<size_t> Candidate(std::span<const SchedRequest> waiting,
                                  isolation::TenantId last_tenant) const;
  // AdmitAfter is Admit with the turn after `last_tenant`.
  std::optional<size_t> AdmitAfter(std::span<const SchedRequest> waiting,
                                   std::span<const SchedRequest> in_flight, int free_pages,
                                   isolation::TenantId last_tenant) const;

  SchedulerOptions options_;
  double usage_;
  double raise_ = 0;
  isolation::TenantId last_tenant_ = 0;  // 0: none yet
};

}  // namespace kvguard::core

#endif  // KVGUARD_CORE_ENGINE_SCHEDULER_H_
