#include "tests/core/gguf/gguf_writer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_format.h"
#include "core/model/gguf_weight_source.h"
#include "kernels/formats.h"

namespace kvguard::core::testing {
namespace {

using gguf::TensorType;
using gguf::ValueType;

template <class T>
void Put(std::string* out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out->append(b, sizeof(T));
}

void PutString(std::string* out, const std::string& s) {
  Put<uint64_t>(out, s.size());
  out->append(s);
}

uint16_t Bf16(float x) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7FFF + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace

GgufWriter& GgufWriter::Raw(const std::string& key, uint32_t type, const std::string& bytes) {
  PutString(&kv_bytes_, key);
  Put<uint32_t>(&kv_bytes_, type);
  kv_bytes_ += bytes;
  ++kv_n_;
  return *this;
}

GgufWriter& GgufWriter::Str(const std::string& key, const std::string& value) {
  std::string b;
  PutString(&b, value);
  return Raw(key, uint32_t(ValueType::kString), b);
}

template <class T>
GgufWriter& GgufWriter::Scalar(const std::string& key, ValueType type, T value) {
  std::string b;
  Put(&b, value);
  return Raw(key, uint32_t(type), b);
}

GgufWriter& GgufWriter::U32(const std::string& key, uint32_t v) {
  return Scalar(key, ValueType::kUint32, v);
}
GgufWriter& GgufWriter::I32(const std::string& key, int32_t v) {
  return Scalar(key, ValueType::kInt32, v);
}
GgufWriter& GgufWriter::U64(const std::string& key, uint64_t v) {
  return Scalar(key, ValueType::kUint64, v);
}
GgufWriter& GgufWriter::F32(const std::string& key, float v) {
  return Scalar(key, ValueType::kFloat32, v);
}

GgufWriter& GgufWriter::Bool(const std::string& key, bool value) {
  return Raw(key, uint32_t(ValueType::kBool), std::string(1, value ? '\1' : '\0'));
}

GgufWriter& GgufWriter::StrArray(const std::string& key, const std::vector<std::string>& values) {
  std::string b;
  Put<uint32_t>(&b, uint32_t(ValueType::kString));
  Put<uint64_t>(&b, values.size());
  for (const std::string& v : values) PutString(&b, v);
  return Raw(key, uint32_t(ValueType::kArray), b);
}

template <class T>
GgufWriter& GgufWriter::Array(const std::string& key, ValueType elem,
                              const std::vector<T>& values) {
  std::string b;
  Put<uint32_t>(&b, uint32_t(elem));
  Put<uint64_t>(&b, values.size());
  for (const T& v : values) Put(&b, v);
  return Raw(key, uint32_t(ValueType::kArray), b);
}

GgufWriter& GgufWriter::F32Array(const std::string& key, const std::vector<float>& values) {
  return Array(key, ValueType::kFloat32, values);
}

GgufWriter& GgufWriter::I32Array(const std::string& key, const std::vector<int32_t>& values) {
  return Array(key, ValueType::kInt32, values);
}

GgufWriter& GgufWriter::Tensor(const std::string& name, uint32_t type,
                               const std::vector<uint64_t>& ne, const std::string& data,
                               std::optional<uint64_t> offset) {
  tensors_.push_back({name, type, ne, data, offset});
  return *this;
}

GgufWriter& GgufWriter::Remove(const std::string& name) {
  tensors_.erase(std::remove_if(tensors_.begin(), tensors_.end(),
                                [&](const TensorEntry& t) { return t.name == name; }),
                 tensors_.end());
  return *this;
}

std::string GgufWriter::Build() const {
  std::string out = "GGUF";
  Put<uint32_t>(&out, version_);
  Put<uint64_t>(&out, tensor_count_.value_or(tensors_.size()));
  Put<uint64_t>(&out, kv_count_.value_or(kv_n_));
  out += kv_bytes_;
  // Data layout: each tensor at the next aligned offset (unless overridden).
  std::vector<uint64_t> offsets;
  uint64_t next = 0;
  for (const TensorEntry& t : tensors_) {
    offsets.push_back(t.offset.value_or(next));
    next = (next + t.data.size() + alignment_ - 1) / alignment_ * alignment_;
  }
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const TensorEntry& t = tensors_[i];
    PutString(&out, t.name);
    Put<uint32_t>(&out, static_cast<uint32_t>(t.ne.size()));
    for (uint64_t d : t.ne) Put(&out, d);
    Put(&out, t.type);
    Put(&out, offsets[i]);
  }
  if (tensors_.empty()) return out;
  out.resize((out.size() + alignment_ - 1) / alignment_ * alignment_, '\0');
  const size_t data_start = out.size();
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (tensors_[i].offset.has_value()) continue;  // deliberately elsewhere: not written
    out.resize(std::max(out.size(), data_start + offsets[i]), '\0');
    out.replace(data_start + offsets[i], tensors_[i].data.size(), tensors_[i].data);
  }
  return out;
}

std::string Encode(TensorType type, const std::vector<float>& x) {
  std::string out;
  switch (type) {
    case TensorType::kF32:
      for (float v : x) Put(&out, v);
      break;
    case TensorType::kF16:
      for (float v : x) Put(&out, kernels::Fp16FromFloat(v));
      break;
    case TensorType::kBF16:
      for (float v : x) Put(&out, Bf16(v));
      break;
    case TensorType::kQ8_0:
      for (size_t b = 0; b < x.size(); b += 32) {
        float amax = 0;
        for (size_t j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b + j]));
        const float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
        Put(&out, kernels::Fp16FromFloat(d));
        for (size_t j = 0; j < 32; ++j) {
          out.push_back(static_cast<char>(static_cast<int8_t>(std::lround(x[b + j] * id))));
        }
      }
      break;
    case TensorType::kQ4_0:
      for (size_t b = 0; b < x.size(); b += 32) {
        float max = 0;
        for (size_t j = 0; j < 32; ++j) {
          if (std::fabs(x[b + j]) > std::fabs(max)) max = x[b + j];
        }
        const float d = max / -8.0f, id = d != 0 ? 1.0f / d : 0.0f;
        Put(&out, kernels::Fp16FromFloat(d));
        for (size_t j = 0; j < 16; ++j) {
          const int lo = std::min(15, static_cast<int>(x[b + j] * id + 8.5f));
          const int hi = std::min(15, static_cast<int>(x[b + j + 16] * id + 8.5f));
          out.push_back(static_cast<char>(lo | (hi << 4)));
        }
      }
      break;
  }
  return out;
}

std::vector<float> PermuteForGguf(const std::vector<float>& w, int head_dim, int cols) {
  std::vector<float> out(w.size());
  const size_t rows = w.size() / cols, half = head_dim / 2;
  for (size_t h = 0; h < rows / head_dim; ++h) {
    for (size_t i = 0; i < half; ++i) {
      const size_t base = h * head_dim;
      std::copy_n(&w[(base + i) * cols], cols, &out[(base + 2 * i) * cols]);
      std::copy_n(&w[(base + i + half) * cols], cols, &out[(base + 2 * i + 1) * cols]);
    }
  }
  return out;
}

std::vector<std::string> Gpt2ByteTokens() {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) {
    int cp = b;
    if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)) {
      int n = 0;
      for (int x = 0; x < b; ++x)
        n += !((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174);
      cp = 256 + n;
    }
    std::string s;
    if (cp < 0x80) {
      s.push_back(static_cast<char>(cp));
    } else {
      s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
    tokens.push_back(s);
  }
  return tokens;
}

void AddSpmVocab(GgufWriter& w, const std::vector<std::string>& extra,
                 const std::vector<float>& extra_scores) {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<float> scores = {0, 0, 0};
  std::vector<int32_t> types = {2, 3, 3};
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(absl::StrFormat("<0x%02X>", b));
    scores.push_back(0);
    types.push_back(6);
  }
  for (size_t i = 0; i < extra.size(); ++i) {
    tokens.push_back(extra[i]);
    scores.push_back(i < extra_scores.size() ? extra_scores[i] : 0.0f);
    types.push_back(1);
  }
  w.Str("tokenizer.ggml.model", "llama")
      .StrArray("tokenizer.ggml.tokens", tokens)
      .F32Array("tokenizer.ggml.scores", scores)
      .I32Array("tokenizer.ggml.token_type", types)
      .U32("tokenizer.ggml.bos_token_id", 1)
      .U32("tokenizer.ggml.eos_token_id", 2)
      .U32("tokenizer.ggml.unknown_token_id", 0);
}

GgufWriter LlamaWriter(const WeightSource& source, TensorType type, uint32_t version,
                       const std::string& skip_tensor) {
  const ModelConfig& c = source.config();
  GgufWriter w(version);
  w.Str("general.architecture", "llama")
      .Str("general.name", c.name)
      .U32("llama.context_length", c.max_context)
      .U32("llama.embedding_length", c.dim)
      .U32("llama.block_count", c.n_layers)
      .U32("llama.feed_forward_length", c.ffn_dim)
      .U32("llama.attention.head_count", c.n_heads)
      .U32("llama.attention.head_count_kv", c.n_kv_heads)
      .U32("llama.attention.key_length", c.head_dim)
      .U32("llama.rope.dimension_count", c.head_dim)
      .F32("llama.rope.freq_base", c.rope_theta)
      .F32("llama.attention.layer_norm_rms_epsilon", c.norm_eps);
  std::vector<std::string> filler;
  for (int i = 259; i < c.vocab_size; ++i) filler.push_back("tok" + std::to_string(i));
  AddSpmVocab(w, filler);
  for (const std::string& name : RequiredTensorNames(c)) {
    if (name == skip_tensor) continue;
    int rows = 0, cols = 0;
    (void)TensorShape(c, name, &rows, &cols);
    std::vector<float> values;
    (void)source.ReadTensor(name, &values);
    if (name.ends_with(".attn_q.weight") || name.ends_with(".attn_k.weight")) {
      values = PermuteForGguf(values, c.head_dim, cols);
    }
    // Norm vectors are F32 in every llama.cpp quantisation; so here.
    // Rows that are not whole blocks of 32 fall back to F16, as llama.cpp's quantiser does.
    TensorType t = cols == 1 ? TensorType::kF32 : type;
    if ((t == TensorType::kQ8_0 || t == TensorType::kQ4_0) && cols % 32 != 0) t = TensorType::kF16;
    const std::vector<uint64_t> ne = cols == 1
                                         ? std::vector<uint64_t>{uint64_t(rows)}
                                         : std::vector<uint64_t>{uint64_t(cols), uint64_t(rows)};
    w.Tensor(name, static_cast<uint32_t>(t), ne, Encode(t, values));
  }
  return w;
}

std::string WriteLlama(const WeightSource& source, TensorType type, uint32_t version,
                       const std::string& skip_tensor) {
  return LlamaWriter(source, type, version, skip_tensor).Build();
}

}  // namespace kvguard::core::testing
