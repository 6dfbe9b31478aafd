// kernels/cpu/ops.h: the small per-token operators of a Llama-family decoder.
#ifndef KVGUARD_KERNELS_CPU_OPS_H_
#define KVGUARD_KERNELS_CPU_OPS_H_

#include <cstddef>
#include <cstdint>

namespace kvguard::kernels {

// RmsNorm writes out[i] = x[i] * weight[i] / sqrt(mean(x^2) + eps) for i < n.
// out may alias x.
void RmsNorm(const float* x, const float* weight, size_t n, float eps, float* out);

// Rope rotates `x` [num_heads, head_dim] in place for token position `pos`, Llama's
// rotate-half convention: for i < head_dim/2, with f = pos * theta^(-2i / head_dim),
//   (x[i], x[i + head_dim/2]) <- (x[i] cos f - x[i+d/2] sin f, x[i] sin f + x[i+d/2] cos f).
// head_dim must be even.
void Rope(float* x, int num_heads, int head_dim, int pos, float theta);

// SiluMul writes out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)). out may alias.
void SiluMul(const float* gate, const float* up, size_t n, float* out);

// Softmax replaces x[0..n) by its softmax (max-subtracted). n >= 1. With a NaN in x the
// result is unspecified (callers that may see NaN logits, like the sampler, clean them first).
void Softmax(float* x, size_t n);

// Argmax returns the index of the largest x[i] (the first one on ties; NaN never wins; 0
// when every element is NaN). n >= 1.
size_t Argmax(const float* x, size_t n);

namespace ref {
void RmsNorm(const float* x, const float* weight, size_t n, float eps, float* out);
void Rope(float* x, int num_heads, int head_dim, int pos, float theta);
void SiluMul(const float* gate, const float* up, size_t n, float* out);
void Softmax(float* x, size_t n);
size_t Argmax(const float* x, size_t n);
}  // namespace ref

}  // namespace kvguard::kernels

#endif  // KVGUARD_KERNELS_CPU_OPS_H_
