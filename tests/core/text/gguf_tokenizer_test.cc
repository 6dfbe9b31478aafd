// The GGUF tokenizers: SentencePiece (scores, byte fallback, space prefix) and GPT-2 byte-level
// BPE (merges), BOS/EOS as the metadata says, round trips over several scripts and invalid
// UTF-8, and refusal of malformed tokenizer metadata.
#include "core/text/gguf_tokenizer.h"

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "tests/core/gguf/gguf_writer.h"
#include "tests/core/shared_models.h"

namespace kvguard::core {
namespace {

using testing::GgufWriter;
using testing::Gpt2ByteTokens;

const std::string kSp = "\xE2\x96\x81";  // U+2581

// Texts in several scripts, with leading/trailing/repeated spaces, control characters, and
// invalid UTF-8 (a stray continuation byte, a truncated sequence, an overlong form, 0xFF).
const std::vector<std::string>& RoundTripTexts() {
  static const std::vector<std::string> texts = {
      "Once upon a time",
      "  two leading spaces, trailing  ",
      "Über den Wolken muss die Freiheit wohl grenzenlos sein.",
      "Привет, мир! Как дела?",
      "雲の上は自由だ。東京タワー",
      "مرحبا بالعالم",
      "emoji: \xF0\x9F\x98\x80\xF0\x9F\x9A\x80 done",
      "tabs\tand\nnewlines\r\n",
      "stray \x80 continuation",
      "truncated \xE2\x96",
      "overlong \xC0\xAF and \xFF bytes",
      "I'll say it's 42 o'clock",
      "",
  };
  return texts;
}

struct TokFile {
  std::string bytes;  // kept alive: the file points into it
  std::unique_ptr<gguf::File> file;
  std::unique_ptr<GgufTokenizer> tok;
};

TokFile Make(const GgufWriter& w) {
  TokFile l;
  l.bytes = w.Build();
  auto f = gguf::File::Parse({reinterpret_cast<const uint8_t*>(l.bytes.data()), l.bytes.size()});
  EXPECT_TRUE(f.ok()) << f.status();
  if (!f.ok()) return l;
  l.file = *std::move(f);
  auto t = GgufTokenizer::Create(*l.file);
  EXPECT_TRUE(t.ok()) << t.status();
  if (t.ok()) l.tok = *std::move(t);
  return l;
}

// ---- SentencePiece --------------------------------------------------------------------------

// Token ids of the extras AddSpmVocab appends start at 259.
constexpr int kFirstExtra = 259;

TEST(GgufSpmTest, MergesByScoreAndFallsBackToBytes) {
  // "ab" -> "▁ab": symbols ▁ a b. With "ab" scored above "▁a", ab merges first: [▁, ab].
  // Scores swapped (positive twin): ▁a merges first: [▁a, b].
  for (bool ab_first : {true, false}) {
    GgufWriter w;
    testing::AddSpmVocab(w, {kSp, "a", "b", kSp + "a", "ab"},
                         {-5, -5, -5, ab_first ? -2.0f : -1.0f, ab_first ? -1.0f : -2.0f});
    TokFile l = Make(w);
    ASSERT_NE(l.tok, nullptr);
    const std::vector<int> ids = l.tok->Encode("ab", /*add_bos=*/true);
    const std::vector<int> want =
        ab_first ? std::vector<int>{1, kFirstExtra, kFirstExtra + 4}       // <s> ▁ ab
                 : std::vector<int>{1, kFirstExtra + 3, kFirstExtra + 2};  // <s> ▁a b
    EXPECT_EQ(ids, want);
    EXPECT_EQ(l.tok->Decode(ids), "ab");
    // 'c' is no token: its byte token <0x63> (id 3 + 0x63) stands for it.
    EXPECT_EQ(l.tok->Encode("c", false), (std::vector<int>{kFirstExtra, 3 + 0x63}));
  }
}

TEST(GgufSpmTest, BosEosAndSpacePrefixFollowTheMetadata) {
  GgufWriter w;
  testing::AddSpmVocab(w, {kSp, "a"});
  TokFile with = Make(w);
  ASSERT_NE(with.tok, nullptr);
  EXPECT_EQ(with.tok->Encode("a", true), (std::vector<int>{1, kFirstExtra, kFirstExtra + 1}));
  EXPECT_EQ(with.tok->Encode("a", false), (std::vector<int>{kFirstExtra, kFirstExtra + 1}));
  EXPECT_EQ(with.tok->DecodeToken(kFirstExtra), " ");  // streaming keeps the space
  EXPECT_EQ(with.tok->DecodeToken(1), "");             // BOS is text-less
  EXPECT_EQ(with.tok->bos_id(), 1);
  EXPECT_EQ(with.tok->eos_id(), 2);
  GgufWriter v;
  testing::AddSpmVocab(v, {kSp, "a"});
  v.Bool("tokenizer.ggml.add_bos_token", false)
      .Bool("tokenizer.ggml.add_eos_token", true)
      .Bool("tokenizer.ggml.add_space_prefix", false);
  TokFile without = Make(v);
  ASSERT_NE(without.tok, nullptr);
  EXPECT_EQ(without.tok->Encode("a", true), (std::vector<int>{kFirstExtra + 1, 2}));
  // "<s>" in the text is text, never the BOS id.
  const std::vector<int> ids = with.tok->Encode("<s>", false);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 1), 0);
  EXPECT_EQ(with.tok->Decode(ids), "<s>");
}

// Phi-3 (known by general.name, as llama.cpp knows it): whitespace after a user-defined token is
// dropped; another model keeps it (the twin). Either way the next text gets the space prefix.
TEST(GgufSpmTest, Phi3DropsWhitespaceAfterUserDefinedTokens) {
  for (const bool phi3 : {true, false}) {
    std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
    std::vector<int32_t> types = {2, 3, 3};
    for (int b = 0; b < 256; ++b) {
      tokens.push_back(absl::StrFormat("<0x%02X>", b));
      types.push_back(6);
    }
    for (const std::string& t : {kSp, std::string("a"), std::string("b"), std::string("<x>")}) {
      tokens.push_back(t);
      types.push_back(t == "<x>" ? 4 : 1);  // <x>: user-defined
    }
    GgufWriter w;
    w.Str("tokenizer.ggml.model", "llama")
        .Str("general.name", phi3 ? "Phi3" : "Llama")
        .StrArray("tokenizer.ggml.tokens", tokens)
        .I32Array("tokenizer.ggml.token_type", types);
    TokFile l = Make(w);
    ASSERT_NE(l.tok, nullptr);
    const std::vector<int> ids = l.tok->Encode("a<x> \tb", false);
    std::vector<int> want = {kFirstExtra, kFirstExtra + 1, kFirstExtra + 3, kFirstExtra};
    if (!phi3) want.insert(want.end(), {kFirstExtra, 3 + '\t'});  // " \t" -> ▁ ▁ <0x09>
    want.push_back(kFirstExtra + 2);
    EXPECT_EQ(ids, want) << (phi3 ? "Phi3" : "Llama");
  }
}

TEST(GgufSpmTest, RoundTripsEveryScript) {
  GgufWriter w;
  testing::AddSpmVocab(w, {kSp, "a", "e", "n", kSp + "a", "an", kSp + "the", "Ü", "雲"});
  TokFile l = Make(w);
  ASSERT_NE(l.tok, nullptr);
  for (const std::string& text : RoundTripTexts()) {
    EXPECT_EQ(l.tok->Decode(l.tok->Encode(text, true)), text) << text;
  }
}

// ---- GPT-2 byte-level BPE ---------------------------------------------------------------------

// A GPT-2 vocabulary: the byte characters, then the merged tokens; merges t h < th e < Ġ the.
GgufWriter Gpt2Writer(bool with_merges) {
  std::vector<std::string> tokens = Gpt2ByteTokens();
  for (const char* t : {"th", "the", "\xC4\xA0the", "<|endoftext|>"}) tokens.push_back(t);
  std::vector<int32_t> types(tokens.size(), 1);
  types.back() = 3;
  GgufWriter w;
  w.Str("tokenizer.ggml.model", "gpt2")
      .StrArray("tokenizer.ggml.tokens", tokens)
      .I32Array("tokenizer.ggml.token_type", types)
      .U32("tokenizer.ggml.bos_token_id", 259)
      .U32("tokenizer.ggml.eos_token_id", 259);
  w.StrArray("tokenizer.ggml.merges", with_merges
                                          ? std::vector<std::string>{"t h", "th e", "\xC4\xA0 the"}
                                          : std::vector<std::string>{});
  return w;
}

TEST(GgufBpeTest, MergesByRank) {
  TokFile l = Make(Gpt2Writer(true));
  ASSERT_NE(l.tok, nullptr);
  // "the the": pieces "the", " the" -> [the], [Ġthe]; no BOS (add_bos_token defaults to no).
  EXPECT_EQ(l.tok->Encode("the the", true), (std::vector<int>{257, 258}));
  EXPECT_EQ(l.tok->Decode(std::vector<int>{257, 258}), "the the");
  // Positive twin: without merges every byte is its own token.
  TokFile bare = Make(Gpt2Writer(false));
  ASSERT_NE(bare.tok, nullptr);
  EXPECT_EQ(bare.tok->Encode("the the", true),
            (std::vector<int>{'t', 'h', 'e', ' ', 't', 'h', 'e'}));
  EXPECT_EQ(l.tok->DecodeToken(259), "");  // control token
}

TEST(GgufBpeTest, RoundTripsEveryScript) {
  TokFile l = Make(Gpt2Writer(true));
  ASSERT_NE(l.tok, nullptr);
  for (const std::string& text : RoundTripTexts()) {
    EXPECT_EQ(l.tok->Decode(l.tok->Encode(text, true)), text) << text;
  }
}

// User-defined tokens (token_type 4) in the text are those tokens; control tokens, and
// user-defined ones whose text llama.cpp treats as control, stay text.
TEST(GgufBpeTest, FindsUserDefinedTokensNeverControlTokens) {
  std::vector<std::string> tokens = Gpt2ByteTokens();  // ids 0..255
  for (const char* t : {"<tool>", "<tool>x", "<|im_end|>", "<|endoftext|>"}) tokens.push_back(t);
  std::vector<int32_t> types(tokens.size(), 1);
  types[256] = types[257] = 4;  // <tool>, <tool>x: user-defined
  types[258] = 3;               // <|im_end|>: control
  types[259] = 4;               // <|endoftext|>: user-defined, read as control
  const auto make = [&] {
    GgufWriter w;
    w.Str("tokenizer.ggml.model", "gpt2")
        .Str("tokenizer.ggml.pre", "gpt-2")
        .StrArray("tokenizer.ggml.tokens", tokens)
        .I32Array("tokenizer.ggml.token_type", types)
        .StrArray("tokenizer.ggml.merges", {});
    return Make(w);
  };
  TokFile l = make();
  ASSERT_NE(l.tok, nullptr);
  // The longer user-defined token is found first; "<tool>" where "<tool>x" does not fit.
  const std::string text = "a<tool>x<tool>b<|im_end|><|endoftext|>";
  const std::vector<int> ids = l.tok->Encode(text, false);
  std::vector<int> want = {'a', 257, 256, 'b'};
  for (const char c : std::string("<|im_end|><|endoftext|>")) want.push_back(c);
  EXPECT_EQ(ids, want);
  EXPECT_EQ(l.tok->Decode(ids), text);  // user-defined tokens decode to their text
  EXPECT_EQ(l.tok->DecodeToken(258), "");
  EXPECT_EQ(l.tok->DecodeToken(259), "");
  // Positive twin: typed normal, "<tool>" is merely text (no merges: its bytes).
  types[256] = types[257] = 1;
  TokFile plain = make();
  ASSERT_NE(plain.tok, nullptr);
  EXPECT_EQ(plain.tok->Encode("<tool>", false), (std::vector<int>{'<', 't', 'o', 'o', 'l', '>'}));
}

// A merge whose result is a control token's text does not give the control token, and neither
// does a piece that is one under Llama 3's whole-piece rule; typed normal (the twin), it does.
TEST(GgufBpeTest, MergesNeverProduceControlTokens) {
  for (const char* pre : {"gpt-2", "llama-bpe"}) {
    for (const int type : {3, 1}) {
      std::vector<std::string> tokens = Gpt2ByteTokens();
      tokens.push_back("ab");  // id 256
      std::vector<int32_t> types(tokens.size(), 1);
      types[256] = type;
      GgufWriter w;
      w.Str("tokenizer.ggml.model", "gpt2")
          .Str("tokenizer.ggml.pre", pre)
          .StrArray("tokenizer.ggml.tokens", tokens)
          .I32Array("tokenizer.ggml.token_type", types)
          .StrArray("tokenizer.ggml.merges", {"a b"});
      TokFile l = Make(w);
      ASSERT_NE(l.tok, nullptr);
      const std::vector<int> want = type == 3 ? std::vector<int>{'a', 'b'} : std::vector<int>{256};
      EXPECT_EQ(l.tok->Encode("ab", false), want) << pre << " type " << type;
    }
  }
}

// A byte the vocabulary has no token for (here 0xFF) becomes U+FFFD's tokens, as in llama.cpp,
// rather than vanishing; with the token (the twin) it comes back as itself.
TEST(GgufBpeTest, BytesWithoutATokenBecomeReplacementCharacter) {
  for (const bool has_ff : {false, true}) {
    std::vector<std::string> tokens = Gpt2ByteTokens();
    if (!has_ff) tokens[255] = "<unused>";
    GgufWriter w;
    w.Str("tokenizer.ggml.model", "gpt2")
        .Str("tokenizer.ggml.pre", "gpt-2")
        .StrArray("tokenizer.ggml.tokens", tokens)
        .StrArray("tokenizer.ggml.merges", {});
    TokFile l = Make(w);
    ASSERT_NE(l.tok, nullptr);
    const std::vector<int> ids = l.tok->Encode("a\xFF", false);
    const std::vector<int> want =
        has_ff ? std::vector<int>{'a', 255} : std::vector<int>{'a', 0xEF, 0xBF, 0xBD};
    EXPECT_EQ(ids, want);
    EXPECT_EQ(l.tok->Decode(ids), has_ff ? "a\xFF" : "a\xEF\xBF\xBD");
  }
}

// ---- malformed tokenizer metadata -----------------------------------------------------------

TEST(GgufTokenizerTest, RefusesMalformedMetadata) {
  struct Case {
    const char* name;
    std::function<void(GgufWriter&)> add;
    const char* error;
  };
  const Case cases[] = {
      {"unknown model", [](GgufWriter& w) { w.Str("tokenizer.ggml.model", "bert"); },
       "key 'tokenizer.ggml.model' is 'bert'"},
      {"tokens of the wrong type",
       [](GgufWriter& w) {
         w.Str("tokenizer.ggml.model", "llama").F32Array("tokenizer.ggml.tokens", {1.0f});
       },
       "key 'tokenizer.ggml.tokens' is array of f32, expected array of string"},
      {"scores of another length",
       [](GgufWriter& w) {
         w.Str("tokenizer.ggml.model", "llama")
             .StrArray("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "a"})
             .F32Array("tokenizer.ggml.scores", {0, 0});
       },
       "key 'tokenizer.ggml.scores' has 2 entries for 4 tokens"},
      {"BOS outside the vocabulary",
       [](GgufWriter& w) {
         w.Str("tokenizer.ggml.model", "llama")
             .StrArray("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "a"})
             .U32("tokenizer.ggml.bos_token_id", 4);
       },
       "key 'tokenizer.ggml.bos_token_id' = 4 is outside the vocabulary of 4"},
      {"BPE without merges",
       [](GgufWriter& w) {
         w.Str("tokenizer.ggml.model", "gpt2").StrArray("tokenizer.ggml.tokens", {"a"});
       },
       "missing key 'tokenizer.ggml.merges'"},
      {"unknown pre-tokenizer",
       [](GgufWriter& w) {
         w.Str("tokenizer.ggml.model", "gpt2")
             .Str("tokenizer.ggml.pre", "frobnicate")
             .StrArray("tokenizer.ggml.tokens", {"a"})
             .StrArray("tokenizer.ggml.merges", {});
       },
       "key 'tokenizer.ggml.pre' is 'frobnicate': kvguard does not know this pre-tokenizer"},
      {"pre-tokenizer of the wrong type",
       [](GgufWriter& w) {
         w.Str("tokenizer.ggml.model", "gpt2")
             .U32("tokenizer.ggml.pre", 7)
             .StrArray("tokenizer.ggml.tokens", {"a"})
             .StrArray("tokenizer.ggml.merges", {});
       },
       "tokenizer.ggml.pre"},
      {"malformed merge",
       [](GgufWriter& w) {
         w.Str("tokenizer.ggml.model", "gpt2")
             .StrArray("tokenizer.ggml.tokens", {"a"})
             .StrArray("tokenizer.ggml.merges", {"ab"});
       },
       "key 'tokenizer.ggml.merges': entry 0 is not two symbols"},
  };
  for (const Case& c : cases) {
    GgufWriter w;
    c.add(w);
    const std::string bytes = w.Build();
    auto f = gguf::File::Parse({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()});
    ASSERT_TRUE(f.ok()) << c.name << ": " << f.status();
    const auto t = GgufTokenizer::Create(**f);
    ASSERT_FALSE(t.ok()) << c.name;
    EXPECT_NE(std::string(t.status().message()).find(c.error), std::string::npos)
        << c.name << ": " << t.status();
  }
  // Positive twins: a well-formed small vocabulary loads, and so does a BPE one with each
  // pre-tokenizer name kvguard knows (the names of llama.cpp's test suite, GLM-4's and Kimi K2's).
  for (const char* pre :
       {"llama-bpe",  "llama3",      "qwen2",     "deepseek-llm", "deepseek-coder", "deepseek-v3",
        "falcon",     "mpt",         "starcoder", "refact",       "command-r",      "gpt-2",
        "glm4",       "chatglm-bpe", "kimi-k2",   "gpt-4o",       "llama4",         "tekken",
        "seed-coder", "bailingmoe",  "bloom",     "viking",       "default"}) {
    GgufWriter b;
    b.Str("tokenizer.ggml.model", "gpt2")
        .Str("tokenizer.ggml.pre", pre)
        .StrArray("tokenizer.ggml.tokens", {"a"})
        .StrArray("tokenizer.ggml.merges", {});
    const std::string bytes = b.Build();
    auto f = gguf::File::Parse({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()});
    ASSERT_TRUE(f.ok());
    auto t = GgufTokenizer::Create(**f);
    ASSERT_TRUE(t.ok()) << pre << ": " << t.status();
    EXPECT_NE((*t)->Summary().find(absl::StrCat("pre-tokenizer '", pre, "'")), std::string::npos)
        << (*t)->Summary();
  }
  GgufWriter w;
  w.Str("tokenizer.ggml.model", "llama")
      .StrArray("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "a"})
      .F32Array("tokenizer.ggml.scores", {0, 0, 0, 0})
      .U32("tokenizer.ggml.bos_token_id", 1);
  const std::string bytes = w.Build();
  auto f = gguf::File::Parse({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()});
  ASSERT_TRUE(f.ok());
  EXPECT_TRUE(GgufTokenizer::Create(**f).ok());
}

// ---- the real vocabulary of aidreams260K ----------------------------------------------------

TEST(GgufSpmTest, AidreamsVocabulary) {
  const std::string path = testing::SharedModelPath("aidreams260K.gguf");
  if (path.empty()) {
    GTEST_SKIP() << "aidreams260K.gguf not found in $KVGUARD_SHARED_MODELS or "
                 << KVGUARD_SHARED_MODELS_DIR << " (../shared/models is absent)";
  }
  auto f = gguf::File::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  auto tok = GgufTokenizer::Create(**f);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->vocab_size(), 512);
  const std::vector<int> ids = (*tok)->Encode("Once upon a time", true);
  ASSERT_GE(ids.size(), 2u);
  EXPECT_EQ(ids[0], 1);  // BOS
  std::string pieces;    // streamed piece by piece: the space prefix stays
  for (size_t i = 1; i < ids.size(); ++i) pieces += (*tok)->DecodeToken(ids[i]);
  EXPECT_EQ(pieces, " Once upon a time");
  for (const std::string& text : RoundTripTexts()) {
    EXPECT_EQ((*tok)->Decode((*tok)->Encode(text, true)), text) << text;
  }
}

}  // namespace
}  // namespace kvguard::core
