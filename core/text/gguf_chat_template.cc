#include "core/text/gguf_chat_template.h"

#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvguard::core {

absl::StatusOr<GgufChatTemplate> ReadGgufChatTemplate(const gguf::File& file) {
  GgufChatTemplate out;
  if (file.Find("tokenizer.chat_template") != nullptr) {
    absl::StatusOr<std::string_view> source = file.GetString("tokenizer.chat_template");
    if (!source.ok()) return source.status();
    out.source = std::string(*source);
  }
  if (file.Find("tokenizer.ggml.tokens") == nullptr) return out;
  absl::StatusOr<const gguf::Value*> tokens =
      file.GetArray("tokenizer.ggml.tokens", gguf::ValueType::kString);
  if (!tokens.ok()) return tokens.status();
  for (auto [key, text] : {std::pair{"tokenizer.ggml.bos_token_id", &out.bos_token},
                           std::pair{"tokenizer.ggml.eos_token_id", &out.eos_token}}) {
    if (file.Find(key) == nullptr) continue;
    absl::StatusOr<uint64_t> id = file.GetUint(key, UINT32_MAX);
    if (!id.ok()) return id.status();
    if (*id >= (*tokens)->strings.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          key, " = ", *id, " is outside the vocabulary (", (*tokens)->strings.size(), " tokens)"));
    }
    *text = std::string((*tokens)->strings[*id]);
  }
  return out;
}

}  // namespace kvguard::core
