#include "bench/summary_reporter.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "bench/bench_util.h"
#include "nlohmann/json.hpp"

namespace kvguard::bench {
namespace {

int ParseThreads(const std::string& name) {
  const size_t at = name.find("threads:");
  return at == std::string::npos ? 0 : std::atoi(name.c_str() + at + 8);
}

std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

}  // namespace

SummaryReporter::SummaryReporter()
    : benchmark::ConsoleReporter(isatty(STDOUT_FILENO) ? OO_ColorTabular : OO_Tabular) {}

void SummaryReporter::ReportRuns(const std::vector<Run>& runs) {
  benchmark::ConsoleReporter::ReportRuns(runs);
  for (const Run& run : runs) {
    if (run.error_occurred) continue;
    // With repetitions only the median aggregate is kept; without, the single run.
    const bool is_median = run.run_type == Run::RT_Aggregate && run.aggregate_name == "median";
    const bool is_single = run.run_type == Run::RT_Iteration && run.repetitions <= 1;
    if (!is_median && !is_single) continue;
    SummaryRow row;
    row.name = run.run_name.str();
    row.threads = ParseThreads(row.name);
    row.repetitions = static_cast<int>(run.repetitions);
    const auto it = run.counters.find(kBytes);
    if (it != run.counters.end()) row.gbytes_per_s = it->second.value / 1e9;
    const auto flops = run.counters.find(kFlops);
    if (flops != run.counters.end()) row.gflops_per_s = flops->second.value / 1e9;
    // Adjusted times are in run.time_unit; the multiplier is units per second.
    row.ms_per_iter =
        run.GetAdjustedRealTime() / benchmark::GetTimeUnitMultiplier(run.time_unit) * 1e3;
    rows_[row.name] = row;
  }
}

std::vector<SummaryRow> SummaryReporter::Rows() const {
  // Sorted by name: with random interleaving the order of first reports is random.
  std::vector<SummaryRow> out;
  for (const auto& [name, row] : rows_) out.push_back(row);
  return out;
}

double SummaryReporter::StreamReadGBps(int threads) const {
  for (const auto& [name, row] : rows_) {
    if (name.rfind("BM_StreamRead/", 0) == 0 && row.threads == threads) return row.gbytes_per_s;
  }
  return 0;
}

std::string SummaryReporter::Markdown() const {
  std::string md =
      "| benchmark | median GB/s | % of STREAM read (same threads) | GFLOP/s | ms/iter | reps |\n"
      "| --- | ---: | ---: | ---: | ---: | ---: |\n";
  for (const SummaryRow& row : Rows()) {
    const double stream = StreamReadGBps(row.threads);
    const bool has_ratio = row.gbytes_per_s > 0 && stream > 0;
    md += "| " + row.name + " | " + (row.gbytes_per_s > 0 ? Fixed(row.gbytes_per_s, 2) : "-") +
          " | " + (has_ratio ? Fixed(100.0 * row.gbytes_per_s / stream, 1) + "%" : "-") + " | " +
          (row.gflops_per_s > 0 ? Fixed(row.gflops_per_s, 1) : "-") + " | " +
          Fixed(row.ms_per_iter, 3) + " | " + std::to_string(row.repetitions) + " |\n";
  }
  return md;
}

std::string SummaryReporter::Json() const {
  nlohmann::json doc;
  doc["stream_read_gbps"] = {{"1", StreamReadGBps(1)}, {"2", StreamReadGBps(2)}};
  doc["benchmarks"] = nlohmann::json::array();
  for (const SummaryRow& r : Rows()) {
    const double stream = StreamReadGBps(r.threads);
    doc["benchmarks"].push_back({{"name", r.name},
                                 {"gbps", r.gbytes_per_s},
                                 {"stream_fraction", stream > 0 ? r.gbytes_per_s / stream : 0.0},
                                 {"gflops", r.gflops_per_s},
                                 {"ms_per_iter", r.ms_per_iter},
                                 {"threads", r.threads},
                                 {"repetitions", r.repetitions}});
  }
  return doc.dump(2) + "\n";
}

}  // namespace kvguard::bench
