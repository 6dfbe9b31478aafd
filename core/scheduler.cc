#include "core/scheduler.h"

#include <algorithm>
#include <cmath>

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
  return absl::OkStatus();
}

int SchedRequest::GrowthPages(bool waiting) const {
  return std::max(0, most_pages - (waiting ? prefill_pages : held_pages));
}

Scheduler::Scheduler(const SchedulerOptions& options)
    : options_(options), usage_(options.admission_ratio) {}

std::optional<size_t> Scheduler::Candidate(std::span<const SchedRequest> waiting) const {
  for (size_t i = 0; i < waiting.size(); ++i) {
    if (waiting[i].preempted) return i;  // the first preempted in queue order, any tenant
  }
  // Round robin: the first tenant after last_tenant_ (by id, wrapping) that has a request
  // waiting offers its oldest.
  std::optional<size_t> after, first;  // the best candidate after the turn, and overall
  for (size_t i = 0; i < waiting.size(); ++i) {
    const isolation::TenantId t = waiting[i].tenant;
    if (t > last_tenant_ && (!after || t < waiting[*after].tenant)) after = i;
    if (!first || t < waiting[*first].tenant) first = i;
  }
  return after ? after : first;
}

std::optional<size_t> Scheduler::Admit(std::span<const SchedRequest> waiting,
                                       std::span<const SchedRequest> in_flight,
                                       int free_pages) const {
  if (in_flight.size() >= static_cast<size_t>(options_.max_batch)) return std::nullopt;
  const std::optional<size_t> c = Candidate(waiting);
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
