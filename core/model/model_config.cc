#include "core/model/model_config.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/attention.h"

namespace kvguard::core {
namespace {

absl::Status Bad(std::string_view field, long long value, std::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("model config: ", std::string(field), " = ", value, ": ", std::string(why)));
}

}  // namespace

absl::Status ModelConfig::Validate() const {
  // Upper bounds keep every size product far inside 64-bit arithmetic and refuse files that
  // claim absurd shapes before anything is allocated for them.
  if (dim < 1 || dim > 65536) return Bad("dim", dim, "must be in [1, 65536]");
  if (n_layers < 1 || n_layers > 1024) return Bad("n_layers", n_layers, "must be in [1, 1024]");
  if (n_heads < 1 || n_heads > 1024) return Bad("n_heads", n_heads, "must be in [1, 1024]");
  if (n_kv_heads < 1 || n_kv_heads > n_heads) {
    return Bad("n_kv_heads", n_kv_heads, "must be in [1, n_heads]");
  }
  if (n_heads % n_kv_heads != 0) {
    return Bad("n_kv_heads", n_kv_heads, "must divide n_heads (grouped-query attention)");
  }
  if (!kernels::IsSupportedHeadDim(head_dim)) {
    return Bad("head_dim", head_dim,
               "must be a multiple of 16 in [16, 256] (what the attention kernels take)");
  }
  if (ffn_dim < 1 || ffn_dim > 1 << 20) return Bad("ffn_dim", ffn_dim, "must be in [1, 2^20]");
  if (vocab_size < 2 || vocab_size > 1 << 22) {
    return Bad("vocab_size", vocab_size, "must be in [2, 2^22]");
  }
  if (max_context < 1 || max_context > 1 << 22) {
    return Bad("max_context", max_context, "must be in [1, 2^22]");
  }
  if (!(rope_theta > 1.0f) || !(rope_theta < 1e12f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model config: rope_theta = ", rope_theta, ": must be in (1, 1e12)"));
  }
  if (!(norm_eps > 0.0f) || !(norm_eps < 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model config: norm_eps = ", norm_eps, ": must be in (0, 1)"));
  }
  return absl::OkStatus();
}

size_t ModelConfig::ParameterCount() const {
  const size_t d = dim, q = q_dim(), kv = kv_dim(), f = ffn_dim, v = vocab_size;
  const size_t per_layer = 2 * d + d * q + 2 * d * kv + q * d + 3 * d * f;
  return v * d * (tied_embeddings ? 1 : 2) + d + per_layer * n_layers;
}

absl::StatusOr<ModelConfig> BuiltinConfig(std::string_view name) {
  ModelConfig c;
  c.name = std::string(name);
  if (name == "tiny") {
    // For tests: small enough for an FP64 reference; GQA (2 query heads per kv head) and
    // head_dim != dim / n_heads on purpose, so both paths are exercised.
    c.dim = 64, c.n_layers = 2, c.n_heads = 2, c.n_kv_heads = 1, c.head_dim = 64;
    c.ffn_dim = 172, c.vocab_size = 259, c.max_context = 512;
  } else if (name == "small") {
    c.dim = 768, c.n_layers = 12, c.n_heads = 12, c.n_kv_heads = 12, c.head_dim = 64;
    c.ffn_dim = 2048, c.vocab_size = 32000, c.max_context = 4096;
  } else if (name == "medium") {
    c.dim = 2048, c.n_layers = 22, c.n_heads = 32, c.n_kv_heads = 4, c.head_dim = 64;
    c.ffn_dim = 5632, c.vocab_size = 32000, c.max_context = 4096;
  } else {
    return absl::NotFoundError(
        absl::StrCat("unknown built-in model '", std::string(name), "' (tiny, small, medium)"));
  }
  return c;
}

}  // namespace kvguard::core
