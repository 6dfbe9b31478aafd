// `kvguard bench` (engine): the serving experiment. A fixed KV byte budget and a fixed
// context per request; closed-loop load at each concurrency (C requests always in flight);
// configurations side by side: decode-weight format x KV cache dtype, interleaved over rounds.
// Per point: output tokens/s (whole run) and decode tokens/s (tokens of the steps that decoded,
// over those steps' time), p50/p99 time per output token, most requests admitted at once,
// preemptions, and the decode effective bandwidth (weight + KV bytes the decode steps read, over
// their busy time) as a fraction of the STREAM read bandwidth measured in the same run; ratios
// between configurations that differ in one knob, per round, median over rounds. Writes JSON,
// markdown and SVG.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "core/runtime.h"
#include "nlohmann/json.hpp"
#include "tools/bench_load.h"
#include "tools/commands.h"
#include "tools/flags.h"

namespace kvguard::tools {
namespace {

using Clock = std::chrono::steady_clock;

struct Config {
  std::string name;  // "int4/fp8_e4m3"
  kernels::WeightFormat decode;
  kernels::KvDtype kv;
};

struct Point {
  std::string config;
  int concurrency = 0;
  int requests = 0;
  int64_t output_tokens = 0;
  double seconds = 0;
  double tokens_per_s = 0;
  double decode_tokens_per_s = 0;  // decode tokens over the time of the steps that decoded
  double tpot_p50_ms = 0, tpot_p99_ms = 0;
  int max_running = 0;
  int64_t preemptions = 0;
  int64_t decode_steps = 0;
  double effective_gbps = 0;  // (weights + KV) bytes the decode steps read / their busy time
  double stream_fraction = 0;
  int64_t capacity_tokens = 0;
};

std::string Svg(const std::vector<Point>& points, const std::vector<Config>& configs,
                const std::string& title) {
  const double W = 720, H = 440, L = 70, R = 180, T = 40, B = 50;
  double max_tps = 1;
  int max_c = 1;
  for (const Point& p : points)
    max_tps = std::max(max_tps, p.tokens_per_s), max_c = std::max(max_c, p.concurrency);
  const double xmax = std::log2(static_cast<double>(max_c));
  auto X = [&](int c) { return L + (xmax > 0 ? std::log2(double(c)) / xmax : 0.5) * (W - L - R); };
  auto Y = [&](double v) { return H - B - v / (max_tps * 1.1) * (H - T - B); };
  const char* colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"};
  std::string svg = absl::StrCat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"", W, "\" height=\"", H,
      "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" "
      "fill=\"white\"/>\n<text x=\"",
      L, "\" y=\"22\" font-size=\"14\">", title, "</text>\n");
  absl::StrAppend(&svg, "<line x1=\"", L, "\" y1=\"", H - B, "\" x2=\"", W - R, "\" y2=\"", H - B,
                  "\" stroke=\"black\"/><line x1=\"", L, "\" y1=\"", T, "\" x2=\"", L, "\" y2=\"",
                  H - B, "\" stroke=\"black\"/>\n");
  for (int c = 1; c <= max_c; c *= 2) {
    absl::StrAppend(&svg, "<text x=\"", X(c), "\" y=\"", H - B + 18, "\" text-anchor=\"middle\">",
                    c, "</text>\n");
  }
  for (int i = 0; i <= 4; ++i) {
    const double v = max_tps * 1.1 * i / 4;
    absl::StrAppend(&svg, "<text x=\"", L - 6, "\" y=\"", Y(v) + 4, "\" text-anchor=\"end\">",
                    static_cast<int>(v), "</text><line x1=\"", L, "\" y1=\"", Y(v), "\" x2=\"",
                    W - R, "\" y2=\"", Y(v), "\" stroke=\"#ddd\"/>\n");
  }
  absl::StrAppend(&svg, "<text x=\"", (L + W - R) / 2, "\" y=\"", H - 12,
                  "\" text-anchor=\"middle\">concurrent requests</text>\n<text x=\"16\" y=\"",
                  (T + H - B) / 2, "\" transform=\"rotate(-90 16 ", (T + H - B) / 2,
                  ")\" text-anchor=\"middle\">output tokens/s</text>\n");
  for (size_t k = 0; k < configs.size(); ++k) {
    std::string pts;
    for (const Point& p : points) {
      if (p.config == configs[k].name)
        absl::StrAppend(&pts, X(p.concurrency), ",", Y(p.tokens_per_s), " ");
    }
    const char* color = colors[k % 5];
    absl::StrAppend(&svg, "<polyline fill=\"none\" stroke=\"", color,
                    "\" stroke-width=\"2\" points=\"", pts, "\"/>\n<text x=\"", W - R + 10,
                    "\" y=\"", T + 20 + 18 * k, "\" fill=\"", color, "\">", configs[k].name,
                    "</text>\n");
  }
  return svg + "</svg>\n";
}

int BenchUsage(const std::string& error) {
  if (!error.empty()) std::fprintf(stderr, "kvguard bench: %s\n\n", error.c_str());
  std::fprintf(
      stderr,
      "usage: kvguard bench [options] [engine flags]   (kernels: kvguard bench kernels)\n"
      "  --configs LIST               decode-weights/kv-dtype pairs (default\n"
      "                               int4/fp8_e4m3,int4/bf16,fp8/fp8_e4m3)\n"
      "  --concurrency LIST           default 1,2,4,8,16,32,64\n"
      "  --context N                  tokens per request, prompt + output (default 4096)\n"
      "  --prompt-len N               prompt tokens (default 32: on a 2-core CPU a long\n"
      "                               prompt's prefill, not decode, bounds how many\n"
      "                               requests run at once)\n"
      "  --requests-per-client N      requests each concurrent client runs (default 1)\n"
      "  --rounds N                   interleaved rounds, configuration order alternating;\n"
      "                               medians over rounds, ratios per round (default 1)\n"
      "  --out PREFIX                 write PREFIX.json, .md, .svg (default: none)\n"
      "  KV budget default: what holds 16 requests of --context tokens in BF16\n"
      "%s",
      kEngineFlagsHelp);
  return error.empty() ? 0 : 2;
}

}  // namespace

int RunBenchEngine(const std::vector<std::string>& argv) {
  core::RuntimeOptions options;
  std::string configs_text = "int4/fp8_e4m3,int4/bf16,fp8/fp8_e4m3";
  int rounds = 1;
  LoadFlags load_flags;
  load_flags.concurrency = {1, 2, 4, 8, 16, 32, 64};
  load_flags.context = 4096;
  Args a(argv);
  while (!a.done()) {
    absl::Status s;
    if (a.Flag("--help") || a.Flag("-h")) {
      return BenchUsage("");
    } else if (ParseEngineFlag(a, &options, &s)) {
    } else if (a.Flag("--configs")) {
      s = a.Value(&configs_text);
    } else if (a.Flag("--rounds")) {
      s = a.Int(&rounds, 1, 100);
    } else if (ParseLoadFlag(a, &load_flags, &s)) {
    } else {
      return BenchUsage("unknown argument '" + a.peek() + "'");
    }
    if (!s.ok()) return BenchUsage(std::string(s.message()));
  }
  const int context = load_flags.context, prompt_len = load_flags.prompt_len;
  const int per_client = load_flags.per_client;
  const std::string& out = load_flags.out;
  const std::vector<int>& concurrency = load_flags.concurrency;
  if (prompt_len >= context) return BenchUsage("--prompt-len must be below --context");
  std::vector<Config> configs;
  for (absl::string_view item : absl::StrSplit(configs_text, ',')) {
    std::vector<std::string> parts = absl::StrSplit(item, '/');
    if (parts.size() != 2) return BenchUsage(absl::StrCat("config '", item, "' is not WEIGHTS/KV"));
    auto w = core::ParseWeightFormat(parts[0]);
    auto kv = core::ParseKvDtype(parts[1]);
    if (!w.ok()) return BenchUsage(std::string(w.status().message()));
    if (!kv.ok()) return BenchUsage(std::string(kv.status().message()));
    configs.push_back({std::string(item), *w, *kv});
  }

  // Every decode-weight format is loaded once, up front, so that rounds can interleave the
  // configurations (A B, B A, ...) in one session: on a shared machine whose bandwidth moves
  // from minute to minute, only ratios of runs interleaved like that mean anything.
  std::fprintf(stderr, "measuring STREAM read bandwidth (2 threads, 1 GiB, median of 5)...\n");
  const double stream_before = bench::StreamReadGBps(2);
  const bool rss_reset =
      core::ResetPeakRss();  // peak RSS below is models' and pools', not STREAM's
  std::map<kernels::WeightFormat, core::Loaded> models;
  double loaded_weight_gib = 0;
  for (const Config& cfg : configs) {
    if (models.contains(cfg.decode)) continue;
    core::RuntimeOptions o = options;
    o.weights.decode_weights = cfg.decode;
    absl::StatusOr<core::Loaded> l = core::LoadModel(o);
    if (!l.ok()) {
      std::fprintf(stderr, "kvguard bench: %s\n", std::string(l.status().message()).c_str());
      return 1;
    }
    loaded_weight_gib += (*l).model->WeightBytes() / 1073741824.0;
    models[cfg.decode] = *std::move(l);
  }
  const core::ModelConfig& mc = models.begin()->second.model->config();
  if (context > mc.max_context) return BenchUsage("--context exceeds the model's context");
  const size_t kv_budget = options.kv_cache_bytes != 0
                               ? options.kv_cache_bytes
                               : mc.KvBytesPerToken(2) * size_t(context) * 16;

  // runs[config][concurrency][round]
  std::map<std::string, std::map<int, std::vector<Point>>> runs;
  for (int round = 0; round < rounds; ++round) {
    for (int c : concurrency) {
      for (size_t i = 0; i < configs.size(); ++i) {
        const Config& cfg = configs[round % 2 == 0 ? i : configs.size() - 1 - i];
        const core::Loaded& loaded = models[cfg.decode];
        core::RuntimeOptions run = options;
        run.kv_dtype = cfg.kv;
        run.kv_cache_bytes = kv_budget;
        run.engine.max_batch = std::min(std::max(c, 1), core::kMaxDecodeBatch);
        auto engine = core::MakeEngine(loaded, run);
        if (!engine.ok()) {
          std::fprintf(stderr, "kvguard bench: %s\n",
                       std::string(engine.status().message()).c_str());
          return 1;
        }
        const int total = c * per_client;
        absl::StatusOr<LoadRun> load = RunClosedLoop(**engine, *loaded.tokenizer, c, total,
                                                     prompt_len, context, options.tenant);
        if (!load.ok()) {
          std::fprintf(stderr, "kvguard bench: %s\n", std::string(load.status().message()).c_str());
          return 1;
        }
        const core::EngineStats& st = load->stats;
        Point p;
        p.config = cfg.name;
        p.concurrency = c;
        p.requests = total;
        p.output_tokens = load->output_tokens;
        p.seconds = load->seconds;
        p.tokens_per_s = load->output_tokens / load->seconds;
        p.decode_tokens_per_s = st.decode_seconds > 0 ? st.decode_tokens / st.decode_seconds : 0;
        p.tpot_p50_ms = Percentile(load->gaps, 0.50) * 1e3;
        p.tpot_p99_ms = Percentile(load->gaps, 0.99) * 1e3;
        p.max_running = st.max_running;
        p.preemptions = st.preemptions;
        p.decode_steps = st.decode_steps;
        p.capacity_tokens = (*engine)->pool().capacity_tokens();
        // Bytes the decode steps read: every decode weight once per step, plus the KV of every
        // token each stepped request attended to (counted by the engine, step by step).
        const double bytes =
            double(loaded.model->DecodeWeightBytesPerStep()) * double(st.decode_steps) +
            double(st.decode_kv_tokens) * double(mc.KvBytesPerToken(kernels::KvDtypeBytes(cfg.kv)));
        p.effective_gbps = st.decode_seconds > 0 ? bytes / st.decode_seconds / 1e9 : 0;
        p.stream_fraction = 0;  // set below, against the larger of the two STREAM figures
        std::fprintf(stderr,
                     "round %d  %-16s C=%-3d %8.1f tok/s (decode %8.1f)  TPOT p50 %7.2f ms p99 "
                     "%7.2f ms  running<=%d  preempt %lld  decode eff %.1f GB/s (%.0f%% of the "
                     "first STREAM)\n",
                     round + 1, cfg.name.c_str(), c, p.tokens_per_s, p.decode_tokens_per_s,
                     p.tpot_p50_ms, p.tpot_p99_ms, p.max_running,
                     static_cast<long long>(p.preemptions), p.effective_gbps,
                     100 * p.effective_gbps / stream_before);
        runs[cfg.name][c].push_back(p);
      }
    }
  }
  const double peak_rss_gib = core::PeakRssBytes() / 1073741824.0;  // before STREAM's 1 GiB
  const double stream_after = bench::StreamReadGBps(2);
  // The denominator of every "% of STREAM": the larger of the figures before and after the runs
  // (the conservative choice on a machine whose bandwidth moves during a run).
  const double stream = std::max(stream_before, stream_after);
  for (auto& [name, by_c] : runs) {
    for (auto& [c, rs] : by_c) {
      for (Point& p : rs) p.stream_fraction = p.effective_gbps / stream;
    }
  }

  // Medians over rounds per point; ratios per round, then their median.
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty()      ? 0.0
           : v.size() % 2 ? v[v.size() / 2]
                          : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  };
  std::vector<Point> points;
  for (const Config& cfg : configs) {
    for (int c : concurrency) {
      const std::vector<Point>& rs = runs[cfg.name][c];
      Point m = rs.front();
      auto med = [&](auto field) {
        std::vector<double> v;
        for (const Point& p : rs) v.push_back(static_cast<double>(p.*field));
        return median(v);
      };
      m.tokens_per_s = med(&Point::tokens_per_s);
      m.decode_tokens_per_s = med(&Point::decode_tokens_per_s);
      m.tpot_p50_ms = med(&Point::tpot_p50_ms);
      m.tpot_p99_ms = med(&Point::tpot_p99_ms);
      m.max_running = static_cast<int>(med(&Point::max_running));
      m.preemptions = static_cast<int64_t>(med(&Point::preemptions));
      m.effective_gbps = med(&Point::effective_gbps);
      m.stream_fraction = med(&Point::stream_fraction);
      points.push_back(m);
    }
  }
  // Ratio rows: two configs differing in one knob (same weights, KV fp8_e4m3 vs bf16; same KV,
  // weights int4 vs fp8), per concurrency, median over rounds of the per-round ratio.
  struct Ratio {
    std::string name;
    int concurrency;
    double tokens, decode_tokens;
  };
  std::vector<Ratio> ratios;
  for (const Config& a_cfg : configs) {
    for (const Config& b_cfg : configs) {
      const bool kv_pair = a_cfg.decode == b_cfg.decode && a_cfg.kv == kernels::KvDtype::kFp8E4m3 &&
                           b_cfg.kv == kernels::KvDtype::kBf16;
      const bool w_pair = a_cfg.kv == b_cfg.kv && a_cfg.decode == kernels::WeightFormat::kInt4 &&
                          b_cfg.decode == kernels::WeightFormat::kFp8;
      if (!kv_pair && !w_pair) continue;
      for (int c : concurrency) {
        std::vector<double> t, d;
        const auto& ra = runs[a_cfg.name][c];
        const auto& rb = runs[b_cfg.name][c];
        for (size_t i = 0; i < ra.size() && i < rb.size(); ++i) {
          t.push_back(ra[i].tokens_per_s / rb[i].tokens_per_s);
          d.push_back(ra[i].decode_tokens_per_s / rb[i].decode_tokens_per_s);
        }
        ratios.push_back({a_cfg.name + " / " + b_cfg.name, c, median(t), median(d)});
      }
    }
  }

  // Markdown.
  std::string md = absl::StrCat(
      "# Engine benchmark\n\n`kvguard bench ", absl::StrJoin(argv, " "), "`\n\n",
      BuildDescription(), "\nModel `", options.model, "` (", mc.ParameterCount() / 1000000,
      "M parameters), prefill weights ", kernels::WeightFormatName(options.weights.prefill_weights),
      " (", PrefillArithmetic(options.weights), " arithmetic), context ", context,
      " tokens per request (prompt ", prompt_len, "), ", per_client,
      " requests per concurrent client, engine threads ", options.engine.threads, ", KV budget ",
      kv_budget / 1048576.0, " MiB for every configuration, ", rounds,
      " interleaved round(s) (configuration order alternating), medians over rounds.\n"
      "STREAM read (2 threads) measured in this run: ",
      stream_before, " GB/s before, ", stream_after,
      " GB/s after; % of STREAM is against the larger.\n\n"
      "Output tok/s counts every generated token over the whole run (prefill included); decode "
      "tok/s counts decode tokens over the time of the steps that decoded (a mixed step's prefill "
      "chunks included); decode effective "
      "GB/s is (decode weights x steps + KV bytes every step attended to) over that time.\n\n"
      "| config (decode weights / KV) | concurrency | KV capacity (tokens) | output tok/s | "
      "decode tok/s | TPOT p50 ms | TPOT p99 ms | most running | preemptions | decode effective "
      "GB/s | % of STREAM |\n"
      "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (const Point& p : points) {
    char row[512];
    std::snprintf(row, sizeof(row),
                  "| %s | %d | %lld | %.1f | %.1f | %.2f | %.2f | %d | %lld | %.1f | %.0f%% |\n",
                  p.config.c_str(), p.concurrency, static_cast<long long>(p.capacity_tokens),
                  p.tokens_per_s, p.decode_tokens_per_s, p.tpot_p50_ms, p.tpot_p99_ms,
                  p.max_running, static_cast<long long>(p.preemptions), p.effective_gbps,
                  100 * p.stream_fraction);
    md += row;
  }
  if (!ratios.empty()) {
    md += "\n| ratio | concurrency | output tok/s | decode tok/s |\n| --- | ---: | ---: | ---: |\n";
    for (const Ratio& r : ratios) {
      char row[256];
      std::snprintf(row, sizeof(row), "| %s | %d | %.3f | %.3f |\n", r.name.c_str(), r.concurrency,
                    r.tokens, r.decode_tokens);
      md += row;
    }
  }
  md += absl::StrCat(
      "\nMemory: weights of every loaded model ", loaded_weight_gib, " GiB (", models.size(),
      " decode-weight format(s) held at once), KV budget ", kv_budget / 1073741824.0,
      " GiB (one pool alive at a time); peak RSS ", peak_rss_gib, " GiB (",
      rss_reset ? "after the STREAM measurement" : "process, STREAM array included", ").\n");
  std::printf("%s", md.c_str());
  if (!out.empty()) {
    nlohmann::json doc;
    doc["command"] = "kvguard bench " + absl::StrJoin(argv, " ");
    doc["model"] = options.model;
    doc["context"] = context;
    doc["prompt_len"] = prompt_len;
    doc["rounds"] = rounds;
    doc["kv_budget_bytes"] = kv_budget;
    doc["stream_read_gbps"] = {stream_before, stream_after};
    for (const auto& [name, by_c] : runs) {
      for (const auto& [c, rs] : by_c) {
        for (size_t round = 0; round < rs.size(); ++round) {
          const Point& p = rs[round];
          doc["runs"].push_back({{"config", p.config},
                                 {"concurrency", p.concurrency},
                                 {"round", round + 1},
                                 {"requests", p.requests},
                                 {"output_tokens", p.output_tokens},
                                 {"seconds", p.seconds},
                                 {"tokens_per_s", p.tokens_per_s},
                                 {"decode_tokens_per_s", p.decode_tokens_per_s},
                                 {"tpot_p50_ms", p.tpot_p50_ms},
                                 {"tpot_p99_ms", p.tpot_p99_ms},
                                 {"max_running", p.max_running},
                                 {"preemptions", p.preemptions},
                                 {"decode_steps", p.decode_steps},
                                 {"capacity_tokens", p.capacity_tokens},
                                 {"effective_gbps", p.effective_gbps},
                                 {"stream_fraction", p.stream_fraction}});
        }
      }
    }
    for (const Ratio& r : ratios) {
      doc["ratios"].push_back({{"ratio", r.name},
                               {"concurrency", r.concurrency},
                               {"tokens_per_s", r.tokens},
                               {"decode_tokens_per_s", r.decode_tokens}});
    }
    doc["memory"] = {{"weights_gib", loaded_weight_gib},
                     {"models_loaded", models.size()},
                     {"kv_budget_gib", kv_budget / 1073741824.0},
                     {"peak_rss_gib", peak_rss_gib}};
    std::ofstream(out + ".json") << doc.dump(2) << "\n";
    std::ofstream(out + ".md") << md;
    std::ofstream(out + ".svg") << Svg(points, configs,
                                       absl::StrCat("kvguard bench: ", options.model, ", context ",
                                                    context, ", output tokens/s vs concurrency"));
    std::fprintf(stderr, "wrote %s.{json,md,svg}\n", out.c_str());
  }
  return 0;
}

}  // namespace kvguard::tools
