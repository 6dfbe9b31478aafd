// core/text/gguf_tokenizer.h: the tokenizer a GGUF file carries in its metadata.
//
// Two vocabularies (tokenizer.ggml.model):
//   "llama"  SentencePiece-style (SPM): the text gets a leading space when add_space_prefix
//            (default true), every space becomes U+2581 "▁", then adjacent symbols (UTF-8
//            characters) are merged greedily, highest tokenizer.ggml.scores first (ties: the
//            leftmost pair), as long as the merged text is a token. A symbol that is not a
//            token falls back to its bytes' <0xXX> tokens (else the unknown token). This is
//            llama.cpp's llm_tokenizer_spm.
//   "gpt2"   GPT-2 byte-level BPE: the text is cut into pieces by the pre-tokenizer that
//            tokenizer.ggml.pre names (pretokenizer.h: llama.cpp's expressions for each name,
//            run by PCRE2; an unknown name is refused), each piece's bytes are mapped to GPT-2's
//            printable code points, and adjacent symbols are merged by tokenizer.ggml.merges rank
//            (lowest first, leftmost on ties). Under Llama 3's pre-tokenizer a piece that is a
//            token as a whole is that token (llama.cpp's ignore_merges).
// The ids equal llama.cpp's (`llama_tokenize(..., add_special, parse_special=false)`) on every
// case of its tokenizer test suite for each pre-tokenizer it covers (tests/core/text/
// llama_vocab_suite_test.cc; bench/results/tokenizers.md).
// Special tokens: BOS/EOS/UNK ids from tokenizer.ggml.{bos,eos,unknown}_token_id (SPM
// defaults 1, 2, 0 when absent, as llama.cpp); Encode(text, add_bos) prepends BOS only when
// add_bos and tokenizer.ggml.add_bos_token (default: true for SPM, false for BPE) and appends
// EOS when add_bos and tokenizer.ggml.add_eos_token. Text is never parsed for control tokens:
// "<s>" in a prompt is three characters, never the BOS id, so a user cannot inject control
// tokens. User-defined tokens (token_type 4) are found in the text first, as llama.cpp does
// (added_tokens.h), unless their text is one llama.cpp promotes to control ("<|endoftext|>",
// "<|im_end|>", FIM markers, ...): those stay text too. User-defined tokens decode to their text.
// As in llama.cpp, a model whose general.name says Phi-3 drops the whitespace after them.
// Decoding: control tokens contribute nothing, <0xXX> tokens their byte, the unknown token
// U+FFFD; Decode (whole texts) drops the leading space that add_space_prefix added, as
// SentencePiece does; DecodeToken (streaming) keeps it. Decode(Encode(t)) == t for any bytes t
// (invalid UTF-8 included) in BPE, and in SPM when t contains no U+2581 and no user-defined
// token (llama.cpp puts a space prefix after each one).
// Chat prompts: EncodeTemplated is the one place control-token texts become ids, and only in the
// template's own text (core/text/chat_prompt.h decides which bytes came from the client). The
// exception in BPE: bytes UTF-8 never uses (C0, C1, F5-FF) that a vocabulary has no normal token
// for come back as U+FFFD (no token: falcon, mpt, starcoder, ...) or as the user-defined token's
// text (DeepSeek types them so). Chat prompts: EncodeTemplated is the one place where control-token
// texts become ids, and only in the chat template's own text (core/text/chat_prompt.h decides which
// bytes are client text).
#ifndef KVGUARD_CORE_TEXT_GGUF_TOKENIZER_H_
#define KVGUARD_CORE_TEXT_GGUF_TOKENIZER_H_

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "core/gguf/gguf.h"
#include "core/text/added_tokens.h"
#include "core/text/pretokenizer.h"
#include "core/text/tokenizer.h"

namespace kvguard::core {

class GgufTokenizer final : public Tokenizer {
 public:
  // Not copyable: control_texts_ views the strings of tokens_.
  GgufTokenizer(const GgufTokenizer&) = delete;
  GgufTokenizer& operator=(const GgufTokenizer&) = delete;
  enum class Kind { kSpm, kBpe };

  // Create reads the tokenizer of `file`. InvalidArgument (naming the key) for an unknown
  // tokenizer.ggml.model or tokenizer.ggml.pre, arrays of the wrong type or length, or special ids
  // outside the vocabulary; NotFound for a missing tokenizer.ggml.tokens (or merges, for BPE).
  static absl::StatusOr<std::unique_ptr<GgufTokenizer>> Create(const gguf::File& file);

  std::vector<int> Encode(std::string_view text, bool add_bos) const override;
  std::string Decode(std::span<const int> ids) const override;
  std::string DecodeToken(int id) const override;
  int bos_id() const override { return bos_; }
  int eos_id() const override { return eos_; }
  int vocab_size() const override { return static_cast<int>(tokens_.size()); }
  std::span<const std::string_view> ControlTokenTexts() const override;
  std::vector<int> EncodeTemplated(std::string_view text,
                                   std::span<const TextSpan> untrusted) const override;

  Kind kind() const { return kind_; }
  // pre_tokenizer returns the BPE pre-tokenizer, or nullptr for SentencePiece.
  const PreTokenizer* pre_tokenizer() const { return pre_.get(); }
  // Summary returns one line for `kvguard model inspect`: kind, pre-tokenizer, vocab, merges,
  // added tokens, special ids, BOS/EOS/space-prefix behaviour.
  std::string Summary() const;

 private:
  // A BPE merge: the pair (left, right) of symbol ids merges into `merged` at priority `rank`.
  struct Merge {
    int rank;
    int merged;
  };
  // WordCache maps pieces already encoded during one Encode call to their ids.
  struct WordCache;

  GgufTokenizer() = default;
  // TokenId returns the id of the token with text `text`, or -1 (also when it is a control
  // token: encoding never produces one).
  int TokenId(std::string_view text) const;
  // SymbolId returns the symbol id of `text`: its token id, else an id past the vocabulary that
  // stands for a merge result that is no token (added on first sight).
  int SymbolId(const std::string& text);
  // EncodeText appends the ids of `text` (no control tokens: user-defined ones, then SPM/BPE);
  // *after_token says whether a token precedes it (SPM's space prefix) and is cleared.
  void EncodeText(std::string_view text, bool* after_token, WordCache* cache,
                  std::vector<int>* ids) const;
  void EncodeSpm(std::string_view text, bool space_prefix, std::vector<int>* ids) const;
  void EncodeBpe(std::string_view text, WordCache* cache, std::vector<int>* ids) const;
  // BpeWord merges the byte-mapped symbols of one pre-tokenized piece and appends their ids.
  void BpeWord(std::string_view piece, std::vector<int>* ids) const;
  // AppendSymbol appends the ids of symbol `id`: itself if a token, else its characters' tokens.
  void AppendSymbol(int id, std::vector<int>* ids) const;
  // AppendByte appends the id standing for raw byte `b` (byte token, else UNK, else nothing).
  void AppendByte(unsigned char b, std::vector<int>* ids) const;

  Kind kind_ = Kind::kSpm;
  std::unique_ptr<PreTokenizer> pre_;            // BPE only
  AddedTokens added_;                            // user-defined tokens, looked for in text
  std::vector<std::string_view> control_texts_;  // texts of the special_ tokens, into tokens_
  AddedTokens control_;  // special_ tokens: looked for only in template text (EncodeTemplated)
  std::vector<std::string> tokens_;                    // [vocab] token text as stored
  std::vector<std::string> pieces_;                    // [vocab] the bytes each token decodes to
  std::vector<float> scores_;                          // [vocab] SPM merge priority
  std::vector<bool> special_;                          // [vocab] control tokens: decode to nothing
  absl::flat_hash_map<std::string, int> index_;        // token text -> id (first wins)
  absl::flat_hash_map<uint64_t, Merge> merges_;        // BPE: (left << 32 | right) -> merge
  std::vector<std::string> extra_symbols_;             // BPE: texts of symbol ids >= vocab
  absl::flat_hash_map<std::string, int> extra_index_;  // BPE: text -> symbol id >= vocab
  std::array<int, 256> byte_id_;                       // id standing for each raw byte, or -1
  std::array<int, 256> byte_symbol_;                   // BPE: symbol id of each byte's character
  std::array<std::string, 256> byte_char_;             // BPE: the code point (UTF-8) of each byte
  std::vector<int> replacement_ids_;  // BPE: U+FFFD's ids, for bytes the vocabulary lacks
  int bos_ = -1, eos_ = -1, unk_ = -1;
  bool add_bos_ = false, add_eos_ = false, add_space_prefix_ = false;
};

}  // namespace kvguard::core

#endif  // KVGUARD_CORE_TEXT_GGUF_TOKENIZER_H_
