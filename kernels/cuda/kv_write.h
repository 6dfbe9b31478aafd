// kernels/cuda/kv_write.h: quantise-on-write of new tokens' K and V into paged KV on the GPU.
//
// The page layout is formats.h's PagedKvView (K [head_dim, P] and V [P, head_dim] per kv head
// of a page), on device memory; the conversion is the CPU pool's (core/model/kv_pool.cc
// WriteToken), bit for bit: FP8 stored = Fp8E4m3FromFloat(x / scale) with the per-(layer, kv head)
// scale (saturating, correctly rounded division), BF16 Bf16FromFloat(x), FP32 as is.
#ifndef KVGUARD_KERNELS_CUDA_KV_WRITE_H_
#define KVGUARD_KERNELS_CUDA_KV_WRITE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/formats.h"

namespace kvguard::kernels::cuda {

// KvSlot is where one token goes: physical page and token slot in it.
struct KvSlot {
  int32_t page = 0;
  int32_t slot = 0;
};

// WriteKvTokens writes token i's K and V (k, v: [count, num_kv_heads * head_dim], FP32) into
// page slots[i].page at slots[i].slot of `kv` (one layer; its k and v pointers are written
// through, the view's const notwithstanding), for i < count. Every slot must be owned by the
// caller's request, in the pool, and checked against its tag beforehand (the engine's write
// check); pages and slots are bounds-checked here too (an out-of-range one is skipped and
// *bad_slots, if given, incremented). InvalidArgument for count < 0 or a view without pages
// (kv.num_pages must be set). All pointers are device pointers.
absl::Status WriteKvTokens(const PagedKvView& kv, const float* k, const float* v,
                           const KvSlot* slots, int count, int32_t* bad_slots, void* stream);

}  // namespace kvguard::kernels::cuda

#endif  // KVGUARD_KERNELS_CUDA_KV_WRITE_H_
