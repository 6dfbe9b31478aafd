#include "core/model/gguf_weight_source.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace kvguard::core {
namespace {

constexpr int kMaxInt = 1 << 30;

// Prefixed returns an error `s` with "what: " in front.
absl::Status Prefixed(const absl::Status& s, std::string_view what) {
  return absl::Status(s.code(), absl::StrCat(std::string(what), ": ", s.message()));
}

// GetInt reads integer key `key` into *out (range [0, 2^30]); an absent key leaves *out as it
// is when `optional`.
absl::Status GetInt(const gguf::File& f, const std::string& key, bool optional, int* out) {
  if (optional && f.Find(key) == nullptr) return absl::OkStatus();
  absl::StatusOr<uint64_t> v = f.GetUint(key, kMaxInt);
  if (!v.ok()) return v.status();
  *out = static_cast<int>(*v);
  return absl::OkStatus();
}

absl::Status GetFloat(const gguf::File& f, const std::string& key, bool optional, float* out) {
  if (optional && f.Find(key) == nullptr) return absl::OkStatus();
  absl::StatusOr<double> v = f.GetFloat(key);
  if (!v.ok()) return v.status();
  *out = static_cast<float>(*v);
  return absl::OkStatus();
}

// IsRopeMatrix: attn_q and attn_k rows are stored for adjacent-pair RoPE (see the header).
bool IsRopeMatrix(const std::string& name) {
  return absl::EndsWith(name, ".attn_q.weight") || absl::EndsWith(name, ".attn_k.weight");
}

}  // namespace

bool IsGgufPath(const std::string& model) { return absl::EndsWith(model, ".gguf"); }

std::vector<std::string> RequiredTensorNames(const ModelConfig& c) {
  std::vector<std::string> names = {"token_embd.weight", "output_norm.weight"};
  if (!c.tied_embeddings) names.push_back("output.weight");
  for (int l = 0; l < c.n_layers; ++l) {
    for (const char* suffix : {"attn_norm.weight", "attn_q.weight", "attn_k.weight",
                               "attn_v.weight", "attn_output.weight", "ffn_norm.weight",
                               "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"}) {
      names.push_back(LayerTensorName(l, suffix));
    }
  }
  return names;
}

absl::StatusOr<ModelConfig> ConfigFromGguf(const gguf::File& f, const std::string& name) {
  absl::StatusOr<std::string_view> arch = f.GetString("general.architecture");
  if (!arch.ok()) return arch.status();
  if (*arch != "llama") {
    return absl::InvalidArgumentError(
        absl::StrCat("key 'general.architecture' is '", std::string(*arch),
                     "': kvguard loads only the Llama architecture ('llama')"));
  }
  ModelConfig c;
  c.name = name;
  struct IntKey {
    const char* key;
    int* out;
    bool optional;
  };
  int rope_dims = -1;
  const IntKey ints[] = {
      {"llama.embedding_length", &c.dim, false},
      {"llama.block_count", &c.n_layers, false},
      {"llama.attention.head_count", &c.n_heads, false},
      {"llama.feed_forward_length", &c.ffn_dim, false},
      {"llama.context_length", &c.max_context, false},
      {"llama.rope.dimension_count", &rope_dims, true},
  };
  for (const IntKey& k : ints) {
    if (auto s = GetInt(f, k.key, k.optional, k.out); !s.ok()) return s;
  }
  c.n_kv_heads = c.n_heads;
  if (auto s = GetInt(f, "llama.attention.head_count_kv", true, &c.n_kv_heads); !s.ok()) return s;
  if (c.n_heads < 1) return absl::InvalidArgumentError("key 'llama.attention.head_count' is 0");
  c.head_dim = c.dim / c.n_heads;
  if (auto s = GetInt(f, "llama.attention.key_length", true, &c.head_dim); !s.ok()) return s;
  int value_length = c.head_dim;
  if (auto s = GetInt(f, "llama.attention.value_length", true, &value_length); !s.ok()) return s;
  if (value_length != c.head_dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("key 'llama.attention.value_length' = ", value_length,
                     " differs from the key length ", c.head_dim, " (not supported)"));
  }
  if (rope_dims >= 0 && rope_dims != c.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat("key 'llama.rope.dimension_count' = ", rope_dims,
                                                   ": partial RoPE (head_dim ", c.head_dim,
                                                   ") is not supported"));
  }
  if (const gguf::Value* v = f.Find("llama.rope.scaling.type")) {
    absl::StatusOr<std::string_view> t = f.GetString("llama.rope.scaling.type");
    if (!t.ok()) return t.status();
    if (*t != "none") {
      return absl::InvalidArgumentError(absl::StrCat("key 'llama.rope.scaling.type' is '",
                                                     std::string(v->str),
                                                     "': scaled RoPE is not supported"));
    }
  }
  if (auto s = GetFloat(f, "llama.rope.freq_base", true, &c.rope_theta); !s.ok()) return s;
  if (auto s = GetFloat(f, "llama.attention.layer_norm_rms_epsilon", false, &c.norm_eps); !s.ok()) {
    return s;
  }
  const gguf::TensorInfo* embd = f.FindTensor("token_embd.weight");
  if (embd == nullptr) return absl::NotFoundError("missing tensor 'token_embd.weight'");
  if (embd->ne.size() != 2 || embd->ne[1] > uint64_t{kMaxInt}) {
    return absl::InvalidArgumentError("tensor 'token_embd.weight' is not a [vocab, dim] matrix");
  }
  c.vocab_size = static_cast<int>(embd->ne[1]);
  int vocab_key = c.vocab_size;
  if (auto s = GetInt(f, "llama.vocab_size", true, &vocab_key); !s.ok()) return s;
  if (vocab_key != c.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("key 'llama.vocab_size' = ", vocab_key,
                                                   " but token_embd.weight has ", c.vocab_size,
                                                   " rows"));
  }
  c.tied_embeddings = f.FindTensor("output.weight") == nullptr;
  if (auto s = c.Validate(); !s.ok()) return s;
  return c;
}

absl::StatusOr<std::unique_ptr<GgufWeightSource>> GgufWeightSource::Create(
    std::shared_ptr<const gguf::File> file, const std::string& description) {
  absl::StatusOr<ModelConfig> config = ConfigFromGguf(*file, description);
  if (!config.ok()) return config.status();
  for (const std::string& name : RequiredTensorNames(*config)) {
    const gguf::TensorInfo* t = file->FindTensor(name);
    if (t == nullptr) return absl::NotFoundError(absl::StrCat("missing tensor '", name, "'"));
    int rows = 0, cols = 0;
    if (auto s = TensorShape(*config, name, &rows, &cols); !s.ok()) return s;
    // GGUF lists ne[0] (columns) first; a vector is [rows] with cols = 1.
    const std::vector<uint64_t> want = cols == 1
                                           ? std::vector<uint64_t>{uint64_t(rows)}
                                           : std::vector<uint64_t>{uint64_t(cols), uint64_t(rows)};
    if (t->ne != want) {
      std::string got, expected;
      for (uint64_t d : t->ne) absl::StrAppend(&got, got.empty() ? "" : ", ", d);
      for (uint64_t d : want) absl::StrAppend(&expected, expected.empty() ? "" : ", ", d);
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' has shape [", got,
                                                     "] (ne), the config needs [", expected, "]"));
    }
  }
  std::unique_ptr<GgufWeightSource> src(new GgufWeightSource());
  src->file_ = std::move(file);
  src->config_ = *std::move(config);
  src->description_ = description;
  return src;
}

absl::StatusOr<std::unique_ptr<GgufWeightSource>> GgufWeightSource::Open(const std::string& path) {
  absl::StatusOr<std::unique_ptr<gguf::File>> file = gguf::File::Open(path);
  if (!file.ok()) return file.status();  // already names the path
  absl::StatusOr<std::unique_ptr<GgufWeightSource>> src =
      Create(std::shared_ptr<const gguf::File>(*std::move(file)), path);
  if (!src.ok()) return Prefixed(src.status(), path);
  return src;
}

absl::Status GgufWeightSource::ReadTensor(const std::string& name, std::vector<float>* out) const {
  int rows = 0, cols = 0;
  if (auto s = TensorShape(config_, name, &rows, &cols); !s.ok()) return s;
  const gguf::TensorInfo* t = file_->FindTensor(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("missing tensor '", name, "'"));
  // Create checked the shape, so t holds rows * cols elements in t->bytes.
  out->resize(size_t(rows) * cols);
  gguf::DequantizeRow(t->type, t->data, out->size(), out->data());
  if (IsRopeMatrix(name)) {
    const int hd = config_.head_dim, half = hd / 2;
    std::vector<float> head(size_t(hd) * cols);
    for (int h = 0; h < rows / hd; ++h) {
      float* base = out->data() + size_t(h) * hd * cols;
      std::copy(base, base + head.size(), head.begin());
      for (int i = 0; i < half; ++i) {
        std::copy_n(&head[size_t(2 * i) * cols], cols, base + size_t(i) * cols);
        std::copy_n(&head[size_t(2 * i + 1) * cols], cols, base + size_t(i + half) * cols);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace kvguard::core
