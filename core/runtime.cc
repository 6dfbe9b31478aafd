#include "core/runtime.h"

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>

#if defined(__GLIBC__)
#include <malloc.h>  // malloc_trim
#endif

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/model/gguf_weight_source.h"
#include "core/model/synthetic_model.h"
#include "core/service/audit_log_sink.h"
#include "core/text/gguf_tokenizer.h"

namespace kvguard::core {
namespace {

// Reads a "Key:   N kB" line of a /proc file; 0 if absent.
size_t ProcKiB(const char* path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) == 0) {
      return std::strtoull(line.c_str() + key.size() + 1, nullptr, 10) * 1024;
    }
  }
  return 0;
}

}  // namespace

const std::vector<std::string>& CalibrationPrompts() {
  // Varied text (prose, code, numbers, other scripts) so every head sees a typical range.
  static const std::vector<std::string> prompts = {
      "Once upon a time, in a city of glass towers, a small robot learned to read.",
      "The KV cache holds the keys and values of every token a request has seen so far.",
      "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n",
      "Temperature 21.5 C, humidity 43%, wind 12 km/h from the north-west at 06:30.",
      "Über den Wolken muss die Freiheit wohl grenzenlos sein. 雲の上は自由だ。",
      "SELECT tenant, count(*) FROM audit_log WHERE reason = 'stale_generation';",
      "Q: What is 17 times 23? A: 17 times 23 is 391, because 17 * 20 = 340 and 17 * 3 = 51.",
      "The quick brown fox jumps over the lazy dog while the cat watches from the wall.",
  };
  return prompts;
}

absl::StatusOr<size_t> ParseBytes(const std::string& text) {
  if (text.empty()) return absl::InvalidArgumentError("empty byte count");
  size_t mult = 1;
  std::string digits = text;
  const char last = text.back();
  if (last == 'K' || last == 'k') mult = size_t{1} << 10;
  if (last == 'M' || last == 'm') mult = size_t{1} << 20;
  if (last == 'G' || last == 'g') mult = size_t{1} << 30;
  if (mult != 1) digits.pop_back();
  uint64_t n = 0;
  if (!absl::SimpleAtoi(digits, &n) || n == 0 || n > (uint64_t{1} << 50) / mult) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "' is not a byte count (like 512M or 2G)"));
  }
  return static_cast<size_t>(n * mult);
}

size_t PeakRssBytes() { return ProcKiB("/proc/self/status", "VmHWM"); }

bool ResetPeakRss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.close();
  return static_cast<bool>(out);
}

absl::StatusOr<size_t> KvBudgetBytes(const RuntimeOptions& o) {
  if (o.kv_cache_bytes > 0) return o.kv_cache_bytes;
  if (!(o.kv_cache_fraction > 0 && o.kv_cache_fraction <= 0.9)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv-cache-fraction ", o.kv_cache_fraction, " must be in (0, 0.9]"));
  }
  const size_t available = ProcKiB("/proc/meminfo", "MemAvailable");
  if (available == 0) {
    return absl::FailedPreconditionError(
        "cannot read MemAvailable from /proc/meminfo: pass --kv-cache-bytes");
  }
  return static_cast<size_t>(static_cast<double>(available) * o.kv_cache_fraction);
}

absl::StatusOr<Loaded> LoadModel(const RuntimeOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  Loaded loaded;
  if (IsGgufPath(options.model)) {
    // A GGUF file brings its own weights and tokenizer; the vocabularies must agree.
    absl::StatusOr<std::unique_ptr<GgufWeightSource>> source =
        GgufWeightSource::Open(options.model);
    if (!source.ok()) return source.status();
    absl::StatusOr<std::unique_ptr<GgufTokenizer>> tokenizer =
        GgufTokenizer::Create((*source)->file());
    if (!tokenizer.ok()) {
      return absl::Status(tokenizer.status().code(),
                          absl::StrCat(options.model, ": ", tokenizer.status().message()));
    }
    if ((*tokenizer)->vocab_size() != (*source)->config().vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          options.model, ": the tokenizer has ", (*tokenizer)->vocab_size(),
          " tokens but token_embd.weight has ", (*source)->config().vocab_size, " rows"));
    }
    loaded.source = *std::move(source);
    loaded.tokenizer = *std::move(tokenizer);
  } else {
    absl::StatusOr<std::unique_ptr<WeightSource>> source =
        MakeBuiltinSource(options.model, options.seed);
    if (!source.ok()) return source.status();
    loaded.source = *std::move(source);
    absl::StatusOr<std::unique_ptr<ByteTokenizer>> tokenizer =
        ByteTokenizer::Create(loaded.source->config().vocab_size);
    if (!tokenizer.ok()) return tokenizer.status();
    loaded.tokenizer = *std::move(tokenizer);
  }
  kernels::ThreadPool pool(2);
  absl::StatusOr<std::unique_ptr<Model>> model =
      Model::Load(*loaded.source, options.weights, &pool);
  if (!model.ok()) {
    return absl::Status(model.status().code(),
                        absl::StrCat(options.model, ": ", model.status().message()));
  }
  loaded.model = *std::move(model);
  std::vector<std::vector<int>> prompts;
  for (const std::string& p : CalibrationPrompts()) {
    prompts.push_back(loaded.tokenizer->Encode(p, /*add_bos=*/true));
  }
  if (absl::Status s = loaded.model->CalibrateKvScales(prompts, &pool); !s.ok()) return s;
#if defined(__GLIBC__)
  // Hand the loader's freed FP32 staging buffers back to the OS. A tensor buffer of 128 KiB-32 MiB
  // comes from a malloc arena (glibc raises its mmap threshold after the first large free), and its
  // pages stay resident, and in the peak RSS that the engine's memory target counts, once freed.
  // Measured on Zen 4 (`kvguard bench --model small --context 2048 --kv-cache-bytes 288M
  // --concurrency 16 --configs int4/fp8_e4m3,int4/bf16 --rounds 1`, old and new binary alternated A
  // B A B): peak RSS 0.577 / 0.595 GiB without this, 0.562 / 0.562 with it, against 0.528 GiB of
  // weights + KV budget (+9.3% / +12.6% -> +6.5% / +6.4%). glibc only: other C libraries'
  // allocators differ, and the sanitizers' allocators do not keep glibc's arenas.
  malloc_trim(0);
#endif
  loaded.load_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return loaded;
}

absl::StatusOr<std::unique_ptr<Engine>> MakeEngine(const Loaded& loaded,
                                                   const RuntimeOptions& options) {
  absl::StatusOr<size_t> budget = KvBudgetBytes(options);
  if (!budget.ok()) return budget.status();
  KvPoolOptions po;
  po.dtype = options.kv_dtype;
  po.page_size = options.page_size;
  po.budget_bytes = *budget;
  if (!options.tag_key_file.empty()) {
    absl::StatusOr<std::unique_ptr<isolation::TagKeyRing>> keys =
        isolation::TagKeyRing::LoadOrCreate(options.tag_key_file);
    if (!keys.ok()) return keys.status();
    po.tag_keys = std::move(*keys);
  }
  EngineOptions eo = options.engine;
  if (!options.tenants_file.empty()) {
    absl::StatusOr<isolation::TenantPolicy> policy =
        isolation::TenantPolicy::LoadFile(options.tenants_file);
    if (!policy.ok()) return policy.status();
    eo.isolation.policy = *std::move(policy);
  }
  if (options.isolation_mode) {
    bool found = false;
    for (isolation::TenantSettings& t : eo.isolation.policy.tenants) {
      if (t.name == options.tenant) {
        t.mode = *options.isolation_mode;
        found = true;
      }
    }
    if (!found) {
      return absl::NotFoundError(
          absl::StrCat("--isolation: no tenant '", options.tenant, "' in the tenant policy"));
    }
  }
  if (!options.audit_log_dir.empty()) {
    const std::string key_path = options.audit_signing_key.empty()
                                     ? options.audit_log_dir + ".signing-key"
                                     : options.audit_signing_key;
    absl::StatusOr<std::unique_ptr<audit::SigningKey>> key =
        audit::SigningKey::LoadOrCreate(key_path);
    if (!key.ok()) return key.status();
    audit::LogOptions lo;
    lo.dir = options.audit_log_dir;
    lo.key = std::move(*key);
    lo.witness_file = options.audit_log_dir + ".witness";  // beside the key, outside the log
    lo.batch_records = static_cast<uint64_t>(options.audit_batch_records);
    lo.checkpoint_every = static_cast<uint64_t>(options.audit_checkpoint_every);
    lo.checkpoint_interval_ms = static_cast<int64_t>(options.audit_checkpoint_seconds * 1000);
    lo.heartbeat_interval_ms = static_cast<int64_t>(options.audit_heartbeat_seconds * 1000);
    absl::StatusOr<std::unique_ptr<audit::AuditLog>> log = audit::AuditLog::Open(std::move(lo));
    if (!log.ok()) return log.status();
    eo.isolation.sink = std::make_shared<AuditLogSink>(std::move(*log));
  }
  absl::StatusOr<std::unique_ptr<KvPool>> pool = KvPool::Create(loaded.model->config(), po);
  if (!pool.ok()) return pool.status();
  return Engine::Create(loaded.model, loaded.tokenizer, *std::move(pool), eo);
}

}  // namespace kvguard::core
