#include "core/text/chat_prompt.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvguard::core {
namespace {

// CouldFormControl says whether `text` holds a control token's text, or starts with a proper
// suffix or ends with a proper prefix of one (it could complete one with the bytes around it).
bool CouldFormControl(std::string_view text, std::span<const std::string_view> controls) {
  for (std::string_view c : controls) {
    if (text.find(c) != std::string_view::npos) return true;
    for (size_t k = 1; k < c.size() && k <= text.size(); ++k) {
      if (text.substr(text.size() - k) == c.substr(0, k)) return true;
      if (text.substr(0, k) == c.substr(c.size() - k)) return true;
    }
  }
  return false;
}

// AddOccurrences appends every occurrence of `needle` (overlapping ones too) in `hay` to *spans
// and returns how many (Knuth-Morris-Pratt: O(hay + needle) whatever the texts).
size_t AddOccurrences(std::string_view hay, std::string_view needle, std::vector<TextSpan>* spans) {
  if (needle.empty() || needle.size() > hay.size()) return 0;
  std::vector<size_t> fail(needle.size(), 0);
  for (size_t i = 1, k = 0; i < needle.size(); ++i) {
    while (k > 0 && needle[i] != needle[k]) k = fail[k - 1];
    if (needle[i] == needle[k]) ++k;
    fail[i] = k;
  }
  size_t found = 0;
  for (size_t i = 0, k = 0; i < hay.size(); ++i) {
    while (k > 0 && hay[i] != needle[k]) k = fail[k - 1];
    if (hay[i] == needle[k]) ++k;
    if (k == needle.size()) {
      spans->push_back({i + 1 - k, i + 1});
      ++found;
      k = fail[k - 1];
    }
  }
  return found;
}

// TrimAsciiWhitespace is Python's str.strip() for ASCII whitespace (jinja2's `trim`); (Debian's
// Abseil has its own string_view, so absl::StripAsciiWhitespace does not take this one).
std::string_view TrimAsciiWhitespace(std::string_view s) {
  auto space = [](char c) { return c == ' ' || (c >= '\t' && c <= '\r'); };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

}  // namespace

absl::StatusOr<std::vector<TextSpan>> ClientTextSpans(
    std::string_view rendered, std::span<const std::string> client_texts,
    std::span<const std::string_view> control_texts, size_t* failed) {
  std::vector<TextSpan> spans;
  size_t scanned = 0;
  for (size_t i = 0; i < client_texts.size(); ++i) {
    const std::string_view text = client_texts[i];
    if (control_texts.empty() || !CouldFormControl(text, control_texts)) continue;
    scanned += 2 * (rendered.size() + text.size());
    if (scanned > kMaxChatScanBytes) {
      if (failed != nullptr) *failed = i;
      return absl::ResourceExhaustedError(
          absl::StrCat("client text ", i, ": too many messages hold control-token text (over ",
                       kMaxChatScanBytes, " bytes to search)"));
    }
    const std::string_view trimmed = TrimAsciiWhitespace(text);
    size_t found = AddOccurrences(rendered, text, &spans);
    if (trimmed.size() != text.size()) found += AddOccurrences(rendered, trimmed, &spans);
    if (found == 0) {
      if (failed != nullptr) *failed = i;
      return absl::InvalidArgumentError(absl::StrCat(
          "client text ", i,
          " holds control-token text and the chat template changed it, so it cannot be kept "
          "apart from the template's control tokens"));
    }
  }
  std::sort(spans.begin(), spans.end(),
            [](const TextSpan& a, const TextSpan& b) { return a.begin < b.begin; });
  std::vector<TextSpan> merged;
  for (const TextSpan& s : spans) {
    if (!merged.empty() && s.begin <= merged.back().end) {
      merged.back().end = std::max(merged.back().end, s.end);
    } else {
      merged.push_back(s);
    }
  }
  return merged;
}

absl::StatusOr<std::vector<int>> EncodeChatPrompt(const Tokenizer& tokenizer,
                                                  std::string_view rendered,
                                                  std::span<const std::string> client_texts,
                                                  size_t* failed) {
  const std::span<const std::string_view> controls = tokenizer.ControlTokenTexts();
  absl::StatusOr<std::vector<TextSpan>> spans =
      ClientTextSpans(rendered, client_texts, controls, failed);
  if (!spans.ok()) return spans.status();
  return tokenizer.EncodeTemplated(rendered, *spans);
}

}  // namespace kvguard::core
