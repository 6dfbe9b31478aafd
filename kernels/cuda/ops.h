// kernels/cuda/ops.h: host launchers for the per-token operators on the GPU, batched over rows.
//
// Same definitions as kernels/cpu/ops.h (FP32 arithmetic; within the kF32Accum budgets of
// tests/kernels/backends_test.cc of the scalar references). Pointers are device pointers;
// launches go on `stream` (a cudaStream_t as void*, null for the default stream) and are
// asynchronous. Each launcher returns an error if the launch fails; shapes are the caller's to
// validate (the engine validates them once, before a step).
#ifndef KVGUARD_KERNELS_CUDA_OPS_H_
#define KVGUARD_KERNELS_CUDA_OPS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace kvguard::kernels::cuda {

// RmsNorm: out[r, i] = x[r, i] * weight[i] / sqrt(mean_i(x[r]^2) + eps), rows x n. out may alias.
absl::Status RmsNorm(const float* x, const float* weight, int rows, int n, float eps, float* out,
                     void* stream);

// Rope rotates x [rows, num_heads, head_dim] in place, row r at position positions[r]
// (rotate-half, theta as in kernels/cpu/ops.h). head_dim even.
absl::Status Rope(float* x, const int32_t* positions, int rows, int num_heads, int head_dim,
                  float theta, void* stream);

// SiluMul: out[i] = silu(gate[i]) * up[i] for i < n. out may alias.
absl::Status SiluMul(const float* gate, const float* up, size_t n, float* out, void* stream);

// Softmax replaces each of `rows` rows of x [rows, n] by its softmax. n >= 1.
absl::Status Softmax(float* x, int rows, int n, void* stream);

// Argmax writes out[r] = the index of the largest x[r, i] (first on ties, NaN never wins, 0 when
// all are NaN), rows x n, n >= 1: greedy sampling on the device.
absl::Status Argmax(const float* x, int rows, int n, int32_t* out, void* stream);

}  // namespace kvguard::kernels::cuda

#endif  // KVGUARD_KERNELS_CUDA_OPS_H_
