// `kvguard eval`: how much each quantised configuration changes the model's next-token
// distribution, against FP32 weights with an FP32 KV cache. Teacher-forced: the reference
// greedily continues each prompt of a fixed set; every configuration is then run over the
// same tokens, and at every position the KL divergence KL(P_fp32 || P_config) and the top-1
// agreement are recorded.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/runtime.h"
#include "nlohmann/json.hpp"
#include "tools/commands.h"
#include "tools/flags.h"

namespace kvguard::tools {
namespace {

// Prompts not used for FP8 KV calibration, so the KV scales are not fitted to them.
const std::vector<std::string>& EvalPrompts() {
  static const std::vector<std::string> prompts = {
      "In the beginning the servers were quiet, and the queue was empty.",
      "A page of the cache belongs to exactly one session at a time.",
      "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
      "Prices rose 3.2% in October; analysts expect 2.9% by spring.",
      "La mémoire du modèle tient dans des pages de seize jetons.",
      "Ask not what the allocator can do for you.",
  };
  return prompts;
}

struct Trace {
  std::vector<std::vector<float>> logits;  // [positions][vocab]
};

// RunTrace feeds `prompt` then `forced` through the model and records the logits after the
// prompt and after each forced token (the last forced token's logits are not needed).
absl::StatusOr<Trace> RunTrace(core::Model& model, core::KvPool& pool,
                               const std::vector<int>& prompt, const std::vector<int>& forced,
                               kernels::ThreadPool* tp) {
  const int V = model.config().vocab_size;
  const int total = static_cast<int>(prompt.size() + forced.size());
  std::vector<core::PageGrant> pages;
  const int P = pool.page_size();
  if (auto s = pool.table().GrantMany(core::Owner{0, 1}, (total + P - 1) / P, &pages); !s.ok())
    return s;
  Trace t;
  std::vector<float> logits(V);
  absl::Status s = model.Prefill(prompt, pages, pool, logits.data(), tp);
  if (s.ok()) t.logits.push_back(logits);
  for (size_t i = 0; s.ok() && i + 1 < forced.size(); ++i) {
    const core::Model::DecodeItem item{forced[i], static_cast<int>(prompt.size() + i), pages};
    s = model.Decode({&item, 1}, pool, logits.data(), tp);
    if (s.ok()) t.logits.push_back(logits);
  }
  for (const core::PageGrant& g : pages) pool.table().Release(core::Owner{0, 1}, g, false);
  if (!s.ok()) return s;
  return t;
}

std::vector<double> LogSoftmax(const std::vector<float>& x) {
  const double m = *std::max_element(x.begin(), x.end());
  double sum = 0;
  for (float v : x) sum += std::exp(double{v} - m);
  const double lse = m + std::log(sum);
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = double{x[i]} - lse;
  return out;
}

int EvalUsage(const std::string& error) {
  if (!error.empty()) std::fprintf(stderr, "kvguard eval: %s\n\n", error.c_str());
  std::fprintf(stderr,
               "usage: kvguard eval [--configs LIST] [--tokens N] [--out PREFIX] [engine flags]\n"
               "  --configs LIST   prefill/decode/kv triples (default fp32/fp32/fp8_e4m3,"
               "fp32/fp32/bf16,\n"
               "                   fp8/fp8/fp8_e4m3,fp8/int4/fp8_e4m3,fp8/int4/bf16,"
               "bf16/bf16/bf16)\n"
               "  --tokens N       reference continuation length per prompt (default 32)\n"
               "  --out PREFIX     write PREFIX.json and PREFIX.md\n%s",
               kEngineFlagsHelp);
  return error.empty() ? 0 : 2;
}

}  // namespace

int RunEval(const std::vector<std::string>& argv) {
  core::RuntimeOptions options;
  std::string configs_text =
      "fp32/fp32/fp8_e4m3,fp32/fp32/bf16,fp8/fp8/fp8_e4m3,fp8/int4/fp8_e4m3,fp8/int4/bf16,"
      "bf16/bf16/bf16";
  int n_tokens = 32;
  std::string out;
  Args a(argv);
  while (!a.done()) {
    absl::Status s;
    if (a.Flag("--help") || a.Flag("-h")) {
      return EvalUsage("");
    } else if (ParseEngineFlag(a, &options, &s)) {
    } else if (a.Flag("--configs")) {
      s = a.Value(&configs_text);
    } else if (a.Flag("--tokens")) {
      s = a.Int(&n_tokens, 1, 4096);
    } else if (a.Flag("--out")) {
      s = a.Value(&out);
    } else {
      return EvalUsage("unknown argument '" + a.peek() + "'");
    }
    if (!s.ok()) return EvalUsage(std::string(s.message()));
  }
  struct Config {
    std::string name;
    kernels::WeightFormat prefill, decode;
    kernels::KvDtype kv;
  };
  std::vector<Config> configs;
  for (absl::string_view item : absl::StrSplit(configs_text, ',')) {
    std::vector<std::string> p = absl::StrSplit(item, '/');
    if (p.size() != 3)
      return EvalUsage(absl::StrCat("config '", item, "' is not PREFILL/DECODE/KV"));
    auto pf = core::ParseWeightFormat(p[0]);
    auto df = core::ParseWeightFormat(p[1]);
    auto kv = core::ParseKvDtype(p[2]);
    for (const absl::Status& s : {pf.status(), df.status(), kv.status()}) {
      if (!s.ok()) return EvalUsage(std::string(s.message()));
    }
    configs.push_back({std::string(item), *pf, *df, *kv});
  }
  kernels::ThreadPool tp(options.engine.threads);
  auto load = [&](kernels::WeightFormat pf, kernels::WeightFormat df, kernels::KvDtype kv,
                  core::Loaded* loaded, std::unique_ptr<core::KvPool>* pool) -> absl::Status {
    core::RuntimeOptions o = options;
    o.weights.prefill_weights = pf;
    o.weights.decode_weights = df;
    auto l = core::LoadModel(o);
    if (!l.ok()) return l.status();
    *loaded = *std::move(l);
    core::KvPoolOptions po;
    po.dtype = kv;
    po.budget_bytes = loaded->model->config().KvBytesPerToken(kernels::KvDtypeBytes(kv)) * 1024;
    auto p = core::KvPool::Create(loaded->model->config(), po);
    if (!p.ok()) return p.status();
    if (kv == kernels::KvDtype::kFp8E4m3) {
      if (auto s = (*p)->SetFp8Scales(loaded->model->fp8_k_scales(), loaded->model->fp8_v_scales());
          !s.ok()) {
        return s;
      }
    }
    *pool = *std::move(p);
    return absl::OkStatus();
  };

  // The reference: FP32 weights in both phases, FP32 KV; greedy continuations.
  core::Loaded ref;
  std::unique_ptr<core::KvPool> ref_pool;
  if (auto s = load(kernels::WeightFormat::kFp32, kernels::WeightFormat::kFp32,
                    kernels::KvDtype::kFp32, &ref, &ref_pool);
      !s.ok()) {
    std::fprintf(stderr, "kvguard eval: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  std::vector<std::vector<int>> prompts, forced;
  std::vector<Trace> ref_traces;
  for (const std::string& text : EvalPrompts()) {
    prompts.push_back(ref.tokenizer->Encode(text, /*add_bos=*/true));
    // Greedy continuation, one token at a time, teacher-forcing our own argmax.
    std::vector<int> cont;
    Trace t;
    // Run incrementally: prefill then decode feeding argmax.
    const int V = ref.model->config().vocab_size;
    const int total = static_cast<int>(prompts.back().size()) + n_tokens;
    std::vector<core::PageGrant> pages;
    const int P = ref_pool->page_size();
    if (!ref_pool->table().GrantMany(core::Owner{0, 1}, (total + P - 1) / P, &pages).ok()) return 1;
    std::vector<float> logits(V);
    if (!ref.model->Prefill(prompts.back(), pages, *ref_pool, logits.data(), &tp).ok()) return 1;
    for (int i = 0; i < n_tokens; ++i) {
      t.logits.push_back(logits);
      const int next =
          static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      cont.push_back(next);
      if (i + 1 == n_tokens) break;
      const core::Model::DecodeItem item{next, static_cast<int>(prompts.back().size()) + i, pages};
      if (!ref.model->Decode({&item, 1}, *ref_pool, logits.data(), &tp).ok()) return 1;
    }
    for (const core::PageGrant& g : pages) ref_pool->table().Release(core::Owner{0, 1}, g, false);
    forced.push_back(cont);
    ref_traces.push_back(std::move(t));
  }

  nlohmann::json doc;
  doc["command"] = "kvguard eval " + absl::StrJoin(argv, " ");
  doc["model"] = options.model;
  doc["prompts"] = EvalPrompts().size();
  doc["tokens_per_prompt"] = n_tokens;
  std::string md = absl::StrCat(
      "# Quantisation quality\n\n`kvguard eval ", absl::StrJoin(argv, " "), "` on model `",
      options.model, "`: ", EvalPrompts().size(), " prompts x ", n_tokens,
      " teacher-forced positions, against FP32 weights with an FP32 KV cache.\n\n"
      "| prefill / decode weights / KV | mean KL (nats) | max KL | top-1 agreement | "
      "greedy continuation identical (prompts) |\n| --- | ---: | ---: | ---: | ---: |\n");
  for (const Config& cfg : configs) {
    core::Loaded q;
    std::unique_ptr<core::KvPool> pool;
    if (auto s = load(cfg.prefill, cfg.decode, cfg.kv, &q, &pool); !s.ok()) {
      std::fprintf(stderr, "kvguard eval: %s: %s\n", cfg.name.c_str(),
                   std::string(s.message()).c_str());
      return 1;
    }
    double kl_sum = 0, kl_max = 0;
    int agree = 0, positions = 0, identical = 0;
    for (size_t p = 0; p < prompts.size(); ++p) {
      auto trace = RunTrace(*q.model, *pool, prompts[p], forced[p], &tp);
      if (!trace.ok()) {
        std::fprintf(stderr, "kvguard eval: %s\n", std::string(trace.status().message()).c_str());
        return 1;
      }
      bool same = true;
      for (size_t i = 0; i < trace->logits.size(); ++i) {
        const std::vector<double> lp = LogSoftmax(ref_traces[p].logits[i]);
        const std::vector<double> lq = LogSoftmax(trace->logits[i]);
        double kl = 0;
        for (size_t v = 0; v < lp.size(); ++v) kl += std::exp(lp[v]) * (lp[v] - lq[v]);
        kl_sum += kl;
        kl_max = std::max(kl_max, kl);
        const auto& a1 = ref_traces[p].logits[i];
        const auto& b1 = trace->logits[i];
        const bool top1 = std::max_element(a1.begin(), a1.end()) - a1.begin() ==
                          std::max_element(b1.begin(), b1.end()) - b1.begin();
        agree += top1;
        same = same && top1;
        ++positions;
      }
      identical += same;
    }
    const double mean_kl = kl_sum / positions;
    char row[256];
    std::snprintf(row, sizeof(row), "| %s | %.5f | %.5f | %.1f%% | %d / %zu |\n", cfg.name.c_str(),
                  mean_kl, kl_max, 100.0 * agree / positions, identical, prompts.size());
    md += row;
    std::fprintf(stderr, "%s", row);
    doc["configs"].push_back({{"config", cfg.name},
                              {"mean_kl", mean_kl},
                              {"max_kl", kl_max},
                              {"top1_agreement", double(agree) / positions},
                              {"identical_continuations", identical}});
  }
  md +=
      "\n(\"identical\": every teacher-forced position's top-1 equals the reference's, i.e. "
      "greedy decoding would reproduce the FP32 continuation.)\n";
  std::printf("%s", md.c_str());
  if (!out.empty()) {
    std::ofstream(out + ".json") << doc.dump(2) << "\n";
    std::ofstream(out + ".md") << md;
    std::fprintf(stderr, "wrote %s.{json,md}\n", out.c_str());
  }
  return 0;
}

}  // namespace kvguard::tools
