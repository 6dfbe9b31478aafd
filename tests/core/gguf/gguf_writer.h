// tests/core/gguf/gguf_writer.h: builds GGUF files in memory for the GGUF reader's tests (and the
// fuzz target's seeds): metadata of every type, tensors of every supported type, and the
// deliberate defects the error-path tests need (any version, counts, offsets, raw bytes).
#ifndef KVGUARD_TESTS_CORE_GGUF_GGUF_WRITER_H_
#define KVGUARD_TESTS_CORE_GGUF_GGUF_WRITER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/gguf/gguf.h"
#include "core/model/weight_source.h"

namespace kvguard::core::testing {

class GgufWriter {
 public:
  explicit GgufWriter(uint32_t version = 3) : version_(version) {}

  GgufWriter& Str(const std::string& key, const std::string& value);
  GgufWriter& U32(const std::string& key, uint32_t value);
  GgufWriter& I32(const std::string& key, int32_t value);
  GgufWriter& U64(const std::string& key, uint64_t value);
  GgufWriter& F32(const std::string& key, float value);
  GgufWriter& Bool(const std::string& key, bool value);
  GgufWriter& StrArray(const std::string& key, const std::vector<std::string>& values);
  GgufWriter& F32Array(const std::string& key, const std::vector<float>& values);
  GgufWriter& I32Array(const std::string& key, const std::vector<int32_t>& values);
  // Raw appends a key with `type` and the value bytes as given (for malformed values).
  GgufWriter& Raw(const std::string& key, uint32_t type, const std::string& value_bytes);

  // Tensor adds a tensor with ne (ne[0] fastest) and its stored bytes; its offset is the next
  // aligned one unless `offset` is given. Remove drops a tensor added before.
  GgufWriter& Tensor(const std::string& name, uint32_t type, const std::vector<uint64_t>& ne,
                     const std::string& data, std::optional<uint64_t> offset = std::nullopt);
  GgufWriter& Remove(const std::string& name);

  // Overrides of the header's counts (for absurd-count tests) and of the padding alignment.
  GgufWriter& KvCountOverride(uint64_t n) {
    kv_count_ = n;
    return *this;
  }
  GgufWriter& TensorCountOverride(uint64_t n) {
    tensor_count_ = n;
    return *this;
  }
  GgufWriter& Alignment(uint64_t a) {
    alignment_ = a;
    return *this;
  }

  // Build returns the file's bytes.
  std::string Build() const;

 private:
  struct TensorEntry {
    std::string name;
    uint32_t type;
    std::vector<uint64_t> ne;
    std::string data;
    std::optional<uint64_t> offset;
  };
  template <class T>
  GgufWriter& Scalar(const std::string& key, gguf::ValueType type, T value);
  template <class T>
  GgufWriter& Array(const std::string& key, gguf::ValueType elem, const std::vector<T>& values);

  uint32_t version_;
  uint64_t alignment_ = 32;
  std::optional<uint64_t> kv_count_, tensor_count_;
  std::string kv_bytes_;
  uint64_t kv_n_ = 0;
  std::vector<TensorEntry> tensors_;
};

// Encode writes `values` in tensor type `type` the way ggml quantises: F16/BF16 round to
// nearest even; Q8_0 d = max|x| / 127, q = round(x / d); Q4_0 d = (the value of largest
// magnitude) / -8, q = min(15, trunc(x / d + 8.5)).
std::string Encode(gguf::TensorType type, const std::vector<float>& values);

// PermuteForGguf reorders the rows of attn_q / attn_k [n_heads * head_dim, cols] from the
// engine's rotate-half order to GGUF's adjacent-pair order (the loader's inverse).
std::vector<float> PermuteForGguf(const std::vector<float>& w, int head_dim, int cols);

// SpmVocab returns the tokenizer keys of a SentencePiece vocabulary: <unk>, <s>, </s>, the 256
// <0xXX> byte tokens, then `extra` tokens with `extra_scores`.
void AddSpmVocab(GgufWriter& w, const std::vector<std::string>& extra = {},
                 const std::vector<float>& extra_scores = {});

// Gpt2ByteTokens returns the 256 byte characters of a GPT-2 byte-level vocabulary, in byte order
// (byte b is token b), written out from GPT-2's bytes_to_unicode independently of the tokenizer.
std::vector<std::string> Gpt2ByteTokens();

// WriteLlama writes every tensor of `source` (its config's shape) as `type`, with the llama
// metadata for its config and an SPM vocabulary of source.config().vocab_size tokens (byte
// tokens plus filler), as a GGUF of `version`. `skip_tensor` is left out when set.
std::string WriteLlama(const WeightSource& source, gguf::TensorType type, uint32_t version = 3,
                       const std::string& skip_tensor = "");

// LlamaWriter returns the writer WriteLlama builds (for tests that change it before Build).
GgufWriter LlamaWriter(const WeightSource& source, gguf::TensorType type, uint32_t version = 3,
                       const std::string& skip_tensor = "");

}  // namespace kvguard::core::testing

#endif  // KVGUARD_TESTS_CORE_GGUF_GGUF_WRITER_H_
