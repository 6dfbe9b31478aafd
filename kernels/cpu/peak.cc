// kernels/cpu/peak.cc: MeasurePeak (peak.h). The FP32 loop is compiled once per Highway target
// (the one dispatch picks runs); the BF16 and INT8 loops once, with x86 intrinsics under a target
// attribute, run only where the CPU has the instructions.
#include "kernels/cpu/peak.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/internal/avx512_bf16.h"
#include "kernels/cpu/internal/cpu_features.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/peak.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

// Independent accumulator chains per thread: latency (4-5 cycles on the CPUs here) times issue
// width (2 per cycle) is at most 10, so 12 keep every pipe busy; 12 plus the two operands fit in
// the 16 registers of AVX2 as in the 32 of AVX-512.
#define KVGUARD_PEAK_CHAINS 12

HWY_BEFORE_NAMESPACE();
namespace kvguard::kernels {
namespace HWY_NAMESPACE {
namespace {
namespace hn = hwy::HWY_NAMESPACE;

// FmaLoop runs `iterations` x 12 FMAs of full vectors and returns FLOPs done (2 per lane per FMA).
// `seed` comes from outside so that the compiler cannot fold the loop; the sum is returned
// through `sink` so that it cannot drop it.
double FmaLoop(int64_t iterations, float seed, float* sink) {
  const hn::ScalableTag<float> d;
  const auto a = hn::Set(d, seed), b = hn::Set(d, 1.0f - seed * 1e-7f);
  hn::Vec<decltype(d)> acc[KVGUARD_PEAK_CHAINS];
  for (int c = 0; c < KVGUARD_PEAK_CHAINS; ++c) acc[c] = hn::Set(d, static_cast<float>(c));
  for (int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 12
    for (int c = 0; c < KVGUARD_PEAK_CHAINS; ++c) acc[c] = hn::MulAdd(acc[c], b, a);
  }
  auto total = acc[0];
  for (int c = 1; c < KVGUARD_PEAK_CHAINS; ++c) total = hn::Add(total, acc[c]);
  *sink += hn::GetLane(hn::SumOfLanes(d, total));
  return 2.0 * static_cast<double>(hn::Lanes(d)) * KVGUARD_PEAK_CHAINS * iterations;
}

const char* FmaName() { return hwy::TargetName(HWY_TARGET); }

size_t FmaLanes() { return hn::Lanes(hn::ScalableTag<float>()); }

}  // namespace
// Exported (outside the anonymous namespace) for HWY_EXPORT.
double FmaLoopImpl(int64_t iterations, float seed, float* sink) {
  return FmaLoop(iterations, seed, sink);
}
const char* FmaTargetImpl() { return FmaName(); }
size_t FmaLanesImpl() { return FmaLanes(); }
}  // namespace HWY_NAMESPACE
}  // namespace kvguard::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvguard::kernels {
HWY_EXPORT(FmaLoopImpl);
HWY_EXPORT(FmaTargetImpl);
HWY_EXPORT(FmaLanesImpl);

namespace {

#if KVGUARD_AVX512_BF16
KVG_AVX512_BF16_BEGIN
// Bf16Loop: `iterations` x 12 VDPBF16PS zmm, 32 multiply-adds each.
KVG_AVX512_BF16_TARGET double Bf16Loop(int64_t iterations, float seed, float* sink) {
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(seed), _mm512_set1_ps(seed));
  const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(1e-3f));
  __m512 acc[KVGUARD_PEAK_CHAINS];
  for (int c = 0; c < KVGUARD_PEAK_CHAINS; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c));
  for (int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 12
    for (int c = 0; c < KVGUARD_PEAK_CHAINS; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
  }
  __m512 total = acc[0];
  for (int c = 1; c < KVGUARD_PEAK_CHAINS; ++c) total = _mm512_add_ps(total, acc[c]);
  *sink += _mm512_reduce_add_ps(total);
  return 2.0 * 32 * KVGUARD_PEAK_CHAINS * static_cast<double>(iterations);
}

// Int8Loop: `iterations` x 12 VPDPBUSD zmm, 64 multiply-adds each.
__attribute__((target("avx512f,avx512bw,avx512vnni"))) double Int8Loop(int64_t iterations,
                                                                       float seed, float* sink) {
  const __m512i a = _mm512_set1_epi8(static_cast<char>(static_cast<int>(seed) | 1));
  const __m512i b = _mm512_set1_epi8(3);
  __m512i acc[KVGUARD_PEAK_CHAINS];
  for (int c = 0; c < KVGUARD_PEAK_CHAINS; ++c) acc[c] = _mm512_set1_epi32(c);
  for (int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 12
    for (int c = 0; c < KVGUARD_PEAK_CHAINS; ++c) acc[c] = _mm512_dpbusd_epi32(acc[c], a, b);
  }
  __m512i total = acc[0];
  for (int c = 1; c < KVGUARD_PEAK_CHAINS; ++c) total = _mm512_add_epi32(total, acc[c]);
  *sink += static_cast<float>(_mm512_reduce_add_epi32(total));
  return 2.0 * 64 * KVGUARD_PEAK_CHAINS * static_cast<double>(iterations);
}
KVG_AVX512_BF16_END

bool HasAvx512Vnni() { return __builtin_cpu_supports("avx512vnni"); }
#endif  // KVGUARD_AVX512_BF16

using Loop = double (*)(int64_t, float, float*);

// Rate runs `loop` on every thread of `pool` in rounds of a fixed iteration count until
// `seconds` have passed, and returns the operations of all threads over the wall time.
double Rate(Loop loop, ThreadPool* pool, double seconds) {
  using Clock = std::chrono::steady_clock;
  const int threads = pool != nullptr ? pool->size() : 1;
  std::vector<double> ops(threads, 0.0);
  std::vector<float> sinks(threads, 0.0f);
  constexpr int64_t kIterations = 1 << 16;  // ~0.2-1 ms a round at these rates
  auto round = [&]() {
    auto body = [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        ops[t] += loop(kIterations, 1.0f + static_cast<float>(t), &sinks[t]);
      }
    };
    // One chunk per thread: each runs its own loop at once.
    if (pool != nullptr) {
      pool->ParallelFor(threads, 1, body, 1);
    } else {
      body(0, 1);
    }
  };
  round();  // warm-up: clocks up, and AVX-512 licence on CPUs that have one
  std::fill(ops.begin(), ops.end(), 0.0);
  const auto start = Clock::now();
  double elapsed = 0;
  do {
    round();
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  } while (elapsed < seconds);
  double total = 0;
  for (double o : ops) total += o;
  volatile float keep = 0;
  for (float s : sinks) keep = keep + s;
  return total / elapsed;
}

}  // namespace

PeakRate MeasurePeak(MatMulArithmetic arithmetic, ThreadPool* pool, double seconds) {
  PeakRate r;
  switch (arithmetic) {
    case MatMulArithmetic::kBf16Products:
#if KVGUARD_AVX512_BF16
      if (internal::HasAvx512Bf16Vbmi()) {
        r.instruction = "VDPBF16PS zmm";
        r.ops_per_second = Rate(&Bf16Loop, pool, seconds);
        return r;
      }
#endif
      r.instruction = "none (no AVX-512 BF16)";
      return r;
    case MatMulArithmetic::kInt8Activations:
#if KVGUARD_AVX512_BF16
      if (HasAvx512Vnni()) {
        r.instruction = "VPDPBUSD zmm";
        r.ops_per_second = Rate(&Int8Loop, pool, seconds);
        return r;
      }
#endif
      r.instruction = "none (no AVX-512 VNNI)";
      return r;
    case MatMulArithmetic::kFp32:
      r.instruction = absl::StrCat("FMA f32 x", HWY_DYNAMIC_DISPATCH(FmaLanesImpl)(), " (",
                                   HWY_DYNAMIC_DISPATCH(FmaTargetImpl)(), ")");
      r.ops_per_second = Rate(
          [](int64_t iterations, float seed, float* sink) {
            return HWY_DYNAMIC_DISPATCH(FmaLoopImpl)(iterations, seed, sink);
          },
          pool, seconds);
      return r;
  }
  return r;
}

}  // namespace kvguard::kernels
#endif  // HWY_ONCE
