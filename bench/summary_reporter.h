// bench/summary_reporter.h: turns a Google Benchmark run of the kernel benchmarks into the
// table the issue asks for: median GB/s of each memory-bound kernel and its ratio to the STREAM
// read bandwidth measured in the same run, at the same thread count.
#ifndef KVGUARD_BENCH_SUMMARY_REPORTER_H_
#define KVGUARD_BENCH_SUMMARY_REPORTER_H_

#include <benchmark/benchmark.h>

#include <map>
#include <string>
#include <vector>

namespace kvguard::bench {

// One benchmark's result: the median (or the single run) of its repetitions.
struct SummaryRow {
  std::string name;         // benchmark name without the aggregate suffix
  double gbytes_per_s = 0;  // kBytes counter / 1e9; 0 when the benchmark reports no bytes
  double gflops_per_s = 0;  // kFlops counter / 1e9 (compute-bound benchmarks); 0 when absent
  double ms_per_iter = 0;   // real or CPU time per iteration, whichever the benchmark used
  int threads = 0;          // parsed from "threads:N" in the name (0 when absent)
  int repetitions = 1;
};

// SummaryReporter forwards everything to the console reporter (so a person watching sees
// progress) and keeps each benchmark's median for Rows().
class SummaryReporter : public benchmark::ConsoleReporter {
 public:
  // SummaryReporter colours the console output only when stdout is a terminal.
  SummaryReporter();

  void ReportRuns(const std::vector<Run>& runs) override;

  // Rows returns one row per benchmark, sorted by name.
  std::vector<SummaryRow> Rows() const;

  // StreamReadGBps returns the median STREAM read bandwidth at `threads`, or 0 if not run.
  double StreamReadGBps(int threads) const;

  // Markdown returns the summary table: name, GB/s, % of STREAM read at the same thread count.
  std::string Markdown() const;

  // Json returns the rows and STREAM figures as a JSON document.
  std::string Json() const;

 private:
  std::map<std::string, SummaryRow> rows_;
};

}  // namespace kvguard::bench

#endif  // KVGUARD_BENCH_SUMMARY_REPORTER_H_
