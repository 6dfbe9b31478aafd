// core/text/chat_prompt.h: a rendered chat prompt to token ids, without letting client text
// become control tokens.
//
// The rule. A chat template writes control tokens as text (`<|im_start|>`, `<|eot_id|>`,
// `{{ bos_token }}`) and they must become their ids, or the model sees no turns. The client's
// message contents are pasted into the same text, and must never become control tokens, or a
// user could close its turn and forge a system or assistant one ("prompt injection by special
// tokens"). Everywhere else kvguard never parses control tokens out of text (gguf_tokenizer.h).
//
// How. The renderer does not record where each byte came from, so the client's bytes are found
// again in the rendered text. Only a message content that could make or complete a control
// token matters: one that holds a control token's text, or begins with the end of one or ends
// with the beginning of one (it could join the template's text around it). Every occurrence of
// such a content in the rendered prompt, and of its whitespace-trimmed form (templates `| trim`
// contents), is marked as client text, and the tokenizer (Tokenizer::EncodeTemplated) parses
// control tokens only outside those marks. Marking every occurrence rather than guessing the
// right one errs on the safe side: a marker the template wrote that happens to equal a client
// text stays text (only that client's own prompt suffers).
//
// Fail closed: when such a content occurs nowhere in the prompt (the template changed it other
// than by trimming), where its control-token text went cannot be known, and the request is
// refused. Not seen: a template that itself turns client text into a control token's text by
// other means (`| replace`, `| lower`, slicing); templates are the operator's choice, and the
// ones llama.cpp ships do not.
//
// Cost: searching is linear (Knuth-Morris-Pratt) per content; the total searched is capped at
// kMaxChatScanBytes, past which the request is refused rather than slowed.
#ifndef KVGUARD_CORE_TEXT_CHAT_PROMPT_H_
#define KVGUARD_CORE_TEXT_CHAT_PROMPT_H_

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/text/tokenizer.h"

namespace kvguard::core {

inline constexpr size_t kMaxChatScanBytes = size_t{128} << 20;

// ClientTextSpans returns the sorted, disjoint byte ranges of `rendered` to keep out of
// control-token parsing (see above), given the client's texts in it and the vocabulary's
// control-token texts. InvalidArgument naming the text's index ("client text N ...") when a text
// that could make a control token is not found, ResourceExhausted past kMaxChatScanBytes; *failed
// (if not null) is then set to that index.
absl::StatusOr<std::vector<TextSpan>> ClientTextSpans(
    std::string_view rendered, std::span<const std::string> client_texts,
    std::span<const std::string_view> control_texts, size_t* failed = nullptr);

// EncodeChatPrompt returns the ids of `rendered` (a chat template's output holding
// `client_texts`): tokenizer.EncodeTemplated over ClientTextSpans; its errors as there.
absl::StatusOr<std::vector<int>> EncodeChatPrompt(const Tokenizer& tokenizer,
                                                  std::string_view rendered,
                                                  std::span<const std::string> client_texts,
                                                  size_t* failed = nullptr);

}  // namespace kvguard::core

#endif  // KVGUARD_CORE_TEXT_CHAT_PROMPT_H_
