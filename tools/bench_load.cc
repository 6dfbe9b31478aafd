#include "tools/bench_load.h"

#include <algorithm>
#include <chrono>
#include <deque>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kvguard::tools {
namespace {

// A deterministic prompt of `len` byte tokens (after BOS), different per request.
std::vector<int> Prompt(const core::Tokenizer& tok, int len, int salt) {
  static const std::string text =
      "The KV cache is the memory of a request: every token it has seen, as keys and values "
      "for every layer. Serving many tenants means sharing one pool of pages among them. ";
  std::string s;
  for (int i = 0; static_cast<int>(s.size()) < len - 1; ++i) {
    s += text[(i + salt * 7) % text.size()];
  }
  return tok.Encode(s, /*add_bos=*/true);
}

}  // namespace

bool ParseLoadFlag(Args& a, LoadFlags* f, absl::Status* status) {
  if (a.Flag("--concurrency")) {
    std::string text;
    *status = a.Value(&text);
    if (!status->ok()) return true;
    f->concurrency.clear();
    for (absl::string_view item : absl::StrSplit(text, ',')) {
      int c = 0;
      if (!absl::SimpleAtoi(item, &c) || c < 1 || c > 4096) {
        *status =
            absl::InvalidArgumentError(absl::StrCat("bad concurrency '", item, "' (want 1..4096)"));
        return true;
      }
      f->concurrency.push_back(c);
    }
    return true;
  }
  if (a.Flag("--context")) {
    *status = a.Int(&f->context, 2, 1 << 20);
  } else if (a.Flag("--prompt-len")) {
    *status = a.Int(&f->prompt_len, 1, 1 << 20);
  } else if (a.Flag("--requests-per-client")) {
    *status = a.Int(&f->per_client, 1, 1000);
  } else if (a.Flag("--out")) {
    *status = a.Value(&f->out);
  } else {
    return false;
  }
  return true;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5));
  return v[i];
}

absl::StatusOr<LoadRun> RunClosedLoop(core::Engine& engine, const core::Tokenizer& tokenizer,
                                      int concurrency, int total, int prompt_len, int context,
                                      const std::string& tenant) {
  LoadRun run;
  std::deque<core::RequestId> in_flight;
  int submitted = 0, finished = 0;
  auto submit = [&]() -> absl::Status {
    core::GenerationRequest r;
    r.tenant = tenant;
    r.prompt = Prompt(tokenizer, prompt_len, submitted);
    r.max_tokens = context - static_cast<int>(r.prompt.size());
    r.stop_at_eos = false;
    absl::StatusOr<core::RequestId> id = engine.Submit(std::move(r));
    if (!id.ok()) return id.status();
    in_flight.push_back(*id);
    ++submitted;
    return absl::OkStatus();
  };
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < std::min(concurrency, total); ++i) {
    if (absl::Status s = submit(); !s.ok()) return s;
  }
  while (finished < total) {
    const core::RequestId id = in_flight.front();
    in_flight.pop_front();
    absl::StatusOr<core::GenerationResult> res = engine.Wait(id);
    if (!res.ok()) return res.status();
    if (res->reason == core::FinishReason::kError || res->reason == core::FinishReason::kAborted) {
      return absl::InternalError(absl::StrCat("request ", id, " failed: ", res->status.message()));
    }
    ++finished;
    run.output_tokens += static_cast<int64_t>(res->tokens.size());
    run.gaps.insert(run.gaps.end(), res->token_seconds.begin(), res->token_seconds.end());
    if (submitted < total) {
      if (absl::Status s = submit(); !s.ok()) return s;
    }
  }
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  run.stats = engine.stats();
  return run;
}

}  // namespace kvguard::tools
