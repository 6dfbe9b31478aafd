// kernels/cpu/codec.h: bulk FP8 e4m3 and BF16 encode/decode (SIMD with runtime dispatch).
//
// Every function here has a scalar twin of the same signature in namespace `ref`, built on the
// scalar codecs in kernels/formats.h; the SIMD versions equal their twins bit for bit.
#ifndef KVGUARD_KERNELS_CPU_CODEC_H_
#define KVGUARD_KERNELS_CPU_CODEC_H_

#include <cstddef>
#include <cstdint>

namespace kvguard::kernels {

// EncodeFp8 writes out[i] = Fp8E4m3FromFloat(x[i] / scale) for i < n (stored = sat(rne(x/scale))).
// `scale` must be finite and > 0. No alignment is required.
void EncodeFp8(const float* x, size_t n, float scale, uint8_t* out);

// DecodeFp8 writes out[i] = Fp8E4m3ToFloat(in[i]) * scale for i < n.
void DecodeFp8(const uint8_t* in, size_t n, float scale, float* out);

// EncodeBf16 writes out[i] = Bf16FromFloat(x[i]) for i < n.
void EncodeBf16(const float* x, size_t n, uint16_t* out);

// DecodeBf16 writes out[i] = Bf16ToFloat(in[i]) for i < n.
void DecodeBf16(const uint16_t* in, size_t n, float* out);

namespace ref {
void EncodeFp8(const float* x, size_t n, float scale, uint8_t* out);
void DecodeFp8(const uint8_t* in, size_t n, float scale, float* out);
void EncodeBf16(const float* x, size_t n, uint16_t* out);
void DecodeBf16(const uint16_t* in, size_t n, float* out);
}  // namespace ref

}  // namespace kvguard::kernels

#endif  // KVGUARD_KERNELS_CPU_CODEC_H_
