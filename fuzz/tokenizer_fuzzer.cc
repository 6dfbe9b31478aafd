// fuzz/tokenizer_fuzzer.cc: the GGUF tokenizers on arbitrary prompts.
//
// The first byte picks a tokenizer: a byte-level BPE vocabulary (every byte has a token, a few
// merges, user-defined tokens, a control token) under one of the pre-tokenizers, or a
// SentencePiece one; the rest is the prompt. Oracles: the pre-tokenizer's pieces concatenate to
// the prompt; every id is in the vocabulary and none is the control token; BPE gives the prompt
// back byte for byte (Decode(Encode(t)) == t), SentencePiece too when the prompt has no U+2581.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/gguf/gguf.h"
#include "core/text/gguf_tokenizer.h"
#include "core/text/pretokenizer.h"
#include "tests/core/gguf/gguf_writer.h"

namespace {

using kvguard::core::GgufTokenizer;
using kvguard::core::PreTokenizer;
namespace gguf = kvguard::core::gguf;
namespace testing = kvguard::core::testing;

constexpr const char* kPres[] = {
    "gpt-2",      "llama-bpe",  "qwen2", "deepseek-llm", "deepseek-coder", "deepseek-v3",
    "falcon",     "starcoder",  "glm4",  "kimi-k2",      "gpt-4o",         "tekken",
    "seed-coder", "bailingmoe", "bloom", "viking",       "default"};
constexpr int kNumPres = sizeof(kPres) / sizeof(kPres[0]);
constexpr int kControl = 260;  // <|im_end|> in the BPE vocabulary

struct Loaded {
  std::string bytes;  // the file points into it
  std::unique_ptr<gguf::File> file;
  std::unique_ptr<GgufTokenizer> tok;
  std::unique_ptr<PreTokenizer> pre;  // BPE only
};

Loaded Load(const testing::GgufWriter& w, const char* pre) {
  Loaded l;
  l.bytes = w.Build();
  auto f = gguf::File::Parse({reinterpret_cast<const uint8_t*>(l.bytes.data()), l.bytes.size()});
  if (!f.ok()) std::abort();
  l.file = *std::move(f);
  auto t = GgufTokenizer::Create(*l.file);
  if (!t.ok()) std::abort();
  l.tok = *std::move(t);
  if (pre != nullptr) l.pre = *PreTokenizer::Create(pre);
  return l;
}

const std::vector<Loaded>& Tokenizers() {
  static const auto* const all = [] {
    auto* v = new std::vector<Loaded>();
    for (const char* pre : kPres) {
      std::vector<std::string> tokens = testing::Gpt2ByteTokens();
      // 256 th, 257 the, 258 Ġthe, 259 <tool> (user-defined), 260 <|im_end|> (control),
      // 261 three spaces (user-defined, as MPT's whitespace tokens).
      for (const char* t : {"th", "the", "\xC4\xA0the", "<tool>", "<|im_end|>", "   "}) {
        tokens.push_back(t);
      }
      std::vector<int32_t> types(tokens.size(), 1);
      types[259] = types[261] = 4;
      types[kControl] = 3;
      testing::GgufWriter w;
      w.Str("tokenizer.ggml.model", "gpt2")
          .Str("tokenizer.ggml.pre", pre)
          .StrArray("tokenizer.ggml.tokens", tokens)
          .I32Array("tokenizer.ggml.token_type", types)
          .StrArray("tokenizer.ggml.merges", {"t h", "th e", "\xC4\xA0 the"});
      v->push_back(Load(w, pre));
    }
    testing::GgufWriter spm;
    testing::AddSpmVocab(spm,
                         {"\xE2\x96\x81", "a",
                          "\xE2\x96\x81"
                          "a",
                          "ab"},
                         {-5, -5, -2, -1});
    v->push_back(Load(spm, nullptr));
    return v;
  }();
  return *all;
}

void Fail(const char* oracle) {
  std::fprintf(stderr, "==kvguard-fuzz== ORACLE %s\n", oracle);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Loaded& l = Tokenizers()[data[0] % (kNumPres + 1)];
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  if (l.pre != nullptr) {
    std::vector<std::string_view> pieces;
    l.pre->Split(text, &pieces);
    std::string joined;
    for (std::string_view p : pieces) joined.append(p);
    if (joined != text) Fail("pretokenizer-concat: the pieces are not the prompt");
  }
  const std::vector<int> ids = l.tok->Encode(text, /*add_bos=*/true);
  for (const int id : ids) {
    if (id < 0 || id >= l.tok->vocab_size()) Fail("tokenizer-range: an id outside the vocabulary");
    if (l.pre != nullptr && id == kControl)
      Fail("tokenizer-control: a prompt became a control token");
  }
  const bool lossless = l.pre != nullptr || text.find("\xE2\x96\x81") == std::string::npos;
  if (lossless && l.tok->Decode(ids) != text) Fail("tokenizer-roundtrip: Decode(Encode(t)) != t");
  return 0;
}
