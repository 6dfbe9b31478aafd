// core/scheduler.h: the engine's scheduling decisions, as data. No threads, no clock and no
// pages inside: the engine describes its requests and its pool, the scheduler answers, and
// its tests call it directly, decision by decision (vLLM v1's scheduler is the model).
//
// Decisions:
//   * Admission: which waiting request starts its (re)prefill now, if any. Preempted requests
//     come first, in queue order (the engine puts each victim at the front, so the latest is
//     first, as before the scheduler): their KV was thrown away and they hold the user's
//     partial output. Then tenants take turns: round robin over the tenants with a waiting request,
//     starting after the tenant admitted last, each offering its oldest request, so one
//     tenant's queue cannot starve another's. The request so chosen is admitted when the decode
//     batch has room and the pool holds its prefill pages plus the reserve and, while other
//     requests are in flight, ceil(ratio x the pages they and it may still grow into). If it
//     does not fit it waits, and nothing overtakes it: a long prompt is never starved by short
//     ones.
//   * Preemption: when the pool runs dry, the running request admitted last gives its pages
//     back (it has the least work to recompute, and the oldest finish first).
//   * The admission ratio (SchedulerOptions::admission_ratio): the estimate of how much of
//     max_tokens requests use, raised to 1 by every preemption.
#ifndef KVGUARD_CORE_SCHEDULER_H_
#define KVGUARD_CORE_SCHEDULER_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

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

  // Validate: InvalidArgument unless max_batch >= 1, reserve_pages >= 0 and the three ratio
  // parameters are in [0, 1].
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
  // GrowthPages: pages it may still need beyond what it holds (waiting: beyond its prefill).
  int GrowthPages(bool waiting) const;
};

class Scheduler {
 public:
  explicit Scheduler(const SchedulerOptions& options);  // options must Validate

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
  std::optional<size_t> Candidate(std::span<const SchedRequest> waiting) const;

  SchedulerOptions options_;
  double usage_;
  double raise_ = 0;
  isolation::TenantId last_tenant_ = 0;  // 0: none yet
};

}  // namespace kvguard::core

#endif  // KVGUARD_CORE_SCHEDULER_H_
