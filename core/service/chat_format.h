// core/service/chat_format.h: the chat format `kvguard serve` gives chat requests, settled once
// at start: the model's chat template (a GGUF file's `tokenizer.chat_template`, or a file given
// with --chat-template, which wins, for any model), parsed once, with the BOS/EOS texts the
// template is given. A template that does not parse stops the start, never falls back to the
// plain rendering: the operator chose it, and a service answering in another format would hide
// that it is broken.
#ifndef KVGUARD_CORE_SERVICE_CHAT_FORMAT_H_
#define KVGUARD_CORE_SERVICE_CHAT_FORMAT_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "core/service/openai_api.h"

namespace kvguard::core {

// The largest --chat-template file read (real templates are under 30 KiB).
inline constexpr size_t kMaxChatTemplateFileBytes = size_t{1} << 20;

// ReadChatTemplateFile returns the bytes of the regular file `path` (a --chat-template), refusing
// one over kMaxChatTemplateFileBytes before reading it; errors name the file.
absl::StatusOr<std::string> ReadChatTemplateFile(const std::string& path);

// LoadChatFormat returns the chat format for `model` (a .gguf path, or a built-in model's name)
// and `template_file` ("" for none). Without either template, the plain rendering (no
// chat_template). BOS/EOS texts come from the GGUF (a built-in model's are empty). Errors name
// the file, or the GGUF key, and the problem: an unreadable or oversized --chat-template file, a
// GGUF key of the wrong type, a template that does not parse (with its line).
absl::StatusOr<ChatFormat> LoadChatFormat(const std::string& model,
                                          const std::string& template_file);

}  // namespace kvguard::core

#endif  // KVGUARD_CORE_SERVICE_CHAT_FORMAT_H_
