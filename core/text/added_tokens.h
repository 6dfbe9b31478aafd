// core/text/added_tokens.h: a vocabulary's user-defined tokens (tokenizer.ggml.token_type 4),
// found in text before it is pre-tokenized, as llama.cpp and Hugging Face tokenizers do ("added
// tokens"): a user-defined token's text in a prompt is that token.
//
// llama.cpp's order, kept so that ids agree: longer tokens are looked for first (equal lengths:
// the lower id first); each token takes its occurrences from left to right in the text no earlier
// token took. Control tokens are never looked for: a prompt cannot contain them.
#ifndef KVGUARD_CORE_TEXT_ADDED_TOKENS_H_
#define KVGUARD_CORE_TEXT_ADDED_TOKENS_H_

#include <array>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvguard::core {

class AddedTokens {
 public:
  // A Fragment is a stretch of text (id < 0) or one added token found in it (its id; text is the
  // token's occurrence).
  struct Fragment {
    std::string_view text;
    int id;
  };

  AddedTokens() = default;
  // AddedTokens takes the (text, id) pairs to look for; empty texts are dropped. With `rstrip`,
  // the ASCII whitespace right after each token found is dropped from the text (llama.cpp's
  // RSTRIP, which it gives Phi-3's user-defined tokens).
  explicit AddedTokens(std::vector<std::pair<std::string, int>> tokens, bool rstrip = false);

  // Split appends to *out the fragments of `text` in order; their texts concatenate to `text`
  // (less the whitespace rstrip drops).
  void Split(std::string_view text, std::vector<Fragment>* out) const;

  bool empty() const { return tokens_.empty(); }
  size_t size() const { return tokens_.size(); }

 private:
  std::vector<std::pair<std::string, int>> tokens_;  // in the order they are looked for
  std::array<std::vector<int>, 256> by_first_byte_;  // indices into tokens_, ascending
  bool rstrip_ = false;
};

}  // namespace kvguard::core

#endif  // KVGUARD_CORE_TEXT_ADDED_TOKENS_H_
