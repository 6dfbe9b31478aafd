// core/model/synthetic_model.h: built-in models with deterministic random weights.
//
// Initialisation scheme (chosen so that neither attention nor the logits are degenerate:
// attention is neither uniform nor one-hot, and the next-token distribution has a clear but
// not certain top token, which makes greedy decoding and KL measurements meaningful):
//   token_embd                 N(0, 1)            rows have unit RMS, like a trained embedding
//   *_norm                     1 + 0.1 N(0, 1)
//   attn_q, attn_k             N(0, 2 / dim)      after RMSNorm, q and k elements have variance
//                                                 ~2, so q.k / sqrt(head_dim) has std ~2:
//                                                 peaked but not one-hot attention
//   attn_v, ffn_gate, ffn_up   N(0, 1 / dim)      unit-variance activations
//   attn_output                N(0, 1 / (q_dim * 2 n_layers))    GPT-2 style residual scaling:
//   ffn_down                   N(0, 1 / (ffn_dim * 2 n_layers))  the stream grows ~sqrt(2)
//   output                     N(0, 16 / dim)     logits with std ~4: over a 32000 vocabulary
//                                                 the top token stands ~4 sigma clear
// Normals are Irwin-Hall approximations (the sum of four 16-bit uniforms, rescaled; bounded
// at +-3.46 sigma), drawn from SplitMix64 keyed by (seed, tensor name, element index): every
// element is a pure function of those three, so any tensor can be generated alone, in any
// order, in parallel, and always equals itself.
#ifndef KVGUARD_CORE_MODEL_SYNTHETIC_MODEL_H_
#define KVGUARD_CORE_MODEL_SYNTHETIC_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model/weight_source.h"

namespace kvguard::core {

class SyntheticWeightSource : public WeightSource {
 public:
  SyntheticWeightSource(ModelConfig config, uint64_t seed);

  const ModelConfig& config() const override { return config_; }
  absl::Status ReadTensor(const std::string& name, std::vector<float>* out) const override;
  std::string Description() const override;

 private:
  ModelConfig config_;
  uint64_t seed_;
};

// MakeBuiltinSource returns the synthetic source of built-in model `name` with `seed`;
// NotFound for an unknown name.
absl::StatusOr<std::unique_ptr<WeightSource>> MakeBuiltinSource(const std::string& name,
                                                                uint64_t seed = 1);

}  // namespace kvguard::core

#endif  // KVGUARD_CORE_MODEL_SYNTHETIC_MODEL_H_
