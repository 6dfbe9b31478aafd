// kernels/cpu/matmul_ref.cc: the scalar reference for y = W x.
//
// Each weight is decoded with the scalar codecs of kernels/formats.h and every product is
// accumulated in FP64. An FP8 or INT4 weight (code value x FP32 or FP16 scale) and its product
// with an FP32 x are exact in FP64, so the only rounding that matters is the final one to FP32
// (plus FP64 accumulation error, ~2^-53 per term): this is the "exact" answer the SIMD kernels'
// error budgets are measured against. With MatMulActivations::kBf16 it is the exact product of the
// dequantised W and x rounded to BF16 (what the BF16 dot-product kernel multiplies), for FP8 and
// BF16 weights on any CPU: the caller asks for it where MatMulArithmeticFor says kBf16Products.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "absl/base/internal/raw_logging.h"
#include "kernels/cpu/matmul.h"

namespace kvguard::kernels::ref {
namespace {

// WeightAt returns W[r, c] as the kernels see it: code value times its scale, in FP64.
double WeightAt(const WeightView& w, int64_t r, int64_t c) {
  const int64_t i = r * w.cols + c;
  const uint8_t* bytes = static_cast<const uint8_t*>(w.data);
  switch (w.format) {
    case WeightFormat::kFp32: {
      float v;
      std::memcpy(&v, bytes + i * 4, sizeof(v));
      return v;
    }
    case WeightFormat::kBf16: {
      uint16_t h;
      std::memcpy(&h, bytes + i * 2, sizeof(h));
      return Bf16ToFloat(h);
    }
    case WeightFormat::kFp8:
      return static_cast<double>(Fp8E4m3ToFloat(bytes[i])) * w.row_scales[r];
    case WeightFormat::kInt4: {
      const int64_t g = w.group;
      const double scale = Fp16ToFloat(w.group_scales[Int4ScaleIndex(r, c / g, w.cols / g)]);
      return (Int4Code(bytes, r, c, w.cols) - kInt4ZeroPoint) * scale;
    }
  }
  return 0.0;
}

// ActivationAt returns x as the kernels use it: as given, or (kBf16, FP8 and BF16 weights)
// rounded to BF16 to nearest even, denormals read as zero (VCVTNE2PS2BF16's behaviour).
double ActivationAt(float x, const WeightView& w, MatMulActivations activations) {
  const bool bf16 = activations == MatMulActivations::kBf16 &&
                    (w.format == WeightFormat::kFp8 || w.format == WeightFormat::kBf16);
  if (!bf16) return x;
  if (std::fabs(x) < 0x1p-126f) return 0.0;
  return Bf16ToFloat(Bf16FromFloat(x));
}

}  // namespace

void MatMul(const WeightView& w, const float* x, int batch, float* y, ThreadPool* pool,
            MatMulActivations activations) {
  ABSL_RAW_CHECK(w.rows > 0 && w.cols > 0 && w.data != nullptr, "ref::MatMul: empty weights");
  ABSL_RAW_CHECK(batch >= 1, "ref::MatMul: batch must be at least 1");
  ABSL_RAW_CHECK(w.format != WeightFormat::kFp8 || w.row_scales != nullptr,
                 "ref::MatMul: FP8 needs row scales");
  ABSL_RAW_CHECK(
      w.format != WeightFormat::kInt4 ||
          (IsValidInt4Group(w.group) && w.cols % w.group == 0 && w.group_scales != nullptr),
      "ref::MatMul: bad INT4 group or scales");
  auto rows_fn = [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int b = 0; b < batch; ++b) {
        double acc = 0.0;
        for (int64_t c = 0; c < w.cols; ++c) {
          acc += WeightAt(w, r, c) * ActivationAt(x[b * w.cols + c], w, activations);
        }
        y[b * w.rows + r] = static_cast<float>(acc);
      }
    }
  };
  if (pool != nullptr) {
    pool->ParallelFor(w.rows, 1, rows_fn);
  } else {
    rows_fn(0, w.rows);
  }
}

}  // namespace kvguard::kernels::ref
