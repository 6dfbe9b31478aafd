#include "core/text/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <cstdint>
#include <initializer_list>

#include "absl/base/internal/raw_logging.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kvguard::core {
namespace {

// llama.cpp's whitespace (Unicode White_Space), as items of a character class. `\s` and `\S` in
// the expressions below are rewritten to it (PCRE2's UCP \s leaves out U+0085).
constexpr std::string_view kSpaceItems =
    "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}";

// GPT-2's expression; \s+ at the end stands for what llama.cpp does with a lone whitespace
// before a non-space (the same piece either way).
constexpr std::string_view kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Llama 3's expression (also GLM-4's) is kContractions|kLetters|\p{N}{1,3}|kRest, with its
// case-insensitive contractions spelled out; Qwen 2's has \p{N} (single digits) instead.
constexpr std::string_view kContractions =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]))";
constexpr std::string_view kLetters = R"([^\r\n\p{L}\p{N}]?\p{L}+)";
constexpr std::string_view kRest = R"( ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// GPT-4o's (also Llama 4's) and Tekken's (Mistral): a word is capitals then lower case, or
// capitals alone. "Capital" is [^a-z] among letters and "lower case" [^A-Z], as llama.cpp writes
// it: every non-ASCII letter is both, exactly as in llama.cpp's std::regex.
constexpr std::string_view kUpperLower =
    R"([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+)";
constexpr std::string_view kUpperOnly =
    R"([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*)";
// BLOOM's (also Poro's, GPT-3 Finnish's, Viking's): runs without whitespace and , . ! ? etc.
constexpr std::string_view kBloom =
    R"( ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{0964}\x{06D4}\x{060C})]+)";
// DeepSeek's CJK ranges (U+4E00-U+9FA5, U+0800-U+4E00, U+AC00-U+D7FF) less the whitespace in
// them, which llama.cpp's std::wregex never sees as itself.
constexpr std::string_view kDeepSeekCjk =
    R"([\x{4E00}-\x{9FA5}\x{0800}-\x{167F}\x{1681}-\x{1FFF}\x{200B}-\x{2027}\x{202A}-\x{202E})"
    R"(\x{2030}-\x{205E}\x{2060}-\x{2FFF}\x{3001}-\x{4E00}\x{AC00}-\x{D7FF}]+)";
// DeepSeek LLM's cased letters (its tokenizer.json's ranges).
constexpr std::string_view kDeepSeekLetters =
    R"(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293})"
    R"(\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A})"
    R"(\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556})"
    R"(\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF})"
    R"(\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D})"
    R"(\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D})"
    R"(\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4})"
    R"(\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4})"
    R"(\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124})"
    R"(\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F})"
    R"(\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4})"
    R"(\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F})"
    R"(\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17})"
    R"(\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3})"
    R"(\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF})"
    R"(\x{1E900}-\x{1E943}]+)";
// DeepSeek V3's third expression. llama.cpp's \p{S} for ASCII lacks '~', hence the two spellings.
constexpr std::string_view kDeepSeekV3 =
    R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|(?:~|[^\r\n\p{L}\p{P}\p{S}])?[\p{L}\p{M}]+)"
    R"(| ?(?:(?!~)[\p{P}\p{S}])+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Kimi K2's, as llama.cpp runs it: Han runs; letter runs without Han (Kimi's upper/lower case
// split is not made) with an optional contraction; then Llama 3's.
constexpr std::string_view kHan =
    R"(\x{4E00}-\x{9FFF}\x{3400}-\x{4DBF}\x{20000}-\x{2A6DF}\x{2A700}-\x{2EBEF}\x{F900}-\x{FAFF})"
    R"(\x{2F800}-\x{2FA1F})";

struct Family {
  std::string_view family;
  std::vector<std::string_view> names;
  std::vector<std::string_view> regexes;
  bool ignore_merges = false, add_bos = false;
};

const std::vector<Family>& Families() {
  const auto join = [](std::initializer_list<std::string_view> parts) {
    auto* s = new std::string();
    for (std::string_view p : parts) *s += std::string(s->empty() ? "" : "|") + std::string(p);
    return s;
  };
  static const std::string* const kLlama3 = join({kContractions, kLetters, R"(\p{N}{1,3})", kRest});
  static const std::string* const kQwen2 = join({kContractions, kLetters, R"(\p{N})", kRest});
  const std::string contraction = std::string("(?:") + std::string(kContractions) + ")?";
  static const std::string* const kGpt4o =
      join({std::string(kUpperLower) + contraction, std::string(kUpperOnly) + contraction,
            R"(\p{N}{1,3})", R"( ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)"});
  static const std::string* const kTekken =
      join({kUpperLower, kUpperOnly, R"(\p{N})",
            R"( ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)"});
  static const std::string* const kSeedCoder = join(
      {kContractions, kLetters, R"(\p{N})", R"( ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+)"});
  static const std::string* const kBailing =
      join({R"('(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE]))", kLetters, R"(\p{N})",
            R"( ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)"});
  const std::string han(kHan);
  static const std::string* const kKimi =
      join({"[" + han + "]+",
            "[^\\r\\n\\p{L}\\p{N}]?(?:(?![" + han +
                "])\\p{L})+(?:'(?:[sStTmMdD]|[rR][eE]|[vV][eE]|[lL][lL]))?",
            R"(\p{N}{1,3})", kRest});
  static const auto* const kFamilies = new std::vector<Family>{
      {"default", {"", "default"}, {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)", "[0-9]{3}"}},
      {"llama3",
       {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"},
       {*kLlama3},
       /*ignore_merges=*/true,
       /*add_bos=*/true},
      {"dbrx", {"dbrx", "smaug-bpe"}, {*kLlama3}},
      {"glm4", {"glm4", "chatglm-bpe"}, {*kLlama3}},
      {"deepseek-llm",
       {"deepseek-llm"},
       {R"([\r\n])", kDeepSeekLetters,
        R"(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E})"
        R"(\x{2018}-\x{201F}\x{3001}-\x{3002}]+)",
        R"(\s+\z)", kDeepSeekCjk, R"(\p{N}+)"}},
      {"deepseek-coder",
       {"deepseek-coder"},
       {R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kDeepSeekCjk, R"(\p{N})"}},
      {"deepseek-v3",
       {"deepseek-v3", "hunyuan-dense"},
       {R"(\p{N}{1,3})", R"([\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+)", kDeepSeekV3}},
      {"falcon", {"falcon"}, {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2, "[0-9]{3}"}},
      {"starcoder",
       {"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"},
       {R"(\p{N})", kGpt2}},
      {"gpt-2",
       {"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "a.x-4.0", "mellum", "exaone4", "mpt",
        "olmo", "jais", "trillion"},
       {kGpt2}},
      {"qwen2", {"qwen2", "deepseek-r1-qwen", "megrez", "stablelm2", "hunyuan"}, {*kQwen2}},
      {"kimi-k2", {"kimi-k2"}, {*kKimi}},
      {"gpt-4o", {"gpt-4o", "llama4"}, {*kGpt4o}},
      {"tekken", {"tekken"}, {*kTekken}, /*ignore_merges=*/true, /*add_bos=*/true},
      {"seed-coder", {"seed-coder"}, {*kSeedCoder}},
      {"bailingmoe", {"bailingmoe"}, {*kBailing}},
      {"bloom", {"bloom", "poro-chat", "gpt3-finnish"}, {kBloom}},
      {"viking", {"viking"}, {kBloom, R"(\p{N})"}},
  };
  return *kFamilies;
}

// ExpandSpaces rewrites \s and \S in `regex` to llama.cpp's whitespace set.
std::string ExpandSpaces(std::string_view regex) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < regex.size(); ++i) {
    const char c = regex[i];
    if (c == '\\' && i + 1 < regex.size()) {
      const char e = regex[++i];
      if (e == 's') {
        out += in_class ? "" : "[";
        out += kSpaceItems;
        out += in_class ? "" : "]";
      } else if (e == 'S') {
        ABSL_RAW_CHECK(!in_class, "\\S inside a class");
        out += "[^";
        out += kSpaceItems;
        out += "]";
      } else {
        out.push_back(c);
        out.push_back(e);
      }
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out.push_back(c);
      if (i + 1 < regex.size() && regex[i + 1] == '^') out.push_back(regex[++i]);
      if (i + 1 < regex.size() && regex[i + 1] == ']') out.push_back(regex[++i]);
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out.push_back(c);
  }
  return out;
}

// JitStack: PCRE2's JIT stack for this thread, grown on demand up to 8 MiB (a group repeated
// over a long run of text needs a frame per repetition).
pcre2_jit_stack* JitStack() {
  struct Holder {
    pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    ~Holder() { pcre2_jit_stack_free(stack); }
  };
  thread_local Holder holder;
  return holder.stack;
}

}  // namespace

struct PreTokenizer::Regex {
  pcre2_code* code = nullptr;
  ~Regex() { pcre2_code_free(code); }
};

PreTokenizer::~PreTokenizer() = default;

std::string PreTokenizer::SupportedNames() {
  std::vector<std::string> names;
  for (const Family& f : Families()) {
    for (std::string_view n : f.names) {
      if (!n.empty()) names.emplace_back(n);
    }
  }
  return absl::StrJoin(names, ", ");
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizer::Create(std::string_view name) {
  for (const Family& f : Families()) {
    bool found = false;
    for (std::string_view n : f.names) found = found || n == name;
    if (!found) continue;
    std::unique_ptr<PreTokenizer> p(new PreTokenizer());
    p->name_ = name.empty() ? "default" : std::string(name);
    p->family_ = std::string(f.family);
    p->ignore_merges_ = f.ignore_merges;
    p->add_bos_ = f.add_bos;
    for (std::string_view r : f.regexes) {
      const std::string pattern = ExpandSpaces(r);
      int error = 0;
      PCRE2_SIZE offset = 0;
      auto regex = std::make_unique<Regex>();
      regex->code =
          pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                        PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &offset, nullptr);
      if (regex->code == nullptr) {  // a bug in the table above, not in the model file
        std::array<PCRE2_UCHAR, 256> message{};
        pcre2_get_error_message(error, message.data(), message.size());
        ABSL_RAW_LOG(FATAL, "pre-tokenizer '%s': expression %s does not compile at %zu: %s",
                     p->family_.c_str(), pattern.c_str(), static_cast<size_t>(offset),
                     reinterpret_cast<const char*>(message.data()));
      }
      // Without JIT (a build of PCRE2 without it) the interpreter matches the same.
      (void)pcre2_jit_compile(regex->code, PCRE2_JIT_COMPLETE);
      p->regexes_.push_back(std::move(regex));
    }
    return p;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "key 'tokenizer.ggml.pre' is '", std::string(name),
      "': kvguard does not know this pre-tokenizer (it knows ", SupportedNames(), ")"));
}

void PreTokenizer::Split(std::string_view text, std::vector<std::string_view>* pieces) const {
  std::vector<std::string_view> current{text}, next;
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_jit_stack_assign(context, nullptr, JitStack());
  pcre2_match_data* match = pcre2_match_data_create(1, nullptr);
  for (const std::unique_ptr<Regex>& regex : regexes_) {
    next.clear();
    for (const std::string_view piece : current) {
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
      size_t done = 0;  // piece[0, done) is cut
      size_t from = 0;  // where the next search starts
      while (from < piece.size()) {
        int rc = pcre2_match(regex->code, subject, piece.size(), from, 0, match, context);
        if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
          // The JIT ran out of stack: the interpreter keeps its state on the heap.
          rc = pcre2_match(regex->code, subject, piece.size(), from, PCRE2_NO_JIT, match, context);
        }
        if (rc < 0) break;  // no match (or still an error): the rest is one piece
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match);
        const size_t begin = ov[0], end = ov[1];
        if (end == begin) {  // no expression here matches empty text; be safe anyway
          from = begin + 1;
          continue;
        }
        if (begin > done) next.push_back(piece.substr(done, begin - done));
        next.push_back(piece.substr(begin, end - begin));
        done = from = end;
      }
      if (done < piece.size()) next.push_back(piece.substr(done));
    }
    current.swap(next);
  }
  pcre2_match_data_free(match);
  pcre2_match_context_free(context);
  pieces->insert(pieces->end(), current.begin(), current.end());
}

}  // namespace kvguard::core
