// kernels/cuda/ops.cu: RMSNorm, RoPE, SiLU-gated multiply, softmax and argmax, batched over rows.
// One block per row for the row reductions; FP32 throughout, with correctly rounded division and
// square root (__fdiv_rn, __fsqrt_rn) so results do not depend on fast-math flags.
#include <cuda_runtime.h>

#include <cmath>

#include "kernels/cuda/internal/launch.cuh"
#include "kernels/cuda/ops.h"

namespace kvguard::kernels::cuda {
namespace {

using internal::BlockMax;
using internal::BlockSum;
using internal::GridFor;
using internal::LaunchStatus;
using internal::Stream;

constexpr int kRowThreads = 256;

__global__ void RmsNormKernel(const float* x, const float* weight, int n, float eps, float* out) {
  __shared__ float scratch[32];
  const float* row = x + static_cast<size_t>(blockIdx.x) * n;
  float* dst = out + static_cast<size_t>(blockIdx.x) * n;
  float sum = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) sum = fmaf(row[i], row[i], sum);
  sum = BlockSum(sum, scratch);
  const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fdiv_rn(sum, static_cast<float>(n)) + eps));
  for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = row[i] * weight[i] * inv;
}

// One thread per (row, head, i < head_dim / 2) pair of rotated elements. The angle is computed
// in double (as the scalar reference does): pos * theta^(-2i/d) reaches 1e5 radians at long
// contexts, where FP32 range reduction would cost the result its accuracy.
__global__ void RopeKernel(float* x, const int32_t* positions, int rows, int num_heads,
                           int head_dim, float theta) {
  const int half = head_dim / 2;
  const size_t total = static_cast<size_t>(rows) * num_heads * half;
  for (size_t t = blockIdx.x * size_t{blockDim.x} + threadIdx.x; t < total;
       t += size_t{gridDim.x} * blockDim.x) {
    const int i = static_cast<int>(t % half);
    const size_t head = t / half;  // (row, head) flattened
    const int row = static_cast<int>(head / num_heads);
    const double angle =
        static_cast<double>(positions[row]) * pow(static_cast<double>(theta), -2.0 * i / head_dim);
    double s, c;
    sincos(angle, &s, &c);
    float* h = x + head * head_dim;
    const double a = h[i], b = h[i + half];
    h[i] = static_cast<float>(a * c - b * s);
    h[i + half] = static_cast<float>(a * s + b * c);
  }
}

__global__ void SiluMulKernel(const float* gate, const float* up, size_t n, float* out) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const float g = gate[i];
    out[i] = __fdiv_rn(g, 1.0f + expf(-g)) * up[i];
  }
}

__global__ void SoftmaxKernel(float* x, int n) {
  __shared__ float scratch[32];
  float* row = x + static_cast<size_t>(blockIdx.x) * n;
  float max = -INFINITY;
  for (int i = threadIdx.x; i < n; i += blockDim.x) max = fmaxf(max, row[i]);
  max = BlockMax(max, scratch);
  float sum = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) sum += expf(row[i] - max);
  sum = BlockSum(sum, scratch);
  const float inv = __fdiv_rn(1.0f, sum);
  for (int i = threadIdx.x; i < n; i += blockDim.x) row[i] = expf(row[i] - max) * inv;
}

// Each thread keeps its best (value, index) over a strided slice; a shared-memory tree keeps
// the larger value, the smaller index on ties, and never a NaN over a number.
__global__ void ArgmaxKernel(const float* x, int n, int32_t* out) {
  __shared__ float best_v[kRowThreads];
  __shared__ int best_i[kRowThreads];
  const float* row = x + static_cast<size_t>(blockIdx.x) * n;
  float v = NAN;
  int idx = n;  // none yet
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float xi = row[i];
    if (isnan(xi)) continue;
    if (idx == n || xi > v) v = xi, idx = i;
  }
  best_v[threadIdx.x] = v;
  best_i[threadIdx.x] = idx;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      const float ov = best_v[threadIdx.x + stride];
      const int oi = best_i[threadIdx.x + stride];
      const int mi = best_i[threadIdx.x];
      const bool take = oi != n && (mi == n || ov > best_v[threadIdx.x] ||
                                    (ov == best_v[threadIdx.x] && oi < mi));
      if (take) best_v[threadIdx.x] = ov, best_i[threadIdx.x] = oi;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = best_i[0] == n ? 0 : best_i[0];
}

}  // namespace

absl::Status RmsNorm(const float* x, const float* weight, int rows, int n, float eps, float* out,
                     void* stream) {
  if (rows == 0) return absl::OkStatus();
  RmsNormKernel<<<rows, kRowThreads, 0, Stream(stream)>>>(x, weight, n, eps, out);
  return LaunchStatus("RmsNorm");
}

absl::Status Rope(float* x, const int32_t* positions, int rows, int num_heads, int head_dim,
                  float theta, void* stream) {
  const size_t total = static_cast<size_t>(rows) * num_heads * (head_dim / 2);
  if (total == 0) return absl::OkStatus();
  RopeKernel<<<GridFor(total, 256), 256, 0, Stream(stream)>>>(x, positions, rows, num_heads,
                                                              head_dim, theta);
  return LaunchStatus("Rope");
}

absl::Status SiluMul(const float* gate, const float* up, size_t n, float* out, void* stream) {
  if (n == 0) return absl::OkStatus();
  SiluMulKernel<<<GridFor(n, 256), 256, 0, Stream(stream)>>>(gate, up, n, out);
  return LaunchStatus("SiluMul");
}

absl::Status Softmax(float* x, int rows, int n, void* stream) {
  if (rows == 0) return absl::OkStatus();
  SoftmaxKernel<<<rows, kRowThreads, 0, Stream(stream)>>>(x, n);
  return LaunchStatus("Softmax");
}

absl::Status Argmax(const float* x, int rows, int n, int32_t* out, void* stream) {
  if (rows == 0) return absl::OkStatus();
  ArgmaxKernel<<<rows, kRowThreads, 0, Stream(stream)>>>(x, n, out);
  return LaunchStatus("Argmax");
}

}  // namespace kvguard::kernels::cuda
