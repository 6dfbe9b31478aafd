// core/model/model_config.h: the shape of a Llama-family decoder, and the built-in synthetic
// models.
#ifndef KVGUARD_CORE_MODEL_MODEL_CONFIG_H_
#define KVGUARD_CORE_MODEL_MODEL_CONFIG_H_

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvguard::core {

// ModelConfig describes a decoder-only Llama-family model: RMSNorm, RoPE (rotate-half),
// grouped-query attention, SwiGLU MLP, tied or untied embeddings.
struct ModelConfig {
  std::string name;
  int dim = 0;  // residual stream width
  int n_layers = 0;
  int n_heads = 0;     // query heads
  int n_kv_heads = 0;  // key/value heads (n_heads % n_kv_heads == 0)
  int head_dim = 0;    // per head; need not equal dim / n_heads
  int ffn_dim = 0;     // SwiGLU hidden width
  int vocab_size = 0;
  int max_context = 0;  // tokens
  float rope_theta = 10000.0f;
  float norm_eps = 1e-5f;
  bool tied_embeddings = false;  // lm head reuses the token embedding matrix

  // Validate returns InvalidArgument naming the first field that is out of range.
  absl::Status Validate() const;

  int q_dim() const { return n_heads * head_dim; }
  int kv_dim() const { return n_kv_heads * head_dim; }

  // KvBytesPerToken returns the KV cache bytes one token occupies (K and V, all layers)
  // at `bytes_per_element`.
  size_t KvBytesPerToken(size_t bytes_per_element) const {
    return size_t{2} * n_layers * n_kv_heads * head_dim * bytes_per_element;
  }

  // ParameterCount returns the number of weights (embeddings and norms included).
  size_t ParameterCount() const;
};

// BuiltinConfig returns the config of a built-in synthetic model: "tiny" (tests), "small",
// "medium"; NotFound for any other name.
absl::StatusOr<ModelConfig> BuiltinConfig(std::string_view name);

}  // namespace kvguard::core

#endif  // KVGUARD_CORE_MODEL_MODEL_CONFIG_H_
