// y = W x with quantised weights, judged against STREAM read bandwidth.
//
//   BM_MatMul/<fp32|bf16|fp8|int4>/<rows>x<cols>/batch:<1|8>/threads:<1|2>
// at 4096x4096 and 11008x4096 (an FFN up projection), INT4 with groups of 128. Bytes per
// iteration = WeightBytes(W) (codes plus scales): decode reads every weight once per step, and
// x and y are small. Each iteration uses the next of several copies of W, more than 512 MiB in
// all, so the weights come from DRAM, not from a last-level cache.
//
//   BM_MatMul/int4/<rows>x<cols>/batch:<3|7|16|64>/threads:2
// the `small` model's decode matrices (fused Q/K/V 2304 x 768, O 768 x 768, fused gate/up
// 4096 x 768, down 768 x 2048, output 32000 x 768) at the decode batches of serving under load
// (16, 64: `kvguard bench --concurrency`, bench/serve_load.py) and those its FP8-KV / BF16-KV
// target runs at (`kvguard bench --model small --context 2048 --kv-cache-bytes 288M`, C = 16: BF16
// KV holds 3 requests at once, FP8 KV 7). At batch 7 INT4 is bound by arithmetic, not bytes:
// compare `flops`.
//
//   BM_MatMulCached/<fp8|int4>/2048x2048/batch:1/threads:<1|2>
// the `medium` model's attention projection shape, one copy of W read again every iteration
// (4 MiB FP8, 2 MiB INT4: held in L2/L3), so memory does not bind: each format's compute ceiling
// and the per-call cost of a small layer.
//
//   BM_MatMulCached/int4/<768x768|2304x768>/batch:7/threads:1
// the same for `small`'s O and fused Q/K/V at batch 7 (see below): INT4's arithmetic rate there.
//
//   BM_MatMulCached/fp8/2048x2048/batch:3/threads:1
// FP8 weights in one 3-column tile, the shape that takes 3 rows per pass on AVX-512.
//
//   BM_MatMulPrefill/<fp8|bf16>/<rows>x<cols>/batch:32/threads:2
// the `medium` model's prefill shapes (fused Q/K/V, gate/up, O, down) at a 32-token prompt with
// the prefill weight formats: compute-bound, so the rate that matters is multiply-adds, reported
// as `flops` (2 rows cols batch per iteration); `bytes` is still the weights once.
//
//   BM_MatMulPrefill/fp8/<rows>x<cols>/batch:<1|8|16|32|64>/threads:2[/bf16x]
// the `small` model's prefill shapes (fused Q/K/V 2304 x 768, O 768 x 768, gate/up 4096 x 768,
// down 768 x 2048) at the batches a step's prefill rows come in (up to 64 per call), with exact
// activations (the FP32 kernel) and, /bf16x, with MatMulActivations::kBf16 as the engine's
// prefill runs them (on CPUs with AVX-512 BF16: the BF16 dot-product kernel), side by side.
// The medium shapes above take /bf16x too.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "bench/bench_util.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/quantize.h"

namespace kvguard::bench {
namespace {

using kernels::QuantizedMatrix;
using kernels::WeightFormat;
using kernels::WeightView;

constexpr size_t kMinTotalBytes = size_t{512} << 20;
constexpr int kInt4Group = 128;

// Master returns one quantised matrix per (format, shape), made once from N(0, 0.02^2) weights.
const QuantizedMatrix& Master(WeightFormat format, int rows, int cols) {
  static std::map<std::tuple<WeightFormat, int, int>, QuantizedMatrix> masters;
  auto it = masters.find({format, rows, cols});
  if (it != masters.end()) return it->second;
  std::mt19937 rng(rows * 31 + cols);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> w(static_cast<size_t>(rows) * cols);
  for (float& v : w) v = normal(rng);
  return masters[{format, rows, cols}] =
             kernels::QuantizeMatrix(w.data(), rows, cols, format, kInt4Group);
}

// Copies holds enough copies of one matrix to exceed kMinTotalBytes, each in its own touched
// buffers (codes and scales alike, since both are read from DRAM in a real step).
struct Copies {
  std::tuple<WeightFormat, int, int> key;
  std::vector<std::unique_ptr<uint8_t[], FreeDeleter>> buffers;
  std::vector<WeightView> views;
};

template <typename T, typename Alloc>
const T* CopyOf(const std::vector<T, Alloc>& v, Copies& c) {
  if (v.empty()) return nullptr;
  auto buf = AllocTouched<uint8_t>(v.size() * sizeof(T));
  std::memcpy(buf.get(), v.data(), v.size() * sizeof(T));
  const T* p = reinterpret_cast<const T*>(buf.get());
  c.buffers.push_back(std::move(buf));
  return p;
}

// WeightCopies returns the copies for (format, rows, cols). Only one set lives at a time (they
// are large); random interleaving rebuilds it, outside the timed loop.
const Copies& WeightCopies(WeightFormat format, int rows, int cols) {
  static std::unique_ptr<Copies> current;
  const auto key = std::make_tuple(format, rows, cols);
  if (current != nullptr && current->key == key) return *current;
  current.reset();
  const QuantizedMatrix& m = Master(format, rows, cols);
  auto copies = std::make_unique<Copies>();
  copies->key = key;
  const size_t bytes = kernels::WeightBytes(m.view());
  const size_t count = std::max<size_t>(2, (kMinTotalBytes + bytes - 1) / bytes);
  for (size_t i = 0; i < count; ++i) {
    WeightView v = m.view();
    v.data = CopyOf(m.data, *copies);
    v.row_scales = CopyOf(m.row_scales, *copies);
    v.group_scales = CopyOf(m.group_scales, *copies);
    copies->views.push_back(v);
  }
  current = std::move(copies);
  return *current;
}

void BM_MatMul(benchmark::State& state, WeightFormat format, int rows, int cols, int batch,
               int threads, bool cached, kernels::MatMulActivations act) {
  const Copies& copies = WeightCopies(format, rows, cols);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(batch) * cols);
  for (float& v : x) v = normal(rng);
  std::vector<float> y(static_cast<size_t>(batch) * rows);
  kernels::ThreadPool* pool = Pool(threads);
  size_t next = 0;
  for (auto _ : state) {
    kernels::MatMul(copies.views[next], x.data(), batch, y.data(), pool, act);
    if (!cached) next = next + 1 == copies.views.size() ? 0 : next + 1;
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.counters[kBytes] =
      benchmark::Counter(static_cast<double>(kernels::WeightBytes(copies.views[0])),
                         benchmark::Counter::kIsIterationInvariantRate);
  state.counters[kFlops] =
      benchmark::Counter(2.0 * rows * cols * batch, benchmark::Counter::kIsIterationInvariantRate);
}

// Register adds <family>/<format>/<rows>x<cols>/batch:<batch>/threads:<threads>[/bf16x] (cached:
// one copy of W, read again every iteration; bf16x: MatMulActivations::kBf16).
void Register(const char* family, WeightFormat f, int rows, int cols, int batch, int threads,
              bool cached, kernels::MatMulActivations act = kernels::MatMulActivations::kExact) {
  const bool bf16x = act == kernels::MatMulActivations::kBf16;
  const std::string name = std::string(family) + "/" + kernels::WeightFormatName(f) + "/" +
                           std::to_string(rows) + "x" + std::to_string(cols) +
                           "/batch:" + std::to_string(batch) +
                           "/threads:" + std::to_string(threads) + (bf16x ? "/bf16x" : "");
  benchmark::RegisterBenchmark(name.c_str(), BM_MatMul, f, rows, cols, batch, threads, cached, act)
      ->UseRealTime()
      ->Unit(benchmark::kMicrosecond);
}

const bool kRegistered = [] {
  const std::pair<int, int> shapes[] = {{4096, 4096}, {11008, 4096}};
  for (WeightFormat f :
       {WeightFormat::kFp32, WeightFormat::kBf16, WeightFormat::kFp8, WeightFormat::kInt4}) {
    for (const auto& [rows, cols] : shapes) {
      for (int batch : {1, 8}) {
        for (int threads : {1, 2}) Register("BM_MatMul", f, rows, cols, batch, threads, false);
      }
    }
  }
  // The `medium` model's decode shapes, from DRAM, at the setting the engine target is measured
  // at: the engine's fused Q/K/V (2560 x 2048) and gate/up (11264 x 2048) matrices, O (2048 x
  // 2048) and down (2048 x 5632), one decode step's 89 calls; and the unfused parts (K/V
  // 256 x 2048, gate/up 5632 x 2048) to compare with.
  const std::pair<int, int> medium_shapes[] = {{2560, 2048}, {11264, 2048}, {2048, 2048},
                                               {2048, 5632}, {256, 2048},   {5632, 2048}};
  for (WeightFormat f : {WeightFormat::kFp8, WeightFormat::kInt4}) {
    for (const auto& [rows, cols] : medium_shapes)
      Register("BM_MatMul", f, rows, cols, 1, 2, false);
  }
  const std::pair<int, int> small_shapes[] = {
      {2304, 768}, {768, 768}, {4096, 768}, {768, 2048}, {32000, 768}};
  for (int batch : {3, 7, 16, 64}) {
    for (const auto& [rows, cols] : small_shapes) {
      Register("BM_MatMul", WeightFormat::kInt4, rows, cols, batch, 2, false);
    }
  }
  for (WeightFormat f : {WeightFormat::kFp8, WeightFormat::kBf16}) {
    for (const auto& [rows, cols] : medium_shapes) {
      if (rows == 256 || rows == 5632) continue;  // unfused: the engine never calls them
      Register("BM_MatMulPrefill", f, rows, cols, 32, 2, false);
      Register("BM_MatMulPrefill", f, rows, cols, 32, 2, false, kernels::MatMulActivations::kBf16);
    }
  }
  for (const auto& [rows, cols] : small_shapes) {
    if (rows == 32000) continue;  // the output head: one row per chunk, not a prefill shape
    for (int batch : {1, 8, 16, 32, 64}) {
      for (auto act : {kernels::MatMulActivations::kExact, kernels::MatMulActivations::kBf16}) {
        Register("BM_MatMulPrefill", WeightFormat::kFp8, rows, cols, batch, 2, false, act);
      }
    }
  }
  for (WeightFormat f : {WeightFormat::kFp8, WeightFormat::kInt4}) {
    for (int threads : {1, 2}) Register("BM_MatMulCached", f, 2048, 2048, 1, threads, true);
  }
  // FP8 weights at batch 3 (one 3-column tile: 3 rows per pass on AVX-512), in cache, one thread.
  Register("BM_MatMulCached", WeightFormat::kFp8, 2048, 2048, 3, 1, true);
  // `small`'s O and fused Q/K/V at FP8 KV's batch, one thread, held in L2/L3: INT4's compute
  // ceiling at that batch, without DRAM's noise.
  for (const auto& [rows, cols] : {std::pair{768, 768}, std::pair{2304, 768}}) {
    Register("BM_MatMulCached", WeightFormat::kInt4, rows, cols, 7, 1, true);
  }
  return true;
}();

}  // namespace
}  // namespace kvguard::bench
