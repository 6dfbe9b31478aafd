// The real trained model in ../shared/models: aidreams260K.gguf (Llama architecture, head_dim
// 16, SentencePiece vocabulary of 512). With FP32 weights and an FP32 KV cache, the engine's
// greedy continuation must match llama.cpp's reference (../shared/models/README.md).
#include <string>
#include <vector>

#include "core/runtime.h"
#include "gtest/gtest.h"
#include "tests/core/shared_models.h"

namespace kvguard::core {
namespace {

struct Reference {
  const char* prompt;
  const char* output;  // llama-simple -n 40, prompt included, "<s> " stripped
};

// From ../shared/models/README.md (llama.cpp b4747, FP32 weights, FP16 KV, greedy, 40 tokens).
constexpr Reference kReferences[] = {
    {"Once upon a time",
     "Once upon a time, pixels unfolding like petals. Classifications unfold, a kaleidoscope of "
     "prob"},
    {"The robot",
     "The robotic whispers secrets, fragments of probability unfolding. Contrast emerge, a "
     "flower, as I"},
};

// MatchingTokens returns how many of `tokens` (decoded one by one) keep prompt + their text a
// prefix of `reference`.
int MatchingTokens(const Tokenizer& tok, const std::string& prompt, const std::vector<int>& tokens,
                   const std::string& reference) {
  std::string text = prompt;
  int n = 0;
  for (int id : tokens) {
    text += tok.DecodeToken(id);
    if (reference.compare(0, text.size(), text) != 0 || text.size() > reference.size()) break;
    ++n;
  }
  return n;
}

std::vector<int> Greedy(const Loaded& loaded, const RuntimeOptions& options,
                        const std::string& prompt, int max_tokens) {
  auto engine = MakeEngine(loaded, options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return {};
  GenerationRequest r;
  r.prompt = loaded.tokenizer->Encode(prompt, /*add_bos=*/true);
  r.max_tokens = max_tokens;
  auto id = (*engine)->Submit(std::move(r));
  EXPECT_TRUE(id.ok()) << id.status();
  auto result = (*engine)->Wait(*id);
  EXPECT_TRUE(result.ok());
  return result.ok() ? result->tokens : std::vector<int>{};
}

RuntimeOptions Fp32Options(const std::string& path) {
  RuntimeOptions o;
  o.model = path;
  o.weights.prefill_weights = kernels::WeightFormat::kFp32;
  o.weights.decode_weights = kernels::WeightFormat::kFp32;
  o.kv_dtype = kernels::KvDtype::kFp32;
  o.kv_cache_bytes = size_t{4} << 20;
  o.engine.threads = 1;
  return o;
}

// The fixture skips every test, saying why, when the model is not there.
class GgufModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = testing::SharedModelPath("aidreams260K.gguf");
    if (path_.empty()) {
      GTEST_SKIP() << "aidreams260K.gguf not found in $KVGUARD_SHARED_MODELS or "
                   << KVGUARD_SHARED_MODELS_DIR << " (../shared/models is absent)";
    }
  }
  std::string path_;
};

TEST_F(GgufModelTest, Fp32GreedyMatchesLlamaCppReference) {
  const RuntimeOptions o = Fp32Options(path_);
  auto loaded = LoadModel(o);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->model->config().head_dim, 16);
  for (const Reference& ref : kReferences) {
    const std::vector<int> tokens = Greedy(*loaded, o, ref.prompt, 40);
    ASSERT_EQ(tokens.size(), 40u) << ref.prompt;
    const int match = MatchingTokens(*loaded->tokenizer, ref.prompt, tokens, ref.output);
    RecordProperty(std::string("matching_tokens_") + ref.prompt, match);
    EXPECT_GE(match, 30) << ref.prompt;
    // Measured: all 40 match, the full text is llama.cpp's (pieces as streamed: Decode would
    // drop a leading space, as it does at the start of a text).
    std::string text = ref.prompt;
    for (int id : tokens) text += loaded->tokenizer->DecodeToken(id);
    EXPECT_EQ(text, ref.output);
  }
}

// The positive control of the comparison above: another prompt's continuation does not match
// the reference, so MatchingTokens can fail.
TEST_F(GgufModelTest, MatchingTokensDetectsADifferentContinuation) {
  const RuntimeOptions o = Fp32Options(path_);
  auto loaded = LoadModel(o);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const std::vector<int> tokens = Greedy(*loaded, o, kReferences[1].prompt, 40);
  EXPECT_LT(
      MatchingTokens(*loaded->tokenizer, kReferences[0].prompt, tokens, kReferences[0].output), 5);
}

// The quantised configurations load and generate (their continuations and KL divergence are
// measured by `kvguard eval`, recorded in bench/results/eval-aidreams.md).
TEST_F(GgufModelTest, QuantisedConfigurationsGenerate) {
  RuntimeOptions o = Fp32Options(path_);
  o.weights.prefill_weights = kernels::WeightFormat::kFp8;
  o.weights.decode_weights = kernels::WeightFormat::kInt4;
  o.kv_dtype = kernels::KvDtype::kFp8E4m3;
  auto loaded = LoadModel(o);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  // ffn_down (K = 172) has no INT4 group: it stays FP8, one per layer.
  EXPECT_EQ(loaded->model->Int4Fallbacks(), loaded->model->config().n_layers);
  const std::vector<int> tokens = Greedy(*loaded, o, kReferences[0].prompt, 40);
  EXPECT_EQ(tokens.size(), 40u);
}

}  // namespace
}  // namespace kvguard::core
