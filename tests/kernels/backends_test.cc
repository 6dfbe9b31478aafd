// One table compares every SIMD kernel, on every Highway target this CPU supports, with its
// scalar twin (namespace ref), each under a named error budget. The per-kernel suites test
// the references themselves against independent definitions; this table guarantees that no
// backend drifts from them.
//
// Budgets (why each is what it is):
//   kBitExact      codecs and argmax: the format defines one right answer.
//   kF32Accum      matmul (fp32/bf16/fp8 weights) and ops: both sides multiply the same
//                  dequantised values; the SIMD kernel sums in FP32 in a different order than
//                  the FP64 reference, so |err| <= 1e-5 * sum|terms| covers 4096-long sums
//                  (worst-case growth n * 2^-24 ~ 2.4e-4 is never approached by random data;
//                  observed errors are < 1e-6).
//   kInt4ActQuant  INT4 matmul rounds x to int8 per block (s = max|x_block| / 127), so each
//                  output may move by sum_c |w_rc| * s / 2 <= sum_c |w_rc| * max|x| / 254, plus
//                  the FP32 accumulation term above.
//                  With MatMulActivations::kBf16 the reference multiplies x rounded to BF16
//                  where the dispatched kernel does (MatMulArithmetic::kBf16Products): the same
//                  kF32Accum budget then holds against it.
//   kAttention     paged attention: same dequantised K/V on both sides; online softmax with a
//                  polynomial exp in FP32 vs a two-pass FP64 softmax: |err| <= 2e-5 * max|V|.
//   kAttentionBf16Products  the same where the dispatched kernel rounds q and the
//                  probabilities to BF16 (AttentionArithmetic::kBf16Products, attention.h):
//                  kAttention plus ref::Bf16ProductsErrorBound, derived there from the data.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/codec.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/quantize.h"
#include "kernels/formats.h"
#include "tests/kernels/compare.h"

namespace kvguard::kernels {
namespace {

// A case runs the dispatched kernel and its ref twin on the same inputs and returns a
// description of the first out-of-budget element, or "" when every element is within budget.
struct BackendCase {
  std::string name;
  std::string budget;
  std::function<std::string()> run;
};

// Test names carry the case name; print only that (not the object's bytes).
void PrintTo(const BackendCase& c, std::ostream* os) { *os << c.name; }

using testing::CompareBits;
using testing::CompareWithin;
using testing::RandomFloats;

// ---- codecs -------------------------------------------------------------------------------
std::string Fp8EncodeCase() {
  std::vector<float> x = RandomFloats(4099, 1, 200.0f);
  x[5] = NAN;
  x[6] = INFINITY;
  x[7] = 1e-8f;
  std::vector<uint8_t> a(x.size()), b(x.size());
  EncodeFp8(x.data() + 1, x.size() - 1, 0.75f, a.data());
  ref::EncodeFp8(x.data() + 1, x.size() - 1, 0.75f, b.data());
  return CompareBits(a.data(), b.data(), a.size(), 1);
}

std::string Fp8DecodeCase() {
  std::vector<uint8_t> codes(4099);
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>(i * 37 + 11);
  std::vector<float> a(codes.size()), b(codes.size());
  DecodeFp8(codes.data() + 3, codes.size() - 3, 1.5f, a.data());
  ref::DecodeFp8(codes.data() + 3, codes.size() - 3, 1.5f, b.data());
  return CompareBits(a.data(), b.data(), (codes.size() - 3) * 4, 4);
}

std::string Bf16EncodeCase() {
  std::vector<float> x = RandomFloats(4099, 2, 1e3f);
  x[9] = NAN;
  x[10] = 3.4e38f;
  std::vector<uint16_t> a(x.size()), b(x.size());
  EncodeBf16(x.data() + 2, x.size() - 2, a.data());
  ref::EncodeBf16(x.data() + 2, x.size() - 2, b.data());
  return CompareBits(a.data(), b.data(), a.size() * 2, 2);
}

std::string Bf16DecodeCase() {
  std::vector<uint16_t> h(4099);
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<uint16_t>(i * 7919 + 3);
  std::vector<float> a(h.size()), b(h.size());
  DecodeBf16(h.data() + 1, h.size() - 1, a.data());
  ref::DecodeBf16(h.data() + 1, h.size() - 1, b.data());
  return CompareBits(a.data(), b.data(), (h.size() - 1) * 4, 4);
}

// ---- matmul -------------------------------------------------------------------------------
std::string MatMulCase(WeightFormat format, int batch, bool int4_budget, MatMulActivations act,
                       int cols = 512) {
  const int rows = 67;
  const bool bf16_products = MatMulArithmeticFor(format, act) == MatMulArithmetic::kBf16Products;
  const std::vector<float> w = RandomFloats(static_cast<size_t>(rows) * cols, 3, 0.05f);
  const std::vector<float> x = RandomFloats(static_cast<size_t>(batch) * cols, 4);
  const QuantizedMatrix q = QuantizeMatrix(w.data(), rows, cols, format, 128);
  const std::vector<float> deq = DequantizeMatrix(q.view());
  std::vector<float> got(static_cast<size_t>(batch) * rows), want(got.size());
  ThreadPool pool(2);
  MatMul(q.view(), x.data(), batch, got.data(), &pool, act);
  ref::MatMul(q.view(), x.data(), batch, want.data(), nullptr,
              bf16_products ? MatMulActivations::kBf16 : MatMulActivations::kExact);
  std::vector<double> tol(got.size());
  for (int b = 0; b < batch; ++b) {
    double max_x = 0;
    for (int c = 0; c < cols; ++c) max_x = std::max(max_x, std::fabs(double{x[b * cols + c]}));
    for (int r = 0; r < rows; ++r) {
      double sum_wx = 0, sum_w = 0;
      for (int c = 0; c < cols; ++c) {
        sum_wx += std::fabs(double{deq[r * cols + c]} * x[b * cols + c]);
        sum_w += std::fabs(double{deq[r * cols + c]});
      }
      tol[b * rows + r] = 1e-5 * sum_wx + (int4_budget ? sum_w * max_x / 254.0 : 0.0);
    }
  }
  return CompareWithin(got, want, tol);
}

// ---- attention ----------------------------------------------------------------------------
std::string AttentionCase(KvDtype dtype, int head_dim) {
  const int page = 16, kv_heads = 2, heads = 8, pages = 40;
  const std::vector<int> lengths = {1, 15, 16, 17, 300};
  const size_t elems = static_cast<size_t>(pages) * kv_heads * page * head_dim;
  const std::vector<float> kf = RandomFloats(elems, 5), vf = RandomFloats(elems, 6);
  std::vector<uint8_t> kbuf(elems * KvDtypeBytes(dtype)), vbuf(kbuf.size());
  const float scale = 4.0f / 448.0f;
  for (size_t i = 0; i < elems; ++i) {
    StoreKvElement(dtype, kf[i], scale, kbuf.data(), i);
    StoreKvElement(dtype, vf[i], scale, vbuf.data(), i);
  }
  const std::vector<float> scales(kv_heads, scale);
  PagedKvView kv = PackedKvView(dtype, page, kv_heads, head_dim, kbuf.data(), vbuf.data());
  kv.k_scale = scales.data();
  kv.v_scale = scales.data();

  std::vector<int32_t> order(pages);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(8));
  const std::vector<float> q = RandomFloats(lengths.size() * heads * head_dim, 9);
  std::vector<float> got(q.size()), want(q.size());
  std::vector<DecodeQuery> qs_got, qs_want;
  size_t next_page = 0;
  for (size_t r = 0; r < lengths.size(); ++r) {
    DecodeQuery d;
    d.q = q.data() + r * heads * head_dim;
    d.page_table = order.data() + next_page;
    d.length = lengths[r];
    next_page += static_cast<size_t>((lengths[r] + page - 1) / page);
    d.out = got.data() + r * heads * head_dim;
    qs_got.push_back(d);
    d.out = want.data() + r * heads * head_dim;
    qs_want.push_back(d);
  }
  if (next_page > order.size()) return "test bug: not enough pages";
  const float softmax_scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  ThreadPool pool(2);
  PagedDecodeAttention(kv, heads, softmax_scale, qs_got.data(), static_cast<int>(qs_got.size()),
                       &pool);
  ref::PagedDecodeAttention(kv, heads, softmax_scale, qs_want.data(),
                            static_cast<int>(qs_want.size()), nullptr);
  double max_v = 0;
  for (size_t i = 0; i < elems; ++i) {
    max_v = std::max(max_v, std::fabs(double{LoadKvElement(dtype, vbuf.data(), i, scale)}));
  }
  std::vector<double> tol(got.size(), 2e-5 * max_v);
  if (PagedAttentionArithmetic(kv) == AttentionArithmetic::kBf16Products) {
    for (size_t r = 0; r < lengths.size(); ++r) {
      for (int h = 0; h < heads; ++h) {
        const double bound = ref::Bf16ProductsErrorBound(kv, heads, softmax_scale, qs_got[r], h);
        for (int d = 0; d < head_dim; ++d) tol[(r * heads + h) * head_dim + d] += bound;
      }
    }
  }
  return CompareWithin(got, want, tol);
}

// ---- small ops ----------------------------------------------------------------------------
std::string RmsNormCase() {
  const std::vector<float> x = RandomFloats(1031, 10), w = RandomFloats(1031, 11);
  std::vector<float> a(x.size()), b(x.size());
  RmsNorm(x.data(), w.data(), x.size(), 1e-5f, a.data());
  ref::RmsNorm(x.data(), w.data(), x.size(), 1e-5f, b.data());
  std::vector<double> tol(x.size());
  for (size_t i = 0; i < x.size(); ++i) tol[i] = 1e-5 * std::fabs(double{b[i]}) + 1e-7;
  return CompareWithin(a, b, tol);
}

std::string RopeCase() {
  std::vector<float> a = RandomFloats(8 * 128, 12), b = a;
  Rope(a.data(), 8, 128, 40961, 500000.0f);
  ref::Rope(b.data(), 8, 128, 40961, 500000.0f);
  return CompareWithin(a, b, std::vector<double>(a.size(), 1e-5));
}

std::string SiluMulCase() {
  const std::vector<float> g = RandomFloats(1031, 13, 4.0f), u = RandomFloats(1031, 14);
  std::vector<float> a(g.size()), b(g.size());
  SiluMul(g.data(), u.data(), g.size(), a.data());
  ref::SiluMul(g.data(), u.data(), g.size(), b.data());
  std::vector<double> tol(g.size());
  for (size_t i = 0; i < g.size(); ++i) tol[i] = 1e-5 * std::fabs(double{b[i]}) + 1e-7;
  return CompareWithin(a, b, tol);
}

std::string SoftmaxCase() {
  std::vector<float> a = RandomFloats(32003, 15, 6.0f), b = a;
  Softmax(a.data(), a.size());
  ref::Softmax(b.data(), b.size());
  std::vector<double> tol(a.size());
  for (size_t i = 0; i < a.size(); ++i) tol[i] = 1e-5 * std::fabs(double{b[i]}) + 1e-9;
  return CompareWithin(a, b, tol);
}

std::string ArgmaxCase() {
  std::vector<float> x = RandomFloats(32003, 16);
  x[31000] = 100.0f;
  x[31001] = 100.0f;
  const size_t a = Argmax(x.data(), x.size()), b = ref::Argmax(x.data(), x.size());
  return a == b ? "" : "argmax " + std::to_string(a) + " != ref " + std::to_string(b);
}

std::vector<BackendCase> Cases() {
  std::vector<BackendCase> cases = {
      {"fp8_encode", "kBitExact", Fp8EncodeCase},   {"fp8_decode", "kBitExact", Fp8DecodeCase},
      {"bf16_encode", "kBitExact", Bf16EncodeCase}, {"bf16_decode", "kBitExact", Bf16DecodeCase},
      {"rmsnorm", "kF32Accum", RmsNormCase},        {"rope", "kF32Accum", RopeCase},
      {"silu_mul", "kF32Accum", SiluMulCase},       {"softmax", "kF32Accum", SoftmaxCase},
      {"argmax", "kBitExact", ArgmaxCase},
  };
  const std::pair<const char*, WeightFormat> formats[] = {{"fp32", WeightFormat::kFp32},
                                                          {"bf16", WeightFormat::kBf16},
                                                          {"fp8", WeightFormat::kFp8},
                                                          {"int4", WeightFormat::kInt4}};
  for (const auto& [name, format] : formats) {
    const bool int4 = format == WeightFormat::kInt4;
    const char* budget = int4 ? "kInt4ActQuant" : "kF32Accum";
    for (int batch : {1, 5, 64}) {
      cases.push_back({std::string("matmul_") + name + "_batch" + std::to_string(batch), budget,
                       [f = format, batch, int4] {
                         return MatMulCase(f, batch, int4, MatMulActivations::kExact);
                       }});
    }
    // BF16 activations (prefill): every batch shape of the kernel's column vectors, odd columns,
    // and a tail of fewer than 64 FP8 codes per row.
    for (int batch : {1, 5, 16, 37, 64}) {
      cases.push_back({std::string("matmul_") + name + "_bf16x_batch" + std::to_string(batch),
                       budget, [f = format, batch, int4] {
                         return MatMulCase(f, batch, int4, MatMulActivations::kBf16);
                       }});
    }
    if (!int4) {
      cases.push_back(
          {std::string("matmul_") + name + "_bf16x_batch37_cols515", budget,
           [f = format] { return MatMulCase(f, 37, false, MatMulActivations::kBf16, 515); }});
    }
  }
  const std::pair<const char*, KvDtype> dtypes[] = {
      {"fp32", KvDtype::kFp32}, {"bf16", KvDtype::kBf16}, {"fp8", KvDtype::kFp8E4m3}};
  for (const auto& [name, dtype] : dtypes) {
    for (int head_dim : {16, 32, 64, 128}) {
      cases.push_back({std::string("attention_") + name + "_d" + std::to_string(head_dim),
                       "kAttention (kAttentionBf16Products where the kernel uses them)",
                       [d = dtype, head_dim] { return AttentionCase(d, head_dim); }});
    }
  }
  return cases;
}

class BackendsTest : public ::testing::TestWithParam<BackendCase> {};

TEST_P(BackendsTest, EverySupportedTargetMatchesScalarTwin) {
  const std::vector<int64_t> targets = SupportedTargets();
  ASSERT_FALSE(targets.empty());
  for (int64_t target : targets) {
    SCOPED_TRACE("target " + TargetName(target) + ", budget " + GetParam().budget);
    ForceTarget(target);
    const std::string failure = GetParam().run();
    ResetTarget();
    EXPECT_EQ(failure, "");
  }
}

INSTANTIATE_TEST_SUITE_P(Table, BackendsTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace kvguard::kernels
