#include "core/model/weight_source.h"

#include <cstdlib>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kvguard::core {

std::string LayerTensorName(int layer, const char* suffix) {
  return absl::StrCat("blk.", layer, ".", suffix);
}

absl::Status TensorShape(const ModelConfig& c, const std::string& name, int* rows, int* cols) {
  *cols = 1;
  if (name == "token_embd.weight" || (name == "output.weight" && !c.tied_embeddings)) {
    *rows = c.vocab_size, *cols = c.dim;
    return absl::OkStatus();
  }
  if (name == "output_norm.weight") {
    *rows = c.dim;
    return absl::OkStatus();
  }
  if (absl::StartsWith(name, "blk.")) {
    const size_t dot = name.find('.', 4);
    int layer = -1;
    if (dot != std::string::npos && absl::SimpleAtoi(name.substr(4, dot - 4), &layer) &&
        layer >= 0 && layer < c.n_layers) {
      const std::string suffix = name.substr(dot + 1);
      if (suffix == "attn_norm.weight" || suffix == "ffn_norm.weight") {
        *rows = c.dim;
      } else if (suffix == "attn_q.weight") {
        *rows = c.q_dim(), *cols = c.dim;
      } else if (suffix == "attn_k.weight" || suffix == "attn_v.weight") {
        *rows = c.kv_dim(), *cols = c.dim;
      } else if (suffix == "attn_output.weight") {
        *rows = c.dim, *cols = c.q_dim();
      } else if (suffix == "ffn_gate.weight" || suffix == "ffn_up.weight") {
        *rows = c.ffn_dim, *cols = c.dim;
      } else if (suffix == "ffn_down.weight") {
        *rows = c.dim, *cols = c.ffn_dim;
      } else {
        return absl::NotFoundError(absl::StrCat("unknown tensor '", name, "'"));
      }
      return absl::OkStatus();
    }
  }
  return absl::NotFoundError(absl::StrCat("unknown tensor '", name, "'"));
}

}  // namespace kvguard::core
