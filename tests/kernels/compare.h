// tests/kernels/compare.h: random inputs and budgeted comparisons shared by the backend tables
// (backends_test.cc for the SIMD kernels, cuda_kernels_test.cc for the CUDA ones).
#ifndef KVGUARD_TESTS_KERNELS_COMPARE_H_
#define KVGUARD_TESTS_KERNELS_COMPARE_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace kvguard::kernels::testing {

// RandomFloats returns n samples of N(0, sd^2), deterministic in `seed`.
inline std::vector<float> RandomFloats(size_t n, uint32_t seed, float sd = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// CompareBits returns "" when the `bytes` at a and b are equal in every `elem`-byte element,
// else which element differs first.
inline std::string CompareBits(const void* a, const void* b, size_t bytes, size_t elem) {
  for (size_t i = 0; i < bytes; i += elem) {
    if (std::memcmp(static_cast<const char*>(a) + i, static_cast<const char*>(b) + i, elem)) {
      return "element " + std::to_string(i / elem) + " differs";
    }
  }
  return "";
}

// CompareWithin returns "" when |got[i] - want[i]| <= tolerance[i] for every i (NaN fails),
// else a description of the first element out of budget.
inline std::string CompareWithin(const std::vector<float>& got, const std::vector<float>& want,
                                 const std::vector<double>& tolerance) {
  if (got.size() != want.size()) return "sizes differ";
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double{got[i]} - double{want[i]});
    if (!(err <= tolerance[i])) {
      return "element " + std::to_string(i) + ": got " + std::to_string(got[i]) + ", want " +
             std::to_string(want[i]) + ", |err| " + std::to_string(err) + " > " +
             std::to_string(tolerance[i]);
    }
  }
  return "";
}

}  // namespace kvguard::kernels::testing

#endif  // KVGUARD_TESTS_KERNELS_COMPARE_H_
