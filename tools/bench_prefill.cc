// `kvguard bench prefill`: how fast the engine turns a prompt into its first token, and how close
// that comes to what the CPU can do. One request at a time (batch 1, as llama.cpp's
// `llama-bench -p N` measures prompt processing), each a prompt of exactly N tokens and one
// output token, through the whole engine (scheduler, chunked prefill, isolation checks, KV
// writes, the first token's sampling): the time from Submit to the end of the request is the
// prefill. Beside it, the peak rate of the instruction the prefill matmuls run on
// (kernels::MeasurePeak), measured in the same run on the same number of threads, and the
// fraction of it the prefill reached: its useful FLOPs (matmuls over every prompt token, the
// output projection for the last one, causal attention) over its time.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/runtime.h"
#include "kernels/cpu/peak.h"
#include "nlohmann/json.hpp"
#include "tools/commands.h"
#include "tools/flags.h"

namespace kvguard::tools {
namespace {

int PrefillUsage(const std::string& error) {
  if (!error.empty()) std::fprintf(stderr, "kvguard bench prefill: %s\n\n", error.c_str());
  std::fprintf(stderr,
               "usage: kvguard bench prefill [options] [engine flags]\n"
               "  --prompt-tokens LIST         prompt lengths in tokens, BOS included\n"
               "                               (default 512)\n"
               "  --repetitions N              timed prompts per length, after one untimed\n"
               "                               (default 5); the median is reported\n"
               "  --out PREFIX                 write PREFIX.json and PREFIX.md (default: none)\n"
               "%s",
               kEngineFlagsHelp);
  return error.empty() ? 0 : 2;
}

// PrefillFlops returns the useful floating-point operations of prefilling `tokens` tokens:
// every per-token matmul (Q/K/V, output, gate/up/down of every layer) for each of them, the
// output projection for the last one only (the engine computes logits where it samples), and
// causal attention (position i attends to i + 1 positions: QK^T and PV, per query head).
double PrefillFlops(const core::ModelConfig& c, int tokens) {
  const double per_layer = double(c.dim) * (c.q_dim() + 2.0 * c.kv_dim()) +  // Q, K, V
                           double(c.q_dim()) * c.dim +                       // output
                           3.0 * double(c.dim) * c.ffn_dim;                  // gate, up, down
  const double matmuls = 2.0 * per_layer * c.n_layers * tokens;
  const double logits = 2.0 * double(c.dim) * c.vocab_size;
  const double attended = double(tokens) * (tokens + 1) / 2;  // sum over positions of i + 1
  const double attention = 2.0 * 2.0 * c.head_dim * c.n_heads * c.n_layers * attended;
  return matmuls + logits + attention;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

struct Row {
  int tokens = 0;
  std::vector<double> seconds;  // per timed prompt
  double median_seconds = 0, tokens_per_s = 0, gflops = 0, fraction_of_peak = 0;
};

}  // namespace

int RunBenchPrefill(const std::vector<std::string>& argv) {
  core::RuntimeOptions options;
  std::vector<int> lengths = {512};
  int repetitions = 5;
  std::string out;
  Args a(argv);
  while (!a.done()) {
    absl::Status s;
    if (a.Flag("--help") || a.Flag("-h")) {
      return PrefillUsage("");
    } else if (ParseEngineFlag(a, &options, &s)) {
    } else if (a.Flag("--prompt-tokens")) {
      std::string text;
      s = a.Value(&text);
      if (s.ok()) {
        lengths.clear();
        for (absl::string_view item : absl::StrSplit(text, ',')) {
          int n = 0;
          if (!absl::SimpleAtoi(item, &n) || n < 2 || n > (1 << 20)) {
            return PrefillUsage(absl::StrCat("bad prompt length '", item, "' (want 2..1048576)"));
          }
          lengths.push_back(n);
        }
      }
    } else if (a.Flag("--repetitions")) {
      s = a.Int(&repetitions, 1, 1000);
    } else if (a.Flag("--out")) {
      s = a.Value(&out);
    } else {
      return PrefillUsage("unknown argument '" + a.peek() + "'");
    }
    if (!s.ok()) return PrefillUsage(std::string(s.message()));
  }

  absl::StatusOr<core::Loaded> loaded = core::LoadModel(options);
  if (!loaded.ok()) {
    std::fprintf(stderr, "kvguard bench prefill: %s\n",
                 std::string(loaded.status().message()).c_str());
    return 1;
  }
  const core::ModelConfig& mc = loaded->model->config();
  const int longest = *std::max_element(lengths.begin(), lengths.end());
  if (longest + 1 > mc.max_context) {
    return PrefillUsage(absl::StrCat("a prompt of ", longest,
                                     " tokens leaves no room for its output token in the model's "
                                     "context of ",
                                     mc.max_context));
  }
  core::RuntimeOptions run = options;
  if (run.kv_cache_bytes == 0) {
    // Room for the longest prompt twice over (the engine's admission reserve and page rounding
    // stay well inside that), not a fraction of the machine's memory.
    run.kv_cache_bytes =
        mc.KvBytesPerToken(kernels::KvDtypeBytes(run.kv_dtype)) * size_t(longest + 1) * 2 +
        (size_t{1} << 20);
  }
  absl::StatusOr<std::unique_ptr<core::Engine>> engine = core::MakeEngine(*loaded, run);
  if (!engine.ok()) {
    std::fprintf(stderr, "kvguard bench prefill: %s\n",
                 std::string(engine.status().message()).c_str());
    return 1;
  }

  const kernels::MatMulArithmetic arithmetic = kernels::MatMulArithmeticFor(
      options.weights.prefill_weights, options.weights.prefill_activations);
  const std::string setup = absl::StrCat(
      "model `", options.model, "` (", mc.ParameterCount() / 1000000,
      "M parameters), prefill weights ", kernels::WeightFormatName(options.weights.prefill_weights),
      " on ", kernels::MatMulArithmeticName(arithmetic), " arithmetic, KV ",
      kernels::KvDtypeName(run.kv_dtype), ", ", options.engine.threads,
      " engine threads, step budget ", options.engine.step_tokens, " tokens");
  std::fprintf(stderr, "%s\n", setup.c_str());

  // Prompts: BOS (where the vocabulary has one), then token ids spread over the vocabulary (speed
  // does not depend on which), different for every prompt so that nothing could be reused between
  // them.
  auto prompt = [&](int tokens, int salt) {
    std::vector<int> ids;
    if (loaded->tokenizer->bos_id() >= 0) ids.push_back(loaded->tokenizer->bos_id());
    uint64_t x = 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(salt + 1);
    while (static_cast<int>(ids.size()) < tokens) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      ids.push_back(static_cast<int>(x % static_cast<uint64_t>(mc.vocab_size)));
    }
    return ids;
  };
  auto time_one = [&](int tokens, int salt) -> absl::StatusOr<double> {
    core::GenerationRequest r;
    r.tenant = options.tenant;
    r.prompt = prompt(tokens, salt);
    r.max_tokens = 1;
    r.stop_at_eos = false;
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<core::RequestId> id = (*engine)->Submit(std::move(r));
    if (!id.ok()) return id.status();
    absl::StatusOr<core::GenerationResult> res = (*engine)->Wait(*id);
    if (!res.ok()) return res.status();
    if (res->tokens.size() != 1) {
      return absl::InternalError(absl::StrCat("a prompt of ", tokens, " tokens ended with ",
                                              res->tokens.size(),
                                              " output tokens: ", res->status.message()));
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };

  // The peak first, on a pool of the engine's size while the engine is idle.
  std::fprintf(stderr, "measuring the peak rate of the prefill's instruction...\n");
  kernels::ThreadPool peak_pool(options.engine.threads);
  const kernels::PeakRate peak = kernels::MeasurePeak(arithmetic, &peak_pool);

  std::vector<Row> rows;
  int salt = 0;
  for (int tokens : lengths) {
    Row row;
    row.tokens = tokens;
    for (int i = 0; i <= repetitions; ++i) {  // the first is untimed: caches, clocks
      absl::StatusOr<double> s = time_one(tokens, salt++);
      if (!s.ok()) {
        std::fprintf(stderr, "kvguard bench prefill: %s\n",
                     std::string(s.status().message()).c_str());
        return 1;
      }
      if (i > 0) row.seconds.push_back(*s);
    }
    row.median_seconds = Median(row.seconds);
    row.tokens_per_s = tokens / row.median_seconds;
    row.gflops = PrefillFlops(mc, tokens) / row.median_seconds / 1e9;
    row.fraction_of_peak = peak.ops_per_second > 0 ? row.gflops * 1e9 / peak.ops_per_second : 0;
    rows.push_back(row);
  }

  std::string table =
      "| prompt tokens | median s | tokens/s | GFLOP/s | % of peak |\n"
      "| ---: | ---: | ---: | ---: | ---: |\n";
  for (const Row& r : rows) {
    absl::StrAppend(&table, "| ", r.tokens, " | ", absl::StrFormat("%.4f", r.median_seconds), " | ",
                    absl::StrFormat("%.1f", r.tokens_per_s), " | ",
                    absl::StrFormat("%.1f", r.gflops), " | ",
                    peak.ops_per_second > 0 ? absl::StrFormat("%.1f", 100 * r.fraction_of_peak)
                                            : std::string("-"),
                    " |\n");
  }
  const std::string peak_line = absl::StrCat(
      "Peak of ", peak.instruction, " on ", options.engine.threads,
      " threads, measured in this run: ", absl::StrFormat("%.1f", peak.ops_per_second / 1e9),
      " GFLOP/s.");
  std::printf("%s\n%s\n\n%s", setup.c_str(), peak_line.c_str(), table.c_str());
  if (!out.empty()) {
    const std::string md = absl::StrCat(
        "# Prefill benchmark\n\nRecorded ", UtcNow(), " by `kvguard bench prefill ",
        absl::StrJoin(argv, " "), "`.\n\n```\n", BuildDescription(), "```\n\n", setup,
        "; one request at a time, each a prompt of exactly N tokens and one output token, timed "
        "from Submit to its end; median of ",
        repetitions, " after one untimed.\n", peak_line,
        " GFLOP/s counts the useful FLOPs: the per-token matmuls over every prompt token, the "
        "output projection for the last, causal attention.\n\n",
        table);
    nlohmann::json doc = {
        {"command", absl::StrCat("kvguard bench prefill ", absl::StrJoin(argv, " "))},
        {"model", options.model},
        {"arithmetic", kernels::MatMulArithmeticName(arithmetic)},
        {"peak_instruction", peak.instruction},
        {"peak_gflops", peak.ops_per_second / 1e9},
        {"threads", options.engine.threads},
        {"step_tokens", options.engine.step_tokens},
        {"rows", nlohmann::json::array()}};
    for (const Row& r : rows) {
      doc["rows"].push_back({{"prompt_tokens", r.tokens},
                             {"seconds", r.seconds},
                             {"median_seconds", r.median_seconds},
                             {"tokens_per_s", r.tokens_per_s},
                             {"gflops", r.gflops},
                             {"fraction_of_peak", r.fraction_of_peak}});
    }
    if (!WriteFile(out + ".md", md) || !WriteFile(out + ".json", doc.dump(2) + "\n")) return 1;
    std::fprintf(stderr, "wrote %s.{json,md}\n", out.c_str());
  }
  return 0;
}

}  // namespace kvguard::tools
