// The BPE pre-tokenizers: real Unicode categories (digits and punctuation of other scripts,
// llama.cpp's whitespace set), the adjustments that make PCRE2 cut where llama.cpp does
// (DeepSeek's ranges without whitespace, DeepSeek V3's '~'), refusal of unknown names, and
// pieces that always concatenate to the text, invalid UTF-8 and very long runs included.
#include "core/text/pretokenizer.h"

#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "gtest/gtest.h"

namespace kvguard::core {
namespace {

std::vector<std::string> Split(const std::string& pre, const std::string& text) {
  auto p = PreTokenizer::Create(pre);
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return {};
  std::vector<std::string_view> pieces;
  (*p)->Split(text, &pieces);
  return std::vector<std::string>(pieces.begin(), pieces.end());
}

struct Case {
  const char* pre;
  std::string text;
  std::vector<std::string> pieces;
};

TEST(PreTokenizerTest, CutsWhereLlamaCppCuts) {
  const Case cases[] = {
      // Arabic-Indic digits are \p{N}, not letters.
      {"gpt-2", "x\u0661\u0662\u0663 y", {"x", "\u0661\u0662\u0663", " y"}},
      // Guillemets are punctuation; NBSP and U+0085 (NEL) are whitespace.
      {"gpt-2", "\u00ABBon\u00BB", {"\u00AB", "Bon", "\u00BB"}},
      {"gpt-2", "a\u00A0b", {"a", "\u00A0", "b"}},
      {"gpt-2", "Hi\u0085there", {"Hi", "\u0085", "there"}},
      {"gpt-2", "I'll  go", {"I", "'ll", " ", " go"}},
      // Llama 3: digits in threes, punctuation takes the newlines after it, any case of 's.
      {"llama-bpe", "Hello 12345!!\n\nIT'S", {"Hello", " ", "123", "45", "!!\n\n", "IT", "'S"}},
      {"glm4", "Hello 12345", {"Hello", " ", "123", "45"}},
      // Qwen 2: single digits.
      {"qwen2", "a12345", {"a", "1", "2", "3", "4", "5"}},
      // DeepSeek LLM: U+3000 is whitespace, neither full-width punctuation nor CJK.
      {"deepseek-llm", "\u3002\u3000\u3002", {"\u3002", "\u3000", "\u3002"}},
      {"deepseek-llm", "\u4E2D\u3000\u6587", {"\u4E2D", "\u3000", "\u6587"}},
      {"deepseek-coder", "\u4E2D\u6587ab 12", {"\u4E2D\u6587", "ab", " ", "1", "2"}},
      // DeepSeek V3: '~' is neither \p{P} nor \p{S} (llama.cpp's ASCII table).
      {"deepseek-v3", "!~", {"!", "~"}},
      {"deepseek-v3", "~\u00E9", {"~\u00E9"}},
      {"deepseek-v3", "1234", {"123", "4"}},
      // Falcon: punctuation runs first, then GPT-2's, then digits in threes.
      {"falcon", "a,b 1234", {"a", ",", "b", " ", "123", "4"}},
      {"starcoder", "x 42", {"x", " ", "4", "2"}},
      // Kimi K2: Han runs apart from other letters; contractions stay on their word.
      {"kimi-k2",
       "\u4E2D\u6587Hello\u4E16\u754C don't",
       {"\u4E2D\u6587", "Hello", "\u4E16\u754C", " don't"}},
      {"llama3", "don't", {"don", "'t"}},
      // GPT-4o / Llama 4: capitals start a word; every non-ASCII letter counts as either case.
      {"llama4", "HelloWorld don't", {"Hello", "World", " don't"}},
      {"gpt-4o",
       "ABCdef \u00C9t\u00E9Bon 12345",
       {"ABCdef", " \u00C9t\u00E9", "Bon", " ", "123", "45"}},
      // Tekken: the same words, single digits, contractions apart.
      {"tekken", "HelloWorld 42", {"Hello", "World", " ", "4", "2"}},
      // BLOOM: runs without whitespace and sentence punctuation.
      {"bloom", "a(b) c, d", {"a", "(", "b", ")", " c", ",", " d"}},
      // Invalid UTF-8 matches nothing and stays, byte for byte, between the matches.
      {"gpt-2", "a\xFF\xC0z", {"a", "\xFF\xC0", "z"}},
      {"", "a,,b", {"a", ",,", "b"}},  // no tokenizer.ggml.pre: llama.cpp's "default"
  };
  for (const Case& c : cases) {
    EXPECT_EQ(Split(c.pre, c.text), c.pieces)
        << c.pre << " '" << c.text << "' -> '" << absl::StrJoin(Split(c.pre, c.text), "' '") << "'";
  }
}

TEST(PreTokenizerTest, RefusesUnknownNamesNamingThem) {
  auto bad = PreTokenizer::Create("llama-bpe2");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message())
                .find("key 'tokenizer.ggml.pre' is 'llama-bpe2': kvguard does not know"),
            std::string::npos)
      << bad.status();
  // Positive twin: the name it resembles is known, and reports its family and flags.
  auto good = PreTokenizer::Create("llama-bpe");
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ((*good)->family(), "llama3");
  EXPECT_TRUE((*good)->ignore_merges());
  EXPECT_TRUE((*good)->add_bos());
  auto glm = PreTokenizer::Create("glm4");
  ASSERT_TRUE(glm.ok());
  EXPECT_EQ((*glm)->family(), "glm4");
  EXPECT_FALSE((*glm)->ignore_merges());
  EXPECT_FALSE((*glm)->add_bos());
}

// Pieces concatenate to the text for every pre-tokenizer, on mixed scripts and on runs long
// enough to exhaust PCRE2's JIT stack where an expression repeats a group.
TEST(PreTokenizerTest, PiecesAlwaysConcatenateToTheText) {
  std::string mixed;
  for (int i = 0; i < 200; ++i) {
    mixed += "Hello, world! \u041F\u0440\u0438\u0432\u0435\u0442 \u4E16\u754C 12345 \t\n";
    mixed += "\u00E9~!\xF0\x9F\x98\x80 \u3000\xFF\xC2 don't";
  }
  const std::vector<std::string> long_runs = {std::string(1 << 20, ' '), std::string(1 << 20, '!'),
                                              std::string(1 << 20, '7'),
                                              [] {
                                                std::string s;
                                                for (int i = 0; i < 200000; ++i) s += "\u4E2D";
                                                return s;
                                              }(),
                                              [] {
                                                std::string s;
                                                for (int i = 0; i < 300000; ++i) s += "~!";
                                                return s;
                                              }()};
  for (const char* pre : {"gpt-2", "llama3", "qwen2", "deepseek-llm", "deepseek-coder",
                          "deepseek-v3", "falcon", "starcoder", "glm4", "kimi-k2", "default"}) {
    auto p = PreTokenizer::Create(pre);
    ASSERT_TRUE(p.ok()) << p.status();
    std::vector<std::string> texts = long_runs;
    texts.push_back(mixed);
    for (const std::string& text : texts) {
      std::vector<std::string_view> pieces;
      (*p)->Split(text, &pieces);
      std::string joined;
      for (std::string_view piece : pieces) {
        EXPECT_FALSE(piece.empty()) << pre;
        joined.append(piece);
      }
      EXPECT_EQ(joined == text, true)
          << pre << ": pieces of a " << text.size() << "-byte text do not concatenate to it";
    }
  }
}

}  // namespace
}  // namespace kvguard::core
