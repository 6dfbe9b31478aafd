// `kvguard bench --isolation off,enforce,strict`: what the isolation layer costs. One engine
// per concurrency, one tenant whose mode is switched between runs (a mode change applies from
// the next step), so every mode runs on the same model, pool and memory placement. Runs are
// interleaved within each round, in alternating order (A B C, then C B A, ...), so drift in
// this shared machine's bandwidth falls on every mode alike; each ratio is taken within one
// round and the report gives the median over rounds.
//
// Two measures per mode: end-to-end (tokens/s and p99 time between tokens, i.e. the step
// latency a request sees), whose ratios carry the machine's noise; and the direct one, the
// time the engine spends verifying per step (GuardStats) as a share of the step time, which
// does not. The strict mode's extra cost (zeroing released pages) shows in its own rows.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/runtime.h"
#include "nlohmann/json.hpp"
#include "tools/bench_load.h"
#include "tools/commands.h"
#include "tools/flags.h"

namespace kvguard::tools {
namespace {

int Usage(const std::string& error) {
  if (!error.empty()) std::fprintf(stderr, "kvguard bench --isolation: %s\n\n", error.c_str());
  std::fprintf(error.empty() ? stdout : stderr,
               "usage: kvguard bench --isolation MODES [options]\n"
               "  --isolation MODES            modes to compare, e.g. off,enforce,strict\n"
               "  --concurrency LIST           default 1,16,64\n"
               "  --rounds N                   interleaved rounds (default 3)\n"
               "  --context N                  tokens per request (default 256)\n"
               "  --prompt-len N               prompt tokens (default 32)\n"
               "  --requests-per-client N      default 1\n"
               "  --out PREFIX                 write PREFIX.json and PREFIX.md\n%s",
               kEngineFlagsHelp);
  return error.empty() ? 0 : 2;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Sample {
  double tokens_per_s = 0;
  double p99_ms = 0;
  double step_ms = 0;         // wall time per decode step
  double verify_us_step = 0;  // verification time per step
  double pages_per_step = 0;  // grants checked per step
};

}  // namespace

int RunBenchIsolation(const std::vector<std::string>& argv) {
  core::RuntimeOptions options;
  options.tenant = "bench";
  std::string modes_text;
  int rounds = 3;
  LoadFlags load_flags;
  load_flags.concurrency = {1, 16, 64};
  load_flags.context = 256;
  Args a(argv);
  while (!a.done()) {
    absl::Status s;
    if (a.Flag("--help") || a.Flag("-h")) {
      return Usage("");
    } else if (a.Flag("--isolation")) {
      s = a.Value(&modes_text);
    } else if (ParseEngineFlag(a, &options, &s)) {
    } else if (a.Flag("--rounds")) {
      s = a.Int(&rounds, 1, 100);
    } else if (ParseLoadFlag(a, &load_flags, &s)) {
    } else {
      return Usage("unknown argument '" + a.peek() + "'");
    }
    if (!s.ok()) return Usage(std::string(s.message()));
  }
  const int context = load_flags.context, prompt_len = load_flags.prompt_len;
  const int per_client = load_flags.per_client;
  const std::string& out = load_flags.out;
  const std::vector<int>& concurrency = load_flags.concurrency;
  if (prompt_len >= context) return Usage("--prompt-len must be below --context");
  std::vector<isolation::Mode> modes;
  for (absl::string_view m : absl::StrSplit(modes_text, ',')) {
    absl::StatusOr<isolation::Mode> mode = isolation::ParseMode(std::string(m));
    if (!mode.ok()) return Usage(std::string(mode.status().message()));
    modes.push_back(*mode);
  }
  if (modes.size() < 2 || modes[0] != isolation::Mode::kOff) {
    return Usage("--isolation needs 'off' first and at least one mode to compare with it");
  }
  if (options.tenants_file.empty()) {
    options.engine.isolation.policy.tenants = {{options.tenant, isolation::Mode::kOff, 1000000}};
  }
  options.isolation_mode.reset();

  absl::StatusOr<core::Loaded> loaded = core::LoadModel(options);
  if (!loaded.ok()) {
    std::fprintf(stderr, "kvguard bench: %s\n", std::string(loaded.status().message()).c_str());
    return 1;
  }
  const core::ModelConfig& mc = loaded->model->config();
  if (context > mc.max_context) return Usage("--context exceeds the model's context");
  if (options.kv_cache_bytes == 0) {
    options.kv_cache_bytes =
        mc.KvBytesPerToken(kernels::KvDtypeBytes(options.kv_dtype)) * size_t(context) * 64;
  }

  nlohmann::json points = nlohmann::json::array();
  std::string md = absl::StrCat(
      "# Isolation overhead\n\n`kvguard bench ", absl::StrJoin(argv, " "), "`\n\n", "Model `",
      options.model, "`, decode weights ",
      kernels::WeightFormatName(options.weights.decode_weights), ", KV ",
      kernels::KvDtypeName(options.kv_dtype), ", context ", context, " (prompt ", prompt_len, "), ",
      rounds, " interleaved rounds per concurrency, alternating order. Ratios are ",
      "mode / off within a round, median over rounds (throughput: > 1 is faster; p99: > 1 is ",
      "slower). `verify` is the engine's own verification time per step (before the step and ",
      "after it), as a share of the step.\n\n",
      "| C | mode | tokens/s (median) | throughput ratio | p99 ms (median) | p99 ratio | ",
      "verify us/step | verify share of step | pages checked/step |\n",
      "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (int c : concurrency) {
    core::RuntimeOptions run = options;
    run.engine.max_batch = std::min(c, core::kMaxDecodeBatch);
    absl::StatusOr<std::unique_ptr<core::Engine>> engine = core::MakeEngine(*loaded, run);
    if (!engine.ok()) {
      std::fprintf(stderr, "kvguard bench: %s\n", std::string(engine.status().message()).c_str());
      return 1;
    }
    core::Engine& e = **engine;
    // samples[mode][round]
    std::vector<std::vector<Sample>> samples(modes.size());
    auto one = [&](size_t m, bool keep) -> bool {
      if (absl::Status s = e.guard().SetMode(options.tenant, modes[m], "bench"); !s.ok()) {
        std::fprintf(stderr, "kvguard bench: %s\n", std::string(s.message()).c_str());
        return false;
      }
      const isolation::GuardStats g0 = e.guard().stats();
      const int64_t steps0 = e.stats().decode_steps;
      absl::StatusOr<LoadRun> load = RunClosedLoop(e, *loaded->tokenizer, c, c * per_client,
                                                   prompt_len, context, options.tenant);
      if (!load.ok()) {
        std::fprintf(stderr, "kvguard bench: %s\n", std::string(load.status().message()).c_str());
        return false;
      }
      const isolation::GuardStats g1 = e.guard().stats();
      const double steps = static_cast<double>(load->stats.decode_steps - steps0);
      Sample s;
      s.tokens_per_s = load->output_tokens / load->seconds;
      s.p99_ms = Percentile(load->gaps, 0.99) * 1e3;
      s.step_ms = steps > 0 ? load->seconds * 1e3 / steps : 0;
      s.verify_us_step = steps > 0 ? (g1.verify_ns_total - g0.verify_ns_total) / 1e3 / steps : 0;
      s.pages_per_step = steps > 0 ? (g1.pages_verified - g0.pages_verified) / steps : 0;
      if (keep) samples[m].push_back(s);
      std::fprintf(stderr, "C=%-3d %-8s %8.1f tok/s  p99 %7.2f ms  verify %6.1f us/step%s\n", c,
                   isolation::ModeName(modes[m]), s.tokens_per_s, s.p99_ms, s.verify_us_step,
                   keep ? "" : "  (warm-up)");
      return true;
    };
    if (!one(0, /*keep=*/false)) return 1;
    for (int r = 0; r < rounds; ++r) {
      for (size_t i = 0; i < modes.size(); ++i) {
        const size_t m = r % 2 == 0 ? i : modes.size() - 1 - i;
        if (!one(m, /*keep=*/true)) return 1;
      }
    }
    for (size_t m = 0; m < modes.size(); ++m) {
      std::vector<double> tps, p99, tput_ratio, p99_ratio, verify, share, pages;
      for (int r = 0; r < rounds; ++r) {
        const Sample& s = samples[m][size_t(r)];
        const Sample& off = samples[0][size_t(r)];
        tps.push_back(s.tokens_per_s);
        p99.push_back(s.p99_ms);
        tput_ratio.push_back(s.tokens_per_s / off.tokens_per_s);
        p99_ratio.push_back(off.p99_ms > 0 ? s.p99_ms / off.p99_ms : 0);
        verify.push_back(s.verify_us_step);
        share.push_back(s.step_ms > 0 ? s.verify_us_step / 1e3 / s.step_ms : 0);
        pages.push_back(s.pages_per_step);
      }
      const char* name = isolation::ModeName(modes[m]);
      absl::StrAppend(&md, "| ", c, " | ", name, " | ", absl::StrFormat("%.1f", Median(tps)), " | ",
                      absl::StrFormat("%.4f", Median(tput_ratio)), " | ",
                      absl::StrFormat("%.2f", Median(p99)), " | ",
                      absl::StrFormat("%.4f", Median(p99_ratio)), " | ",
                      absl::StrFormat("%.1f", Median(verify)), " | ",
                      absl::StrFormat("%.3f%%", 100 * Median(share)), " | ",
                      absl::StrFormat("%.1f", Median(pages)), " |\n");
      points.push_back({{"concurrency", c},
                        {"mode", name},
                        {"tokens_per_s", tps},
                        {"p99_ms", p99},
                        {"throughput_ratio_vs_off", tput_ratio},
                        {"p99_ratio_vs_off", p99_ratio},
                        {"verify_us_per_step", verify},
                        {"verify_share_of_step", share},
                        {"pages_checked_per_step", pages}});
    }
  }
  std::fputs(md.c_str(), stdout);
  if (!out.empty()) {
    std::ofstream(out + ".md") << md;
    nlohmann::json doc = {{"command", absl::StrCat("kvguard bench ", absl::StrJoin(argv, " "))},
                          {"model", options.model},
                          {"context", context},
                          {"prompt_len", prompt_len},
                          {"rounds", rounds},
                          {"points", points}};
    std::ofstream(out + ".json") << doc.dump(2) << "\n";
  }
  return 0;
}

}  // namespace kvguard::tools
