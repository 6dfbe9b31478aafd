#include "core/engine/scheduler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace kvguard::core {

absl::Status SchedulerOptions::Validate() const {
  if (max_batch < 1)
    return absl::InvalidArgumentError(absl::StrCat("max_batch ", max_batch, " < 1"));
  if (reserve_pages < 0) return absl::InvalidArgumentError("reserve_pages < 0");
  auto unit = [](double x) { return x >= 0 && x <= 1; };  // false for NaN too
  if (!unit(admission_ratio) || !unit(admission_ratio_min) || !unit(admission_ratio_decay)) {
    return absl::InvalidArgumentError(
        "admission ratio, its minimum and its decay must each be in [0, 1]");
  }
  if (step_tokens < max_batch) {
    return absl::InvalidArgumentError(
        absl::StrCat("step_tokens ", step_tokens, " must be >= max_batch ", max_batch));
  }
  if (partial_prefill_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("partial_prefill_tokens ", partial_prefill_tokens, " < 0"));
  }
  return absl::OkStatus();
}

int StepPlan::tokens() const {
  int n = static_cast<int>(decode.size());
  for (const Chunk& c : prefill) n += c.tokens;
  for (const Chunk& c : admit) n += c.tokens;
  return n;
}

int SchedRequest::GrowthPages(bool waiting) const {
  return std::max(0, most_pages - (waiting ? prefill_pages : held_pages));
}

Scheduler::Scheduler(const SchedulerOptions& options)
    : options_(options), usage_(options.admission_ratio) {}

std::optional<size_t> Scheduler::Candidate(std::span<const SchedRequest> waiting,
                                           isolation::TenantId last_tenant) const {
  for (size_t i = 0; i < waiting.size(); ++i) {
    if (waiting[i].preempted) return i;  // the first preempted in queue order, any tenant
  }
  // Round robin: the first tenant after last_tenant (by id, wrapping) that has a request
  // waiting offers its oldest.
  std::optional<size_t> after, first;  // the best candidate after the turn, and overall
  for (size_t i = 0; i < waiting.size(); ++i) {
    const isolation::TenantId t = waiting[i].tenant;
    if (t > last_tenant && (!after || t < waiting[*after].tenant)) after = i;
    if (!first || t < waiting[*first].tenant) first = i;
  }
  return after ? after : first;
}

std::optional<size_t> Scheduler::Admit(std::span<const SchedRequest> waiting,
                                       std::span<const SchedRequest> in_flight,
                                       int free_pages) const {
  return AdmitAfter(waiting, in_flight, free_pages, last_tenant_);
}

std::optional<size_t> Scheduler::AdmitAfter(std::span<const SchedRequest> waiting,
                                            std::span<const SchedRequest> in_flight, int free_pages,
                                            isolation::TenantId last_tenant) const {
  if (in_flight.size() >= static_cast<size_t>(options_.max_batch)) return std::nullopt;
  const std::optional<size_t> c = Candidate(waiting, last_tenant);
  if (!c) return std::nullopt;
  const SchedRequest& next = waiting[*c];
  int64_t need = int64_t{next.prefill_pages} + options_.reserve_pages;
  const double r = ratio();
  if (!in_flight.empty() && r > 0) {
    int64_t growth = next.GrowthPages(/*waiting=*/true);
    for (const SchedRequest& f : in_flight) growth += f.GrowthPages(/*waiting=*/false);
    need += static_cast<int64_t>(std::ceil(r * static_cast<double>(growth)));
  }
  if (free_pages < need) return std::nullopt;
  return c;
}

StepPlan Scheduler::Schedule(std::span<const SchedRequest> running,
                             std::span<const SchedRequest> waiting, int free_pages,
                             StepLimits limits) const {
  StepPlan plan;
  std::vector<bool> gone(running.size(), false);  // preempted in this step
  int64_t free = free_pages;
  // 1. Decode, oldest first; a dry pool preempts the newest request still in.
  for (size_t i = 0; i < running.size(); ++i) {
    const SchedRequest& r = running[i];
    if (!limits.decode || gone[i] || r.prefill_tokens > 0) continue;
    while (free < r.grow_pages) {
      size_t v = running.size();
      while (v > 0 && gone[v - 1]) --v;
      // Victim over the requests still in: the newest, which may be r itself (never one
      // planned already: those are older than r).
      const size_t victim = v - 1;
      gone[victim] = true;
      plan.preempt.push_back(victim);
      free += running[victim].held_pages;
      if (victim == i) break;
    }
    if (gone[i]) continue;
    free -= r.grow_pages;
    plan.decode.push_back(i);
  }
  int budget = options_.step_tokens - static_cast<int>(plan.decode.size());
  const int whole_budget = budget;
  // Tokens partial prefills may still take in this step (SchedulerOptions::partial_prefill_tokens):
  // limited while the step has decode tokens or a prompt it could hold whole waits (whose latency
  // the cap protects); long prompts with nothing else to do take the whole budget.
  const bool contended =
      !plan.decode.empty() || std::any_of(waiting.begin(), waiting.end(), [&](const auto& w) {
        return w.prefill_tokens <= whole_budget;
      });
  int partial_left = options_.partial_prefill_tokens > 0 && contended
                         ? options_.partial_prefill_tokens
                         : std::numeric_limits<int>::max();
  // Of that, prefills under way come first (the oldest long prompts finish first, rather than
  // every long prompt creeping on together); a long prompt starts with what they leave. Planned
  // after admissions all the same, which keep the budget's first claim.
  int64_t under_way = 0;
  for (size_t i = 0; i < running.size(); ++i) {
    if (!gone[i]) under_way += running[i].prefill_tokens;
  }
  int new_partial_left =
      partial_left - static_cast<int>(std::min<int64_t>(partial_left, under_way));
  // 2. Admission, by Admit's rule, against the pages left and everything in flight then; none
  // in a step that just found the pool dry.
  if (plan.preempt.empty()) {
    std::vector<SchedRequest> in_flight(running.begin(), running.end());
    std::vector<SchedRequest> queue(waiting.begin(), waiting.end());
    std::vector<size_t> queue_index(waiting.size());
    for (size_t i = 0; i < waiting.size(); ++i) queue_index[i] = i;
    isolation::TenantId turn = last_tenant_;
    while (budget > 0 && !queue.empty() &&
           (limits.admissions < 0 || static_cast<int64_t>(plan.admit.size()) < limits.admissions)) {
      const std::optional<size_t> a = AdmitAfter(queue, in_flight, static_cast<int>(free), turn);
      if (!a) break;
      SchedRequest admitted = queue[*a];
      // A prompt that one step's budget could hold is computed whole, in one step: it waits for
      // the next step (admissions first) rather than start here with what is left and then queue
      // as a prefill under way behind the long ones. Only a prompt longer than that starts with
      // a partial chunk.
      if (admitted.prefill_tokens > budget && admitted.prefill_tokens <= whole_budget) break;
      int n = std::min(admitted.prefill_tokens, budget);
      if (n < admitted.prefill_tokens) {  // a long prompt starts: a partial prefill
        n = std::min(n, new_partial_left);
        if (n == 0) {
          // No long prompt may start in this step: it waits, and the prompts behind it (its own
          // tenant's included) that a step holds whole go on, since they do not spend the cap.
          // It keeps its place: it is offered first when its tenant's turn comes, and pages are
          // still never taken from under it (Admit).
          queue.erase(queue.begin() + static_cast<std::ptrdiff_t>(*a));
          queue_index.erase(queue_index.begin() + static_cast<std::ptrdiff_t>(*a));
          continue;
        }
        new_partial_left -= n;
        partial_left -= n;
      }
      plan.admit.push_back({queue_index[*a], n});
      budget -= n;
      free -= admitted.prefill_pages;
      turn = admitted.tenant;
      admitted.held_pages = admitted.prefill_pages;
      in_flight.push_back(admitted);
      queue.erase(queue.begin() + static_cast<std::ptrdiff_t>(*a));
      queue_index.erase(queue_index.begin() + static_cast<std::ptrdiff_t>(*a));
    }
  }
  // 3. Prefill chunks of requests admitted earlier, oldest first, with what is left.
  for (size_t i = 0; i < running.size() && budget > 0 && partial_left > 0; ++i) {
    if (gone[i] || running[i].prefill_tokens == 0) continue;
    const int n = std::min({running[i].prefill_tokens, budget, partial_left});
    plan.prefill.push_back({i, n});
    budget -= n;
    partial_left -= n;
  }
  return plan;
}

void Scheduler::Finished(int generated, int could) {
  const double used = std::min(1.0, static_cast<double>(generated) / std::max(1, could));
  usage_ += (used - usage_) / 16.0;
}

void Scheduler::DecodeStep() { raise_ = std::max(0.0, raise_ - options_.admission_ratio_decay); }

double Scheduler::ratio() const {
  if (options_.admission_ratio == 0) return 0;  // greedy
  return std::clamp(std::max(usage_, raise_), options_.admission_ratio_min, 1.0);
}

}  // namespace kvguard::core
