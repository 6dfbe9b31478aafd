// Paged decode attention: one decode step of one layer, Llama-3-8B-like shape (32 query heads,
// 8 kv heads, head_dim 128, P = 16), with every request's pages scattered over the pool in a
// shuffled order, as a long-running server's pool ends up.
//
//   BM_PagedAttention/<dtype>/ctx:C/batch:B/threads:T
//     dtype fp8 (e4m3 + per-head scales), bf16, fp32; contexts 512, 4096, 16384 tokens with
//     batch = 65536 / C, so that each step reads 128 MiB of FP8 KV (256 MiB BF16, 512 MiB FP32),
//     far beyond the caches; plus batch 1 at 16384 (32 MiB FP8: latency of one long request)
//     and batch 8 at 512 on one thread (4 MiB FP8, cache-resident: the compute ceiling).
// kBytes = the K and V bytes a step must read (all kv heads, all tokens) plus the FP8 scales;
// compare it with BM_StreamRead at the same thread count from the same run.
//
//   BM_PagedAttentionTagged/fp8/...   the same step with the in-kernel tag check on (every
//     query's page ids and 16-byte page tags checked before any KV is loaded): its time over
//     BM_PagedAttention's, from one interleaved run, is the check's cost.
//
//   BM_PagedAttentionMha/<dtype>/ctx:2048/batch:B/threads:T
//     the `small` model's shape (12 query heads, 12 kv heads: group 1, head_dim 64, P = 16), where
//     the engine's FP8-KV / BF16-KV target is measured: with one query head per kv head every KV
//     element feeds a single multiply-add, so decoding the FP8 codes, not the arithmetic, is
//     what the kernel spends its instructions on. Batch 32 (96 MiB FP8) from DRAM; batch 7, the
//     most FP8 requests `kvguard bench --model small --context 2048 --kv-cache-bytes 288M` runs
//     at once, is one layer's step (21 MiB FP8: partly L3-resident).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <tuple>
#include <vector>

#include "bench/bench_util.h"
#include "kernels/cpu/attention.h"
#include "kernels/formats.h"

namespace kvguard::bench {
namespace {

using kernels::DecodeQuery;
using kernels::KvDtype;
using kernels::PagedKvView;

constexpr int kPage = 16;

// Shape is a model's attention shape.
struct Shape {
  int heads;
  int kv_heads;
  int dim;
  bool operator==(const Shape&) const = default;
};
constexpr Shape kGqa{32, 8, 128};  // Llama-3-8B-like
constexpr Shape kMha{12, 12, 64};  // `small`

uint64_t Mix(uint64_t x) {  // SplitMix64 finaliser: cheap, deterministic fill values
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform returns a float in [-1, 1) from hash bits.
float Uniform(uint64_t bits) { return static_cast<float>(bits >> 40) * 0x1p-23f - 1.0f; }

// Step is one decode step's inputs: a pool holding batch * ctx tokens in shuffled pages, the
// page tables, queries and outputs.
struct Step {
  Shape shape;
  KvDtype dtype;
  int ctx = 0;
  int batch = 0;
  std::unique_ptr<uint8_t[], FreeDeleter> k, v;
  std::vector<float> k_scale, v_scale, q, out;
  std::vector<int32_t> page_ids;  // [batch, ctx / kPage]
  std::vector<DecodeQuery> queries;
  std::vector<kernels::PageTag> tags;      // [num_pages]: the pool's current tags
  std::vector<kernels::PageTag> expected;  // [batch, ctx / kPage]: what each query expects
  std::vector<int32_t> faults;             // [batch]
  PagedKvView view;
  size_t kv_bytes = 0;  // bytes the kernel must read per step

  Step(Shape shape_in, KvDtype dtype_in, int ctx_in, int batch_in)
      : shape(shape_in), dtype(dtype_in), ctx(ctx_in), batch(batch_in) {
    const int heads = shape.heads, kv_heads = shape.kv_heads, dim = shape.dim;
    const size_t esize = kernels::KvDtypeBytes(dtype);
    const int pages_per_request = ctx / kPage;
    const size_t num_pages = static_cast<size_t>(batch) * pages_per_request;
    const size_t head_stride = static_cast<size_t>(kPage) * dim;
    const size_t page_stride = head_stride * kv_heads;
    const size_t bytes = num_pages * page_stride * esize;
    k = AllocTouched<uint8_t>(bytes);
    v = AllocTouched<uint8_t>(bytes);
    Fill(k.get(), bytes / esize, 1);
    Fill(v.get(), bytes / esize, 2);
    k_scale.assign(kv_heads, 2.0f / kernels::kFp8E4m3Max);
    v_scale.assign(kv_heads, 2.0f / kernels::kFp8E4m3Max);

    page_ids.resize(num_pages);
    std::iota(page_ids.begin(), page_ids.end(), 0);
    for (size_t i = num_pages; i > 1; --i) std::swap(page_ids[i - 1], page_ids[Mix(i) % i]);

    q.resize(static_cast<size_t>(batch) * heads * dim);
    for (size_t i = 0; i < q.size(); ++i) q[i] = Uniform(Mix(i + 3));
    out.assign(q.size(), 0.0f);
    queries.resize(static_cast<size_t>(batch));
    for (int r = 0; r < batch; ++r) {
      queries[r].q = q.data() + static_cast<size_t>(r) * heads * dim;
      queries[r].page_table = page_ids.data() + static_cast<size_t>(r) * pages_per_request;
      queries[r].length = ctx;
      queries[r].out = out.data() + static_cast<size_t>(r) * heads * dim;
    }

    tags.resize(num_pages);
    for (size_t p = 0; p < num_pages; ++p) tags[p] = kernels::PageTag{Mix(p), Mix(p + num_pages)};
    expected.resize(page_ids.size());
    for (size_t i = 0; i < page_ids.size(); ++i) expected[i] = tags[size_t(page_ids[i])];
    faults.assign(static_cast<size_t>(batch), -1);

    view = kernels::PackedKvView(dtype, kPage, kv_heads, dim, k.get(), v.get());
    if (dtype == KvDtype::kFp8E4m3) {
      view.k_scale = k_scale.data();
      view.v_scale = v_scale.data();
    }
    kv_bytes = 2 * bytes + (dtype == KvDtype::kFp8E4m3 ? 2 * kv_heads * sizeof(float) : 0);
  }

  // Fill writes `count` elements of values in [-2, 2) (FP8: codes of them, never NaN): a 1 MiB
  // tile of random values, repeated, so that rebuilding a pool between interleaved runs is cheap.
  void Fill(uint8_t* p, size_t count, uint64_t seed) const {
    const size_t esize = kernels::KvDtypeBytes(dtype);
    const size_t tile = std::min(count, (size_t{1} << 20) / esize);
    for (size_t i = 0; i < tile; ++i) {
      const float x = 2.0f * Uniform(Mix(i * 4 + seed));
      kernels::StoreKvElement(dtype, x, 2.0f / kernels::kFp8E4m3Max, p, i);
    }
    for (size_t i = tile; i < count; i += tile) {
      std::memcpy(p + i * esize, p, std::min(tile, count - i) * esize);
    }
  }
};

// GetStep keeps the last step built: the 1- and 2-thread runs of a shape share it, and only one
// pool (up to 1 GiB for FP32) is alive at a time.
Step& GetStep(Shape shape, KvDtype dtype, int ctx, int batch) {
  static std::unique_ptr<Step> step;
  if (!step || !(step->shape == shape) ||
      std::tie(step->dtype, step->ctx, step->batch) != std::tie(dtype, ctx, batch)) {
    step.reset();
    step = std::make_unique<Step>(shape, dtype, ctx, batch);
  }
  return *step;
}

void RunAttention(benchmark::State& state, Shape shape, KvDtype dtype, bool tagged) {
  const int ctx = static_cast<int>(state.range(0));
  const int batch = static_cast<int>(state.range(1));
  const int threads = static_cast<int>(state.range(2));
  Step& step = GetStep(shape, dtype, ctx, batch);
  kernels::ThreadPool* pool = Pool(threads);
  const float softmax_scale = 1.0f / std::sqrt(static_cast<float>(shape.dim));
  PagedKvView view = step.view;
  std::vector<DecodeQuery> queries = step.queries;
  if (tagged) {
    view.page_tags = step.tags.data();
    view.num_pages = static_cast<int32_t>(step.tags.size());
    for (int r = 0; r < batch; ++r) {
      queries[r].expected_tags = step.expected.data() + static_cast<size_t>(r) * (ctx / kPage);
      queries[r].tag_fault = &step.faults[static_cast<size_t>(r)];
    }
  }
  for (auto _ : state) {
    kernels::PagedDecodeAttention(view, shape.heads, softmax_scale, queries.data(), batch, pool);
    benchmark::DoNotOptimize(step.out.data());
    benchmark::ClobberMemory();
  }
  if (tagged && *std::max_element(step.faults.begin(), step.faults.end()) >= 0) {
    state.SkipWithError("a tag check failed on a correct pool");
  }
  state.counters[kBytes] = benchmark::Counter(static_cast<double>(step.kv_bytes),
                                              benchmark::Counter::kIsIterationInvariantRate);
}

void BM_PagedAttention(benchmark::State& state, KvDtype dtype) {
  RunAttention(state, kGqa, dtype, false);
}
void BM_PagedAttentionTagged(benchmark::State& state, KvDtype dtype) {
  RunAttention(state, kGqa, dtype, true);
}
void BM_PagedAttentionMha(benchmark::State& state, KvDtype dtype) {
  RunAttention(state, kMha, dtype, false);
}

void Shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"ctx", "batch", "threads"});
  for (int ctx : {512, 4096, 16384}) {
    for (int threads : {1, 2}) b->Args({ctx, 65536 / ctx, threads});
  }
  for (int threads : {1, 2}) b->Args({16384, 1, threads});
  // 512 tokens x 8 requests: 4 MiB of FP8 KV (8 MiB BF16), held in L3 across iterations, so
  // memory bandwidth does not bind: the kernel's compute ceiling per core.
  b->Args({512, 8, 1});
  b->UseRealTime()->Unit(benchmark::kMillisecond);
}

BENCHMARK_CAPTURE(BM_PagedAttention, fp8, KvDtype::kFp8E4m3)->Apply(Shapes);
BENCHMARK_CAPTURE(BM_PagedAttention, bf16, KvDtype::kBf16)->Apply(Shapes);
BENCHMARK_CAPTURE(BM_PagedAttention, fp32, KvDtype::kFp32)->Apply(Shapes);
BENCHMARK_CAPTURE(BM_PagedAttentionTagged, fp8, KvDtype::kFp8E4m3)->Apply(Shapes);

void MhaShapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"ctx", "batch", "threads"});
  for (int batch : {7, 32}) {
    for (int threads : {1, 2}) b->Args({2048, batch, threads});
  }
  b->UseRealTime()->Unit(benchmark::kMillisecond);
}
BENCHMARK_CAPTURE(BM_PagedAttentionMha, fp8, KvDtype::kFp8E4m3)->Apply(MhaShapes);
BENCHMARK_CAPTURE(BM_PagedAttentionMha, bf16, KvDtype::kBf16)->Apply(MhaShapes);

}  // namespace
}  // namespace kvguard::bench
