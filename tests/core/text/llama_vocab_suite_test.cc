// llama.cpp's tokenizer test suite (models/ggml-vocab-NAME.gguf with .gguf.inp / .gguf.out, as
// its tests/test-tokenizer-0.cpp reads them) run against GgufTokenizer: every case's ids must
// equal llama.cpp's (`common_tokenize(ctx, text, add_special=false, parse_special=false)`), and
// Decode must give the text back. The files come from the llama-cpp-python sdist that
// scripts/setup unpacks outside the repository; the directory is $KVGUARD_LLAMA_VOCABS, else the
// CMake cache variable KVGUARD_LLAMA_VOCAB_DIR. Each vocabulary skips, saying why, when its
// files are absent.
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/gguf/gguf.h"
#include "core/text/gguf_tokenizer.h"
#include "gtest/gtest.h"

namespace kvguard::core {
namespace {

std::string VocabDir() {
  const char* env = std::getenv("KVGUARD_LLAMA_VOCABS");
  return env != nullptr && env[0] != '\0' ? env : KVGUARD_LLAMA_VOCAB_DIR;
}

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream s;
  s << in.rdbuf();
  *out = s.str();
  return true;
}

struct Case {
  std::string text;
  std::vector<int> ids;
};

// ReadCases splits .inp at "\n__ggml_vocab_test__\n" and reads one line of ids per case from
// .out, as test-tokenizer-0.cpp does.
std::vector<Case> ReadCases(const std::string& inp, const std::string& out) {
  std::vector<Case> cases;
  const std::string sep = "\n__ggml_vocab_test__\n";
  for (size_t pos = 0; pos < inp.size();) {
    const size_t next = inp.find(sep, pos);
    cases.push_back({inp.substr(pos, next == std::string::npos ? next : next - pos), {}});
    if (next == std::string::npos) break;
    pos = next + sep.size();
  }
  std::istringstream lines(out);
  std::string line;
  for (Case& c : cases) {
    if (!std::getline(lines, line)) return {};
    std::istringstream ids(line);
    for (int id; ids >> id;) c.ids.push_back(id);
  }
  return cases;
}

std::string Ids(const std::vector<int>& ids) { return absl::StrJoin(ids, " "); }

class LlamaVocabSuite : public ::testing::TestWithParam<const char*> {};

TEST_P(LlamaVocabSuite, IdsEqualLlamaCppAndDecodeRoundTrips) {
  const std::string base = absl::StrCat(VocabDir(), "/ggml-vocab-", GetParam(), ".gguf");
  std::string inp, out;
  if (!ReadFile(base + ".inp", &inp) || !ReadFile(base + ".out", &out)) {
    GTEST_SKIP() << base << ".inp/.out not found: run scripts/setup (it unpacks llama.cpp's "
                 << "vocabularies) or set KVGUARD_LLAMA_VOCABS";
  }
  const std::vector<Case> cases = ReadCases(inp, out);
  ASSERT_GT(cases.size(), 10u) << base << ": .inp and .out disagree on the number of cases";
  auto file = gguf::File::Open(base);
  ASSERT_TRUE(file.ok()) << file.status();
  auto tok = GgufTokenizer::Create(**file);
  ASSERT_TRUE(tok.ok()) << tok.status();
  int equal = 0, round_trips = 0;
  for (const Case& c : cases) {
    const std::vector<int> ids = (*tok)->Encode(c.text, /*add_bos=*/false);
    if (ids == c.ids) {
      ++equal;
    } else {
      ADD_FAILURE() << GetParam() << ": '" << c.text << "'\n  llama.cpp: " << Ids(c.ids)
                    << "\n  kvguard:   " << Ids(ids);
    }
    const std::string back = (*tok)->Decode(ids);
    if (back == c.text) {
      ++round_trips;
    } else {
      ADD_FAILURE() << GetParam() << ": '" << c.text << "' decodes to '" << back << "'";
    }
  }
  // Beyond the suite (where llama.cpp replaces invalid UTF-8 by U+FFFD, kvguard keeps the
  // bytes): invalid sequences made of bytes UTF-8 uses, and control bytes, come back byte for
  // byte (bytes UTF-8 never uses: GgufBpeTest.BytesWithoutATokenBecomeReplacementCharacter).
  for (const std::string text : {"stray \x80 continuation", "truncated \xE2\x96",
                                 "surrogate \xED\xA0\x80!", "nul \x01\x1F"}) {
    EXPECT_EQ((*tok)->Decode((*tok)->Encode(text, false)), text) << GetParam();
  }
  std::printf("%s: %d/%zu cases equal to llama.cpp, %d/%zu round trips (%s)\n", GetParam(), equal,
              cases.size(), round_trips, cases.size(), (*tok)->Summary().c_str());
  EXPECT_EQ(equal, static_cast<int>(cases.size()));
}

INSTANTIATE_TEST_SUITE_P(Vocabularies, LlamaVocabSuite,
                         ::testing::Values("llama-spm", "llama-bpe", "phi-3", "gpt-2", "qwen2",
                                           "deepseek-llm", "deepseek-coder", "falcon", "mpt",
                                           "starcoder", "refact", "command-r"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name) c = c == '-' ? '_' : c;
                           return name;
                         });

// bert-bge is WordPiece (tokenizer.ggml.model 'bert'), which kvguard does not read: it is
// refused with an error naming the model, while a GPT-2 vocabulary of the same suite loads.
TEST(LlamaVocabSuiteTest, RefusesWordPieceNamingIt) {
  const std::string bert = absl::StrCat(VocabDir(), "/ggml-vocab-bert-bge.gguf");
  const std::string gpt2 = absl::StrCat(VocabDir(), "/ggml-vocab-gpt-2.gguf");
  struct stat st;
  if (stat(bert.c_str(), &st) != 0 || stat(gpt2.c_str(), &st) != 0) {
    GTEST_SKIP() << bert << " or " << gpt2 << " not found (run scripts/setup)";
  }
  auto file = gguf::File::Open(bert);
  ASSERT_TRUE(file.ok()) << file.status();
  auto tok = GgufTokenizer::Create(**file);
  ASSERT_FALSE(tok.ok());
  EXPECT_NE(std::string(tok.status().message()).find("'tokenizer.ggml.model' is 'bert'"),
            std::string::npos)
      << tok.status();
  auto good = gguf::File::Open(gpt2);
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_TRUE(GgufTokenizer::Create(**good).ok());
}

}  // namespace
}  // namespace kvguard::core
