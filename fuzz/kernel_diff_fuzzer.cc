// fuzz/kernel_diff_fuzzer.cc: differential fuzzing of the SIMD kernels (the dispatched
// Highway target) against their scalar twins (namespace ref), on inputs the fuzzer shapes:
// raw float bit patterns (NaN, infinities, subnormals, huge values), odd lengths and
// alignments, and scales. Budgets as in tests/kernels/backends_test.cc:
//   FP8 and BF16 codecs   bit-exact (the format defines one right answer)
//   INT4 matmul           |err| <= 1e-5 * sum|w x| + sum|w| * max|x| / 254 (per-block int8
//                         activation rounding), on finite inputs
//   FP8 / BF16 matmul     |err| <= 1e-5 * sum|w x| against the reference multiplying x as the
//                         kernel does (exact, or rounded to BF16 with MatMulActivations::kBf16
//                         where MatMulArithmeticFor says kBf16Products), on finite inputs; and
//                         column 0's outputs alone equal, bit for bit, those in the batch
//   paged attention       |err| <= 2e-5 * max|V| (FP32 online softmax vs FP64 two-pass), plus
//                         ref::Bf16ProductsErrorBound where the kernel rounds q and the
//                         probabilities to BF16 (FP8/BF16 KV, head dims 64/128 on AVX-512 BF16
//                         CPUs); head dims 16..128, NaN in every slot past the length (never
//                         loaded), and the in-kernel tag check on half the inputs (same verdict)
// A mismatch prints the case and aborts.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/codec.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/quantize.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/formats.h"

namespace kvguard::kernels {
namespace {

[[noreturn]] void Mismatch(const char* kernel, size_t i, double got, double want, double tol) {
  std::fprintf(stderr,
               "==kvguard-fuzz== ORACLE simd-vs-scalar: %s element %zu: got %.9g, want "
               "%.9g (budget %.3g)\n",
               kernel, i, got, want, tol);
  std::abort();
}

float AnyFloat(FuzzedDataProvider& in) {
  const uint32_t bits = in.ConsumeIntegral<uint32_t>();
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// A finite float of moderate size: what activations and weights look like.
float FiniteFloat(FuzzedDataProvider& in, float range) {
  return in.ConsumeFloatingPointInRange<float>(-range, range);
}

void Codecs(FuzzedDataProvider& in) {
  const size_t n = in.ConsumeIntegralInRange<size_t>(0, 300);
  const size_t offset = in.ConsumeIntegralInRange<size_t>(0, 7);
  std::vector<float> x(n + offset);
  for (float& f : x) f = AnyFloat(in);
  float scale = std::fabs(FiniteFloat(in, 1e4f));
  if (!(scale > 1e-30f)) scale = 1.0f;
  std::vector<uint8_t> a(n + 1), b(n + 1);
  EncodeFp8(x.data() + offset, n, scale, a.data());
  ref::EncodeFp8(x.data() + offset, n, scale, b.data());
  for (size_t i = 0; i < n; ++i) {
    if (a[i] != b[i]) Mismatch("EncodeFp8", i, a[i], b[i], 0);
  }
  std::vector<float> da(n + 1), db(n + 1);
  DecodeFp8(a.data(), n, scale, da.data());
  ref::DecodeFp8(a.data(), n, scale, db.data());
  if (std::memcmp(da.data(), db.data(), n * 4) != 0) {
    for (size_t i = 0; i < n; ++i) {
      if (std::memcmp(&da[i], &db[i], 4) != 0) Mismatch("DecodeFp8", i, da[i], db[i], 0);
    }
  }
  std::vector<uint16_t> ha(n + 1), hb(n + 1);
  EncodeBf16(x.data() + offset, n, ha.data());
  ref::EncodeBf16(x.data() + offset, n, hb.data());
  for (size_t i = 0; i < n; ++i) {
    if (ha[i] != hb[i]) Mismatch("EncodeBf16", i, ha[i], hb[i], 0);
  }
  DecodeBf16(ha.data(), n, da.data());
  ref::DecodeBf16(ha.data(), n, db.data());
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(&da[i], &db[i], 4) != 0) Mismatch("DecodeBf16", i, da[i], db[i], 0);
  }
}

void Int4MatMul(FuzzedDataProvider& in, ThreadPool* pool) {
  const int group = 32 << in.ConsumeIntegralInRange(0, 2);
  // Up to 3 blocks of 16 rows: calls of one and of two blocks, partial last blocks.
  const int rows = in.ConsumeIntegralInRange(1, 48);
  const int cols = group * in.ConsumeIntegralInRange(1, 3);
  const int batch = in.ConsumeIntegralInRange(1, 5);
  const float wr = in.ConsumeFloatingPointInRange<float>(1e-3f, 10.0f);
  const float xr = in.ConsumeFloatingPointInRange<float>(1e-3f, 100.0f);
  std::vector<float> w(size_t(rows) * cols), x(size_t(batch) * cols);
  for (float& f : w) f = FiniteFloat(in, wr);
  for (float& f : x) f = FiniteFloat(in, xr);
  const QuantizedMatrix q = QuantizeMatrix(w.data(), rows, cols, WeightFormat::kInt4, group);
  const std::vector<float> deq = DequantizeMatrix(q.view());
  std::vector<float> got(size_t(batch) * rows), want(got.size());
  MatMul(q.view(), x.data(), batch, got.data(), pool);
  ref::MatMul(q.view(), x.data(), batch, want.data(), nullptr);
  for (int b = 0; b < batch; ++b) {
    double max_x = 0;
    for (int c = 0; c < cols; ++c)
      max_x = std::max(max_x, std::fabs(double{x[size_t(b) * cols + c]}));
    for (int r = 0; r < rows; ++r) {
      double sum_wx = 0, sum_w = 0;
      for (int c = 0; c < cols; ++c) {
        const double dw = std::fabs(double{deq[size_t(r) * cols + c]});
        sum_wx += dw * std::fabs(double{x[size_t(b) * cols + c]});
        sum_w += dw;
      }
      const double tol = 1e-5 * sum_wx + sum_w * max_x / 254.0 + 1e-30;
      const size_t i = size_t(b) * rows + r;
      if (!(std::fabs(double{got[i]} - double{want[i]}) <= tol)) {
        Mismatch("MatMul int4", i, got[i], want[i], tol);
      }
    }
  }
}

void FpMatMul(FuzzedDataProvider& in, ThreadPool* pool) {
  const WeightFormat format = in.ConsumeBool() ? WeightFormat::kFp8 : WeightFormat::kBf16;
  const MatMulActivations act =
      in.ConsumeBool() ? MatMulActivations::kBf16 : MatMulActivations::kExact;
  const int rows = in.ConsumeIntegralInRange(1, 60);
  const int cols = in.ConsumeIntegralInRange(1, 200);
  const int batch = in.ConsumeIntegralInRange(1, 64);
  const float wr = in.ConsumeFloatingPointInRange<float>(1e-3f, 10.0f);
  const float xr = in.ConsumeFloatingPointInRange<float>(1e-3f, 100.0f);
  std::vector<float> w(size_t(rows) * cols), x(size_t(batch) * cols);
  for (float& f : w) f = FiniteFloat(in, wr);
  for (float& f : x) f = FiniteFloat(in, xr);
  const QuantizedMatrix q = QuantizeMatrix(w.data(), rows, cols, format, 128);
  const std::vector<float> deq = DequantizeMatrix(q.view());
  const bool bf16 = MatMulArithmeticFor(format, act) == MatMulArithmetic::kBf16Products;
  std::vector<float> got(size_t(batch) * rows), want(got.size()), alone(static_cast<size_t>(rows));
  MatMul(q.view(), x.data(), batch, got.data(), pool, act);
  ref::MatMul(q.view(), x.data(), batch, want.data(), nullptr,
              bf16 ? MatMulActivations::kBf16 : MatMulActivations::kExact);
  MatMul(q.view(), x.data(), 1, alone.data(), pool, act);
  for (int r = 0; r < rows; ++r) {
    if (std::memcmp(&alone[size_t(r)], &got[size_t(r)], 4) != 0) {
      Mismatch("MatMul fp: column 0 alone vs in its batch", size_t(r), alone[size_t(r)],
               got[size_t(r)], 0);
    }
  }
  for (int b = 0; b < batch; ++b) {
    for (int r = 0; r < rows; ++r) {
      double sum_wx = 0;
      for (int c = 0; c < cols; ++c) {
        sum_wx += std::fabs(double{deq[size_t(r) * cols + c]} * double{x[size_t(b) * cols + c]});
      }
      const double tol = 1e-5 * sum_wx + 1e-30;
      const size_t i = size_t(b) * rows + r;
      if (!(std::fabs(double{got[i]} - double{want[i]}) <= tol)) {
        Mismatch(bf16 ? "MatMul fp (bf16 products)" : "MatMul fp", i, got[i], want[i], tol);
      }
    }
  }
}

void Attention(FuzzedDataProvider& in, ThreadPool* pool) {
  const KvDtype dtype = static_cast<KvDtype>(in.ConsumeIntegralInRange(0, 2));
  static constexpr int kHeadDims[] = {16, 32, 48, 64, 128};  // 64 and 128 are the tuned ones
  const int head_dim = kHeadDims[in.ConsumeIntegralInRange(0, 4)];
  const int page = in.ConsumeIntegralInRange(1, 16);
  const int kv_heads = in.ConsumeIntegralInRange(1, 2);
  const int heads = kv_heads * in.ConsumeIntegralInRange(1, 4);
  const int length = in.ConsumeIntegralInRange(1, 48);
  const int pages = (length + page - 1) / page + in.ConsumeIntegralInRange(0, 3);
  const float range = in.ConsumeFloatingPointInRange<float>(1e-2f, 8.0f);
  const size_t elems = size_t(pages) * kv_heads * page * head_dim;
  // A few input-chosen values, the rest a cheap deterministic pattern seeded by the input.
  uint32_t seed = in.ConsumeIntegral<uint32_t>() | 1;
  auto next = [&seed, range]() {
    seed ^= seed << 13;
    seed ^= seed >> 17;
    seed ^= seed << 5;
    return (float(seed % 20001) / 10000.0f - 1.0f) * range;
  };
  std::vector<float> kf(elems), vf(elems);
  for (size_t i = 0; i < elems; ++i) {
    kf[i] = next();
    vf[i] = next();
  }
  for (int i = 0; i < 16 && in.remaining_bytes() > 8; ++i) {
    const size_t at = in.ConsumeIntegralInRange<size_t>(0, elems - 1);
    kf[at] = FiniteFloat(in, 50.0f);
    vf[at] = FiniteFloat(in, 50.0f);
  }
  std::vector<uint8_t> kbuf(elems * KvDtypeBytes(dtype)), vbuf(kbuf.size());
  float max_abs = 0;
  for (size_t i = 0; i < elems; ++i)
    max_abs = std::max({max_abs, std::fabs(kf[i]), std::fabs(vf[i])});
  const float scale = std::max(max_abs, 1e-3f) / 448.0f;
  double max_v = 0;
  for (size_t i = 0; i < elems; ++i) {
    StoreKvElement(dtype, kf[i], scale, kbuf.data(), i);
    StoreKvElement(dtype, vf[i], scale, vbuf.data(), i);
    max_v = std::max(max_v, std::fabs(double{LoadKvElement(dtype, vbuf.data(), i, scale)}));
  }
  const std::vector<float> scales(size_t(kv_heads), scale);
  PagedKvView kv = PackedKvView(dtype, page, kv_heads, head_dim, kbuf.data(), vbuf.data());
  kv.k_scale = scales.data();
  kv.v_scale = scales.data();
  std::vector<int32_t> table(static_cast<size_t>(pages));
  std::iota(table.begin(), table.end(), 0);
  for (size_t i = table.size(); i > 1; --i) {
    std::swap(table[i - 1], table[in.ConsumeIntegralInRange<size_t>(0, i - 1)]);
  }
  // Slots past the request's length hold NaN, as stale bytes may: neither kernel may load them.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const int used = (length + page - 1) / page;
  for (int t = length; t < used * page; ++t) {
    const size_t base = size_t(table[size_t(t / page)]) * size_t(kv.page_stride);
    for (int h = 0; h < kv_heads; ++h) {
      const size_t head = base + size_t(h) * size_t(kv.head_stride);
      for (int d = 0; d < head_dim; ++d) {
        StoreKvElement(dtype, nan, scale, kbuf.data(), head + size_t(d) * page + t % page);
        StoreKvElement(dtype, nan, scale, vbuf.data(), head + size_t(t % page) * head_dim + d);
      }
    }
  }
  std::vector<float> q(size_t(heads) * head_dim);
  for (float& f : q) f = next();
  std::vector<float> got(q.size()), want(q.size());
  DecodeQuery dg;
  dg.q = q.data();
  dg.page_table = table.data();
  dg.length = length;
  dg.out = got.data();
  DecodeQuery dw = dg;
  dw.out = want.data();
  // Half the inputs run the in-kernel tag check, with every tag right or one of them wrong:
  // both kernels must name the same page and write nothing else.
  std::vector<PageTag> tags(static_cast<size_t>(pages)), expected(static_cast<size_t>(used));
  int32_t fault_got = -2, fault_want = -2;
  const bool tagged = in.ConsumeBool();
  if (tagged) {
    for (int p = 0; p < pages; ++p)
      tags[size_t(p)] = PageTag{uint64_t(seed) * 2654435761u + 1, uint64_t(p) + 1};
    for (int i = 0; i < used; ++i) expected[size_t(i)] = tags[size_t(table[size_t(i)])];
    if (in.ConsumeBool()) expected[in.ConsumeIntegralInRange<size_t>(0, size_t(used) - 1)].hi ^= 1;
    kv.page_tags = tags.data();
    kv.num_pages = pages;
    dg.expected_tags = dw.expected_tags = expected.data();
    dg.tag_fault = &fault_got;
    dw.tag_fault = &fault_want;
  }
  const float softmax_scale = 1.0f / std::sqrt(float(head_dim));
  PagedDecodeAttention(kv, heads, softmax_scale, &dg, 1, pool);
  ref::PagedDecodeAttention(kv, heads, softmax_scale, &dw, 1, nullptr);
  if (fault_got != fault_want) Mismatch("tag check fault index", 0, fault_got, fault_want, 0);
  const bool bf16 = PagedAttentionArithmetic(kv) == AttentionArithmetic::kBf16Products;
  fprintf(stderr, "DEBUG dtype %d dim %d page %d kvh %d heads %d len %d pages %d tagged %d\n",
          int(dtype), head_dim, page, kv_heads, heads, length, pages, int(tagged));
  for (size_t i = 0; i < got.size(); ++i) {
    double tol = 2e-5 * max_v + 1e-30;
    if (bf16) {
      tol += ref::Bf16ProductsErrorBound(kv, heads, softmax_scale, dw,
                                         static_cast<int>(i / size_t(head_dim)));
    }
    if (!(std::fabs(double{got[i]} - double{want[i]}) <= tol)) {
      Mismatch("PagedDecodeAttention", i, got[i], want[i], tol);
    }
  }
}

}  // namespace
}  // namespace kvguard::kernels

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static kvguard::kernels::ThreadPool pool(1);
  FuzzedDataProvider in(data, size);
  switch (in.ConsumeIntegralInRange(0, 3)) {
    case 0:
      kvguard::kernels::Codecs(in);
      break;
    case 1:
      kvguard::kernels::Int4MatMul(in, &pool);
      break;
    case 3:
      kvguard::kernels::FpMatMul(in, &pool);
      break;
    default:
      kvguard::kernels::Attention(in, &pool);
      break;
  }
  return 0;
}
