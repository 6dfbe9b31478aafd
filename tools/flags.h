// tools/flags.h: the small argument parser the subcommands share, and the engine flags
// (model, weight formats, KV cache) that generate / bench / eval accept alike.
#ifndef KVGUARD_TOOLS_FLAGS_H_
#define KVGUARD_TOOLS_FLAGS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/runtime.h"

namespace kvguard::tools {

// Args walks "--name value" / "--name=value" / "--switch" arguments.
class Args {
 public:
  explicit Args(std::vector<std::string> args) : args_(std::move(args)) {}
  bool done() const { return i_ >= args_.size(); }
  const std::string& peek() const { return args_[i_]; }
  // Flag returns true (and consumes it) if the next argument is `--name` or `--name=...`.
  bool Flag(const std::string& name);
  // Value returns the value of the flag just matched (InvalidArgument if it is missing).
  absl::Status Value(std::string* out);
  absl::Status Int(int* out, int lo, int hi);
  absl::Status Double(double* out, double lo, double hi);
  void Skip() { ++i_; }

 private:
  std::vector<std::string> args_;
  size_t i_ = 0;
  std::string name_;
  std::string inline_value_;
  bool has_inline_ = false;
};

// ParseEngineFlag consumes one engine flag if the next argument is one (returns true, with
// `*status` set on a bad value), else returns false:
//   --model NAME|PATH.gguf  --model-seed N  --prefill-weights fp8|bf16|fp32
//   --prefill-activations bf16|fp32  --decode-weights int4|fp8|bf16|fp32  --int4-group 32|64|128
//   --kv-cache-dtype fp8_e4m3|bf16|fp32  --kv-cache-bytes N[K|M|G]  --kv-cache-fraction F
//   --page-size P  --threads N  --max-batch N
bool ParseEngineFlag(Args& args, core::RuntimeOptions* options, absl::Status* status);

// PrefillArithmetic names how the prefill matmuls of `weights` run on this CPU
// (kernels::MatMulArithmeticName), for the tools' reports.
const char* PrefillArithmetic(const core::ModelOptions& weights);

// kEngineFlagsHelp is the usage text of the flags above.
extern const char kEngineFlagsHelp[];

}  // namespace kvguard::tools

#endif  // KVGUARD_TOOLS_FLAGS_H_
