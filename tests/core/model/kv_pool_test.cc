#include "core/model/kv_pool.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/attention.h"

namespace kvguard::core {
namespace {

ModelConfig Tiny() { return *BuiltinConfig("tiny"); }

TEST(KvPoolTest, CapacityFollowsBudgetAndDtype) {
  const ModelConfig c = Tiny();
  const size_t budget = 8 << 20;
  KvPoolOptions o;
  o.budget_bytes = budget;
  o.dtype = kernels::KvDtype::kFp8E4m3;
  auto fp8 = KvPool::Create(c, o);
  o.dtype = kernels::KvDtype::kBf16;
  auto bf16 = KvPool::Create(c, o);
  o.dtype = kernels::KvDtype::kFp32;
  auto fp32 = KvPool::Create(c, o);
  ASSERT_TRUE(fp8.ok() && bf16.ok() && fp32.ok());
  EXPECT_EQ((*fp8)->page_bytes(), c.KvBytesPerToken(1) * 16);
  EXPECT_EQ((*fp8)->capacity_tokens(), int64_t(budget / (*fp8)->page_bytes()) * 16);
  // The format's whole point: twice the tokens of BF16 in the same bytes.
  EXPECT_GE(double((*fp8)->capacity_tokens()) / double((*bf16)->capacity_tokens()), 1.99);
  EXPECT_GE(double((*bf16)->capacity_tokens()) / double((*fp32)->capacity_tokens()), 1.99);
}

TEST(KvPoolTest, BudgetBelowOnePageIsAClearError) {
  KvPoolOptions o;
  o.budget_bytes = 100;
  const auto pool = KvPool::Create(Tiny(), o);
  ASSERT_FALSE(pool.ok());
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(pool.status().message().find("does not hold one page"), std::string::npos);
  o.budget_bytes = 1 << 20;
  EXPECT_TRUE(KvPool::Create(Tiny(), o).ok());
}

TEST(KvPoolTest, ScalesMustBeFinitePositiveAndComplete) {
  const ModelConfig c = Tiny();
  KvPoolOptions o;
  o.budget_bytes = 1 << 20;
  auto pool = *KvPool::Create(c, o);
  const size_t n = size_t(c.n_layers) * c.n_kv_heads;
  EXPECT_FALSE(pool->SetFp8Scales(std::vector<float>(n - 1, 1.f), std::vector<float>(n, 1.f)).ok());
  EXPECT_FALSE(pool->SetFp8Scales(std::vector<float>(n, 0.f), std::vector<float>(n, 1.f)).ok());
  EXPECT_FALSE(pool->SetFp8Scales(std::vector<float>(n, NAN), std::vector<float>(n, 1.f)).ok());
  EXPECT_TRUE(pool->SetFp8Scales(std::vector<float>(n, .5f), std::vector<float>(n, .25f)).ok());
}

// A new pool holds no bytes from before it existed (heap memory may hold an earlier pool's KV):
// every page reads zero until someone writes it; its twin: a written token is not zero.
TEST(KvPoolTest, NewPoolIsZeroedAndAWrittenTokenIsNot) {
  const ModelConfig c = Tiny();
  for (auto dtype :
       {kernels::KvDtype::kFp32, kernels::KvDtype::kBf16, kernels::KvDtype::kFp8E4m3}) {
    KvPoolOptions o;
    o.budget_bytes = 1 << 20;
    o.dtype = dtype;
    auto pool = *KvPool::Create(c, o);
    const kernels::PagedKvView view = pool->LayerView(0);
    const uint8_t* base = static_cast<const uint8_t*>(view.k);
    const size_t bytes = size_t(pool->num_pages()) * pool->page_bytes();
    auto nonzero = [&] {
      size_t n = 0;
      for (size_t i = 0; i < bytes; ++i) n += base[i] != 0;
      return n;
    };
    EXPECT_EQ(nonzero(), 0u) << kernels::KvDtypeName(dtype);
    const size_t heads = size_t(c.n_layers) * c.n_kv_heads;
    ASSERT_TRUE(
        pool->SetFp8Scales(std::vector<float>(heads, 0.01f), std::vector<float>(heads, 0.01f))
            .ok());
    std::vector<PageGrant> pages;
    ASSERT_TRUE(pool->table().GrantMany(Owner{0, 1}, 1, &pages).ok());
    const std::vector<float> kv(size_t(c.kv_dim()), 0.5f);
    pool->WriteToken(0, pages[0], 0, kv.data(), kv.data());
    EXPECT_GT(nonzero(), 0u) << kernels::KvDtypeName(dtype);
  }
}

// What WriteToken stores is what the attention kernel reads: one token written into a page
// attends to itself with weight 1, so the output equals its (dequantised) V.
TEST(KvPoolTest, WrittenTokenIsWhatAttentionReads) {
  const ModelConfig c = Tiny();
  for (auto dtype :
       {kernels::KvDtype::kFp32, kernels::KvDtype::kBf16, kernels::KvDtype::kFp8E4m3}) {
    KvPoolOptions o;
    o.budget_bytes = 1 << 20;
    o.dtype = dtype;
    auto pool = *KvPool::Create(c, o);
    const size_t n = size_t(c.n_layers) * c.n_kv_heads;
    ASSERT_TRUE(
        pool->SetFp8Scales(std::vector<float>(n, 0.01f), std::vector<float>(n, 0.01f)).ok());
    std::vector<PageGrant> pages;
    ASSERT_TRUE(pool->table().GrantMany(Owner{0, 1}, 2, &pages).ok());
    std::vector<float> k(c.kv_dim()), v(c.kv_dim()), q(c.q_dim(), 0.1f), out(c.q_dim());
    for (int i = 0; i < c.kv_dim(); ++i) {
      k[i] = 0.01f * i;
      v[i] = 1.0f - 0.02f * i;
    }
    // A one-token sequence in slot 0 of the second page (another layer's data must not
    // interfere: layer 0 of the same page is written with different values).
    pool->WriteToken(1, pages[1], 0, k.data(), v.data());
    pool->WriteToken(0, pages[1], 0, q.data(), q.data());
    const int32_t table[1] = {pages[1].page};
    kernels::DecodeQuery query{q.data(), table, 1, out.data()};
    kernels::ref::PagedDecodeAttention(pool->LayerView(1), c.n_heads, 1.0f, &query, 1, nullptr);
    // Half an ulp of the format, relative: FP8 e4m3 keeps 3 mantissa bits, BF16 7.
    const double rel = dtype == kernels::KvDtype::kFp32   ? 1e-6
                       : dtype == kernels::KvDtype::kBf16 ? 0x1p-8
                                                          : 0x1p-4;
    for (int h = 0; h < c.n_heads; ++h) {
      const int kvh = h / (c.n_heads / c.n_kv_heads);
      for (int d = 0; d < c.head_dim; ++d) {
        const float want = v[kvh * c.head_dim + d];
        EXPECT_NEAR(out[h * c.head_dim + d], want, rel * std::fabs(want) + 1e-6)
            << kernels::KvDtypeName(dtype) << " head " << h << " dim " << d;
      }
    }
    // A release with scrub (strict tenants) zeroes the page before it is free again; the
    // test reads it afterwards without a tag check, as only a test may.
    ASSERT_FALSE(pool->table().Release(Owner{0, 1}, pages[1], /*scrub=*/true).has_value());
    kernels::ref::PagedDecodeAttention(pool->LayerView(1), c.n_heads, 1.0f, &query, 1, nullptr);
    for (float x : out) EXPECT_EQ(x, 0.0f) << "scrubbed page still holds data";
  }
}

}  // namespace
}  // namespace kvguard::core
