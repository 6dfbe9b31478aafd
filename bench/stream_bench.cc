// STREAM-style memory bandwidth: the physical limit every kernel here is judged against.
//
//   BM_StreamRead:  sum of a 1 GiB array (read-only; bytes = array size)
//   BM_StreamTriad: a[i] = b[i] + s * c[i] over three 1 GiB arrays (bytes = 3 x array size,
//                   STREAM's convention: write-allocate traffic is not counted)
// Both at 1 and 2 threads, each thread streaming its own contiguous slice.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "bench/bench_util.h"

namespace kvguard::bench {

kernels::ThreadPool* Pool(int threads) {
  static std::mutex mu;
  static std::map<int, std::unique_ptr<kernels::ThreadPool>> pools;
  std::lock_guard<std::mutex> lock(mu);
  auto& p = pools[threads];
  if (!p) p = std::make_unique<kernels::ThreadPool>(threads);
  return p.get();
}

namespace {

constexpr size_t kArrayBytes = size_t{1} << 30;  // 1 GiB: far beyond any cache
constexpr size_t kFloats = kArrayBytes / sizeof(float);

// Eight independent 32-byte accumulators: enough loads in flight to saturate DRAM. The loop is
// compiled for AVX2 where the CPU has it (one 32-byte load per accumulator step): the generic
// vector code, built for baseline x86-64, issues two 16-byte loads per step and measured 20-30%
// below what a core streams here (19-26 vs 29-31 GB/s on one Zen 4 core), which would flatter
// every ratio judged against it. No software prefetch: STREAM's convention.
using V8 = float __attribute__((vector_size(32)));

// Inlined into each caller, so that it is compiled for the caller's target.
template <class Target>
__attribute__((always_inline)) inline float SumWith(const float* p, size_t n, Target) {
  V8 acc[8] = {};
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
#pragma GCC unroll 8  // accumulators in registers, not on the stack
    for (int k = 0; k < 8; ++k) {
      V8 v;
      __builtin_memcpy(&v, p + i + 8 * k, sizeof(v));
      acc[k] += v;
    }
  }
  V8 t = acc[0] + acc[1] + acc[2] + acc[3] + acc[4] + acc[5] + acc[6] + acc[7];
  float s = 0;
  for (int k = 0; k < 8; ++k) s += t[k];
  for (; i < n; ++i) s += p[i];
  return s;
}

struct Generic {};
struct Avx2 {};
float SumSliceGeneric(const float* p, size_t n) { return SumWith(p, n, Generic{}); }
#if defined(__x86_64__)
__attribute__((target("avx2"))) float SumSliceAvx2(const float* p, size_t n) {
  return SumWith(p, n, Avx2{});
}
#endif

float SumSlice(const float* p, size_t n) {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return SumSliceAvx2(p, n);
#endif
  return SumSliceGeneric(p, n);
}

// ReadOnce streams all of `a` [n floats] once on `threads` threads (each its own slice).
float ReadOnce(const float* a, size_t n, int threads) {
  float sums[64 * 8] = {};
  Pool(threads)->ParallelFor(threads, 1, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const size_t begin = n / threads * t;
      const size_t end = t + 1 == threads ? n : n / threads * (t + 1);
      sums[t * 8] = SumSlice(a + begin, end - begin);  // own cache line per thread
    }
  });
  float total = 0;
  for (int t = 0; t < threads; ++t) total += sums[t * 8];
  return total;
}

void BM_StreamRead(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  static auto a = AllocTouched<float>(kFloats);
  for (auto _ : state) benchmark::DoNotOptimize(ReadOnce(a.get(), kFloats, threads));
  state.counters[kBytes] = benchmark::Counter(static_cast<double>(kArrayBytes),
                                              benchmark::Counter::kIsIterationInvariantRate);
}

void BM_StreamTriad(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  static auto a = AllocTouched<float>(kFloats);
  static auto b = AllocTouched<float>(kFloats);
  static auto c = AllocTouched<float>(kFloats);
  kernels::ThreadPool* pool = Pool(threads);
  const float s = 3.0f;
  for (auto _ : state) {
    pool->ParallelFor(threads, 1, [&](int64_t tb, int64_t te) {
      for (int64_t t = tb; t < te; ++t) {
        const size_t begin = kFloats / threads * t;
        const size_t end = t + 1 == threads ? kFloats : kFloats / threads * (t + 1);
        float* __restrict pa = a.get();
        const float* __restrict pb = b.get();
        const float* __restrict pc = c.get();
        for (size_t i = begin; i < end; ++i) pa[i] = pb[i] + s * pc[i];
      }
    });
    benchmark::ClobberMemory();
  }
  state.counters[kBytes] = benchmark::Counter(static_cast<double>(3 * kArrayBytes),
                                              benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK(BM_StreamRead)
    ->Arg(1)
    ->Arg(2)
    ->ArgName("threads")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_StreamTriad)
    ->Arg(1)
    ->Arg(2)
    ->ArgName("threads")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

double StreamReadGBps(int threads, int reps, size_t bytes) {
  const size_t n = bytes / sizeof(float);
  auto a = AllocTouched<float>(n);
  std::vector<double> rates;
  for (int r = 0; r < reps; ++r) {
    const auto start = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(ReadOnce(a.get(), n, threads));
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    rates.push_back(static_cast<double>(n * sizeof(float)) / s / 1e9);
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

}  // namespace kvguard::bench
