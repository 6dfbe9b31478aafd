#include "core/text/gguf_tokenizer.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <queue>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/text/utf8.h"

namespace kvguard::core {
namespace {

constexpr std::string_view kSpmSpace = "\xE2\x96\x81";     // U+2581
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// ggml token types (tokenizer.ggml.token_type).
constexpr int kTypeUnknown = 2;
constexpr int kTypeControl = 3;
constexpr int kTypeUserDefined = 4;
constexpr int kTypeByte = 6;

// Token texts llama.cpp treats as control whatever their token_type (end-of-generation and
// fill-in-the-middle markers it recognises by text); kvguard does too, so they are never found
// in a prompt.
bool PromotedToControl(std::string_view text) {
  static constexpr std::string_view kTexts[] = {"<|eot_id|>",
                                                "<|im_end|>",
                                                "<|end|>",
                                                "<end_of_turn>",
                                                "<|endoftext|>",
                                                "<EOT>",
                                                "_<EOT>",
                                                "<\xEF\xBD\x9C"
                                                "end\xE2\x96\x81"
                                                "of\xE2\x96\x81"
                                                "sentence\xEF\xBD\x9C>",
                                                "<end_of_utterance>",
                                                "<|return|>",
                                                "<|call|>",
                                                "<|eom_id|>",
                                                "<|end_of_text|>",
                                                "<PRE>",
                                                "<SUF>",
                                                "<MID>",
                                                "<PAD>",
                                                "\xE2\x96\x81<PRE>",
                                                "\xE2\x96\x81<SUF>",
                                                "\xE2\x96\x81<MID>",
                                                "<fim-prefix>",
                                                "<fim-suffix>",
                                                "<fim-middle>",
                                                "<fim-pad>",
                                                "<fim-repo>",
                                                "<fim_prefix>",
                                                "<fim_suffix>",
                                                "<fim_middle>",
                                                "<fim_pad>",
                                                "<|fim_prefix|>",
                                                "<|fim_suffix|>",
                                                "<|fim_middle|>",
                                                "<|fim_pad|>",
                                                "<|fim_repo|>",
                                                "<|fim_sep|>",
                                                "<\xEF\xBD\x9C"
                                                "fim\xE2\x96\x81"
                                                "begin\xEF\xBD\x9C>",
                                                "<\xEF\xBD\x9C"
                                                "fim\xE2\x96\x81"
                                                "hole\xEF\xBD\x9C>",
                                                "<\xEF\xBD\x9C"
                                                "fim\xE2\x96\x81"
                                                "end\xEF\xBD\x9C>",
                                                "<|code_prefix|>",
                                                "<|code_suffix|>",
                                                "<|code_middle|>",
                                                "<reponame>",
                                                "<REPO>",
                                                "<|repo_name|>",
                                                "<|file_sep|>"};
  for (std::string_view t : kTexts) {
    if (t == text) return true;
  }
  return false;
}

// SymbolLength: the bytes of the symbol at `pos`, a whole character or one stray byte.
size_t SymbolLength(std::string_view text, size_t pos, uint32_t* cp) {
  char32_t c = 0;
  const size_t n = Utf8SequenceAt(text, pos, &c);
  *cp = n == 0 ? 0xFFFFFFFF : static_cast<uint32_t>(c);  // 0xFFFFFFFF matches no class
  return n == 0 ? 1 : n;
}

// GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest to 256, 257, ...
std::array<uint32_t, 256> ByteToCodePoint() {
  std::array<uint32_t, 256> map{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    map[b] = printable ? b : next++;
  }
  return map;
}

// HexByte parses "<0xXX>" into *b.
bool HexByte(std::string_view text, unsigned char* b) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return false;
  unsigned v = 0;
  for (int i = 3; i < 5; ++i) {
    const char c = text[i];
    v <<= 4;
    if (c >= '0' && c <= '9') {
      v |= unsigned(c - '0');
    } else if (c >= 'A' && c <= 'F') {
      v |= unsigned(c - 'A' + 10);
    } else if (c >= 'a' && c <= 'f') {
      v |= unsigned(c - 'a' + 10);
    } else {
      return false;
    }
  }
  *b = static_cast<unsigned char>(v);
  return true;
}

// SpecialId reads key `key`: absent -> `fallback`; 0xFFFFFFFF (ggml's "none") -> -1; any
// other value must be a token id.
absl::Status SpecialId(const gguf::File& f, const std::string& key, int vocab, int fallback,
                       int* out) {
  *out = fallback;
  if (f.Find(key) == nullptr) return absl::OkStatus();
  absl::StatusOr<uint64_t> v = f.GetUint(key, UINT64_MAX);
  if (!v.ok()) return v.status();
  if (*v == 0xFFFFFFFFu || *v == UINT64_MAX) {
    *out = -1;
  } else if (*v >= static_cast<uint64_t>(vocab)) {
    return absl::InvalidArgumentError(
        absl::StrCat("key '", key, "' = ", *v, " is outside the vocabulary of ", vocab));
  } else {
    *out = static_cast<int>(*v);
  }
  return absl::OkStatus();
}

// PerTokenArray sets *out to the array at `key` (elements of `elem`, one per token), or to
// nullptr when the key is absent.
absl::Status PerTokenArray(const gguf::File& f, const std::string& key, gguf::ValueType elem,
                           size_t vocab, const gguf::Value** out) {
  *out = nullptr;
  if (f.Find(key) == nullptr) return absl::OkStatus();
  absl::StatusOr<const gguf::Value*> a = f.GetArray(key, elem);
  if (!a.ok()) return a.status();
  if ((*a)->count != vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("key '", key, "' has ", (*a)->count, " entries for ", vocab, " tokens"));
  }
  *out = *a;
  return absl::OkStatus();
}

absl::Status OptionalBool(const gguf::File& f, const std::string& key, bool* out) {
  if (f.Find(key) == nullptr) return absl::OkStatus();
  absl::StatusOr<bool> v = f.GetBool(key);
  if (!v.ok()) return v.status();
  *out = *v;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<GgufTokenizer>> GgufTokenizer::Create(const gguf::File& f) {
  absl::StatusOr<std::string_view> model = f.GetString("tokenizer.ggml.model");
  if (!model.ok()) return model.status();
  std::unique_ptr<GgufTokenizer> t(new GgufTokenizer());
  if (*model == "llama") {
    t->kind_ = Kind::kSpm;
  } else if (*model == "gpt2") {
    t->kind_ = Kind::kBpe;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("key 'tokenizer.ggml.model' is '", std::string(*model),
                     "': kvguard reads 'llama' (SentencePiece) and 'gpt2' (byte-level BPE)"));
  }
  const bool spm = t->kind_ == Kind::kSpm;
  absl::StatusOr<const gguf::Value*> tokens =
      f.GetArray("tokenizer.ggml.tokens", gguf::ValueType::kString);
  if (!tokens.ok()) return tokens.status();
  const size_t vocab = (*tokens)->strings.size();
  if (vocab < 1 || vocab > (size_t{1} << 22)) {
    return absl::InvalidArgumentError(
        absl::StrCat("key 'tokenizer.ggml.tokens' has ", vocab, " tokens (must be 1..2^22)"));
  }
  t->scores_.assign(vocab, 0.0f);
  std::vector<int> types(vocab, 1);  // ggml's NORMAL when there is no token_type
  const gguf::Value* scores = nullptr;
  const gguf::Value* type_array = nullptr;
  if (auto s = PerTokenArray(f, "tokenizer.ggml.scores", gguf::ValueType::kFloat32, vocab, &scores);
      !s.ok()) {
    return s;
  }
  if (auto s = PerTokenArray(f, "tokenizer.ggml.token_type", gguf::ValueType::kInt32, vocab,
                             &type_array);
      !s.ok()) {
    return s;
  }
  for (size_t i = 0; scores != nullptr && i < vocab; ++i) {
    t->scores_[i] = static_cast<float>(ArrayFloat(*scores, i));
  }
  for (size_t i = 0; type_array != nullptr && i < vocab; ++i) {
    types[i] = static_cast<int>(ArrayInt(*type_array, i));
  }
  const int v = static_cast<int>(vocab);
  if (auto s = SpecialId(f, "tokenizer.ggml.bos_token_id", v, spm ? 1 : -1, &t->bos_); !s.ok())
    return s;
  if (auto s = SpecialId(f, "tokenizer.ggml.eos_token_id", v, spm ? 2 : -1, &t->eos_); !s.ok())
    return s;
  if (auto s = SpecialId(f, "tokenizer.ggml.unknown_token_id", v, spm ? 0 : -1, &t->unk_); !s.ok())
    return s;
  if (spm && v <= 2) t->bos_ = t->eos_ = t->unk_ = -1;  // defaults need a vocabulary
  if (!spm) {
    std::string_view pre;
    if (f.Find("tokenizer.ggml.pre") != nullptr) {
      absl::StatusOr<std::string_view> p = f.GetString("tokenizer.ggml.pre");
      if (!p.ok()) return p.status();
      pre = *p;
    }
    absl::StatusOr<std::unique_ptr<PreTokenizer>> p = PreTokenizer::Create(pre);
    if (!p.ok()) return p.status();
    t->pre_ = *std::move(p);
  }
  t->add_bos_ = spm || t->pre_->add_bos();
  t->add_space_prefix_ = spm;
  if (auto s = OptionalBool(f, "tokenizer.ggml.add_bos_token", &t->add_bos_); !s.ok()) return s;
  if (auto s = OptionalBool(f, "tokenizer.ggml.add_eos_token", &t->add_eos_); !s.ok()) return s;
  if (auto s = OptionalBool(f, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix_); !s.ok())
    return s;

  t->byte_id_.fill(-1);
  const std::array<uint32_t, 256> byte_cp = ByteToCodePoint();
  absl::flat_hash_map<uint32_t, unsigned char> cp_byte;
  for (int b = 0; b < 256; ++b) {
    AppendUtf8(byte_cp[b], &t->byte_char_[b]);
    cp_byte[byte_cp[b]] = static_cast<unsigned char>(b);
  }
  t->tokens_.resize(vocab);
  t->pieces_.resize(vocab);
  t->special_.assign(vocab, false);
  t->index_.reserve(vocab);
  std::vector<std::pair<std::string, int>> added;
  for (size_t i = 0; i < vocab; ++i) {
    const std::string_view text = (*tokens)->strings[i];
    t->tokens_[i] = std::string(text);
    t->index_.emplace(t->tokens_[i], static_cast<int>(i));
    std::string& piece = t->pieces_[i];
    unsigned char byte = 0;
    const bool special = types[i] == kTypeControl || static_cast<int>(i) == t->bos_ ||
                         static_cast<int>(i) == t->eos_ || PromotedToControl(text);
    if (special) {
      t->special_[i] = true;
    } else if (types[i] == kTypeUserDefined) {
      piece = std::string(text);
      added.emplace_back(piece, static_cast<int>(i));
    } else if (types[i] == kTypeUnknown || static_cast<int>(i) == t->unk_) {
      piece = std::string(kReplacement);
    } else if (spm && types[i] == kTypeByte && HexByte(text, &byte)) {
      piece = std::string(1, static_cast<char>(byte));
      if (t->byte_id_[byte] < 0) t->byte_id_[byte] = static_cast<int>(i);
    } else if (spm) {
      for (size_t p = 0; p < text.size();) {
        if (text.substr(p, kSpmSpace.size()) == kSpmSpace) {
          piece.push_back(' ');
          p += kSpmSpace.size();
        } else {
          piece.push_back(text[p++]);
        }
      }
    } else {
      for (size_t p = 0; p < text.size();) {
        uint32_t cp = 0;
        const size_t n = SymbolLength(text, p, &cp);
        auto it = cp_byte.find(cp);
        if (it != cp_byte.end()) {
          piece.push_back(static_cast<char>(it->second));
        } else {
          piece.append(text.substr(p, n));
        }
        p += n;
      }
    }
  }
  // llama.cpp strips the whitespace after Phi-3's user-defined tokens (it knows the model by
  // general.name); so does kvguard, to give the same ids.
  bool rstrip = false;
  if (absl::StatusOr<std::string_view> name = f.GetString("general.name"); name.ok()) {
    const std::string lower = absl::AsciiStrToLower(std::string(*name));
    rstrip = lower.find("phi-3") != std::string::npos || lower.find("phi3") != std::string::npos;
  }
  t->added_ = AddedTokens(std::move(added), rstrip);
  std::vector<std::pair<std::string, int>> control;
  for (size_t i = 0; i < vocab; ++i) {
    if (!t->special_[i]) continue;
    control.emplace_back(t->tokens_[i], static_cast<int>(i));
    // Views into tokens_, which is not resized after this: found once here, not per request.
    if (!t->tokens_[i].empty()) t->control_texts_.push_back(t->tokens_[i]);
  }
  t->control_ = AddedTokens(std::move(control));
  if (!spm) {
    for (int b = 0; b < 256; ++b) {
      t->byte_id_[b] = t->TokenId(t->byte_char_[b]);
      t->byte_symbol_[b] = t->SymbolId(t->byte_char_[b]);
    }
    absl::StatusOr<const gguf::Value*> merges =
        f.GetArray("tokenizer.ggml.merges", gguf::ValueType::kString);
    if (!merges.ok()) return merges.status();
    t->merges_.reserve((*merges)->strings.size());
    for (size_t i = 0; i < (*merges)->strings.size(); ++i) {
      const std::string_view m = (*merges)->strings[i];
      const size_t space = m.size() > 1 ? m.find(' ', 1) : std::string_view::npos;
      if (space == std::string_view::npos) {
        return absl::InvalidArgumentError(absl::StrCat("key 'tokenizer.ggml.merges': entry ", i,
                                                       " is not two symbols separated by a space"));
      }
      const int left = t->SymbolId(std::string(m.substr(0, space)));
      const int right = t->SymbolId(std::string(m.substr(space + 1)));
      const int merged =
          t->SymbolId(std::string(m.substr(0, space)) + std::string(m.substr(space + 1)));
      t->merges_.emplace(uint64_t{static_cast<uint32_t>(left)} << 32 | static_cast<uint32_t>(right),
                         Merge{static_cast<int>(i), merged});
    }
    std::vector<int> replacement;
    t->BpeWord(kReplacement, &replacement);
    t->replacement_ids_ = std::move(replacement);
  }
  return t;
}

int GgufTokenizer::TokenId(std::string_view text) const {
  auto it = index_.find(absl::string_view(text.data(), text.size()));
  // Text never becomes a control token, however it is merged.
  return it == index_.end() || special_[it->second] ? -1 : it->second;
}

int GgufTokenizer::SymbolId(const std::string& text) {
  if (const int id = TokenId(text); id >= 0) return id;
  auto [it, inserted] =
      extra_index_.emplace(text, vocab_size() + static_cast<int>(extra_symbols_.size()));
  if (inserted) extra_symbols_.push_back(text);
  return it->second;
}

void GgufTokenizer::AppendByte(unsigned char b, std::vector<int>* ids) const {
  if (byte_id_[b] >= 0) {
    ids->push_back(byte_id_[b]);
  } else if (unk_ >= 0) {
    ids->push_back(unk_);
  }
}

// WordCache: a text repeats its words; each distinct piece is merged once per Encode call.
struct GgufTokenizer::WordCache {
  absl::flat_hash_map<absl::string_view, std::pair<uint32_t, uint32_t>> index;  // -> [begin, end)
  std::vector<int> ids;
};

std::vector<int> GgufTokenizer::Encode(std::string_view text, bool add_bos) const {
  std::vector<int> ids;
  if (add_bos && add_bos_ && bos_ >= 0) ids.push_back(bos_);
  WordCache cache;
  bool after_token = true;  // SPM: a space prefix at the start and after each added token
  EncodeText(text, &after_token, &cache, &ids);
  if (add_bos && add_eos_ && eos_ >= 0) ids.push_back(eos_);
  return ids;
}

void GgufTokenizer::EncodeText(std::string_view text, bool* after_token, WordCache* cache,
                               std::vector<int>* ids) const {
  std::vector<AddedTokens::Fragment> fragments;
  added_.Split(text, &fragments);
  for (const AddedTokens::Fragment& f : fragments) {
    if (f.id >= 0) {
      ids->push_back(f.id);
      *after_token = true;
      continue;
    }
    if (kind_ == Kind::kSpm) {
      EncodeSpm(f.text, add_space_prefix_ && *after_token, ids);
    } else {
      EncodeBpe(f.text, cache, ids);
    }
    *after_token = false;
  }
}

std::span<const std::string_view> GgufTokenizer::ControlTokenTexts() const {
  return control_texts_;
}

std::vector<int> GgufTokenizer::EncodeTemplated(std::string_view text,
                                                std::span<const TextSpan> untrusted) const {
  // The control tokens found in the text, as llama.cpp's parse_special finds them (added_tokens.h
  // order); one that overlaps client text is text like its neighbours. Between control tokens
  // the text is encoded as a prompt is, so with no client text involved the ids are llama.cpp's
  // `llama_tokenize(..., add_special=true, parse_special=true)` of the rendered prompt.
  auto client = [&](size_t begin, size_t end) {
    auto it = std::upper_bound(untrusted.begin(), untrusted.end(), begin,
                               [](size_t pos, const TextSpan& s) { return pos < s.end; });
    return it != untrusted.end() && it->begin < end;
  };
  std::vector<AddedTokens::Fragment> fragments;
  control_.Split(text, &fragments);
  std::vector<int> ids;
  WordCache cache;
  bool after_token = true;
  size_t pending = 0;  // start of the text not yet encoded
  for (const AddedTokens::Fragment& f : fragments) {
    const size_t begin = static_cast<size_t>(f.text.data() - text.data());
    const size_t end = begin + f.text.size();
    if (f.id < 0 || client(begin, end)) continue;
    EncodeText(text.substr(pending, begin - pending), &after_token, &cache, &ids);
    ids.push_back(f.id);
    after_token = true;
    pending = end;
  }
  EncodeText(text.substr(pending), &after_token, &cache, &ids);
  // A template that writes BOS itself ({{ bos_token }}) gets no second one (llama.cpp warns of
  // the double BOS; Hugging Face's templates expect the tokenizer to add none then).
  if (add_bos_ && bos_ >= 0 && (ids.empty() || ids.front() != bos_)) ids.insert(ids.begin(), bos_);
  if (add_eos_ && eos_ >= 0) ids.push_back(eos_);
  return ids;
}

void GgufTokenizer::EncodeSpm(std::string_view raw, bool space_prefix,
                              std::vector<int>* ids) const {
  std::string text;
  text.reserve(raw.size() * 3 + 3);
  if (space_prefix) text.append(kSpmSpace);
  for (const char c : raw) {
    if (c == ' ') {
      text.append(kSpmSpace);
    } else {
      text.push_back(c);
    }
  }
  // Symbols form a linked list over `text`; merging grows the left one and empties the right.
  struct Symbol {
    int prev, next;
    size_t pos, len;
  };
  std::vector<Symbol> sym;
  for (size_t pos = 0; pos < text.size();) {
    uint32_t cp = 0;
    const size_t n = SymbolLength(text, pos, &cp);
    const int i = static_cast<int>(sym.size());
    sym.push_back({i - 1, i + 1, pos, n});
    pos += n;
  }
  sym.back().next = -1;
  struct Bigram {
    int left, right;
    float score;
    size_t len;
  };
  const auto worse = [](const Bigram& a, const Bigram& b) {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  };
  std::priority_queue<Bigram, std::vector<Bigram>, decltype(worse)> queue(worse);
  const std::string_view all(text);
  auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const size_t len = sym[left].len + sym[right].len;
    const int id = TokenId(all.substr(sym[left].pos, len));
    if (id >= 0) queue.push({left, right, scores_[id], len});
  };
  for (size_t i = 1; i < sym.size(); ++i) try_add(static_cast<int>(i) - 1, static_cast<int>(i));
  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Symbol& l = sym[b.left];
    Symbol& r = sym[b.right];
    if (l.len == 0 || r.len == 0 || l.len + r.len != b.len) continue;  // stale
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = b.left;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }
  for (int i = 0; i >= 0; i = sym[i].next) {
    const std::string_view s = all.substr(sym[i].pos, sym[i].len);
    const int id = TokenId(s);
    if (id >= 0) {
      ids->push_back(id);
    } else {
      for (const char c : s) AppendByte(static_cast<unsigned char>(c), ids);
    }
  }
}

void GgufTokenizer::EncodeBpe(std::string_view text, WordCache* cache,
                              std::vector<int>* ids) const {
  std::vector<std::string_view> pieces;
  pre_->Split(text, &pieces);
  for (const std::string_view piece : pieces) {
    const absl::string_view key(piece.data(), piece.size());
    auto it = cache->index.find(key);
    if (it == cache->index.end()) {
      const auto begin = static_cast<uint32_t>(cache->ids.size());
      BpeWord(piece, &cache->ids);
      it =
          cache->index.emplace(key, std::make_pair(begin, static_cast<uint32_t>(cache->ids.size())))
              .first;
    }
    ids->insert(ids->end(), cache->ids.begin() + it->second.first,
                cache->ids.begin() + it->second.second);
  }
}

void GgufTokenizer::AppendSymbol(int id, std::vector<int>* ids) const {
  if (id < vocab_size()) {
    ids->push_back(id);
    return;
  }
  // A merge result that is no token (a malformed vocabulary), or a byte the vocabulary has no
  // token for (some leave out C0, C1 and F5-FF, which UTF-8 never uses): its characters' tokens,
  // and for a character without one UNK, else U+FFFD's tokens (what llama.cpp, which replaces
  // invalid UTF-8 by U+FFFD before tokenizing, gives such a byte).
  const std::string& s = extra_symbols_[id - vocab_size()];
  for (size_t p = 0; p < s.size();) {
    uint32_t cp = 0;
    const size_t n = SymbolLength(s, p, &cp);
    const int char_id = TokenId(std::string_view(s).substr(p, n));
    if (char_id >= 0) {
      ids->push_back(char_id);
    } else if (unk_ >= 0) {
      ids->push_back(unk_);
    } else {
      ids->insert(ids->end(), replacement_ids_.begin(), replacement_ids_.end());
    }
    p += n;
  }
}

void GgufTokenizer::BpeWord(std::string_view piece, std::vector<int>* ids) const {
  if (piece.size() == 1) {
    AppendSymbol(byte_symbol_[static_cast<unsigned char>(piece[0])], ids);
    return;
  }
  if (pre_->ignore_merges()) {
    std::string mapped;
    for (const char c : piece) mapped += byte_char_[static_cast<unsigned char>(c)];
    if (const int id = TokenId(mapped); id >= 0) {
      ids->push_back(id);
      return;
    }
  }
  // Symbols form a linked list; merging gives the left one the merged id and kills the right.
  struct Symbol {
    int id, prev, next;
  };
  std::vector<Symbol> sym(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) {
    sym[i] = {byte_symbol_[static_cast<unsigned char>(piece[i])], static_cast<int>(i) - 1,
              i + 1 < piece.size() ? static_cast<int>(i) + 1 : -1};
  }
  // Candidate merges, lowest rank first, then leftmost. A candidate is stale when either symbol
  // has changed since (symbols only grow, so equal ids mean the same pair).
  struct Candidate {
    int rank, left, left_id, right_id, merged;
  };
  const auto later = [](const Candidate& a, const Candidate& b) {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  };
  std::vector<Candidate> heap;
  const auto consider = [&](int left) {
    if (left < 0 || sym[left].next < 0) return;
    const int l = sym[left].id, r = sym[sym[left].next].id;
    auto it = merges_.find(uint64_t{static_cast<uint32_t>(l)} << 32 | static_cast<uint32_t>(r));
    if (it == merges_.end()) return;
    heap.push_back({it->second.rank, left, l, r, it->second.merged});
    std::push_heap(heap.begin(), heap.end(), later);
  };
  for (size_t i = 0; i + 1 < piece.size(); ++i) consider(static_cast<int>(i));
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Candidate c = heap.back();
    heap.pop_back();
    Symbol& l = sym[c.left];
    if (l.id != c.left_id || l.next < 0 || sym[l.next].id != c.right_id) continue;
    Symbol& r = sym[l.next];
    l.id = c.merged;
    r.id = -1;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = c.left;
    consider(l.prev);
    consider(c.left);
  }
  for (int i = 0; i >= 0; i = sym[i].next) AppendSymbol(sym[i].id, ids);
}

std::string GgufTokenizer::DecodeToken(int id) const {
  if (id < 0 || id >= vocab_size() || special_[id]) return std::string();
  return pieces_[id];
}

std::string GgufTokenizer::Decode(std::span<const int> ids) const {
  std::string text;
  bool first = true;
  for (const int id : ids) {
    if (id < 0 || id >= vocab_size() || special_[id]) continue;
    const std::string& piece = pieces_[id];
    if (first && add_space_prefix_ && !piece.empty() && piece[0] == ' ') {
      text.append(piece, 1, std::string::npos);
    } else {
      text += piece;
    }
    first = false;
  }
  return text;
}

std::string GgufTokenizer::Summary() const {
  auto name = [&](int id) {
    return id < 0 ? std::string("none") : absl::StrCat(id, " '", tokens_[id], "'");
  };
  return absl::StrCat(
      kind_ == Kind::kSpm ? std::string("llama (SentencePiece)")
                          : absl::StrCat("gpt2 (byte-level BPE), pre-tokenizer '", pre_->name(),
                                         "' (tokenizer.ggml.pre; ", pre_->family(), ")"),
      ", ", tokens_.size(), " tokens",
      kind_ == Kind::kBpe ? absl::StrCat(", ", merges_.size(), " merges") : "",
      added_.empty() ? "" : absl::StrCat(", ", added_.size(), " user-defined"), "; BOS ",
      name(bos_), ", EOS ", name(eos_), ", UNK ", name(unk_), "; add BOS ", add_bos_ ? "yes" : "no",
      ", add EOS ", add_eos_ ? "yes" : "no", ", space prefix ", add_space_prefix_ ? "yes" : "no");
}

}  // namespace kvguard::core
