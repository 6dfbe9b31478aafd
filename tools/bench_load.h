// tools/bench_load.h: the closed-loop load generator shared by the serving benchmarks
// (`kvguard bench` and `kvguard bench --isolation ...`).
#ifndef KVGUARD_TOOLS_BENCH_LOAD_H_
#define KVGUARD_TOOLS_BENCH_LOAD_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/engine/engine.h"
#include "core/text/tokenizer.h"
#include "tools/flags.h"

namespace kvguard::tools {

struct LoadRun {
  int64_t output_tokens = 0;
  double seconds = 0;
  std::vector<double> gaps;  // seconds between consecutive tokens of a request, all requests
  core::EngineStats stats;   // the engine's, after the run
};

// RunClosedLoop keeps `concurrency` requests in flight (a new one as each finishes) until
// `total` have finished. Each runs as `tenant`, a deterministic prompt of `prompt_len` tokens
// (different per request), and generates up to `context` tokens in all. Returns the first
// refused or failed request's error.
absl::StatusOr<LoadRun> RunClosedLoop(core::Engine& engine, const core::Tokenizer& tokenizer,
                                      int concurrency, int total, int prompt_len, int context,
                                      const std::string& tenant);

// LoadFlags are the load-shape flags both serving benchmarks take.
struct LoadFlags {
  std::vector<int> concurrency;
  int context = 512;    // tokens per request, prompt + output
  int prompt_len = 32;  // prompt tokens
  int per_client = 1;   // requests each concurrent client runs
  std::string out;      // output prefix, "" for none
};

// ParseLoadFlag consumes one of --concurrency LIST, --context N, --prompt-len N,
// --requests-per-client N, --out PREFIX if it is next (returns true; *status says whether its
// value was good), else returns false.
bool ParseLoadFlag(Args& args, LoadFlags* flags, absl::Status* status);

// Percentile returns the p-quantile (nearest rank) of `v`, 0 if empty.
double Percentile(std::vector<double> v, double p);

}  // namespace kvguard::tools

#endif  // KVGUARD_TOOLS_BENCH_LOAD_H_
