// `kvguard bench kernels`: runs the kernel benchmarks in bench/ and prints (and optionally
// records) the summary: median GB/s per kernel and its fraction of the STREAM read bandwidth
// measured in the same run.
//
// Noise: memory bandwidth on shared machines moves 2-4x from minute to minute, so by default
// every benchmark runs several repetitions in random interleaved order
// (--benchmark_enable_random_interleaving) and the summary uses medians.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "bench/summary_reporter.h"
#include "kernels/cpu/dispatch.h"
#include "tools/commands.h"

namespace kvguard::tools {
namespace {

// The subset `--quick` runs (what `make run` shows): STREAM at 2 threads and the batch-1 /
// 2-thread headline kernels at the smaller shapes.
constexpr const char* kQuickFilter =
    "^BM_StreamRead/threads:2|^BM_MatMul/.*/4096x4096/batch:1/threads:2|"
    "^BM_PagedAttention/(fp8|bf16)/ctx:4096/.*threads:2|^BM_(Encode|Decode)Fp8/elements:16777216";

int BenchUsage() {
  std::fprintf(stderr,
               "usage: kvguard bench kernels [--quick] [--repetitions N] [--filter REGEX]\n"
               "                             [--markdown FILE] [--json FILE] "
               "[--benchmark_* flags]\n");
  return 2;
}

int RunBenchKernels(const std::vector<std::string>& args) {
  bool quick = false;
  int repetitions = 5;
  std::string filter = ".";
  std::string markdown_path;
  std::string json_path;
  std::vector<std::string> passthrough;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&](std::string* out) {
      if (i + 1 >= args.size()) return false;
      *out = args[++i];
      return true;
    };
    std::string v;
    if (a == "--quick") {
      quick = true;
    } else if (a == "--repetitions") {
      if (!value(&v) || (repetitions = std::atoi(v.c_str())) < 1) return BenchUsage();
    } else if (a == "--filter") {
      if (!value(&filter)) return BenchUsage();
    } else if (a == "--markdown") {
      if (!value(&markdown_path)) return BenchUsage();
    } else if (a == "--json") {
      if (!value(&json_path)) return BenchUsage();
    } else if (a.rfind("--benchmark_", 0) == 0) {
      passthrough.push_back(a);
    } else {
      std::fprintf(stderr, "kvguard bench kernels: unknown argument '%s'\n", a.c_str());
      return BenchUsage();
    }
  }
  if (quick) {
    if (filter == ".") filter = kQuickFilter;
    repetitions = std::min(repetitions, 3);
  }

  std::vector<std::string> flags = {"kvguard-bench", "--benchmark_filter=" + filter,
                                    "--benchmark_repetitions=" + std::to_string(repetitions),
                                    "--benchmark_enable_random_interleaving=true",
                                    "--benchmark_report_aggregates_only=true"};
  if (quick) flags.push_back("--benchmark_min_time=0.1");
  flags.insert(flags.end(), passthrough.begin(), passthrough.end());
  std::vector<char*> argv;
  for (std::string& f : flags) argv.push_back(f.data());
  int argc = static_cast<int>(argv.size());
  benchmark::Initialize(&argc, argv.data());
  if (benchmark::ReportUnrecognizedArguments(argc, argv.data())) return 2;

  const std::string command = "kvguard bench kernels " + absl::StrJoin(args, " ");
  std::printf("%s\n", BuildDescription().c_str());
  bench::SummaryReporter reporter;
  const size_t ran = benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  if (ran == 0) {
    std::fprintf(stderr, "kvguard bench kernels: no benchmark matched '%s'\n", filter.c_str());
    return 1;
  }

  const std::string table = reporter.Markdown();
  std::printf(
      "\nSummary (medians of %d interleaved repetitions; %% of STREAM read bandwidth at "
      "the same thread count, measured in this run):\n\n%s",
      repetitions, table.c_str());
  if (!markdown_path.empty()) {
    const std::string md = "# Kernel benchmarks\n\nRecorded " + UtcNow() + " by `" + command +
                           "`.\n\n```\n" + BuildDescription() + "```\n\n" + table;
    if (!WriteFile(markdown_path, md)) return 1;
  }
  if (!json_path.empty() && !WriteFile(json_path, reporter.Json())) return 1;
  return 0;
}

}  // namespace

std::string UtcNow() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&t));
  return buf;
}

bool WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) {
    std::fprintf(stderr, "kvguard bench: cannot write %s\n", path.c_str());
    return false;
  }
  return true;
}

int RunBench(const std::vector<std::string>& args) {
  if (!args.empty() && args[0] == "kernels") {
    return RunBenchKernels(std::vector<std::string>(args.begin() + 1, args.end()));
  }
  if (!args.empty() && args[0] == "gpu") {
    return RunBenchGpu(std::vector<std::string>(args.begin() + 1, args.end()));
  }
  if (!args.empty() && args[0] == "prefill") {
    return RunBenchPrefill(std::vector<std::string>(args.begin() + 1, args.end()));
  }
  // `--isolation off,enforce,...` (a list) is the isolation-overhead benchmark; a single mode
  // is an engine flag like any other.
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    const std::string value = a.rfind("--isolation=", 0) == 0             ? a.substr(12)
                              : a == "--isolation" && i + 1 < args.size() ? args[i + 1]
                                                                          : "";
    if (value.find(',') != std::string::npos) return RunBenchIsolation(args);
  }
  return RunBenchEngine(args);
}

}  // namespace kvguard::tools
