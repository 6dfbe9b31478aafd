// Tests of core/service/chat_format.h: what `kvguard serve` starts with. A bad --chat-template
// (does not parse, missing, too large) or a bad tokenizer.chat_template in the GGUF stops the
// start with an error naming the file or key and the problem; each has its good twin.
#include "core/service/chat_format.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>
#include <string>

#include "tests/core/gguf/gguf_writer.h"
#include "tests/temp_dir.h"

namespace kvguard::core {
namespace {

class ChatFormatTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = tests::NewTempDir("chat_format_test"); }
  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  // Gguf writes a vocabulary-only GGUF with `chat_template` (none when empty).
  std::string Gguf(const std::string& name, const std::string& chat_template) {
    testing::GgufWriter w;
    testing::AddSpmVocab(w);
    if (!chat_template.empty()) w.Str("tokenizer.chat_template", chat_template);
    return Write(name, w.Build());
  }
  std::string dir_;
};

constexpr char kGood[] = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}";
constexpr char kBad[] = "{% for m in messages %}<|{{ m.role }}|>";  // no endfor

TEST_F(ChatFormatTest, TemplateFileThatDoesNotParseStopsTheStart) {
  const std::string path = Write("bad.jinja", kBad);
  absl::StatusOr<ChatFormat> f = LoadChatFormat("tiny", path);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("--chat-template " + path + ": "), std::string::npos)
      << f.status();
  // Twin: the same with the block closed.
  absl::StatusOr<ChatFormat> good = LoadChatFormat("tiny", Write("good.jinja", kGood));
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_NE(good->chat_template, nullptr);
}

TEST_F(ChatFormatTest, MissingOrOversizedTemplateFile) {
  absl::StatusOr<ChatFormat> missing = LoadChatFormat("tiny", dir_ + "/absent.jinja");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("absent.jinja: cannot open"), std::string::npos);
  const std::string big = Write("big.jinja", std::string(kMaxChatTemplateFileBytes + 1, 'x'));
  absl::StatusOr<ChatFormat> over = LoadChatFormat("tiny", big);
  ASSERT_FALSE(over.ok());
  EXPECT_NE(over.status().message().find("over the limit"), std::string::npos) << over.status();
  const std::string at = Write("at.jinja", std::string(kMaxChatTemplateFileBytes, 'x'));
  EXPECT_TRUE(LoadChatFormat("tiny", at).ok());  // twin: at the limit
}

TEST_F(ChatFormatTest, NoTemplateIsThePlainRendering) {
  absl::StatusOr<ChatFormat> f = LoadChatFormat("tiny", "");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->chat_template, nullptr);
  absl::StatusOr<ChatFormat> g = LoadChatFormat(Gguf("none.gguf", ""), "");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->chat_template, nullptr);
}

TEST_F(ChatFormatTest, GgufTemplate) {
  const std::string bad = Gguf("bad.gguf", kBad);
  absl::StatusOr<ChatFormat> f = LoadChatFormat(bad, "");
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find(bad + ": tokenizer.chat_template: "), std::string::npos)
      << f.status();
  // --chat-template replaces the GGUF's (bad) template; the BOS/EOS texts stay the GGUF's.
  absl::StatusOr<ChatFormat> over = LoadChatFormat(bad, Write("good.jinja", kGood));
  ASSERT_TRUE(over.ok()) << over.status();
  EXPECT_EQ(over->bos_token, "<s>");
  EXPECT_EQ(over->eos_token, "</s>");
  absl::StatusOr<ChatFormat> good = LoadChatFormat(Gguf("good.gguf", kGood), "");
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_NE(good->chat_template, nullptr);
}

}  // namespace
}  // namespace kvguard::core
