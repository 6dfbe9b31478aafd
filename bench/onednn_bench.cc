// bench/onednn_bench.cc: oneDNN's matmul against kvguard's prefill kernel at the prefill shapes,
// in one process so both run in the same minutes (built when Debian's libdnnl-dev is installed;
// scripts/setup installs it). Issue 25 asked whether oneDNN, the library made for this GEMM,
// should replace our kernel where it wins; bench/results/prefill.md records the answer.
//
//   BM_Prefill/kvguard_fp8/<rows>x<cols>/batch:<M>
//     kernels::MatMul with FP8 weights (the prefill format) and MatMulActivations::kBf16, as the
//     engine runs a step's prefill rows: x FP32 in, BF16 dot products, y FP32 out.
//   BM_Prefill/onednn_bf16/<rows>x<cols>/batch:<M>
//     dnnl::matmul, BF16 x (converted outside the timed loop: in oneDNN's favour) times BF16
//     weights in the layout oneDNN picks (format any, reordered once outside the loop), FP32 y.
//   BM_Prefill/onednn_int8/<rows>x<cols>/batch:<M>
//     dnnl::matmul, u8 x times s8 weights (layout any), int32 sums scaled to FP32 y: the INT8
//     alternative (what AMX-INT8 and VNNI run), x quantised outside the loop.
// `flops` counts 2 rows cols M per iteration for all three. Threads: our pool of 2; oneDNN's
// OpenMP runtime with OMP_NUM_THREADS (set it to 2 on the command line to compare like for like).
// ONEDNN_VERBOSE=1 prints the ISA oneDNN dispatched each primitive to.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bench/bench_util.h"
#include "dnnl.hpp"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/quantize.h"

namespace kvguard::bench {
namespace {

std::vector<float> Random(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& f : v) f = normal(rng);
  return v;
}

void SetFlops(benchmark::State& state, int rows, int cols, int batch) {
  state.counters[kFlops] =
      benchmark::Counter(2.0 * rows * cols * batch, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_Kvguard(benchmark::State& state, int rows, int cols, int batch) {
  const std::vector<float> w = Random(size_t(rows) * cols, 1, 0.02f);
  const kernels::QuantizedMatrix q =
      kernels::QuantizeMatrix(w.data(), rows, cols, kernels::WeightFormat::kFp8);
  const std::vector<float> x = Random(size_t(batch) * cols, 2, 1.0f);
  std::vector<float> y(size_t(batch) * rows);
  static kernels::ThreadPool pool2(2);
  kernels::ThreadPool* pool = &pool2;
  for (auto _ : state) {
    kernels::MatMul(q.view(), x.data(), batch, y.data(), pool, kernels::MatMulActivations::kBf16);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  SetFlops(state, rows, cols, batch);
}

// OneDnn runs y [batch, rows] = x [batch, cols] W^T with x of type `xt` and W of type `wt`.
void BM_OneDnn(benchmark::State& state, int rows, int cols, int batch, bool int8) {
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(eng);
  const dt xt = int8 ? dt::u8 : dt::bf16, wt = int8 ? dt::s8 : dt::bf16;
  const dnnl::memory::desc x_md({batch, cols}, xt, tag::ab);
  const dnnl::memory::desc w_any({cols, rows}, wt, tag::any);
  const dnnl::memory::desc y_md({batch, rows}, dt::f32, tag::ab);
  dnnl::primitive_attr attr;
  if (int8) attr.set_output_scales(0, {0.02f / 127.0f});
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(x_md, w_any, y_md), attr, eng);

  // Weights: FP32 [cols, rows] (W^T, plain) converted by a reorder into oneDNN's chosen layout.
  const std::vector<float> w = Random(size_t(rows) * cols, 1, int8 ? 40.0f : 0.02f);
  dnnl::memory w_f32({{cols, rows}, dt::f32, tag::ab}, eng, const_cast<float*>(w.data()));
  dnnl::memory w_mem(pd.weights_desc(), eng);
  dnnl::reorder(w_f32, w_mem).execute(stream, w_f32, w_mem);
  const std::vector<float> xf = Random(size_t(batch) * cols, 2, int8 ? 40.0f : 1.0f);
  dnnl::memory x_f32({{batch, cols}, dt::f32, tag::ab}, eng, const_cast<float*>(xf.data()));
  dnnl::memory x_mem(pd.src_desc(), eng);
  dnnl::reorder(x_f32, x_mem).execute(stream, x_f32, x_mem);
  dnnl::memory y_mem(pd.dst_desc(), eng);
  stream.wait();
  const dnnl::matmul mm(pd);
  for (auto _ : state) {
    mm.execute(stream, {{DNNL_ARG_SRC, x_mem}, {DNNL_ARG_WEIGHTS, w_mem}, {DNNL_ARG_DST, y_mem}});
    stream.wait();
    benchmark::ClobberMemory();
  }
  SetFlops(state, rows, cols, batch);
}

const bool kRegistered = [] {
  // `medium`'s fused Q/K/V, gate/up, O and down, then `small`'s (model.cc fuses them likewise).
  const std::pair<int, int> shapes[] = {{2560, 2048}, {11264, 2048}, {2048, 2048}, {2048, 5632},
                                        {2304, 768},  {4096, 768},   {768, 768},   {768, 2048}};
  for (const auto& [rows, cols] : shapes) {
    for (int batch : {64, 256}) {
      const std::string shape = "/" + std::to_string(rows) + "x" + std::to_string(cols) +
                                "/batch:" + std::to_string(batch);
      benchmark::RegisterBenchmark(("BM_Prefill/kvguard_fp8" + shape).c_str(), BM_Kvguard, rows,
                                   cols, batch)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("BM_Prefill/onednn_bf16" + shape).c_str(), BM_OneDnn, rows,
                                   cols, batch, false)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("BM_Prefill/onednn_int8" + shape).c_str(), BM_OneDnn, rows,
                                   cols, batch, true)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
  return true;
}();

}  // namespace
}  // namespace kvguard::bench

BENCHMARK_MAIN();
