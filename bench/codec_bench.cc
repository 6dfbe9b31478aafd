// Bulk codec throughput, one thread: FP8 e4m3 and BF16 encode/decode.
//
//   64 MiB of floats (16 Mi elements): far beyond the caches, so DRAM-bound; compare the bytes
//   rate with BM_StreamRead in the same run.
//   64 KiB of floats (16 Ki elements): L2-resident, so it shows the compute rate.
// bytes = bytes read + bytes written per iteration (write-allocate traffic not counted, as in
// STREAM); items = elements converted.
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <random>

#include "bench/bench_util.h"
#include "kernels/cpu/codec.h"

namespace kvguard::bench {
namespace {

constexpr int64_t kDramElements = (int64_t{64} << 20) / sizeof(float);
constexpr int64_t kL2Elements = (int64_t{64} << 10) / sizeof(float);

// Activations-like input: mostly in e4m3 range after a scale of 1/64, a few outliers.
void FillActivations(float* x, size_t n) {
  std::mt19937 rng(42);
  std::normal_distribution<float> dist(0.0f, 64.0f);
  for (size_t i = 0; i < n; ++i) x[i] = dist(rng);
}

void SetCounters(benchmark::State& state, size_t n, size_t bytes_per_element) {
  state.counters[kBytes] = benchmark::Counter(static_cast<double>(n * bytes_per_element),
                                              benchmark::Counter::kIsIterationInvariantRate);
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(n));
}

void BM_EncodeFp8(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  auto x = AllocTouched<float>(n);
  auto out = AllocTouched<uint8_t>(n);
  FillActivations(x.get(), n);
  for (auto _ : state) {
    kernels::EncodeFp8(x.get(), n, 1.0f / 64, out.get());
    benchmark::ClobberMemory();
  }
  SetCounters(state, n, sizeof(float) + 1);
}

void BM_DecodeFp8(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  auto in = AllocTouched<uint8_t>(n);
  auto out = AllocTouched<float>(n);
  std::mt19937 rng(43);
  for (size_t i = 0; i < n; ++i) in[i] = static_cast<uint8_t>(rng());
  for (auto _ : state) {
    kernels::DecodeFp8(in.get(), n, 1.0f / 64, out.get());
    benchmark::ClobberMemory();
  }
  SetCounters(state, n, 1 + sizeof(float));
}

void BM_EncodeBf16(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  auto x = AllocTouched<float>(n);
  auto out = AllocTouched<uint16_t>(n);
  FillActivations(x.get(), n);
  for (auto _ : state) {
    kernels::EncodeBf16(x.get(), n, out.get());
    benchmark::ClobberMemory();
  }
  SetCounters(state, n, sizeof(float) + sizeof(uint16_t));
}

void BM_DecodeBf16(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  auto in = AllocTouched<uint16_t>(n);
  auto out = AllocTouched<float>(n);
  std::mt19937 rng(44);
  for (size_t i = 0; i < n; ++i) in[i] = static_cast<uint16_t>(rng() & 0x7F7F);  // finite
  for (auto _ : state) {
    kernels::DecodeBf16(in.get(), n, out.get());
    benchmark::ClobberMemory();
  }
  SetCounters(state, n, sizeof(uint16_t) + sizeof(float));
}

// Real time, like BM_StreamRead, so that the two bytes rates divide into each other.
#define KVGUARD_CODEC_BENCH(fn) \
  BENCHMARK(fn)                 \
      ->Arg(kDramElements)      \
      ->Arg(kL2Elements)        \
      ->ArgName("elements")     \
      ->UseRealTime()           \
      ->Unit(benchmark::kMicrosecond)

KVGUARD_CODEC_BENCH(BM_EncodeFp8);
KVGUARD_CODEC_BENCH(BM_DecodeFp8);
KVGUARD_CODEC_BENCH(BM_EncodeBf16);
KVGUARD_CODEC_BENCH(BM_DecodeBf16);

#undef KVGUARD_CODEC_BENCH

}  // namespace
}  // namespace kvguard::bench
