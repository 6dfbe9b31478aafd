// `kvguard generate`: one prompt through the full engine (scheduler, engine thread, paged KV
// pool), text streamed to stdout, then the timing.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "core/runtime.h"
#include "tools/commands.h"
#include "tools/flags.h"

namespace kvguard::tools {
namespace {

int GenerateUsage(const std::string& error) {
  if (!error.empty()) std::fprintf(stderr, "kvguard generate: %s\n\n", error.c_str());
  std::fprintf(stderr,
               "usage: kvguard generate [--prompt TEXT] [--max-tokens N] [sampling] [engine]\n"
               "  --prompt TEXT                the prompt (default \"Once upon a time\")\n"
               "  --max-tokens N               tokens to generate (default 64)\n"
               "  --temperature T              0 = greedy (default), else sample\n"
               "  --top-k K / --top-p P        sampling filters (default off)\n"
               "  --seed N                     sampling seed (default 0)\n"
               "  --stop TEXT                  stop sequence (repeatable, up to 4)\n"
               "%s",
               kEngineFlagsHelp);
  return error.empty() ? 0 : 2;
}

}  // namespace

int RunGenerate(const std::vector<std::string>& argv) {
  core::RuntimeOptions options;
  options.kv_cache_bytes = size_t{256} << 20;  // one request: a small pool starts fast
  core::GenerationRequest request;
  request.max_tokens = 64;
  std::string prompt = "Once upon a time";
  Args a(argv);
  while (!a.done()) {
    absl::Status s;
    double d = 0;
    int n = 0;
    std::string v;
    if (a.Flag("--help") || a.Flag("-h")) {
      return GenerateUsage("");
    } else if (ParseEngineFlag(a, &options, &s)) {
    } else if (a.Flag("--prompt")) {
      s = a.Value(&prompt);
    } else if (a.Flag("--max-tokens")) {
      s = a.Int(&request.max_tokens, 1, 1 << 20);
    } else if (a.Flag("--temperature")) {
      s = a.Double(&d, 0, 100);
      request.sampling.temperature = static_cast<float>(d);
    } else if (a.Flag("--top-k")) {
      s = a.Int(&request.sampling.top_k, 0, 1 << 22);
    } else if (a.Flag("--top-p")) {
      s = a.Double(&d, 1e-9, 1);
      request.sampling.top_p = static_cast<float>(d);
    } else if (a.Flag("--seed")) {
      s = a.Int(&n, 0, 1 << 30);
      request.sampling.seed = static_cast<uint64_t>(n);
    } else if (a.Flag("--stop")) {
      s = a.Value(&v);
      request.stop.push_back(v);
    } else {
      return GenerateUsage("unknown argument '" + a.peek() + "'");
    }
    if (!s.ok()) return GenerateUsage(std::string(s.message()));
  }

  request.tenant = options.tenant;
  absl::StatusOr<core::Loaded> loaded = core::LoadModel(options);
  if (!loaded.ok()) {
    std::fprintf(stderr, "kvguard generate: %s\n", std::string(loaded.status().message()).c_str());
    return 1;
  }
  absl::StatusOr<std::unique_ptr<core::Engine>> engine = core::MakeEngine(*loaded, options);
  if (!engine.ok()) {
    std::fprintf(stderr, "kvguard generate: %s\n", std::string(engine.status().message()).c_str());
    return 1;
  }
  const core::ModelConfig& c = loaded->model->config();
  const core::KvPool& pool = (*engine)->pool();
  std::fprintf(stderr,
               "model %s: %.1fM parameters, weights %s prefill (%s) / %s decode (%.0f MiB held), "
               "loaded in %.1f s\nKV cache %s: %d pages of %d tokens = %lld tokens in %.0f MiB\n",
               loaded->source->Description().c_str(), c.ParameterCount() / 1e6,
               kernels::WeightFormatName(options.weights.prefill_weights),
               PrefillArithmetic(options.weights),
               kernels::WeightFormatName(options.weights.decode_weights),
               loaded->model->WeightBytes() / 1048576.0, loaded->load_seconds,
               kernels::KvDtypeName(pool.dtype()), pool.num_pages(), pool.page_size(),
               static_cast<long long>(pool.capacity_tokens()),
               pool.num_pages() * static_cast<double>(pool.page_bytes()) / 1048576.0);

  request.prompt = loaded->tokenizer->Encode(prompt, /*add_bos=*/true);
  request.on_text = [](std::string_view text) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  };
  std::fputs(prompt.c_str(), stdout);
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<core::RequestId> id = (*engine)->Submit(std::move(request));
  if (!id.ok()) {
    std::fprintf(stderr, "\nkvguard generate: %s\n", std::string(id.status().message()).c_str());
    return 1;
  }
  absl::StatusOr<core::GenerationResult> result = (*engine)->Wait(*id);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fputc('\n', stdout);
  std::fflush(stdout);
  if (!result.ok() || result->reason == core::FinishReason::kError ||
      result->reason == core::FinishReason::kAborted) {
    std::fprintf(stderr, "kvguard generate: %s\n",
                 std::string((result.ok() ? result->status : result.status()).message()).c_str());
    return 1;
  }
  const isolation::GuardStats gs = (*engine)->guard().stats();
  std::fprintf(stderr, "isolation: tenant %s, mode %s, %lld page tables verified (%.1f us/step)\n",
               options.tenant.c_str(),
               isolation::ModeName(
                   (*engine)->guard().mode(*(*engine)->guard().ResolveTenant(options.tenant))),
               static_cast<long long>(gs.verifications),
               gs.steps > 0 ? gs.verify_ns_total / 1e3 / double(gs.steps) : 0.0);
  const size_t n = result->tokens.size();
  const double decode_seconds = seconds - result->first_token_seconds;
  std::fprintf(stderr,
               "%zu tokens in %.2f s (%s): %.1f tokens/s; first token %.0f ms; decode %.1f "
               "tokens/s\n",
               n, seconds, core::FinishReasonName(result->reason).c_str(), n / seconds,
               result->first_token_seconds * 1e3,
               n > 1 && decode_seconds > 0 ? (n - 1) / decode_seconds : 0.0);
  return 0;
}

}  // namespace kvguard::tools
