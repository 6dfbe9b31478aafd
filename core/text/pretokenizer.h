// core/text/pretokenizer.h: the pre-tokenizers of byte-level BPE vocabularies
// (tokenizer.ggml.pre), which cut text into the pieces BPE merges inside.
//
// A pre-tokenizer is a list of regular expressions applied in turn: the first cuts the text into
// its matches and the stretches between them (both are pieces), each later one cuts every piece
// the same way. The expressions are the ones llama.cpp applies for each name (src/llama-vocab.cpp,
// src/unicode.cpp), run by PCRE2 (UTF, UCP: Unicode categories and lookaheads), with the
// adjustments that make PCRE2 cut where llama.cpp cuts:
//   - \s is llama.cpp's whitespace set (Unicode White_Space, which includes U+0085), not PCRE2's;
//   - expressions llama.cpp runs through std::regex see non-ASCII whitespace as U+000B, so their
//     literal ranges (DeepSeek's CJK and full-width punctuation) exclude whitespace here, and
//     their \p{S} (through llama.cpp's ASCII table) lacks '~';
//   - ECMAScript's `$` is the end of the piece: \z.
// Names: those of llama.cpp's tokenizer suite (llama-bpe, qwen2, deepseek-llm, deepseek-coder,
// falcon, mpt, starcoder, refact, command-r, gpt-2), deepseek-v3, glm4, kimi-k2, gpt-4o/llama4,
// tekken, seed-coder, bailingmoe, bloom, viking, default, and llama.cpp's aliases of them
// (SupportedNames); bench/results/tokenizers.md shows each giving llama.cpp's ids. Not (yet):
// chameleon, superbpe, jina-v2-*, roberta-bpe (their extra rules are not implemented).
// Known differences from llama.cpp: code points whose category changed after Unicode 14 (PCRE2
// 10.42's tables; llama.cpp's are newer), and invalid UTF-8, which llama.cpp replaces by U+FFFD
// before splitting while here the bytes stay (they match no class and end up in the stretches
// between matches), so that no byte is lost.
#ifndef KVGUARD_CORE_TEXT_PRETOKENIZER_H_
#define KVGUARD_CORE_TEXT_PRETOKENIZER_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kvguard::core {

class PreTokenizer {
 public:
  // Create returns the pre-tokenizer for tokenizer.ggml.pre `name` (empty: the key is absent,
  // which llama.cpp splits the way it calls "default"), or InvalidArgument naming `name` and the
  // supported names when kvguard does not know it.
  static absl::StatusOr<std::unique_ptr<PreTokenizer>> Create(std::string_view name);
  ~PreTokenizer();

  // Split appends to *pieces the pieces of `text` in order; they are views into `text` and
  // their concatenation is `text`, whatever its bytes.
  void Split(std::string_view text, std::vector<std::string_view>* pieces) const;

  // name returns the name Create was given ("" reads as "default"); family the expression set
  // it selects (several names share one: "llama-bpe" and "llama3" are "llama3").
  const std::string& name() const { return name_; }
  const std::string& family() const { return family_; }
  // ignore_merges: a piece that is a token as a whole is that token, without merging (Llama 3).
  bool ignore_merges() const { return ignore_merges_; }
  // add_bos: llama.cpp's default for tokenizer.ggml.add_bos_token under this pre-tokenizer.
  bool add_bos() const { return add_bos_; }

  // SupportedNames returns every name Create accepts, comma-separated.
  static std::string SupportedNames();

 private:
  struct Regex;
  PreTokenizer() = default;

  std::string name_, family_;
  bool ignore_merges_ = false, add_bos_ = false;
  std::vector<std::unique_ptr<Regex>> regexes_;  // applied in order
};

}  // namespace kvguard::core

#endif  // KVGUARD_CORE_TEXT_PRETOKENIZER_H_
