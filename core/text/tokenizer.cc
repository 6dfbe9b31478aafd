#include "core/text/tokenizer.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/text/utf8.h"

namespace kvguard::core {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace

absl::StatusOr<std::unique_ptr<ByteTokenizer>> ByteTokenizer::Create(int vocab_size) {
  if (vocab_size < kMinVocab) {
    return absl::InvalidArgumentError(absl::StrCat("byte tokenizer: vocab_size = ", vocab_size,
                                                   ": must be >= ", kMinVocab,
                                                   " (256 bytes, BOS, EOS)"));
  }
  return std::unique_ptr<ByteTokenizer>(new ByteTokenizer(vocab_size));
}

std::vector<int> ByteTokenizer::Encode(std::string_view text, bool add_bos) const {
  std::vector<int> ids;
  ids.reserve(text.size() + (add_bos ? 1 : 0));
  if (add_bos) ids.push_back(kBos);
  for (const char c : text) ids.push_back(static_cast<unsigned char>(c));
  return ids;
}

void ByteTokenizer::AppendToken(int id, std::string* out) const {
  if (id < 0 || id >= vocab_size_ || id == kBos || id == kEos) return;
  const int byte = id < 256 ? id : (id - kMinVocab) % 256;
  out->push_back(static_cast<char>(byte));
}

std::string ByteTokenizer::Decode(std::span<const int> ids) const {
  std::string text;
  text.reserve(ids.size());
  for (const int id : ids) AppendToken(id, &text);
  return text;
}

std::string ByteTokenizer::DecodeToken(int id) const {
  std::string text;
  AppendToken(id, &text);
  return text;
}

// The state machine is the WHATWG Encoding Standard's UTF-8 decoder: the lead byte fixes how
// many continuation bytes follow and narrows the range of the first one (Table 3-7's rules,
// from Utf8LeadOf, the one codec's), which is what rules out overlong forms, surrogates and
// values above U+10FFFF; C0, C1 and F5..FF can never start a sequence.
void Utf8StreamDecoder::Step(unsigned char byte, std::string* out) {
  if (needed_ == 0) {
    const Utf8Lead lead = Utf8LeadOf(byte);
    if (lead.length == 1) {
      out->push_back(static_cast<char>(byte));
      return;
    }
    if (lead.length == 0) {
      out->append(kReplacement);
      return;
    }
    needed_ = lead.length - 1;
    lower_ = lead.second_lo;
    upper_ = lead.second_hi;
    pending_.push_back(static_cast<char>(byte));
    return;
  }
  if (byte < lower_ || byte > upper_) {
    // What is pending is a maximal ill-formed subpart: one U+FFFD for all of it, and `byte`
    // is looked at again as the possible start of the next sequence (needed_ is 0 by then, so
    // this recurses once at most).
    pending_.clear();
    needed_ = 0;
    lower_ = 0x80;
    upper_ = 0xBF;
    out->append(kReplacement);
    Step(byte, out);
    return;
  }
  lower_ = 0x80;
  upper_ = 0xBF;
  pending_.push_back(static_cast<char>(byte));
  if (--needed_ == 0) {
    out->append(pending_);
    pending_.clear();
  }
}

std::string Utf8StreamDecoder::Push(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() + pending_.size());
  for (const char c : bytes) Step(static_cast<unsigned char>(c), &out);
  return out;
}

std::string Utf8StreamDecoder::Flush() {
  if (needed_ == 0) return std::string();
  pending_.clear();
  needed_ = 0;
  lower_ = 0x80;
  upper_ = 0xBF;
  return std::string(kReplacement);
}

}  // namespace kvguard::core
