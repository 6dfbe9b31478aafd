// kernels/cuda/kv_write.cu: see kv_write.h. One thread per (token, kv head, dim) element; K's
// transposed layout makes the K stores strided (P apart), which is fine for one token per step.
#include <cuda_runtime.h>

#include "kernels/cuda/internal/launch.cuh"
#include "kernels/cuda/kv_write.h"

namespace kvguard::kernels::cuda {
namespace {

using internal::GridFor;
using internal::LaunchStatus;
using internal::Stream;

template <KvDtype kType>
__device__ __forceinline__ void Store(void* base, int64_t index, float x, float scale) {
  if constexpr (kType == KvDtype::kFp32) {
    static_cast<float*>(base)[index] = x;
  } else if constexpr (kType == KvDtype::kBf16) {
    static_cast<uint16_t*>(base)[index] = Bf16FromFloat(x);
  } else {
    static_cast<uint8_t*>(base)[index] = Fp8E4m3FromFloat(__fdiv_rn(x, scale));
  }
}

template <KvDtype kType>
__global__ void WriteKvKernel(PagedKvView kv, const float* k, const float* v, const KvSlot* slots,
                              int count, int32_t* bad_slots) {
  const int dim = kv.head_dim;
  const int per_token = kv.num_kv_heads * dim;
  const size_t total = static_cast<size_t>(count) * per_token;
  for (size_t t = blockIdx.x * size_t{blockDim.x} + threadIdx.x; t < total;
       t += size_t{gridDim.x} * blockDim.x) {
    const int token = static_cast<int>(t / per_token);
    const int e = static_cast<int>(t % per_token);
    const int head = e / dim, d = e % dim;
    const KvSlot s = slots[token];
    if (s.page < 0 || s.page >= kv.num_pages || s.slot < 0 || s.slot >= kv.page_size) {
      if (e == 0 && bad_slots != nullptr) atomicAdd(bad_slots, 1);
      continue;
    }
    const int64_t head_base = s.page * kv.page_stride + head * kv.head_stride;
    const float ks = kType == KvDtype::kFp8E4m3 ? kv.k_scale[head] : 1.0f;
    const float vs = kType == KvDtype::kFp8E4m3 ? kv.v_scale[head] : 1.0f;
    Store<kType>(const_cast<void*>(kv.k),
                 head_base + static_cast<int64_t>(d) * kv.page_size + s.slot, k[t], ks);
    Store<kType>(const_cast<void*>(kv.v), head_base + static_cast<int64_t>(s.slot) * dim + d, v[t],
                 vs);
  }
}

}  // namespace

absl::Status WriteKvTokens(const PagedKvView& kv, const float* k, const float* v,
                           const KvSlot* slots, int count, int32_t* bad_slots, void* stream) {
  if (count < 0 || kv.num_pages <= 0 || kv.page_size < 1 || kv.num_kv_heads < 1 ||
      kv.head_dim < 1) {
    return absl::InvalidArgumentError(
        "WriteKvTokens: count >= 0 and a view with pages (num_pages > 0), heads and dims");
  }
  const size_t total = static_cast<size_t>(count) * kv.num_kv_heads * kv.head_dim;
  if (total == 0) return absl::OkStatus();
  const unsigned blocks = GridFor(total, 256);
  switch (kv.dtype) {
    case KvDtype::kFp32:
      WriteKvKernel<KvDtype::kFp32>
          <<<blocks, 256, 0, Stream(stream)>>>(kv, k, v, slots, count, bad_slots);
      break;
    case KvDtype::kBf16:
      WriteKvKernel<KvDtype::kBf16>
          <<<blocks, 256, 0, Stream(stream)>>>(kv, k, v, slots, count, bad_slots);
      break;
    case KvDtype::kFp8E4m3:
      if (kv.k_scale == nullptr || kv.v_scale == nullptr) {
        return absl::InvalidArgumentError("WriteKvTokens: FP8 KV needs k_scale and v_scale");
      }
      WriteKvKernel<KvDtype::kFp8E4m3>
          <<<blocks, 256, 0, Stream(stream)>>>(kv, k, v, slots, count, bad_slots);
      break;
  }
  return LaunchStatus("WriteKvTokens");
}

}  // namespace kvguard::kernels::cuda
