// kernels/cpu/ops_ref.cc: scalar references for the per-token operators. They favour accuracy
// over speed (double accumulators and trigonometry), so the SIMD versions are judged against
// something better than themselves.
#include <cmath>
#include <cstddef>

#include "absl/base/internal/raw_logging.h"
#include "kernels/cpu/ops.h"

namespace kvguard::kernels::ref {

void RmsNorm(const float* x, const float* weight, size_t n, float eps, float* out) {
  double sum_squares = 0.0;
  for (size_t i = 0; i < n; ++i) sum_squares += static_cast<double>(x[i]) * x[i];
  const double inv_rms = 1.0 / std::sqrt(sum_squares / static_cast<double>(n) + eps);
  for (size_t i = 0; i < n; ++i) {
    out[i] = static_cast<float>(static_cast<double>(x[i]) * weight[i] * inv_rms);
  }
}

void Rope(float* x, int num_heads, int head_dim, int pos, float theta) {
  ABSL_RAW_CHECK(head_dim > 0 && head_dim % 2 == 0, "Rope: head_dim must be even and > 0");
  ABSL_RAW_CHECK(num_heads >= 0, "Rope: num_heads must be >= 0");
  const int half = head_dim / 2;
  for (int h = 0; h < num_heads; ++h) {
    float* head = x + static_cast<ptrdiff_t>(h) * head_dim;
    for (int i = 0; i < half; ++i) {
      const double angle =
          static_cast<double>(pos) * std::pow(static_cast<double>(theta), -2.0 * i / head_dim);
      const double c = std::cos(angle);
      const double s = std::sin(angle);
      const double a = head[i];
      const double b = head[i + half];
      head[i] = static_cast<float>(a * c - b * s);
      head[i + half] = static_cast<float>(a * s + b * c);
    }
  }
}

void SiluMul(const float* gate, const float* up, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) {
    const double g = gate[i];
    out[i] = static_cast<float>(g / (1.0 + std::exp(-g)) * up[i]);
  }
}

void Softmax(float* x, size_t n) {
  ABSL_RAW_CHECK(n >= 1, "Softmax: n must be >= 1");
  float max = x[0];
  for (size_t i = 1; i < n; ++i) max = x[i] > max ? x[i] : max;
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(x[i]) - max);
  for (size_t i = 0; i < n; ++i) {
    x[i] = static_cast<float>(std::exp(static_cast<double>(x[i]) - max) / sum);
  }
}

size_t Argmax(const float* x, size_t n) {
  ABSL_RAW_CHECK(n >= 1, "Argmax: n must be >= 1");
  size_t best = n;  // none yet
  for (size_t i = 0; i < n; ++i) {
    if (std::isnan(x[i])) continue;
    if (best == n || x[i] > x[best]) best = i;
  }
  return best == n ? 0 : best;
}

}  // namespace kvguard::kernels::ref
