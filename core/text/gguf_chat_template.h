// core/text/gguf_chat_template.h: a GGUF file's chat template and BOS/EOS token texts, the
// inputs core/text/chat_template.h needs from a model file (a library of its own, so that the
// renderer and its fuzz target need no GGUF reader).
#ifndef KVGUARD_CORE_TEXT_GGUF_CHAT_TEMPLATE_H_
#define KVGUARD_CORE_TEXT_GGUF_CHAT_TEMPLATE_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "core/gguf/gguf.h"

namespace kvguard::core {

// GgufChatTemplate: what a GGUF file says about chat formatting.
struct GgufChatTemplate {
  std::optional<std::string> source;  // tokenizer.chat_template; nullopt when the file has none
  std::string bos_token;              // the texts of tokenizer.ggml.{bos,eos}_token_id's tokens,
  std::string eos_token;              // "" when the file names no such token
};

// ReadGgufChatTemplate returns `file`'s chat template and BOS/EOS texts, or InvalidArgument
// naming the key when one is present with the wrong type or an id outside the vocabulary.
absl::StatusOr<GgufChatTemplate> ReadGgufChatTemplate(const gguf::File& file);

}  // namespace kvguard::core

#endif  // KVGUARD_CORE_TEXT_GGUF_CHAT_TEMPLATE_H_
