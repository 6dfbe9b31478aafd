// kernels/cuda/codec.h: host launchers for the FP8 e4m3 / BF16 codecs on the GPU.
//
// Same convention and bit-exact results as kernels/cpu/codec.h: both sides use the scalar
// codecs of kernels/formats.h. Pointers are device pointers; launches go on `stream`
// (a cudaStream_t passed as void*, null for the default stream) and are asynchronous.
// Each launcher returns an error if the launch fails; shapes are the caller's to validate.
#ifndef KVGUARD_KERNELS_CUDA_CODEC_H_
#define KVGUARD_KERNELS_CUDA_CODEC_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace kvguard::kernels::cuda {

// EncodeFp8 writes out[i] = Fp8E4m3FromFloat(x[i] / scale) for i < n.
absl::Status EncodeFp8(const float* x, size_t n, float scale, uint8_t* out, void* stream);

// DecodeFp8 writes out[i] = Fp8E4m3ToFloat(in[i]) * scale for i < n.
absl::Status DecodeFp8(const uint8_t* in, size_t n, float scale, float* out, void* stream);

// EncodeBf16 / DecodeBf16: as kernels/cpu/codec.h.
absl::Status EncodeBf16(const float* x, size_t n, uint16_t* out, void* stream);
absl::Status DecodeBf16(const uint16_t* in, size_t n, float* out, void* stream);

}  // namespace kvguard::kernels::cuda

#endif  // KVGUARD_KERNELS_CUDA_CODEC_H_
