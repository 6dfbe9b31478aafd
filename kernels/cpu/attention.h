// kernels/cpu/attention.h: paged decode attention (one query token per request, GQA).
#ifndef KVGUARD_KERNELS_CPU_ATTENTION_H_
#define KVGUARD_KERNELS_CPU_ATTENTION_H_

#include <vector>

#include "kernels/cpu/thread_pool.h"
#include "kernels/formats.h"

namespace kvguard::kernels {

// PagedDecodeAttention computes, for every request r and query head h,
//   out = softmax(q_h . K^T * softmax_scale) V   over the first queries[r].length tokens,
// with kv head h / (num_heads / kv.num_kv_heads) (grouped-query attention).
// K and V are read through `kv` (layout in formats.h); bytes beyond a request's length in its
// last page are never read. Online softmax; FP32 accumulation. Each queries[r].out receives
// [num_heads, head_dim]; q, page tables and KV stay owned by the caller. `pool` may be nullptr
// (single-threaded); with more threads, long requests are split over them (split-K).
// Preconditions (CHECKed): num_heads % kv.num_kv_heads == 0; IsSupportedHeadDim(head_dim);
// page_size >= 1; length >= 1; page ids >= 0; FP8 scales present. Page ids beyond the pool cannot
// be checked here (the view carries no page count): the caller (isolation) validates page tables.
void PagedDecodeAttention(const PagedKvView& kv, int num_heads, float softmax_scale,
                          const DecodeQuery* queries, int num_queries, ThreadPool* pool);

// IsSupportedHeadDim returns whether the attention kernels take `head_dim`: a multiple of 16
// (the widest vector, so every row is whole vectors on every target) in [16, 256]. 64 and 128
// are the tuned cases; 16 and 32 serve small trained models (aidreams260K: 16).
constexpr bool IsSupportedHeadDim(int head_dim) {
  return head_dim >= 16 && head_dim <= 256 && head_dim % 16 == 0;
}

namespace attention_internal {
// CheckTags applies the in-kernel tag check to queries[0, num_queries) (see above) and returns
// the queries to compute: `queries` itself when none failed, else the survivors, copied into
// *live. Sets *count to their number.
const DecodeQuery* CheckTags(const PagedKvView& kv, int num_heads, const DecodeQuery* queries,
                             int num_queries, std::vector<DecodeQuery>* live, int* count);
}  // namespace attention_internal

namespace ref {
// Scalar reference with the same contract (FP64 accumulation, two-pass softmax).
void PagedDecodeAttention(const PagedKvView& kv, int num_heads, float softmax_scale,
                          const DecodeQuery* queries, int num_queries, ThreadPool* pool);
}  // namespace ref

}  // namespace kvguard::kernels

#endif  // KVGUARD_KERNELS_CPU_ATTENTION_H_
