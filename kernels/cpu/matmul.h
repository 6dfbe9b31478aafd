// kernels/cpu/matmul.h: y = W x for quantised W (FP32, BF16, FP8, INT4) and FP32 x.
//
// Batch 1 is a GEMV; batch > 1 is a small GEMM that streams W once and applies each loaded
// piece of it to every column of x. Work is split over output rows on the caller's pool.
#ifndef KVGUARD_KERNELS_CPU_MATMUL_H_
#define KVGUARD_KERNELS_CPU_MATMUL_H_

#include "kernels/cpu/thread_pool.h"
#include "kernels/formats.h"

namespace kvguard::kernels {

// MatMulActivations says what MatMul may do to x for FP8 and BF16 weights:
//   kExact  x is used as given (FP32 products and sums).
//   kBf16   on CPUs with AVX-512 BF16 and VBMI (Zen 4, Zen 5, Sapphire Rapids), x is rounded to
//           BF16 and the products are summed on BF16 dot products (twice the multiply-adds per
//           instruction: prefill, which is bound by them); elsewhere as kExact.
// Either way the arithmetic depends on the weights, the request and the CPU, never on the batch:
// a column's outputs are the same bit for bit whatever other columns share the call (the engine
// relies on it: a request's tokens do not depend on what it is batched with). FP32 weights are
// always exact, INT4 always rounds x to int8 per group.
enum class MatMulActivations { kExact, kBf16 };

// MatMul computes y[b, r] = sum_c W[r, c] * x[b, c] for b < batch, r < w.rows.
//   x: [batch, w.cols] row-major FP32; y: [batch, w.rows] row-major FP32 (overwritten).
//   batch >= 1 (the kernels take calls of up to 64 columns, 512 on BF16 dot products; larger
//   batches run as calls of balanced sizes). `pool` may be null (single-threaded). Preconditions
//   (CHECKed): a non-empty view, batch in range, FP8 row scales, INT4 group 32/64/128 dividing
//   cols.
// MatMulArithmeticFor says how y is computed; the error bounds are derived in matmul.cc and
// matmul_bf16dot.cc. A non-finite x makes that column's outputs inf or NaN. Safe to call from
// several threads at once, each with its own pool (or none): per-call scratch is per thread.
void MatMul(const WeightView& w, const float* x, int batch, float* y, ThreadPool* pool,
            MatMulActivations activations = MatMulActivations::kExact);

// MatMulArithmetic is how MatMul computes y:
//   kFp32            weights exact, x exact, FP32 products and sums;
//   kBf16Products    weights exact, x rounded to BF16 (relative error <= 2^-8 per element,
//                    denormal x read as zero), FP32 products and sums: |y - y_exact| <= 2^-8
//                    sum_c |W[r,c] x[b,c]| plus the FP32 accumulation error (matmul_bf16dot.cc);
//   kInt8Activations INT4 weights, x rounded to int8 per weight group (matmul.cc).
enum class MatMulArithmetic { kFp32, kBf16Products, kInt8Activations };
// MatMulArithmeticFor returns the arithmetic MatMul uses for `format` and `activations` on this
// CPU, under the SIMD target runtime dispatch picks now (ForceTarget included).
MatMulArithmetic MatMulArithmeticFor(WeightFormat format, MatMulActivations activations);
// MatMulArithmeticName returns "fp32", "bf16-products" or "int8-activations".
const char* MatMulArithmeticName(MatMulArithmetic arithmetic);

namespace ref {
// Scalar reference: dequantises each weight and accumulates in FP64, so it is the exact
// product of the dequantised W and x up to one final rounding per output. With kBf16, FP8 and
// BF16 weights multiply x rounded to BF16 (denormals as zero), on every CPU: the operands of
// MatMulArithmetic::kBf16Products.
void MatMul(const WeightView& w, const float* x, int batch, float* y, ThreadPool* pool,
            MatMulActivations activations = MatMulActivations::kExact);
}  // namespace ref

}  // namespace kvguard::kernels

#endif  // KVGUARD_KERNELS_CPU_MATMUL_H_
