// fuzz/gguf_parse_fuzzer.cc: the GGUF reader on arbitrary bytes.
//
// Every input either parses or is refused with an error: no crash, no read outside the input
// (ASan), no allocation the input's size does not justify (libFuzzer's -rss_limit_mb /
// -malloc_limit_mb catch those). On a file that parses, the invariant checked is that every
// tensor lies inside the input; the weight source and the tokenizer are then built from it, so
// their metadata checks are fuzzed too, and a tokenizer that loads encodes and decodes a
// fixed text.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <span>
#include <vector>

#include "core/gguf/gguf.h"
#include "core/model/gguf_weight_source.h"
#include "core/text/gguf_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using kvguard::core::GgufTokenizer;
  using kvguard::core::GgufWeightSource;
  namespace gguf = kvguard::core::gguf;
  absl::StatusOr<std::unique_ptr<gguf::File>> file = gguf::File::Parse({data, size});
  if (!file.ok()) return 0;
  for (const gguf::TensorInfo& t : (*file)->tensors()) {
    if (t.data < data || t.bytes > size || t.data + t.bytes > data + size) {
      std::fprintf(stderr, "==kvguard-fuzz== ORACLE gguf-bounds: a tensor lies outside the file\n");
      std::abort();
    }
  }
  std::shared_ptr<const gguf::File> shared(*std::move(file));
  absl::StatusOr<std::unique_ptr<GgufTokenizer>> tok = GgufTokenizer::Create(*shared);
  if (tok.ok()) {
    const std::vector<int> ids = (*tok)->Encode("Hello, w\xC3\xB6rld \xFF", true);
    (void)(*tok)->Decode(ids);
  }
  absl::StatusOr<std::unique_ptr<GgufWeightSource>> src = GgufWeightSource::Create(shared, "fuzz");
  if (src.ok()) {
    std::vector<float> values;
    (void)(*src)->ReadTensor("output_norm.weight", &values);
  }
  return 0;
}
