// The GGUF reader and the GGUF weight source: every tensor type, v2 and v3, and every class of
// malformed file, each refused with an error that names what is wrong (with its positive twin:
// the same file without the defect loads).
#include "core/gguf/gguf.h"

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/model/gguf_weight_source.h"
#include "core/model/model.h"
#include "core/model/synthetic_model.h"
#include "gtest/gtest.h"
#include "kernels/formats.h"
#include "tests/core/gguf/gguf_writer.h"

namespace kvguard::core {
namespace {

using gguf::File;
using gguf::TensorType;
using testing::GgufWriter;

std::span<const uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

absl::StatusOr<std::unique_ptr<File>> ParseString(const std::string& s) {
  return File::Parse(Bytes(s));
}

// A small model: head_dim 16, GQA, ffn 64 (whole Q8_0/Q4_0 blocks), the byte vocabulary.
ModelConfig SmallConfig() {
  ModelConfig c;
  c.name = "gguf-test";
  c.dim = 32, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 16;
  c.ffn_dim = 64, c.vocab_size = 259, c.max_context = 64;
  return c;
}

// ---- tensor types, versions --------------------------------------------------------------

// Hand-made codes, decoded by the formula of each format (independent of the reader's code).
TEST(GgufTest, DecodesEveryTensorTypeExactly) {
  std::vector<float> f32 = {1.0f, -2.5f, 3.25e-3f, 65504.0f};
  std::string q8;  // one block: d = 0.5, q = -16 .. 15
  const uint16_t half = kernels::Fp16FromFloat(0.5f);
  q8.append(reinterpret_cast<const char*>(&half), 2);
  for (int j = 0; j < 32; ++j) q8.push_back(static_cast<char>(j - 16));
  std::string q4;  // one block: d = 0.25, element j < 16: nibble j; j >= 16: nibble 15 - (j-16)
  const uint16_t quarter = kernels::Fp16FromFloat(0.25f);
  q4.append(reinterpret_cast<const char*>(&quarter), 2);
  for (int j = 0; j < 16; ++j) q4.push_back(static_cast<char>(j | ((15 - j) << 4)));
  GgufWriter w;
  w.Tensor("f32", 0, {4}, testing::Encode(TensorType::kF32, f32))
      .Tensor("f16", 1, {4}, testing::Encode(TensorType::kF16, f32))
      .Tensor("bf16", 30, {4}, testing::Encode(TensorType::kBF16, {1.0f, -2.5f, 3.0f, 256.0f}))
      .Tensor("q8", 8, {32}, q8)
      .Tensor("q4", 2, {32}, q4);
  const std::string bytes = w.Build();  // the parsed file points into it
  auto f = ParseString(bytes);
  ASSERT_TRUE(f.ok()) << f.status();
  auto decode = [&](const char* name) {
    const gguf::TensorInfo* t = (*f)->FindTensor(name);
    std::vector<float> out(t->elements());
    gguf::DequantizeRow(t->type, t->data, out.size(), out.data());
    return out;
  };
  EXPECT_EQ(decode("f32"), f32);
  const std::vector<float> f16 = decode("f16");
  EXPECT_EQ(f16[0], 1.0f);
  EXPECT_EQ(f16[1], -2.5f);
  EXPECT_NEAR(f16[2], 3.25e-3f, 2e-6f);
  EXPECT_EQ(f16[3], 65504.0f);
  EXPECT_EQ(decode("bf16"), (std::vector<float>{1.0f, -2.5f, 3.0f, 256.0f}));
  const std::vector<float> v8 = decode("q8");
  for (int j = 0; j < 32; ++j) EXPECT_EQ(v8[j], (j - 16) * 0.5f) << j;
  const std::vector<float> v4 = decode("q4");
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(v4[j], (j - 8) * 0.25f) << j;
    EXPECT_EQ(v4[j + 16], (15 - j - 8) * 0.25f) << j;
  }
}

// A whole model in each tensor type and both versions: loads, and each matrix is within the
// format's rounding of the source (F32 exactly; q/k rows back in the engine's order).
TEST(GgufTest, LoadsModelInEveryTypeAndVersion) {
  const SyntheticWeightSource src(SmallConfig(), 5);
  struct Case {
    TensorType type;
    float rel_budget;  // of the tensor's max |w|
  };
  const Case cases[] = {{TensorType::kF32, 0},
                        {TensorType::kF16, 1e-3f},
                        {TensorType::kBF16, 8e-3f},
                        {TensorType::kQ8_0, 1e-2f},
                        {TensorType::kQ4_0, 0.15f}};
  for (uint32_t version : {2u, 3u}) {
    for (const Case& c : cases) {
      const std::string bytes = testing::WriteLlama(src, c.type, version);
      auto file = ParseString(bytes);
      ASSERT_TRUE(file.ok()) << file.status();
      EXPECT_EQ((*file)->version(), version);
      auto gsrc = GgufWeightSource::Create(std::shared_ptr<const File>(std::move(*file)), "t");
      ASSERT_TRUE(gsrc.ok()) << gsrc.status();
      EXPECT_EQ((*gsrc)->config().head_dim, 16);
      EXPECT_EQ((*gsrc)->config().n_kv_heads, 2);
      for (const std::string& name : RequiredTensorNames(src.config())) {
        std::vector<float> want, got;
        ASSERT_TRUE(src.ReadTensor(name, &want).ok());
        ASSERT_TRUE((*gsrc)->ReadTensor(name, &got).ok()) << name;
        ASSERT_EQ(got.size(), want.size()) << name;
        float max = 0, err = 0;
        for (size_t i = 0; i < want.size(); ++i) {
          max = std::max(max, std::fabs(want[i]));
          err = std::max(err, std::fabs(want[i] - got[i]));
        }
        EXPECT_LE(err, c.rel_budget * max) << name << " type " << int(c.type) << " v" << version;
      }
    }
  }
}

// The engine on a GGUF copy of a synthetic model computes exactly what it computes on the
// synthetic model itself: same config, same FP32 weights (q/k rows permuted and back).
TEST(GgufTest, F32ModelMatchesItsSourceExactly) {
  const SyntheticWeightSource src(SmallConfig(), 7);
  const std::string bytes = testing::WriteLlama(src, TensorType::kF32);  // outlives gsrc
  auto gsrc = GgufWeightSource::Create(std::shared_ptr<const File>(*ParseString(bytes)), "t");
  ASSERT_TRUE(gsrc.ok()) << gsrc.status();
  ModelOptions o;
  o.prefill_weights = kernels::WeightFormat::kFp32;
  o.decode_weights = kernels::WeightFormat::kFp32;
  auto a = Model::Load(src, o, nullptr);
  auto b = Model::Load(**gsrc, o, nullptr);
  ASSERT_TRUE(a.ok() && b.ok());
  KvPoolOptions po;
  po.dtype = kernels::KvDtype::kFp32;
  po.budget_bytes = src.config().KvBytesPerToken(4) * 64;
  const std::vector<int> tokens = {1, 72, 101, 108, 108, 111, 44, 32, 119};
  std::vector<float> la(259), lb(259);
  for (auto* m : {a->get(), b->get()}) {
    auto pool = KvPool::Create(src.config(), po);
    ASSERT_TRUE(pool.ok());
    std::vector<PageGrant> pages;
    ASSERT_TRUE((*pool)->table().GrantMany(Owner{0, 1}, 1, &pages).ok());
    ASSERT_TRUE(
        m->Prefill(tokens, pages, **pool, m == a->get() ? la.data() : lb.data(), nullptr).ok());
  }
  EXPECT_EQ(la, lb);
  // Positive control: a source with other weights gives other logits.
  const SyntheticWeightSource other(SmallConfig(), 8);
  auto c = Model::Load(other, o, nullptr);
  auto pool = KvPool::Create(src.config(), po);
  std::vector<PageGrant> pages;
  ASSERT_TRUE((*pool)->table().GrantMany(Owner{0, 1}, 1, &pages).ok());
  std::vector<float> lc(259);
  ASSERT_TRUE((*c)->Prefill(tokens, pages, **pool, lc.data(), nullptr).ok());
  EXPECT_NE(la, lc);
}

// ---- malformed files ------------------------------------------------------------------------

struct Defect {
  std::string name;
  std::function<std::string()> build;  // the defective file
  std::string error;                   // a substring of the error
};

// The valid file every defect starts from: a whole small model, v3.
GgufWriter Baseline() {
  return testing::LlamaWriter(SyntheticWeightSource(SmallConfig(), 3), TensorType::kF32);
}

// Load parses and builds a weight source, returning the first error.
absl::Status Load(const std::string& bytes) {
  auto f = ParseString(bytes);
  if (!f.ok()) return f.status();
  auto src = GgufWeightSource::Create(std::shared_ptr<const File>(*std::move(f)), "t");
  return src.status();
}

// ArchitectureOnly returns a file whose only key is general.architecture = `arch`.
std::string ArchitectureOnly(const std::string& arch) {
  GgufWriter w;
  w.Str("general.architecture", arch);
  return w.Build();
}

std::string SetU64At(std::string s, size_t at, uint64_t v) {
  std::memcpy(s.data() + at, &v, 8);
  return s;
}

TEST(GgufTest, RefusesEveryDefectWithAClearError) {
  const std::string good = Baseline().Build();
  ASSERT_TRUE(Load(good).ok()) << Load(good);  // the positive twin of every case
  const std::vector<Defect> defects = {
      {"bad magic", [&] { return "GGUX" + good.substr(4); }, "not a GGUF file"},
      {"truncated header", [&] { return good.substr(0, 10); }, "truncated at offset 8"},
      {"truncated tensor data", [&] { return good.substr(0, good.size() - 5); },
       "run past the end of the file"},
      {"version 1", [&] { return GgufWriter(1).Build(); }, "GGUF version 1 is not supported"},
      {"version 4", [&] { return GgufWriter(4).Build(); }, "GGUF version 4 is not supported"},
      {"offset beyond file",
       [&] {
         return Baseline()
             .Remove("output.weight")
             .Tensor("output.weight", 0, {32, 259}, "", uint64_t{1} << 40)
             .Build();
       },
       "tensor 'output.weight': 33152 bytes at data offset 1099511627776"},
      {"misaligned offset",
       [&] {
         return Baseline()
             .Remove("output_norm.weight")
             .Tensor("output_norm.weight", 0, {32}, "", 4)
             .Build();
       },
       "tensor 'output_norm.weight': offset 4 is not a multiple of the alignment 32"},
      {"duplicate key", [&] { return Baseline().U32("llama.block_count", 2).Build(); },
       "duplicate key 'llama.block_count'"},
      {"duplicate tensor",
       [&] {
         return Baseline().Tensor("output_norm.weight", 0, {32}, std::string(128, '\0')).Build();
       },
       "duplicate tensor 'output_norm.weight'"},
      {"unknown tensor type",
       [&] { return Baseline().Tensor("extra", 12, {256}, std::string(144, '\0')).Build(); },
       "tensor 'extra': tensor type Q4_K (12) is not supported"},
      {"absurd metadata count", [&] { return SetU64At(good, 16, uint64_t{1} << 60); },
       "metadata count 1152921504606846976 cannot fit"},
      {"absurd tensor count", [&] { return SetU64At(good, 8, uint64_t{1} << 60); },
       "tensor count 1152921504606846976 cannot fit"},
      {"absurd string array",
       [&] {
         std::string b;
         const uint32_t elem = 8;
         const uint64_t n = uint64_t{1} << 58;
         b.append(reinterpret_cast<const char*>(&elem), 4)
             .append(reinterpret_cast<const char*>(&n), 8);
         return GgufWriter().Raw("tokenizer.ggml.tokens", 9, b).Build();
       },
       "key 'tokenizer.ggml.tokens': array of 288230376151711744 strings cannot fit"},
      {"absurd string length",
       [&] {
         std::string b;
         const uint64_t n = uint64_t{1} << 62;
         b.append(reinterpret_cast<const char*>(&n), 8);
         return GgufWriter().Raw("general.name", 8, b).Build();
       },
       "claims 4611686018427387904 bytes"},
      {"absurd dimension",
       [&] {
         return Baseline().Tensor("huge", 0, {uint64_t{1} << 40, 1}, "").Build();
       },
       "tensor 'huge': dimension 0 = 1099511627776 is zero or more than"},
      {"zero dimension", [&] { return Baseline().Tensor("empty", 0, {0}, "").Build(); },
       "tensor 'empty': dimension 0 = 0"},
      {"Q8_0 row not whole blocks",
       [&] { return Baseline().Tensor("odd", 8, {31}, std::string(34, '\0')).Build(); },
       "tensor 'odd': rows of 31 elements are not whole Q8_0 blocks"},
      {"another architecture", [&] { return ArchitectureOnly("gpt2"); },
       "key 'general.architecture' is 'gpt2': kvguard loads only the Llama architecture"},
      {"missing tensor", [&] { return Baseline().Remove("blk.1.ffn_up.weight").Build(); },
       "missing tensor 'blk.1.ffn_up.weight'"},
      {"shape mismatch",
       [&] {
         return Baseline()
             .Remove("blk.0.ffn_down.weight")
             .Tensor("blk.0.ffn_down.weight", 0, {32, 64}, std::string(32 * 64 * 4, '\0'))
             .Build();
       },
       "tensor 'blk.0.ffn_down.weight' has shape [32, 64] (ne), the config needs [64, 32]"},
      {"missing key", [&] { return ArchitectureOnly("llama"); },
       "missing key 'llama.embedding_length'"},
      {"bad alignment", [&] { return Baseline().U32("general.alignment", 24).Build(); },
       "key 'general.alignment' must be a u32 power of two"},
  };
  for (const Defect& d : defects) {
    const absl::Status s = Load(d.build());
    EXPECT_FALSE(s.ok()) << d.name;
    EXPECT_NE(std::string(s.message()).find(d.error), std::string::npos)
        << d.name << ": got \"" << s.message() << "\"";
  }
}

// A key of the wrong type is named with both types; the same key with its right type loads.
TEST(GgufTest, RefusesAKeyOfTheWrongType) {
  const SyntheticWeightSource src(SmallConfig(), 3);
  for (bool wrong : {true, false}) {
    // Rebuild the metadata with head_count_kv as a string (wrong) or a u32 (right).
    GgufWriter w = testing::LlamaWriter(src, TensorType::kF32);
    GgufWriter x(3);
    x.Str("general.architecture", "llama")
        .U32("llama.context_length", 64)
        .U32("llama.embedding_length", 32)
        .U32("llama.block_count", 2)
        .U32("llama.feed_forward_length", 64)
        .U32("llama.attention.head_count", 4)
        .U32("llama.attention.key_length", 16)
        .F32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
    if (wrong) {
      x.Str("llama.attention.head_count_kv", "2");
    } else {
      x.U32("llama.attention.head_count_kv", 2);
    }
    // Tensors: take them from the full writer's file.
    const std::string full_bytes = w.Build();  // the parsed file points into it
    auto full = ParseString(full_bytes);
    ASSERT_TRUE(full.ok());
    for (const gguf::TensorInfo& t : (*full)->tensors()) {
      x.Tensor(t.name, t.type, t.ne, std::string(reinterpret_cast<const char*>(t.data), t.bytes));
    }
    const absl::Status s = Load(x.Build());
    if (wrong) {
      EXPECT_NE(std::string(s.message())
                    .find("key 'llama.attention.head_count_kv' is string, expected an integer"),
                std::string::npos)
          << s;
    } else {
      EXPECT_TRUE(s.ok()) << s;
    }
  }
}

// Every proper prefix of a valid file is refused (never read past its end: ASan would see it);
// the whole file loads.
TEST(GgufTest, EveryTruncationIsRefused) {
  GgufWriter w;
  w.Str("general.architecture", "llama").U32("general.alignment", 16);
  testing::AddSpmVocab(w, {"\xE2\x96\x81"
                           "a"});
  w.Tensor("a", 0, {4}, testing::Encode(TensorType::kF32, {1, 2, 3, 4}))
      .Alignment(16)
      .Tensor("b", 8, {32}, testing::Encode(TensorType::kQ8_0, std::vector<float>(32, 1.0f)));
  const std::string good = w.Build();
  ASSERT_TRUE(ParseString(good).ok());
  for (size_t n = 0; n < good.size(); ++n) {
    const std::string cut = good.substr(0, n);  // its own allocation: ASan sees overreads
    EXPECT_FALSE(ParseString(cut).ok()) << "prefix of " << n << " bytes";
  }
}

// Flipping any byte of a small file's header and metadata never crashes the reader: each
// result is a file or an error.
TEST(GgufTest, ByteFlipsNeverCrash) {
  GgufWriter w;
  w.Str("general.architecture", "llama").U32("llama.block_count", 1).Bool("b", true);
  w.F32Array("s", {1, 2}).StrArray("t", {"x", "yz"});
  w.Tensor("a", 2, {32}, testing::Encode(TensorType::kQ4_0, std::vector<float>(32, 0.5f)));
  const std::string good = w.Build();
  int refused = 0;
  for (size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] ^= 0x42;
    refused += !ParseString(bad).ok();
  }
  EXPECT_GT(refused, 0);
  EXPECT_TRUE(ParseString(good).ok());
}

TEST(GgufTest, OpenNamesThePath) {
  const absl::StatusOr<std::unique_ptr<File>> f = File::Open("/nonexistent/x.gguf");
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(std::string(f.status().message()).find("/nonexistent/x.gguf"), std::string::npos);
}

}  // namespace
}  // namespace kvguard::core
