// core/model/gguf_weight_source.h: a Llama-architecture GGUF file as a WeightSource.
//
// Metadata read (llama.cpp's names; `llama.` is the architecture prefix):
//   general.architecture                    must be "llama"
//   llama.embedding_length                  dim
//   llama.block_count                       n_layers
//   llama.attention.head_count              n_heads
//   llama.attention.head_count_kv           n_kv_heads (default n_heads)
//   llama.attention.key_length              head_dim (default dim / n_heads)
//   llama.rope.dimension_count              must equal head_dim (partial RoPE is not supported)
//   llama.feed_forward_length               ffn_dim
//   llama.context_length                    max_context
//   llama.rope.freq_base                    rope_theta (default 10000)
//   llama.attention.layer_norm_rms_epsilon  norm_eps
//   llama.vocab_size                        vocab (default: rows of token_embd.weight)
//   llama.rope.scaling.type                 absent or "none" (scaled RoPE is refused)
// Tied embeddings: output.weight absent.
//
// RoPE layout: GGUF Llama files store attn_q / attn_k rows for ggml's "normal" RoPE, which
// rotates adjacent pairs (2i, 2i+1) of each head; the engine rotates halves (i, i + hd/2).
// ReadTensor permutes those two matrices' rows within each head (row 2i -> i, 2i+1 -> i + hd/2),
// the inverse of llama.cpp's convert_hf_to_gguf permutation. q.k is unchanged by a permutation
// applied to both, so attention is exactly the model's.
#ifndef KVGUARD_CORE_MODEL_GGUF_WEIGHT_SOURCE_H_
#define KVGUARD_CORE_MODEL_GGUF_WEIGHT_SOURCE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/gguf/gguf.h"
#include "core/model/weight_source.h"

namespace kvguard::core {

// IsGgufPath returns whether a --model value names a GGUF file (ends in ".gguf").
bool IsGgufPath(const std::string& model);

// ConfigFromGguf returns the model config the metadata and tensors of `file` describe, named
// `name`. InvalidArgument naming the key when the architecture is not "llama", a key has the
// wrong type or value, or the config is invalid; NotFound naming a missing required key.
absl::StatusOr<ModelConfig> ConfigFromGguf(const gguf::File& file, const std::string& name);

class GgufWeightSource : public WeightSource {
 public:
  // Create checks that `file` holds every tensor the config needs, with the shape it needs
  // (NotFound naming a missing tensor, InvalidArgument naming a tensor whose shape differs).
  static absl::StatusOr<std::unique_ptr<GgufWeightSource>> Create(
      std::shared_ptr<const gguf::File> file, const std::string& description);

  // Open memory-maps and parses `path` and calls Create; errors are prefixed with the path.
  static absl::StatusOr<std::unique_ptr<GgufWeightSource>> Open(const std::string& path);

  const ModelConfig& config() const override { return config_; }
  absl::Status ReadTensor(const std::string& name, std::vector<float>* out) const override;
  std::string Description() const override { return description_; }
  const gguf::File& file() const { return *file_; }

 private:
  GgufWeightSource() = default;

  std::shared_ptr<const gguf::File> file_;
  ModelConfig config_;
  std::string description_;
};

// RequiredTensorNames returns the names of every tensor `config` needs, in load order.
std::vector<std::string> RequiredTensorNames(const ModelConfig& config);

}  // namespace kvguard::core

#endif  // KVGUARD_CORE_MODEL_GGUF_WEIGHT_SOURCE_H_
