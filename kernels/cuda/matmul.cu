// kernels/cuda/matmul.cu: see matmul.h. Block: 8 warps = 8 output rows; grid (row blocks,
// batch tiles of 8 columns). The block walks the columns in chunks of kColTile: the chunk of its
// 8 columns of x goes to shared memory, then every warp streams its row's weights of the chunk,
// each lane 4 bytes at a time (1 FP32, 2 BF16, 4 FP8 or 8 INT4 weights), reading the matching
// x as one 4- or 2-element vector (INT4: two, 4 floats apart; conflict-free), and keeps 8
// accumulators. A warp sum per column ends the row.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/internal/launch.cuh"
#include "kernels/cuda/matmul.h"

namespace kvguard::kernels::cuda {
namespace {

using internal::LaunchStatus;
using internal::Stream;
using internal::WarpSum;

constexpr int kWarps = 8;       // rows per block
constexpr int kBatchTile = 8;   // columns of x per pass over W
constexpr int kColTile = 1024;  // columns of W (and x) per shared-memory chunk

template <WeightFormat F, int G>
__global__ void __launch_bounds__(kWarps * 32)
    MatMulKernel(WeightView w, const float* __restrict__ x, int batch, float* __restrict__ y) {
  __shared__ __align__(16) float x_s[kBatchTile][kColTile];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = blockIdx.x * kWarps + warp;
  const int b0 = blockIdx.y * kBatchTile;
  const int cols = w.cols;
  const bool live = row < w.rows;
  float acc[kBatchTile];
#pragma unroll
  for (int b = 0; b < kBatchTile; ++b) acc[b] = 0.0f;

  const uint8_t* data = static_cast<const uint8_t*>(w.data);
  for (int c0 = 0; c0 < cols; c0 += kColTile) {
    const int span = min(kColTile, cols - c0);
    __syncthreads();  // the previous chunk's x is no longer read
    for (int i = threadIdx.x; i < kBatchTile * kColTile; i += kWarps * 32) {
      const int b = i / kColTile, c = i % kColTile;
      x_s[b][c] =
          (b0 + b < batch && c < span) ? x[static_cast<size_t>(b0 + b) * cols + c0 + c] : 0.0f;
    }
    __syncthreads();
    if (!live) continue;
    if constexpr (F == WeightFormat::kInt4) {
      // Eight columns per lane at a time: 4 bytes of the row's 64-byte tile (formats.h) hold
      // columns c .. c + 3 in their low nibbles and c + 4 .. c + 7 in their high ones, as
      // code + 8. c0 and c are multiples of 8, so the 8 columns share one group (8 | G).
      const int groups = cols / G;
      for (int c = lane * 8; c < span; c += 32 * 8) {
        const int col = c0 + c;
        const uint32_t four =
            *reinterpret_cast<const uint32_t*>(data + Int4CodeByte(row, col, cols));
        const float s =
            __half2float(__ushort_as_half(w.group_scales[Int4ScaleIndex(row, col / G, groups)]));
        const int lo = c, hi = c + 4;  // x offsets within the chunk
        float wl[4], wh[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int code = (four >> (8 * q)) & 0xFF;
          wl[q] = static_cast<float>((code & 0xF) - kInt4ZeroPoint) * s;
          wh[q] = static_cast<float>((code >> 4) - kInt4ZeroPoint) * s;
        }
        // Lane l reads x 32 bytes after lane l - 1, so lanes l and l + 4 would hit the same
        // banks (a 128-bit load is served 8 lanes at a time): lanes 4..7 of every 8 read their
        // high half first, spreading each load's 8 lanes over all 32 banks.
        const bool swap = (lane >> 2) & 1;
#pragma unroll
        for (int b = 0; b < kBatchTile; ++b) {
          const float4 xa = *reinterpret_cast<const float4*>(&x_s[b][swap ? hi : lo]);
          const float4 xb = *reinterpret_cast<const float4*>(&x_s[b][swap ? lo : hi]);
          const float4 xl = swap ? xb : xa, xh = swap ? xa : xb;
          float a = acc[b];
          a = fmaf(wl[0], xl.x, a);
          a = fmaf(wl[1], xl.y, a);
          a = fmaf(wl[2], xl.z, a);
          a = fmaf(wl[3], xl.w, a);
          a = fmaf(wh[0], xh.x, a);
          a = fmaf(wh[1], xh.y, a);
          a = fmaf(wh[2], xh.z, a);
          a = fmaf(wh[3], xh.w, a);
          acc[b] = a;
        }
      }
    } else if constexpr (F == WeightFormat::kFp8) {
      const uint8_t* codes = data + static_cast<size_t>(row) * cols;
      for (int c = lane * 4; c < span; c += 32 * 4) {
        const uint32_t four = *reinterpret_cast<const uint32_t*>(codes + c0 + c);
        float wv[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) wv[q] = Fp8E4m3ToFloat((four >> (8 * q)) & 0xFF);
#pragma unroll
        for (int b = 0; b < kBatchTile; ++b) {
          const float4 xv = *reinterpret_cast<const float4*>(&x_s[b][c]);
          acc[b] =
              fmaf(wv[0], xv.x, fmaf(wv[1], xv.y, fmaf(wv[2], xv.z, fmaf(wv[3], xv.w, acc[b]))));
        }
      }
    } else if constexpr (F == WeightFormat::kBf16) {
      const uint16_t* bits =
          reinterpret_cast<const uint16_t*>(data) + static_cast<size_t>(row) * cols;
      for (int c = lane * 2; c < span; c += 32 * 2) {
        const uint32_t two = *reinterpret_cast<const uint32_t*>(bits + c0 + c);
        const float w0 = Bf16ToFloat(two & 0xFFFF), w1 = Bf16ToFloat(two >> 16);
#pragma unroll
        for (int b = 0; b < kBatchTile; ++b) {
          const float2 xv = *reinterpret_cast<const float2*>(&x_s[b][c]);
          acc[b] = fmaf(w0, xv.x, fmaf(w1, xv.y, acc[b]));
        }
      }
    } else {
      const float* values = reinterpret_cast<const float*>(data) + static_cast<size_t>(row) * cols;
      for (int c = lane; c < span; c += 32) {
        const float wv = values[c0 + c];
#pragma unroll
        for (int b = 0; b < kBatchTile; ++b) acc[b] = fmaf(wv, x_s[b][c], acc[b]);
      }
    }
  }
  if (!live) return;
  const float row_scale = F == WeightFormat::kFp8 ? w.row_scales[row] : 1.0f;
#pragma unroll
  for (int b = 0; b < kBatchTile; ++b) {
    const float sum = WarpSum(acc[b]);
    if (lane == 0 && b0 + b < batch)
      y[static_cast<size_t>(b0 + b) * w.rows + row] = sum * row_scale;
  }
}

template <WeightFormat F, int G>
void Launch(const WeightView& w, const float* x, int batch, float* y, cudaStream_t stream) {
  const dim3 grid((w.rows + kWarps - 1) / kWarps, (batch + kBatchTile - 1) / kBatchTile);
  MatMulKernel<F, G><<<grid, kWarps * 32, 0, stream>>>(w, x, batch, y);
}

}  // namespace

absl::Status MatMul(const WeightView& w, const float* x, int batch, float* y, void* stream) {
  if (w.rows <= 0 || w.cols <= 0 || w.data == nullptr || x == nullptr || y == nullptr) {
    return absl::InvalidArgumentError("CUDA MatMul: empty weights or null x/y");
  }
  if (batch < 1 || batch > 64) return absl::InvalidArgumentError("CUDA MatMul: batch in [1, 64]");
  if (reinterpret_cast<uintptr_t>(w.data) % 4 != 0) {
    return absl::InvalidArgumentError("CUDA MatMul: weights must be 4-byte aligned");
  }
  cudaStream_t s = Stream(stream);
  switch (w.format) {
    case WeightFormat::kFp32:
      Launch<WeightFormat::kFp32, 0>(w, x, batch, y, s);
      break;
    case WeightFormat::kBf16:
      if (w.cols % 2 != 0) return absl::InvalidArgumentError("CUDA MatMul: BF16 cols must be even");
      Launch<WeightFormat::kBf16, 0>(w, x, batch, y, s);
      break;
    case WeightFormat::kFp8:
      if (w.cols % 4 != 0 || w.row_scales == nullptr) {
        return absl::InvalidArgumentError("CUDA MatMul: FP8 needs cols % 4 == 0 and row scales");
      }
      Launch<WeightFormat::kFp8, 0>(w, x, batch, y, s);
      break;
    case WeightFormat::kInt4:
      if (!IsValidInt4Group(w.group) || w.cols % w.group != 0 || w.group_scales == nullptr) {
        return absl::InvalidArgumentError(
            "CUDA MatMul: INT4 needs group 32/64/128 dividing cols, and group scales");
      }
      if (w.group == 32) {
        Launch<WeightFormat::kInt4, 32>(w, x, batch, y, s);
      } else if (w.group == 64) {
        Launch<WeightFormat::kInt4, 64>(w, x, batch, y, s);
      } else {
        Launch<WeightFormat::kInt4, 128>(w, x, batch, y, s);
      }
      break;
  }
  return LaunchStatus("MatMul");
}

}  // namespace kvguard::kernels::cuda
