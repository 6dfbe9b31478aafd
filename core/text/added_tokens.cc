#include "core/text/added_tokens.h"

#include <algorithm>
#include <cstring>

namespace kvguard::core {

AddedTokens::AddedTokens(std::vector<std::pair<std::string, int>> tokens, bool rstrip)
    : rstrip_(rstrip) {
  std::erase_if(tokens, [](const auto& t) { return t.first.empty(); });
  std::sort(tokens.begin(), tokens.end(), [](const auto& a, const auto& b) {
    return a.first.size() != b.first.size() ? a.first.size() > b.first.size() : a.second < b.second;
  });
  tokens_ = std::move(tokens);
  for (size_t i = 0; i < tokens_.size(); ++i) {
    by_first_byte_[static_cast<unsigned char>(tokens_[i].first[0])].push_back(static_cast<int>(i));
  }
}

void AddedTokens::Split(std::string_view text, std::vector<Fragment>* out) const {
  // Which tokens occur at all (one pass; most texts have none), then llama.cpp's order: token by
  // token (the order of tokens_), each occurrence from left to right that overlaps nothing taken
  // before. Memory stays O(text) however many occurrences overlap (runs of spaces under MPT's
  // whitespace tokens); time is O(text) per token that occurs.
  std::vector<bool> occurs(tokens_.size(), false);
  bool any = false;
  for (size_t pos = 0; pos < text.size(); ++pos) {
    for (const int t : by_first_byte_[static_cast<unsigned char>(text[pos])]) {
      const std::string& s = tokens_[t].first;
      if (!occurs[t] && s.size() <= text.size() - pos &&
          std::memcmp(s.data(), text.data() + pos, s.size()) == 0) {
        occurs[t] = any = true;
      }
    }
  }
  if (!any) {
    if (!text.empty()) out->push_back({text, -1});
    return;
  }
  struct Taken {
    int token;
    size_t pos;
    size_t stripped;  // whitespace bytes after it that rstrip drops
  };
  std::vector<Taken> taken;
  std::vector<bool> owned(text.size(), false);  // taken by a token, or dropped by rstrip
  for (size_t t = 0; t < tokens_.size(); ++t) {
    if (!occurs[t]) continue;
    const std::string& s = tokens_[t].first;
    for (size_t pos = text.find(s); pos != std::string_view::npos; pos = text.find(s, pos)) {
      if (std::any_of(owned.begin() + pos, owned.begin() + pos + s.size(),
                      [](bool o) { return o; })) {
        ++pos;  // an occurrence may start inside this one
        continue;
      }
      std::fill(owned.begin() + pos, owned.begin() + pos + s.size(), true);
      size_t end = pos + s.size();
      for (; rstrip_ && end < text.size() && !owned[end]; ++end) {
        const char c = text[end];
        if (c != ' ' && (c < '\t' || c > '\r')) break;
        owned[end] = true;
      }
      taken.push_back({static_cast<int>(t), pos, end - pos - s.size()});
      pos = end;
    }
  }
  std::sort(taken.begin(), taken.end(),
            [](const Taken& a, const Taken& b) { return a.pos < b.pos; });
  size_t done = 0;
  for (const Taken& h : taken) {
    if (h.pos > done) out->push_back({text.substr(done, h.pos - done), -1});
    const size_t len = tokens_[h.token].first.size();
    out->push_back({text.substr(h.pos, len), tokens_[h.token].second});
    done = h.pos + len + h.stripped;
  }
  if (done < text.size()) out->push_back({text.substr(done), -1});
}

}  // namespace kvguard::core
