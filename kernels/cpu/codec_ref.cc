// kernels/cpu/codec_ref.cc: scalar references for the bulk codecs: plain loops over the scalar
// codecs of kernels/formats.h, the oracle the SIMD versions must match bit for bit.
#include <cmath>

#include "absl/base/internal/raw_logging.h"
#include "kernels/cpu/codec.h"
#include "kernels/formats.h"

namespace kvguard::kernels::ref {

void EncodeFp8(const float* x, size_t n, float scale, uint8_t* out) {
  ABSL_RAW_CHECK(std::isfinite(scale) && scale > 0.0f, "EncodeFp8: scale must be finite and > 0");
  for (size_t i = 0; i < n; ++i) out[i] = Fp8E4m3FromFloat(x[i] / scale);
}

void DecodeFp8(const uint8_t* in, size_t n, float scale, float* out) {
  for (size_t i = 0; i < n; ++i) out[i] = Fp8E4m3ToFloat(in[i]) * scale;
}

void EncodeBf16(const float* x, size_t n, uint16_t* out) {
  for (size_t i = 0; i < n; ++i) out[i] = Bf16FromFloat(x[i]);
}

void DecodeBf16(const uint16_t* in, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) out[i] = Bf16ToFloat(in[i]);
}

}  // namespace kvguard::kernels::ref
