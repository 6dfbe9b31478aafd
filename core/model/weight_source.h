// core/model/weight_source.h: the one interface through which weights reach the engine.
//
// A source (built-in synthetic models today, GGUF files later) describes its model and hands
// out each tensor as FP32; the engine quantises them into its per-phase formats. Tensor names
// and shapes follow the GGUF/llama.cpp convention so file formats plug in unchanged:
//   token_embd.weight           [vocab, dim]
//   output_norm.weight          [dim]
//   output.weight               [vocab, dim]     (absent when config().tied_embeddings)
//   blk.N.attn_norm.weight      [dim]
//   blk.N.attn_q.weight         [n_heads * head_dim, dim]
//   blk.N.attn_k.weight         [n_kv_heads * head_dim, dim]
//   blk.N.attn_v.weight         [n_kv_heads * head_dim, dim]
//   blk.N.attn_output.weight    [dim, n_heads * head_dim]
//   blk.N.ffn_norm.weight       [dim]
//   blk.N.ffn_gate.weight       [ffn_dim, dim]
//   blk.N.ffn_up.weight         [ffn_dim, dim]
//   blk.N.ffn_down.weight       [dim, ffn_dim]
// Shapes are [rows, cols], row-major, rows = output features (y = W x).
#ifndef KVGUARD_CORE_MODEL_WEIGHT_SOURCE_H_
#define KVGUARD_CORE_MODEL_WEIGHT_SOURCE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/model/model_config.h"

namespace kvguard::core {

class WeightSource {
 public:
  virtual ~WeightSource() = default;

  // config returns the model's shape (already validated).
  virtual const ModelConfig& config() const = 0;

  // ReadTensor fills `out` with the FP32 values of tensor `name` ([rows * cols] row-major,
  // shape per the table above). Returns NotFound for an unknown name, InvalidArgument or
  // DataLoss when the stored tensor is malformed.
  virtual absl::Status ReadTensor(const std::string& name, std::vector<float>* out) const = 0;

  // Description returns a one-line summary for logs ("built-in small, seed 1", a file path).
  virtual std::string Description() const = 0;
};

// TensorShape returns the [rows, cols] of tensor `name` for `config` per the table above
// (cols = 1 for vectors), or NotFound.
absl::Status TensorShape(const ModelConfig& config, const std::string& name, int* rows, int* cols);

// LayerTensorName returns "blk.<layer>.<suffix>".
std::string LayerTensorName(int layer, const char* suffix);

}  // namespace kvguard::core

#endif  // KVGUARD_CORE_MODEL_WEIGHT_SOURCE_H_
