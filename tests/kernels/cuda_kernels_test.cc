// The CUDA kernels against their CPU scalar twins (namespace ref): one table of cases, each
// under a named budget, as backends_test.cc does for the SIMD kernels; then the in-kernel tag
// check under the isolation layer's fault scenarios. Every test skips with the CUDA runtime's
// reason where no GPU is present; CI compiles and links them, and scripts/gpu-check runs them
// (also under compute-sanitizer) where a GPU is.
//
// Budgets:
//   kBitExact   KV quantise-on-write and argmax: one right answer.
//   kF32Accum   matmul (every weight format: the CUDA kernel dequantises exactly and sums in
//               FP32, so |err| <= 1e-5 sum |w x|, as for the CPU's FP32-arithmetic formats; the
//               CPU INT4 kernel's int8 activation rounding does not happen on the GPU) and the
//               per-token ops (1e-5 relative).
//   kAttention  FP32 scores and online softmax over exactly decoded K and V against the FP64
//               reference: |err| <= 2e-5 max|V| (the CPU FP32 kernel's budget).
#include <cuda_runtime.h>
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
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/quantize.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/kv_write.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/ops.h"
#include "kernels/formats.h"
#include "tests/kernels/compare.h"
#include "tests/kernels/cuda_buffers.h"

namespace kvguard::kernels {
namespace {

using testing::CompareBits;
using testing::CompareWithin;
using testing::DeviceBuffer;
using testing::RandomFloats;

// ---- matmul ------------------------------------------------------------------------------
std::string MatMulCase(WeightFormat format, int rows, int cols, int batch, int group) {
  const std::vector<float> w = RandomFloats(static_cast<size_t>(rows) * cols, 3, 0.05f);
  const std::vector<float> x = RandomFloats(static_cast<size_t>(batch) * cols, 4);
  const QuantizedMatrix q = QuantizeMatrix(w.data(), rows, cols, format, group);
  const std::vector<float> deq = DequantizeMatrix(q.view());
  std::vector<float> want(static_cast<size_t>(batch) * rows);
  ref::MatMul(q.view(), x.data(), batch, want.data(), nullptr);
  DeviceBuffer<uint8_t> data(q.data);
  DeviceBuffer<float> row_scales(q.row_scales);
  DeviceBuffer<uint16_t> group_scales(q.group_scales);
  DeviceBuffer<float> dx(x), dy(want.size());
  WeightView dv = q.view();
  dv.data = data.get();
  if (!q.row_scales.empty()) dv.row_scales = row_scales.get();
  if (!q.group_scales.empty()) dv.group_scales = group_scales.get();
  const absl::Status s = cuda::MatMul(dv, dx.get(), batch, dy.get(), nullptr);
  if (!s.ok()) return std::string(s.message());
  const std::vector<float> got = dy.Download();
  std::vector<double> tol(got.size());
  for (int b = 0; b < batch; ++b) {
    for (int r = 0; r < rows; ++r) {
      double sum = 0;
      for (int c = 0; c < cols; ++c) {
        sum += std::fabs(double{deq[size_t(r) * cols + c]} * x[size_t(b) * cols + c]);
      }
      tol[size_t(b) * rows + r] = 1e-5 * sum + 1e-30;
    }
  }
  return CompareWithin(got, want, tol);
}

// ---- paged attention -----------------------------------------------------------------------
struct AttentionSpec {
  KvDtype dtype = KvDtype::kFp8E4m3;
  int head_dim = 128;
  int kv_heads = 2;
  int group = 4;
  int page = 16;
  std::vector<int> lengths = {1, 15, 16, 17, 300};
};

// AttentionPool is a shuffled paged pool with random K and V, on the host and the device, and
// the queries of `spec`: the shared setup of the attention and tag-check tests.
struct AttentionPool {
  explicit AttentionPool(const AttentionSpec& s) : spec(s) {
    const int heads = s.kv_heads * s.group;
    int pages = 1;
    for (int l : s.lengths) pages += (l + s.page - 1) / s.page;
    num_pages = pages + 3;
    const size_t elems = size_t(num_pages) * s.kv_heads * s.page * s.head_dim;
    // Every slot no request may read (past a length, unused pages) holds NaN codes: a kernel
    // that loads one turns its output into NaN. Per-head K and V scales all differ.
    kbuf.resize(elems * KvDtypeBytes(s.dtype));
    vbuf.resize(kbuf.size());
    for (size_t i = 0; i < elems; ++i) {
      StoreKvElement(s.dtype, NAN, 1.0f, kbuf.data(), i);
      StoreKvElement(s.dtype, NAN, 1.0f, vbuf.data(), i);
    }
    for (int h = 0; h < s.kv_heads; ++h) {
      k_scales.push_back((3.0f + h) / 448.0f);
      v_scales.push_back((2.0f + 0.5f * h) / 448.0f);
    }
    std::vector<int32_t> order(num_pages);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(8));
    size_t next = 0;
    for (int l : s.lengths) {
      offsets.push_back(static_cast<int32_t>(page_ids.size()));
      for (int i = 0; i < (l + s.page - 1) / s.page; ++i) page_ids.push_back(order[next++]);
    }
    const PagedKvView kv = HostView();
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (size_t r = 0; r < s.lengths.size(); ++r) {
      for (int t = 0; t < s.lengths[r]; ++t) {
        const int64_t page = page_ids[size_t(offsets[r] + t / s.page)];
        for (int h = 0; h < s.kv_heads; ++h) {
          const int64_t base = page * kv.page_stride + h * kv.head_stride;
          for (int d = 0; d < s.head_dim; ++d) {
            const size_t ki = size_t(base + int64_t{d} * s.page + t % s.page);
            const size_t vi = size_t(base + int64_t{t % s.page} * s.head_dim + d);
            StoreKvElement(s.dtype, normal(rng) * (1.0f + h), k_scales[h], kbuf.data(), ki);
            StoreKvElement(s.dtype, normal(rng) + 0.5f * h, v_scales[h], vbuf.data(), vi);
            max_v = std::max(
                max_v, std::fabs(double{LoadKvElement(s.dtype, vbuf.data(), vi, v_scales[h])}));
          }
        }
      }
    }
    q = RandomFloats(s.lengths.size() * heads * s.head_dim, 9);
    tags.resize(size_t(num_pages));
    for (size_t p = 0; p < tags.size(); ++p) tags[p] = PageTag{0x9E3779B97F4A7C15ull * (p + 1), ~p};
    for (int32_t p : page_ids) expected.push_back(tags[size_t(p)]);
  }

  PagedKvView HostView() const {
    PagedKvView kv =
        PackedKvView(spec.dtype, spec.page, spec.kv_heads, spec.head_dim, kbuf.data(), vbuf.data());
    kv.k_scale = k_scales.data();
    kv.v_scale = v_scales.data();
    return kv;
  }

  // Reference runs the CPU reference: [request][heads * head_dim] flattened.
  std::vector<float> Reference() const {
    const int heads = spec.kv_heads * spec.group;
    std::vector<float> out(q.size());
    std::vector<DecodeQuery> qs;
    for (size_t r = 0; r < spec.lengths.size(); ++r) {
      DecodeQuery d;
      d.q = q.data() + r * heads * spec.head_dim;
      d.page_table = page_ids.data() + offsets[r];
      d.length = spec.lengths[r];
      d.out = out.data() + r * heads * spec.head_dim;
      qs.push_back(d);
    }
    ref::PagedDecodeAttention(HostView(), heads, Scale(), qs.data(), static_cast<int>(qs.size()),
                              nullptr);
    return out;
  }

  // RunDevice runs the CUDA kernel; with `expected_tags` (one per entry of page_ids) the tag
  // check is on and *faults receives its verdicts. `device_tags`: the pool's current tags.
  std::string RunDevice(std::vector<float>* out, const std::vector<PageTag>* device_tags,
                        const std::vector<PageTag>* expected_tags,
                        std::vector<int32_t>* faults) const {
    const int heads = spec.kv_heads * spec.group;
    DeviceBuffer<uint8_t> k(kbuf), v(vbuf);
    DeviceBuffer<float> dks(k_scales), dvs(v_scales), dq(q), dout(q.size());
    std::vector<int32_t> lengths(spec.lengths.begin(), spec.lengths.end());
    DeviceBuffer<int32_t> dlengths(lengths), doffsets(offsets), dids(page_ids);
    DeviceBuffer<PageTag> dtags(device_tags != nullptr ? *device_tags : std::vector<PageTag>(1));
    DeviceBuffer<PageTag> dexp(expected_tags != nullptr ? *expected_tags : std::vector<PageTag>(1));
    DeviceBuffer<int32_t> dfaults(lengths.size());
    PagedKvView kv = HostView();
    kv.k = k.get();
    kv.v = v.get();
    kv.k_scale = dks.get();
    kv.v_scale = dvs.get();
    if (device_tags != nullptr) {
      kv.page_tags = dtags.get();
      kv.num_pages = static_cast<int32_t>(device_tags->size());
    }
    cuda::DeviceDecodeBatch batch;
    batch.num_queries = static_cast<int>(lengths.size());
    batch.max_length = *std::max_element(lengths.begin(), lengths.end());
    batch.q = dq.get();
    batch.out = dout.get();
    batch.lengths = dlengths.get();
    batch.table_offsets = doffsets.get();
    batch.page_ids = dids.get();
    if (expected_tags != nullptr) {
      batch.expected_tags = dexp.get();
      batch.tag_faults = dfaults.get();
    }
    // The workspace starts as garbage (0x7F bytes: huge finite floats) and serves two calls:
    // no result may depend on what it held before.
    const size_t ws = cuda::AttentionWorkspaceBytes(kv, heads, batch.num_queries, batch.max_length);
    DeviceBuffer<uint8_t> workspace(std::vector<uint8_t>(ws, 0x7F));
    for (int call = 0; call < 2; ++call) {
      const absl::Status s =
          cuda::PagedDecodeAttention(kv, heads, Scale(), batch, workspace.get(), ws, nullptr);
      if (!s.ok()) return std::string(s.message());
    }
    *out = dout.Download();
    if (faults != nullptr) *faults = dfaults.Download();
    return "";
  }

  float Scale() const { return 1.0f / std::sqrt(static_cast<float>(spec.head_dim)); }

  AttentionSpec spec;
  int num_pages = 0;
  std::vector<uint8_t> kbuf, vbuf;
  std::vector<float> k_scales, v_scales, q;
  std::vector<int32_t> page_ids, offsets;
  std::vector<PageTag> tags, expected;
  double max_v = 0;
};

std::string AttentionCase(const AttentionSpec& spec) {
  const AttentionPool pool(spec);
  std::vector<float> got;
  if (std::string e = pool.RunDevice(&got, nullptr, nullptr, nullptr); !e.empty()) return e;
  return CompareWithin(got, pool.Reference(), std::vector<double>(got.size(), 2e-5 * pool.max_v));
}

// ---- quantise-on-write ---------------------------------------------------------------------
// KvWriteSetup is a small pool and `count` tokens to write into it: the host's expected bytes
// come from the CPU convention (StoreKvElement, as core/model/kv_pool.cc WriteToken).
struct KvWriteSetup {
  static constexpr int kKvHeads = 3, kDim = 64, kPage = 16, kPages = 5;
  explicit KvWriteSetup(KvDtype dtype, std::vector<cuda::KvSlot> slots_in) : slots(slots_in) {
    const size_t elems = size_t(kPages) * kKvHeads * kPage * kDim;
    kwant.assign(elems * KvDtypeBytes(dtype), 0);
    vwant.assign(kwant.size(), 0);
    const int count = static_cast<int>(slots.size());
    k = RandomFloats(size_t(count) * kKvHeads * kDim, 11, 2.0f);
    v = RandomFloats(k.size(), 12, 2.0f);
    k[5] = 1e30f;  // saturates in FP8
    v[9] = -1e-30f;
    const int64_t head_stride = int64_t{kPage} * kDim, page_stride = head_stride * kKvHeads;
    for (int i = 0; i < count; ++i) {
      if (slots[i].page < 0 || slots[i].page >= kPages || slots[i].slot < 0 ||
          slots[i].slot >= kPage) {
        continue;  // skipped by the kernel
      }
      for (int h = 0; h < kKvHeads; ++h) {
        for (int d = 0; d < kDim; ++d) {
          const size_t src = (size_t(i) * kKvHeads + h) * kDim + d;
          const int64_t base = slots[i].page * page_stride + h * head_stride;
          StoreKvElement(dtype, k[src], k_scales[h], kwant.data(),
                         base + d * kPage + slots[i].slot);
          StoreKvElement(dtype, v[src], v_scales[h], vwant.data(), base + slots[i].slot * kDim + d);
        }
      }
    }
  }
  // Run writes on the device (into zeroed pages) and returns "" or the error; *bad receives the
  // kernel's count of skipped slots.
  std::string Run(KvDtype dtype, int32_t num_pages, std::vector<uint8_t>* kgot,
                  std::vector<uint8_t>* vgot, int32_t* bad, int count_override = -2) const {
    DeviceBuffer<uint8_t> dk(std::vector<uint8_t>(kwant.size(), 0)), dv(dk.Download());
    DeviceBuffer<float> dkx(k), dvx(v), dks(k_scales), dvs(v_scales);
    DeviceBuffer<cuda::KvSlot> dslots(slots);
    DeviceBuffer<int32_t> dbad(std::vector<int32_t>{0});
    PagedKvView kv = PackedKvView(dtype, kPage, kKvHeads, kDim, dk.get(), dv.get());
    kv.k_scale = dks.get();
    kv.v_scale = dvs.get();
    kv.num_pages = num_pages;
    const int count = count_override != -2 ? count_override : static_cast<int>(slots.size());
    const absl::Status s =
        cuda::WriteKvTokens(kv, dkx.get(), dvx.get(), dslots.get(), count, dbad.get(), nullptr);
    if (!s.ok()) return std::string(s.message());
    *kgot = dk.Download();
    *vgot = dv.Download();
    *bad = dbad.Download()[0];
    return "";
  }
  std::vector<cuda::KvSlot> slots;
  std::vector<float> k, v;
  const std::vector<float> k_scales = {0.01f, 0.5f, 3.0f}, v_scales = {0.02f, 0.25f, 7.0f};
  std::vector<uint8_t> kwant, vwant;
};

std::string KvWriteCase(KvDtype dtype) {
  std::vector<cuda::KvSlot> slots;
  for (int i = 0; i < 7; ++i) slots.push_back({(i * 3) % KvWriteSetup::kPages, (i * 5) % 16});
  const KvWriteSetup w(dtype, slots);
  std::vector<uint8_t> kgot, vgot;
  int32_t bad = -1;
  if (std::string e = w.Run(dtype, KvWriteSetup::kPages, &kgot, &vgot, &bad); !e.empty()) return e;
  if (bad != 0) return "slots reported bad";
  const size_t e = KvDtypeBytes(dtype);
  if (std::string d = CompareBits(kgot.data(), w.kwant.data(), w.kwant.size(), e); !d.empty()) {
    return "K " + d;
  }
  if (std::string d = CompareBits(vgot.data(), w.vwant.data(), w.vwant.size(), e); !d.empty()) {
    return "V " + d;
  }
  return "";
}

// ---- per-token ops -------------------------------------------------------------------------
std::string RmsNormCase() {
  const int rows = 5, n = 1031;
  const std::vector<float> x = RandomFloats(size_t(rows) * n, 10), w = RandomFloats(n, 11);
  std::vector<float> want(x.size());
  for (int r = 0; r < rows; ++r)
    ref::RmsNorm(&x[size_t(r) * n], w.data(), n, 1e-5f, &want[size_t(r) * n]);
  DeviceBuffer<float> dx(x), dw(w), dout(x.size());
  if (absl::Status s = cuda::RmsNorm(dx.get(), dw.get(), rows, n, 1e-5f, dout.get(), nullptr);
      !s.ok()) {
    return std::string(s.message());
  }
  std::vector<double> tol(want.size());
  for (size_t i = 0; i < tol.size(); ++i) tol[i] = 1e-5 * std::fabs(double{want[i]}) + 1e-7;
  return CompareWithin(dout.Download(), want, tol);
}

std::string RopeCase() {
  const int rows = 3, heads = 8, dim = 128;
  const std::vector<int32_t> pos = {0, 40961, 7};
  std::vector<float> x = RandomFloats(size_t(rows) * heads * dim, 12), want = x;
  for (int r = 0; r < rows; ++r)
    ref::Rope(&want[size_t(r) * heads * dim], heads, dim, pos[r], 500000.0f);
  DeviceBuffer<float> dx(x);
  DeviceBuffer<int32_t> dpos(pos);
  if (absl::Status s = cuda::Rope(dx.get(), dpos.get(), rows, heads, dim, 500000.0f, nullptr);
      !s.ok()) {
    return std::string(s.message());
  }
  return CompareWithin(dx.Download(), want, std::vector<double>(want.size(), 1e-5));
}

std::string SiluMulCase() {
  const std::vector<float> g = RandomFloats(1031, 13, 4.0f), u = RandomFloats(1031, 14);
  std::vector<float> want(g.size());
  ref::SiluMul(g.data(), u.data(), g.size(), want.data());
  DeviceBuffer<float> dg(g), du(u), dout(g.size());
  if (absl::Status s = cuda::SiluMul(dg.get(), du.get(), g.size(), dout.get(), nullptr); !s.ok()) {
    return std::string(s.message());
  }
  std::vector<double> tol(want.size());
  for (size_t i = 0; i < tol.size(); ++i) tol[i] = 1e-5 * std::fabs(double{want[i]}) + 1e-7;
  return CompareWithin(dout.Download(), want, tol);
}

std::string SoftmaxCase() {
  const int rows = 2, n = 32003;
  std::vector<float> x = RandomFloats(size_t(rows) * n, 15, 6.0f), want = x;
  for (int r = 0; r < rows; ++r) ref::Softmax(&want[size_t(r) * n], n);
  DeviceBuffer<float> dx(x);
  if (absl::Status s = cuda::Softmax(dx.get(), rows, n, nullptr); !s.ok()) {
    return std::string(s.message());
  }
  std::vector<double> tol(want.size());
  for (size_t i = 0; i < tol.size(); ++i) tol[i] = 1e-5 * std::fabs(double{want[i]}) + 1e-9;
  return CompareWithin(dx.Download(), want, tol);
}

std::string ArgmaxCase() {
  const int rows = 3, n = 32003;
  std::vector<float> x = RandomFloats(size_t(rows) * n, 16);
  x[31000] = x[31001] = 100.0f;                            // row 0: a tie, the first wins
  x[size_t(n) + 5] = NAN;                                  // row 1: NaN never wins
  for (int i = 0; i < n; ++i) x[size_t(2) * n + i] = NAN;  // row 2: all NaN -> 0
  DeviceBuffer<float> dx(x);
  DeviceBuffer<int32_t> dout{static_cast<size_t>(rows)};
  if (absl::Status s = cuda::Argmax(dx.get(), rows, n, dout.get(), nullptr); !s.ok()) {
    return std::string(s.message());
  }
  const std::vector<int32_t> got = dout.Download();
  for (int r = 0; r < rows; ++r) {
    const size_t want = ref::Argmax(&x[size_t(r) * n], n);
    if (got[r] != static_cast<int32_t>(want)) {
      return "row " + std::to_string(r) + ": " + std::to_string(got[r]) +
             " != " + std::to_string(want);
    }
  }
  return "";
}

struct CudaCase {
  std::string name;
  std::string budget;
  std::function<std::string()> run;
};
void PrintTo(const CudaCase& c, std::ostream* os) { *os << c.name; }

std::vector<CudaCase> Cases() {
  std::vector<CudaCase> cases = {
      {"kv_write_fp8", "kBitExact", [] { return KvWriteCase(KvDtype::kFp8E4m3); }},
      {"kv_write_bf16", "kBitExact", [] { return KvWriteCase(KvDtype::kBf16); }},
      {"kv_write_fp32", "kBitExact", [] { return KvWriteCase(KvDtype::kFp32); }},
      {"rmsnorm", "kF32Accum", RmsNormCase},
      {"rope", "kF32Accum", RopeCase},
      {"silu_mul", "kF32Accum", SiluMulCase},
      {"softmax", "kF32Accum", SoftmaxCase},
      {"argmax", "kBitExact", ArgmaxCase},
  };
  const std::pair<const char*, WeightFormat> formats[] = {{"fp32", WeightFormat::kFp32},
                                                          {"bf16", WeightFormat::kBf16},
                                                          {"fp8", WeightFormat::kFp8},
                                                          {"int4", WeightFormat::kInt4}};
  for (const auto& [name, format] : formats) {
    for (int batch : {1, 5, 8, 9, 64}) {
      cases.push_back({std::string("matmul_") + name + "_batch" + std::to_string(batch),
                       "kF32Accum",
                       [f = format, batch] { return MatMulCase(f, 67, 1536, batch, 128); }});
    }
  }
  for (int group : {32, 64}) {  // the other INT4 groups, and a row wider than one x chunk
    cases.push_back({"matmul_int4_g" + std::to_string(group), "kF32Accum", [group] {
                       return MatMulCase(WeightFormat::kInt4, 33, 2048 + group, 3, group);
                     }});
  }
  for (KvDtype dtype : {KvDtype::kFp8E4m3, KvDtype::kBf16}) {
    const std::string dname = dtype == KvDtype::kBf16 ? "bf16" : "fp8";
    for (int dim : {64, 128}) {
      for (int group : {1, 4, 8}) {
        AttentionSpec s;
        s.dtype = dtype;
        s.head_dim = dim;
        s.group = group;
        cases.push_back(
            {"attention_" + dname + "_d" + std::to_string(dim) + "_g" + std::to_string(group),
             "kAttention", [s] { return AttentionCase(s); }});
      }
    }
    AttentionSpec split;  // split-K: 1100 and 2049 tokens span 3 and 5 blocks
    split.dtype = dtype;
    split.page = 32;
    split.lengths = {1100, 37, 2049, 1};
    cases.push_back(
        {"attention_" + dname + "_splitk", "kAttention", [split] { return AttentionCase(split); }});
    for (int page : {1, 8, 64}) {
      AttentionSpec s;
      s.dtype = dtype;
      s.page = page;
      s.lengths = {page + 1, 1, 3 * page + 5};
      cases.push_back({"attention_" + dname + "_p" + std::to_string(page), "kAttention",
                       [s] { return AttentionCase(s); }});
    }
  }
  return cases;
}

class CudaKernelsTest : public ::testing::TestWithParam<CudaCase> {};

TEST_P(CudaKernelsTest, MatchesCpuScalarTwin) {
  KVGUARD_SKIP_WITHOUT_CUDA_DEVICE();
  SCOPED_TRACE("budget " + GetParam().budget);
  EXPECT_EQ(GetParam().run(), "");
}

INSTANTIATE_TEST_SUITE_P(Table, CudaKernelsTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.name; });

// The in-kernel tag check, with the isolation layer's fault scenarios (isolation/README.md):
// with every tag right, results equal the unchecked run bit for bit (positive twin); a page
// released or re-granted mid-step (its current tag changed), a stale or forged page-table
// entry (its expected tag wrong in any byte), a page id beyond the pool and an entry expecting
// the zero tag of a free page each fail that request alone: its output is zero, its fault index
// names the first bad page, and every other request's output is unchanged.
TEST(CudaTagCheckTest, FailsOnlyTheRequestWithABadPage) {
  KVGUARD_SKIP_WITHOUT_CUDA_DEVICE();
  AttentionSpec spec;
  spec.lengths = {40, 17, 1100, 64};  // the third spans 3 split-K blocks
  const AttentionPool pool(spec);
  std::vector<float> base, checked;
  ASSERT_EQ(pool.RunDevice(&base, nullptr, nullptr, nullptr), "");
  std::vector<int32_t> faults;
  ASSERT_EQ(pool.RunDevice(&checked, &pool.tags, &pool.expected, &faults), "");
  EXPECT_EQ(checked, base);
  EXPECT_EQ(faults, std::vector<int32_t>(spec.lengths.size(), -1));

  const int heads = spec.kv_heads * spec.group;
  const size_t per_request = size_t(heads) * spec.head_dim;
  auto expect_only = [&](const std::vector<float>& out, const std::vector<int32_t>& f, size_t r,
                         int32_t index, const std::string& what) {
    SCOPED_TRACE(what);
    for (size_t o = 0; o < spec.lengths.size(); ++o) {
      const std::vector<float> got(out.begin() + o * per_request,
                                   out.begin() + (o + 1) * per_request);
      const std::vector<float> want(base.begin() + o * per_request,
                                    base.begin() + (o + 1) * per_request);
      if (o == r) {
        EXPECT_EQ(f[o], index);
        EXPECT_EQ(got, std::vector<float>(per_request, 0.0f));
      } else {
        EXPECT_EQ(f[o], -1);
        EXPECT_EQ(got, want);
      }
    }
  };
  for (size_t r = 0; r < spec.lengths.size(); ++r) {
    const int32_t first = pool.offsets[r];
    const int32_t pages = (spec.lengths[r] + spec.page - 1) / spec.page;
    for (int32_t i : {0, pages - 1, pages / 2}) {
      // A stale or forged entry: one byte of its expected tag differs.
      std::vector<PageTag> bad = pool.expected;
      reinterpret_cast<uint8_t*>(&bad[size_t(first + i)])[(i + r) % 16] ^= 0x42;
      std::vector<float> out;
      ASSERT_EQ(pool.RunDevice(&out, &pool.tags, &bad, &faults), "");
      expect_only(out, faults, r, i, "forged entry");
      // A page released (or re-granted) mid-step: its current tag changed.
      std::vector<PageTag> now = pool.tags;
      now[size_t(pool.page_ids[size_t(first + i)])].hi ^= 1;
      ASSERT_EQ(pool.RunDevice(&out, &now, &pool.expected, &faults), "");
      expect_only(out, faults, r, i, "page changed hands");
    }
  }
  // A page id beyond the pool: the pool claims fewer pages than request 2's largest id.
  int32_t largest = 0;
  for (int32_t i = 0; i < (spec.lengths[2] + spec.page - 1) / spec.page; ++i) {
    largest = std::max(largest, pool.page_ids[size_t(pool.offsets[2] + i)]);
  }
  std::vector<PageTag> fewer(pool.tags.begin(), pool.tags.begin() + largest);
  std::vector<float> out;
  ASSERT_EQ(pool.RunDevice(&out, &fewer, &pool.expected, &faults), "");
  EXPECT_GE(faults[2], 0);
  EXPECT_EQ(std::vector<float>(out.begin() + 2 * per_request, out.begin() + 3 * per_request),
            std::vector<float>(per_request, 0.0f));
  // An entry expecting zero on a free page (zero tag) fails; its twin (the owned page) passed
  // above.
  std::vector<PageTag> freed = pool.tags, zero = pool.expected;
  freed[size_t(pool.page_ids[size_t(pool.offsets[1])])] = PageTag{};
  zero[size_t(pool.offsets[1])] = PageTag{};
  ASSERT_EQ(pool.RunDevice(&out, &freed, &zero, &faults), "");
  expect_only(out, faults, 1, 0, "zero tag on a free page");
}

// Slots outside the pool or the page are skipped and counted, the others written as usual; a
// view without pages or a negative count is refused. Positive twin: the kv_write cases of the
// table (every slot valid, none reported).
TEST(CudaKvWriteTest, BadSlotsAreSkippedAndCounted) {
  KVGUARD_SKIP_WITHOUT_CUDA_DEVICE();
  const std::vector<cuda::KvSlot> slots = {{0, 0}, {5, 1}, {-1, 2}, {2, 16}, {3, -1}, {4, 15}};
  const KvWriteSetup w(KvDtype::kFp8E4m3, slots);
  std::vector<uint8_t> kgot, vgot;
  int32_t bad = 0;
  ASSERT_EQ(w.Run(KvDtype::kFp8E4m3, KvWriteSetup::kPages, &kgot, &vgot, &bad), "");
  EXPECT_EQ(bad, 4);  // page 5 of 5, page -1, slot 16 of 16, slot -1
  EXPECT_EQ(kgot, w.kwant);
  EXPECT_EQ(vgot, w.vwant);
  EXPECT_NE(w.Run(KvDtype::kFp8E4m3, /*num_pages=*/0, &kgot, &vgot, &bad), "");
  EXPECT_NE(w.Run(KvDtype::kFp8E4m3, KvWriteSetup::kPages, &kgot, &vgot, &bad, -1), "");
}

// Shapes the kernel does not take are refused with a clear error, not launched; the positive
// twin is every case of the table above.
TEST(CudaAttentionTest, RefusesUnsupportedShapes) {
  KVGUARD_SKIP_WITHOUT_CUDA_DEVICE();
  AttentionSpec spec;
  const AttentionPool pool(spec);
  PagedKvView kv = pool.HostView();
  cuda::DeviceDecodeBatch batch;
  batch.num_queries = 1;
  batch.max_length = 1;
  for (auto change : std::vector<std::function<void(PagedKvView&)>>{
           [](PagedKvView& k) { k.dtype = KvDtype::kFp32; },
           [](PagedKvView& k) { k.head_dim = 96; }, [](PagedKvView& k) { k.page_size = 24; }}) {
    PagedKvView bad = kv;
    change(bad);
    EXPECT_FALSE(cuda::PagedDecodeAttention(bad, 8, 1.0f, batch, nullptr, 0, nullptr).ok());
  }
  EXPECT_FALSE(cuda::PagedDecodeAttention(kv, 2 * 9, 1.0f, batch, nullptr, 0, nullptr).ok());
}

}  // namespace
}  // namespace kvguard::kernels
