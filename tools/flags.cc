#include "tools/flags.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kvguard::tools {

const char* PrefillArithmetic(const core::ModelOptions& weights) {
  return kernels::MatMulArithmeticName(
      kernels::MatMulArithmeticFor(weights.prefill_weights, weights.prefill_activations));
}

const char kEngineFlagsHelp[] =
    "  --model NAME|PATH.gguf       built-in model: tiny, small (default), medium; or a\n"
    "                               Llama GGUF file (F32/F16/BF16/Q8_0/Q4_0 tensors)\n"
    "  --model-seed N               seed of the synthetic weights (default 1)\n"
    "  --prefill-weights FMT        fp8 (default), bf16, fp32\n"
    "  --prefill-activations A      bf16 (default: BF16 dot products where the CPU has\n"
    "                               AVX-512 BF16) or fp32, for the prefill matmuls\n"
    "  --decode-weights FMT         int4 (default), fp8, bf16, fp32\n"
    "  --int4-group G               32, 64, 128 (default)\n"
    "  --kv-cache-dtype DT          fp8_e4m3 (default), bf16, fp32\n"
    "  --kv-cache-bytes N           KV pool budget, e.g. 512M, 2G\n"
    "  --kv-cache-fraction F        else this fraction of available memory (default 0.1)\n"
    "  --page-size P                tokens per KV page (default 16)\n"
    "  --threads N                  threads of the engine's kernels (default 2)\n"
    "  --max-batch N                most requests in flight at once (default 64)\n"
    "  --step-tokens N              a step's token budget: decode tokens plus prefill\n"
    "                               chunks; >= --max-batch (default 256)\n"
    "  --partial-prefill-tokens N   the most tokens long prompts' chunks take in one step,\n"
    "                               all together, beside other work (default 64; 0: no\n"
    "                               limit beyond the budget)\n"
    "  --admission-ratio F          first estimate of the fraction of max_tokens requests\n"
    "                               use; admission reserves that much of their growth (then\n"
    "                               follows observed usage, 1 after a preemption; default 1;\n"
    "                               0: greedy admission)\n"
    "  --tag-key-file PATH          page-tag keys (created with mode 0600 if absent;\n"
    "                               default: an ephemeral key per process)\n"
    "  --tenants PATH               tenant config (JSON; default: one tenant, 'default',\n"
    "                               in enforce mode)\n"
    "  --tenant NAME                the tenant this command's requests run as (default\n"
    "                               'default')\n"
    "  --isolation MODE             off | enforce | strict: this tenant's mode\n"
    "  --audit-log DIR              write the tamper-evident audit log there\n"
    "  --audit-signing-key PATH     its Ed25519 key (default DIR.signing-key; created\n"
    "                               with mode 0600 if absent)\n"
    "  --audit-batch-records N      records per batched write + fsync (default 512;\n"
    "                               strict tenants' records are always fsync'd at once)\n"
    "  --audit-checkpoint-every N   records per signed checkpoint (default 1000)\n"
    "  --audit-checkpoint-seconds T a signed checkpoint at least every T s while records\n"
    "                               wait for one (default 10)\n"
    "  --audit-heartbeat-seconds T  and every T s while none do (default 60): an auditor's\n"
    "                               `audit verify --max-age` tells a log no longer signed\n";

bool Args::Flag(const std::string& name) {
  if (done()) return false;
  const std::string& a = args_[i_];
  if (a == name) {
    has_inline_ = false;
  } else if (a.rfind(name + "=", 0) == 0) {
    has_inline_ = true;
    inline_value_ = a.substr(name.size() + 1);
  } else {
    return false;
  }
  name_ = name;
  ++i_;
  return true;
}

absl::Status Args::Value(std::string* out) {
  if (has_inline_) {
    *out = inline_value_;
    has_inline_ = false;
    return absl::OkStatus();
  }
  if (done()) return absl::InvalidArgumentError(absl::StrCat(name_, " needs a value"));
  *out = args_[i_++];
  return absl::OkStatus();
}

absl::Status Args::Int(int* out, int lo, int hi) {
  std::string v;
  if (absl::Status s = Value(&v); !s.ok()) return s;
  if (!absl::SimpleAtoi(v, out) || *out < lo || *out > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat(name_, " '", v, "': want an integer in [", lo, ", ", hi, "]"));
  }
  return absl::OkStatus();
}

absl::Status Args::Double(double* out, double lo, double hi) {
  std::string v;
  if (absl::Status s = Value(&v); !s.ok()) return s;
  if (!absl::SimpleAtod(v, out) || !(*out >= lo && *out <= hi)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name_, " '", v, "': want a number in [", lo, ", ", hi, "]"));
  }
  return absl::OkStatus();
}

bool ParseEngineFlag(Args& a, core::RuntimeOptions* o, absl::Status* status) {
  std::string v;
  int n = 0;
  double d = 0;
  auto value_to = [&](auto parse) {
    *status = a.Value(&v);
    if (status->ok()) *status = parse(v);
    return true;
  };
  if (a.Flag("--model")) {
    return value_to([&](const std::string& s) {
      o->model = s;
      return absl::OkStatus();
    });
  }
  if (a.Flag("--model-seed")) {
    *status = a.Int(&n, 0, 1 << 30);
    o->seed = static_cast<uint64_t>(n);
    return true;
  }
  if (a.Flag("--prefill-weights")) {
    return value_to([&](const std::string& s) {
      auto f = core::ParseWeightFormat(s);
      if (f.ok()) o->weights.prefill_weights = *f;
      return f.status();
    });
  }
  if (a.Flag("--prefill-activations")) {
    return value_to([&](const std::string& s) {
      if (s == "bf16") {
        o->weights.prefill_activations = kernels::MatMulActivations::kBf16;
      } else if (s == "fp32") {
        o->weights.prefill_activations = kernels::MatMulActivations::kExact;
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("unknown prefill activations '", s, "' (bf16, fp32)"));
      }
      return absl::OkStatus();
    });
  }
  if (a.Flag("--decode-weights")) {
    return value_to([&](const std::string& s) {
      auto f = core::ParseWeightFormat(s);
      if (f.ok()) o->weights.decode_weights = *f;
      return f.status();
    });
  }
  if (a.Flag("--int4-group")) {
    *status = a.Int(&o->weights.int4_group, 32, 128);
    return true;
  }
  if (a.Flag("--kv-cache-dtype")) {
    return value_to([&](const std::string& s) {
      auto t = core::ParseKvDtype(s);
      if (t.ok()) o->kv_dtype = *t;
      return t.status();
    });
  }
  if (a.Flag("--kv-cache-bytes")) {
    return value_to([&](const std::string& s) {
      auto b = core::ParseBytes(s);
      if (b.ok()) o->kv_cache_bytes = *b;
      return b.status();
    });
  }
  if (a.Flag("--kv-cache-fraction")) {
    *status = a.Double(&d, 1e-6, 0.9);
    o->kv_cache_fraction = d;
    return true;
  }
  if (a.Flag("--tag-key-file")) {
    *status = a.Value(&o->tag_key_file);
    return true;
  }
  if (a.Flag("--tenants")) {
    *status = a.Value(&o->tenants_file);
    return true;
  }
  if (a.Flag("--audit-log")) {
    *status = a.Value(&o->audit_log_dir);
    return true;
  }
  if (a.Flag("--audit-batch-records")) {
    *status = a.Int(&o->audit_batch_records, 1, 1 << 20);
    return true;
  }
  if (a.Flag("--audit-checkpoint-every")) {
    *status = a.Int(&o->audit_checkpoint_every, 1, 1 << 24);
    return true;
  }
  if (a.Flag("--audit-checkpoint-seconds")) {
    *status = a.Double(&o->audit_checkpoint_seconds, 0.001, 86400);
    return true;
  }
  if (a.Flag("--audit-heartbeat-seconds")) {
    *status = a.Double(&o->audit_heartbeat_seconds, 0.001, 86400);
    return true;
  }
  if (a.Flag("--audit-signing-key")) {
    *status = a.Value(&o->audit_signing_key);
    return true;
  }
  if (a.Flag("--tenant")) {
    *status = a.Value(&o->tenant);
    return true;
  }
  if (a.Flag("--isolation")) {
    std::string mode;
    *status = a.Value(&mode);
    if (status->ok()) {
      absl::StatusOr<isolation::Mode> m = isolation::ParseMode(mode);
      if (m.ok()) {
        o->isolation_mode = *m;
      } else {
        *status = m.status();
      }
    }
    return true;
  }
  if (a.Flag("--page-size")) {
    *status = a.Int(&o->page_size, 1, 1024);
    return true;
  }
  if (a.Flag("--threads")) {
    *status = a.Int(&n, 1, 256);
    o->engine.threads = n;
    return true;
  }
  if (a.Flag("--max-batch")) {
    *status = a.Int(&o->engine.max_batch, 1, core::kMaxDecodeBatch);
    return true;
  }
  if (a.Flag("--admission-ratio")) {
    *status = a.Double(&o->engine.admission_ratio, 0, 1);  // 0: greedy, always
    return true;
  }
  if (a.Flag("--partial-prefill-tokens")) {
    *status = a.Int(&o->engine.partial_prefill_tokens, 0, 1 << 20);
    return true;
  }
  if (a.Flag("--step-tokens")) {
    *status = a.Int(&o->engine.step_tokens, 1, 1 << 20);  // >= max batch: Engine::Create
    return true;
  }
  return false;
}

}  // namespace kvguard::tools
