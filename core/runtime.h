// core/runtime.h: everything a command needs to run the engine, built from one options
// struct: weight source, model (both phases' weights), tokenizer, FP8 KV calibration, KV
// pool and engine. `kvguard generate`, `bench`, `eval` (and later `serve`) share it.
#ifndef KVGUARD_CORE_RUNTIME_H_
#define KVGUARD_CORE_RUNTIME_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/engine/engine.h"
#include "core/model/kv_pool.h"
#include "core/model/model.h"
#include "core/model/weight_source.h"
#include "core/text/tokenizer.h"

namespace kvguard::core {

struct RuntimeOptions {
  std::string model = "small";  // a built-in name (tiny, small, medium) or a path ending .gguf
  uint64_t seed = 1;            // synthetic weights' seed
  ModelOptions weights;
  kernels::KvDtype kv_dtype = kernels::KvDtype::kFp8E4m3;
  int page_size = 16;
  size_t kv_cache_bytes = 0;        // 0: kv_cache_fraction of available memory
  double kv_cache_fraction = 0.10;  // of MemAvailable, when kv_cache_bytes is 0
  EngineOptions engine;
  // Isolation: the tag key file (LoadOrCreate; empty: an ephemeral key), the tenant config
  // (empty: engine.isolation.policy as given), the tenant a command's requests run as, and,
  // if set, the mode that tenant is switched to.
  std::string tag_key_file;
  std::string tenants_file;
  std::string tenant = "default";
  std::optional<isolation::Mode> isolation_mode;
  // The audit log (audit/): a directory (empty: events stay in memory) and its Ed25519
  // signing key file (empty: "<dir>.signing-key" beside it; kept out of the directory an
  // auditor is handed).
  std::string audit_log_dir;
  std::string audit_signing_key;
  int audit_batch_records = 512;      // non-durable records per write + fsync
  int audit_checkpoint_every = 1000;  // records per signed checkpoint
  // A checkpoint at least this often while records wait for one, and this often while none do.
  double audit_checkpoint_seconds = 10;
  double audit_heartbeat_seconds = 60;
};

// Loaded is a model with its tokenizer and FP8 KV scales, ready for any number of engines.
struct Loaded {
  std::unique_ptr<WeightSource> source;
  std::shared_ptr<Model> model;
  std::shared_ptr<const Tokenizer> tokenizer;
  double load_seconds = 0;
};

// LoadModel loads `options.model` with `options.weights` and calibrates FP8 KV scales over
// CalibrationPrompts(). A model ending in ".gguf" is a GGUF file (memory-mapped; its weights
// converted to the engine's formats, its own tokenizer); any other name is a built-in model
// with the byte tokenizer. Errors name the model and what failed.
absl::StatusOr<Loaded> LoadModel(const RuntimeOptions& options);

// MakeEngine builds a KV pool per `options` (kv_dtype, page_size, budget, tag keys) for
// `loaded` and starts an engine on it with the tenant policy (file, then isolation_mode for
// `tenant`). Errors: the budget's, the key file's, the tenant file's (prefixed with the path),
// NotFound when isolation_mode names a tenant the policy lacks.
absl::StatusOr<std::unique_ptr<Engine>> MakeEngine(const Loaded& loaded,
                                                   const RuntimeOptions& options);

// KvBudgetBytes resolves the KV budget: kv_cache_bytes, else the fraction of MemAvailable.
absl::StatusOr<size_t> KvBudgetBytes(const RuntimeOptions& options);

// CalibrationPrompts returns the built-in prompt set used for FP8 KV scales (and by `eval`).
const std::vector<std::string>& CalibrationPrompts();

// ParseBytes parses "123", "64K", "512M", "2G" (binary units); InvalidArgument otherwise.
absl::StatusOr<size_t> ParseBytes(const std::string& text);

// PeakRssBytes returns the process's peak resident set (VmHWM), or 0 if unknown.
size_t PeakRssBytes();

// ResetPeakRss restarts the VmHWM count (Linux: "5" to /proc/self/clear_refs), so a benchmark
// can exclude what it allocated before (such as the STREAM array); false if unsupported.
bool ResetPeakRss();

}  // namespace kvguard::core

#endif  // KVGUARD_CORE_RUNTIME_H_
