// tests/core/model/reference_decoder.h: a single-file Llama decoder, llama2.c style, used as the
// oracle for the engine. Plain FP32 (FP64 accumulation in matmuls), a dense KV cache, no
// batching, no quantisation, no SIMD: readable top to bottom, so a reviewer can check it
// against the architecture by eye.
#ifndef KVGUARD_TESTS_CORE_MODEL_REFERENCE_DECODER_H_
#define KVGUARD_TESTS_CORE_MODEL_REFERENCE_DECODER_H_

#include <vector>

#include "absl/status/statusor.h"
#include "core/model/weight_source.h"

namespace kvguard::testing {

class ReferenceDecoder {
 public:
  // Load reads every tensor of `source` as FP32.
  static absl::StatusOr<ReferenceDecoder> Load(const core::WeightSource& source);

  // Forward runs token `token` at position `pos` (0, 1, 2, ... in order: each call appends to
  // the KV cache) and returns the logits [vocab_size].
  std::vector<float> Forward(int token, int pos);

  // Reset forgets the KV cache (the next Forward must be at position 0).
  void Reset() { cached_ = 0; }

  const core::ModelConfig& config() const { return c_; }

 private:
  struct Layer {
    std::vector<float> attn_norm;  // [dim]
    std::vector<float> wq;         // [n_heads * head_dim, dim]
    std::vector<float> wk;         // [n_kv_heads * head_dim, dim]
    std::vector<float> wv;         // [n_kv_heads * head_dim, dim]
    std::vector<float> wo;         // [dim, n_heads * head_dim]
    std::vector<float> ffn_norm;   // [dim]
    std::vector<float> w_gate;     // [ffn_dim, dim]
    std::vector<float> w_up;       // [ffn_dim, dim]
    std::vector<float> w_down;     // [dim, ffn_dim]
    std::vector<float> k_cache;    // [max_context, n_kv_heads * head_dim]
    std::vector<float> v_cache;    // [max_context, n_kv_heads * head_dim]
  };

  core::ModelConfig c_;
  std::vector<float> token_embd_;   // [vocab, dim]
  std::vector<float> output_norm_;  // [dim]
  std::vector<float> output_;       // [vocab, dim] (a copy of token_embd_ when tied)
  std::vector<Layer> layers_;
  int cached_ = 0;
};

}  // namespace kvguard::testing

#endif  // KVGUARD_TESTS_CORE_MODEL_REFERENCE_DECODER_H_
