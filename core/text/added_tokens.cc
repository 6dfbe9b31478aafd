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
  // Every occurrence of every token, then taken in llama.cpp's order: by token (the order of
  // tokens_), left to right, skipping those that overlap one already taken.
  struct Hit {
    int token;
    size_t pos;
    size_t stripped = 0;  // whitespace bytes after it that rstrip drops
  };
  std::vector<Hit> hits;
  if (!tokens_.empty()) {
    for (size_t pos = 0; pos < text.size(); ++pos) {
      for (const int t : by_first_byte_[static_cast<unsigned char>(text[pos])]) {
        const std::string& s = tokens_[t].first;
        if (s.size() <= text.size() - pos &&
            std::memcmp(s.data(), text.data() + pos, s.size()) == 0) {
          hits.push_back({t, pos});
        }
      }
    }
  }
  if (hits.empty()) {
    if (!text.empty()) out->push_back({text, -1});
    return;
  }
  std::sort(hits.begin(), hits.end(), [](const Hit& a, const Hit& b) {
    return a.token != b.token ? a.token < b.token : a.pos < b.pos;
  });
  std::vector<int> owner(text.size(), -1);  // which token took each byte (-2: dropped)
  std::vector<Hit> taken;
  for (const Hit& h : hits) {
    const size_t len = tokens_[h.token].first.size();
    if (std::any_of(owner.begin() + h.pos, owner.begin() + h.pos + len,
                    [](int o) { return o != -1; })) {
      continue;
    }
    std::fill(owner.begin() + h.pos, owner.begin() + h.pos + len, h.token);
    taken.push_back(h);
    for (size_t p = h.pos + len; rstrip_ && p < text.size() && owner[p] == -1; ++p) {
      const char c = text[p];
      if (c != ' ' && (c < '\t' || c > '\r')) break;
      owner[p] = -2;
      ++taken.back().stripped;
    }
  }
  std::sort(taken.begin(), taken.end(), [](const Hit& a, const Hit& b) { return a.pos < b.pos; });
  size_t done = 0;
  for (const Hit& h : taken) {
    if (h.pos > done) out->push_back({text.substr(done, h.pos - done), -1});
    const size_t len = tokens_[h.token].first.size();
    out->push_back({text.substr(h.pos, len), tokens_[h.token].second});
    done = h.pos + len + h.stripped;
  }
  if (done < text.size()) out->push_back({text.substr(done), -1});
}

}  // namespace kvguard::core
