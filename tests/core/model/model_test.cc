// The engine's forward pass against the single-file reference decoder (the oracle).
#include "core/model/model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/model/synthetic_model.h"
#include "tests/core/model/reference_decoder.h"
#include "tests/core/model/tiny_model.h"

namespace kvguard::core {
namespace {

using kernels::KvDtype;
using kernels::WeightFormat;

struct Loaded {
  std::unique_ptr<WeightSource> source;
  std::unique_ptr<Model> model;
  std::unique_ptr<KvPool> pool;
};

Loaded Load(const std::string& name, WeightFormat prefill, WeightFormat decode, KvDtype kv,
            kernels::ThreadPool* tp) {
  Loaded l;
  l.source = *MakeBuiltinSource(name, 1);
  ModelOptions mo;
  mo.prefill_weights = prefill;
  mo.decode_weights = decode;
  l.model = *Model::Load(*l.source, mo, tp);
  KvPoolOptions po;
  po.dtype = kv;
  po.budget_bytes = l.model->config().KvBytesPerToken(KvDtypeBytes(kv)) * 16 * 64;
  l.pool = *KvPool::Create(l.model->config(), po);
  if (kv == KvDtype::kFp8E4m3) {
    std::vector<std::vector<int>> prompts = {{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}};
    EXPECT_TRUE(l.model->CalibrateKvScales(prompts, tp).ok());
    EXPECT_TRUE(l.pool->SetFp8Scales(l.model->fp8_k_scales(), l.model->fp8_v_scales()).ok());
  }
  return l;
}

double MaxAbsDiff(const std::vector<float>& a, const float* b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double{a[i]} - b[i]));
  return m;
}

// With FP32 weights and FP32 KV the engine computes the same function as the reference:
// logits agree to 1e-4 at the prompt's last token and at every decode step after it.
void ExpectMatchesReference(const std::string& name, int prompt_len, int steps) {
  kernels::ThreadPool tp(2);
  Loaded l = Load(name, WeightFormat::kFp32, WeightFormat::kFp32, KvDtype::kFp32, &tp);
  const ModelConfig& c = l.model->config();
  auto ref = *testing::ReferenceDecoder::Load(*l.source);
  std::vector<int> tokens;
  for (int i = 0; i < prompt_len; ++i) tokens.push_back((i * 37 + 11) % 256);
  std::vector<float> want;
  for (int i = 0; i < prompt_len; ++i) want = ref.Forward(tokens[i], i);

  std::vector<PageGrant> pages;
  ASSERT_TRUE(l.pool->table().GrantMany(Owner{0, 1}, (prompt_len + steps + 15) / 16, &pages).ok());
  std::vector<float> got(c.vocab_size);
  ASSERT_TRUE(l.model->Prefill(tokens, pages, *l.pool, got.data(), &tp).ok());
  EXPECT_LE(MaxAbsDiff(want, got.data()), 1e-4) << name << " prefill";
  for (int s = 0; s < steps; ++s) {
    const int next = static_cast<int>(std::max_element(want.begin(), want.end()) - want.begin());
    const int pos = prompt_len + s;
    want = ref.Forward(next, pos);
    const Model::DecodeItem item{next, pos, pages};
    ASSERT_TRUE(l.model->Decode({&item, 1}, *l.pool, got.data(), &tp).ok());
    EXPECT_LE(MaxAbsDiff(want, got.data()), 1e-4) << name << " decode step " << s;
  }
}

TEST(ModelTest, TinyFp32MatchesReferenceDecoder) { ExpectMatchesReference("tiny", 21, 12); }

TEST(ModelTest, SmallFp32MatchesReferenceDecoder) { ExpectMatchesReference("small", 7, 3); }

// A batched decode step computes, for each sequence, what a step of that sequence alone does.
TEST(ModelTest, BatchedDecodeEqualsEachAlone) {
  kernels::ThreadPool tp(2);
  Loaded l = Load("tiny", WeightFormat::kFp32, WeightFormat::kFp32, KvDtype::kFp32, &tp);
  const ModelConfig& c = l.model->config();
  const int B = 5;
  std::vector<std::vector<PageGrant>> pages(B);
  std::vector<Model::DecodeItem> items;
  std::vector<float> logits(size_t(B) * c.vocab_size);
  for (int b = 0; b < B; ++b) {
    std::vector<int> prompt;
    for (int i = 0; i < 3 + 7 * b; ++i) prompt.push_back((b * 31 + i * 7) % 256);
    ASSERT_TRUE(
        l.pool->table().GrantMany(Owner{0, static_cast<uint64_t>(b + 1)}, 4, &pages[b]).ok());
    ASSERT_TRUE(l.model->Prefill(prompt, pages[b], *l.pool, logits.data(), &tp).ok());
    items.push_back({(b * 13) % 256, static_cast<int>(prompt.size()), pages[b]});
  }
  std::vector<float> batched(size_t(B) * c.vocab_size);
  ASSERT_TRUE(l.model->Decode(items, *l.pool, batched.data(), &tp).ok());
  for (int b = 0; b < B; ++b) {
    std::vector<float> alone(c.vocab_size);
    ASSERT_TRUE(l.model->Decode({&items[b], 1}, *l.pool, alone.data(), &tp).ok());
    EXPECT_LE(MaxAbsDiff(alone, &batched[size_t(b) * c.vocab_size]), 1e-5) << "sequence " << b;
  }
}

// The bug class "prefill's write-page tag check is done before the first layer only": a page
// that changes hands after layer 0 has written into it must not be written by any later
// layer. Twin: an untouched page table is written by every layer and reports no fault.
// A prompt prefilled in chunks over several forward passes (each attending to the earlier ones
// through the paged cache) gives the logits of prefilling it whole, and leaves the same K and V
// for the decode step after it; FP8 KV (as served) and INT4 decode weights, FP8 prefill weights.
TEST(ModelTest, ChunkedPrefillEqualsWholePrefill) {
  kernels::ThreadPool tp(2);
  for (const KvDtype kv : {KvDtype::kFp32, KvDtype::kFp8E4m3}) {
    SCOPED_TRACE(kv == KvDtype::kFp32 ? "fp32 kv" : "fp8 kv");
    Loaded l = Load("tiny", WeightFormat::kFp8, WeightFormat::kInt4, kv, &tp);
    const ModelConfig& c = l.model->config();
    std::vector<int> prompt;
    for (int i = 0; i < 45; ++i) prompt.push_back((i * 37 + 5) % 256);
    std::vector<PageGrant> whole_pages, chunk_pages;
    ASSERT_TRUE(l.pool->table().GrantMany(Owner{0, 1}, 4, &whole_pages).ok());
    ASSERT_TRUE(l.pool->table().GrantMany(Owner{0, 2}, 4, &chunk_pages).ok());
    std::vector<float> whole(c.vocab_size), chunked(c.vocab_size);
    ASSERT_TRUE(l.model->Prefill(prompt, whole_pages, *l.pool, whole.data(), &tp).ok());
    // Chunks of 16, 3 and 26 tokens: page boundaries inside and between chunks.
    int at = 0;
    for (const int n : {16, 3, 26}) {
      const Model::Chunk ch{.tokens = std::span(prompt).subspan(size_t(at), size_t(n)),
                            .pos = at,
                            .pages = chunk_pages,
                            .prefill = true,
                            .logits = at + n == 45,
                            .check_tags = false,
                            .tag_fault = nullptr};
      ASSERT_TRUE(l.model->Forward({&ch, 1}, *l.pool, chunked.data(), &tp).ok());
      at += n;
    }
    EXPECT_LE(MaxAbsDiff(whole, chunked.data()), 1e-5);
    // The next decode step reads what the chunks wrote: the same as after the whole prefill.
    const Model::DecodeItem a{7, 45, whole_pages}, b{7, 45, chunk_pages};
    std::vector<float> la(c.vocab_size), lb(c.vocab_size);
    ASSERT_TRUE(l.model->Decode({&a, 1}, *l.pool, la.data(), &tp).ok());
    ASSERT_TRUE(l.model->Decode({&b, 1}, *l.pool, lb.data(), &tp).ok());
    EXPECT_LE(MaxAbsDiff(la, lb.data()), 1e-5);
    // Twin: a different chunk would change them (the comparison can fail).
    std::vector<int> other = prompt;
    other[20] = (other[20] + 1) % 256;
    std::vector<PageGrant> other_pages;
    ASSERT_TRUE(l.pool->table().GrantMany(Owner{0, 3}, 4, &other_pages).ok());
    std::vector<float> changed(c.vocab_size);
    ASSERT_TRUE(l.model->Prefill(other, other_pages, *l.pool, changed.data(), &tp).ok());
    EXPECT_GT(MaxAbsDiff(whole, changed.data()), 1e-3);
  }
}

// One forward pass over a mixed batch (decode tokens through the decode weights, a prefill
// chunk through the prefill weights) gives each sequence the logits it gets alone.
TEST(ModelTest, AMixedBatchEqualsEachChunkAlone) {
  kernels::ThreadPool tp(2);
  Loaded l = Load("tiny", WeightFormat::kFp8, WeightFormat::kInt4, KvDtype::kFp8E4m3, &tp);
  const ModelConfig& c = l.model->config();
  const size_t V = static_cast<size_t>(c.vocab_size);
  std::vector<int> p0 = {1, 2, 3, 4, 5, 6, 7}, p1 = {9, 8, 7}, fresh;
  for (int i = 0; i < 20; ++i) fresh.push_back((i * 11 + 3) % 256);
  std::vector<PageGrant> g0, g1, g2, g2_alone;
  ASSERT_TRUE(l.pool->table().GrantMany(Owner{0, 1}, 2, &g0).ok());
  ASSERT_TRUE(l.pool->table().GrantMany(Owner{0, 2}, 2, &g1).ok());
  ASSERT_TRUE(l.pool->table().GrantMany(Owner{0, 3}, 2, &g2).ok());
  ASSERT_TRUE(l.pool->table().GrantMany(Owner{0, 4}, 2, &g2_alone).ok());
  std::vector<float> scratch(V);
  ASSERT_TRUE(l.model->Prefill(p0, g0, *l.pool, scratch.data(), &tp).ok());
  ASSERT_TRUE(l.model->Prefill(p1, g1, *l.pool, scratch.data(), &tp).ok());
  const int t0 = 42, t1 = 43;
  // Alone first: decode 0 and 1 write position 7 and 3; the mixed pass rewrites the same.
  std::vector<float> a0(V), a1(V), a2(V);
  const Model::DecodeItem d0{t0, 7, g0}, d1{t1, 3, g1};
  ASSERT_TRUE(l.model->Decode({&d0, 1}, *l.pool, a0.data(), &tp).ok());
  ASSERT_TRUE(l.model->Decode({&d1, 1}, *l.pool, a1.data(), &tp).ok());
  ASSERT_TRUE(l.model->Prefill(fresh, g2_alone, *l.pool, a2.data(), &tp).ok());
  // Mixed, with the prefill chunk first in the list: the model orders rows by phase itself.
  const std::vector<Model::Chunk> mixed = {
      {.tokens = fresh, .pos = 0, .pages = g2, .prefill = true},
      {.tokens = std::span(&t0, 1), .pos = 7, .pages = g0, .prefill = false},
      {.tokens = std::span(&t1, 1), .pos = 3, .pages = g1, .prefill = false}};
  std::vector<float> out(3 * V);
  ASSERT_TRUE(l.model->Forward(mixed, *l.pool, out.data(), &tp).ok());
  EXPECT_LE(MaxAbsDiff(a2, &out[0]), 1e-5) << "the prefill chunk";
  EXPECT_LE(MaxAbsDiff(a0, &out[V]), 1e-5) << "decode 0";
  EXPECT_LE(MaxAbsDiff(a1, &out[2 * V]), 1e-5) << "decode 1";
  // Twin: the phases' weights differ (FP8 and INT4), so the same token through the other
  // phase's weights gives other logits: the row order by phase is what makes them equal.
  const Model::Chunk as_prefill{
      .tokens = std::span(&t0, 1), .pos = 7, .pages = g0, .prefill = true};
  std::vector<float> other(V);
  ASSERT_TRUE(l.model->Forward({&as_prefill, 1}, *l.pool, other.data(), &tp).ok());
  EXPECT_GT(MaxAbsDiff(a0, other.data()), 1e-4);
}

// Chunk::token_logits: every row of a prefill chunk, in a pass beside a decode token, is the
// reference decoder's logits at its position; the last is the chunk's own row of `logits`, and
// the decode token's row is what it is without them.
TEST(ModelTest, TokenLogitsAreEveryRowsLogits) {
  kernels::ThreadPool tp(2);
  Loaded l = Load("tiny", WeightFormat::kFp32, WeightFormat::kFp32, KvDtype::kFp32, &tp);
  const ModelConfig& c = l.model->config();
  const size_t V = static_cast<size_t>(c.vocab_size);
  auto ref = *testing::ReferenceDecoder::Load(*l.source);
  std::vector<int> prompt, other = {5, 6, 7};
  for (int i = 0; i < 13; ++i) prompt.push_back((i * 37 + 11) % 256);
  std::vector<PageGrant> g0, g1;
  ASSERT_TRUE(l.pool->table().GrantMany(Owner{0, 1}, 1, &g0).ok());
  ASSERT_TRUE(l.pool->table().GrantMany(Owner{0, 2}, 1, &g1).ok());
  std::vector<float> scratch(V);
  ASSERT_TRUE(l.model->Prefill(other, g1, *l.pool, scratch.data(), &tp).ok());
  const int next = 9;
  std::vector<float> rows(prompt.size() * V), out(2 * V, -1.0f), plain(2 * V, -1.0f);
  std::vector<Model::Chunk> step = {
      {.tokens = prompt, .pos = 0, .pages = g0, .prefill = true, .token_logits = rows.data()},
      {.tokens = std::span(&next, 1), .pos = 3, .pages = g1, .prefill = false}};
  ASSERT_TRUE(l.model->Forward(step, *l.pool, out.data(), &tp).ok());
  for (size_t i = 0; i < prompt.size(); ++i) {
    const std::vector<float> want = ref.Forward(prompt[i], static_cast<int>(i));
    EXPECT_LE(MaxAbsDiff(want, &rows[i * V]), 1e-4) << "row " << i;
  }
  EXPECT_TRUE(std::equal(out.begin(), out.begin() + V, rows.end() - V));
  // The twin without token_logits: the same pass, the same rows of `logits`.
  step[0].token_logits = nullptr;
  ASSERT_TRUE(l.model->Forward(step, *l.pool, plain.data(), &tp).ok());
  EXPECT_EQ(plain, out);
}

TEST(ModelTest, PrefillChecksItsWritePagesBeforeEveryLayer) {
  const TinyModel& t = Fp32Tiny();
  Model& model = *t.model;
  ASSERT_GE(model.config().n_layers, 2);
  for (const bool release : {false, true}) {
    SCOPED_TRACE(release ? "page 1 released after layer 0" : "twin: untouched");
    KvPoolOptions po;
    po.dtype = KvDtype::kFp32;
    po.budget_bytes = model.config().KvBytesPerToken(4) * 16 * 4;
    std::unique_ptr<KvPool> pool = *KvPool::Create(model.config(), po);
    const Owner owner{1, 1};
    std::vector<PageGrant> pages;
    ASSERT_TRUE(pool->table().GrantMany(owner, 2, &pages).ok());
    std::vector<int> tokens(20);  // two pages of 16
    for (int i = 0; i < 20; ++i) tokens[size_t(i)] = 1 + i;
    // The model is shared by the binary's tests: the hook goes when this scope ends, however.
    struct HookReset {
      Model& m;
      ~HookReset() { m.set_layer_hook(nullptr); }
    } reset{model};
    model.set_layer_hook([&](int layer) {
      if (release && layer == 1) {
        EXPECT_FALSE(pool->table().Release(owner, pages[1], false).has_value());
      }
    });
    std::vector<float> logits(size_t(model.config().vocab_size));
    int32_t fault = -1;
    ASSERT_TRUE(model.Prefill(tokens, pages, *pool, logits.data(), nullptr, &fault).ok());
    EXPECT_EQ(fault, release ? 1 : -1);
    // Page 1's bytes: layer 0 was written (before the release); from layer 1 on, nothing.
    const auto* base = static_cast<const uint8_t*>(pool->LayerView(0).k);
    const uint8_t* page1 = base + pool->page_bytes() * size_t(pages[1].page);
    const size_t layer_bytes = pool->page_bytes() / size_t(model.config().n_layers);
    const bool later_layers_zero = std::all_of(page1 + layer_bytes, page1 + pool->page_bytes(),
                                               [](uint8_t b) { return b == 0; });
    EXPECT_EQ(later_layers_zero, release);
    EXPECT_FALSE(std::all_of(page1, page1 + layer_bytes, [](uint8_t b) { return b == 0; }));
  }
}

TEST(ModelTest, BadInputsAreRefusedWithClearErrors) {
  kernels::ThreadPool tp(1);
  Loaded l = Load("tiny", WeightFormat::kFp32, WeightFormat::kFp32, KvDtype::kFp32, &tp);
  std::vector<PageGrant> pages;
  ASSERT_TRUE(l.pool->table().GrantMany(Owner{0, 1}, 1, &pages).ok());
  std::vector<float> logits(l.model->config().vocab_size);
  EXPECT_EQ(l.model->Prefill({}, pages, *l.pool, logits.data(), &tp).code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<int> too_long(17, 1);  // one page holds 16
  EXPECT_EQ(l.model->Prefill(too_long, pages, *l.pool, logits.data(), &tp).code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<int> bad_token = {1, 100000};
  EXPECT_EQ(l.model->Prefill(bad_token, pages, *l.pool, logits.data(), &tp).code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<int> fine = {1, 2};
  EXPECT_TRUE(l.model->Prefill(fine, pages, *l.pool, logits.data(), &tp).ok());
  ModelOptions mo;
  mo.prefill_weights = WeightFormat::kInt4;
  EXPECT_EQ(Model::Load(*l.source, mo, &tp).status().code(), absl::StatusCode::kInvalidArgument);
}

// Quantised configurations stay close to FP32: FP8 KV with FP8/INT4 weights keeps the
// next-token distribution (top-1 agreement is measured in `kvguard eval`; here, the logits
// stay finite and correlated).
TEST(ModelTest, QuantisedConfigurationsStayCloseToFp32) {
  kernels::ThreadPool tp(2);
  Loaded ref = Load("tiny", WeightFormat::kFp32, WeightFormat::kFp32, KvDtype::kFp32, &tp);
  Loaded q = Load("tiny", WeightFormat::kFp8, WeightFormat::kInt4, KvDtype::kFp8E4m3, &tp);
  const int V = ref.model->config().vocab_size;
  std::vector<int> prompt;
  for (int i = 0; i < 30; ++i) prompt.push_back((i * 53 + 5) % 256);
  std::vector<PageGrant> p1, p2;
  ASSERT_TRUE(ref.pool->table().GrantMany(Owner{0, 1}, 2, &p1).ok());
  ASSERT_TRUE(q.pool->table().GrantMany(Owner{0, 1}, 2, &p2).ok());
  std::vector<float> a(V), b(V);
  ASSERT_TRUE(ref.model->Prefill(prompt, p1, *ref.pool, a.data(), &tp).ok());
  ASSERT_TRUE(q.model->Prefill(prompt, p2, *q.pool, b.data(), &tp).ok());
  const Model::DecodeItem i1{7, 30, p1}, i2{7, 30, p2};
  ASSERT_TRUE(ref.model->Decode({&i1, 1}, *ref.pool, a.data(), &tp).ok());
  ASSERT_TRUE(q.model->Decode({&i2, 1}, *q.pool, b.data(), &tp).ok());
  double dot = 0, na = 0, nb = 0;
  for (int i = 0; i < V; ++i) {
    ASSERT_TRUE(std::isfinite(b[i]));
    dot += double{a[i]} * b[i], na += double{a[i]} * a[i], nb += double{b[i]} * b[i];
  }
  EXPECT_GT(dot / std::sqrt(na * nb), 0.95);
}

}  // namespace
}  // namespace kvguard::core
