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
// Preconditions (CHECKed): num_heads % kv.num_kv_heads == 0; head_dim 64 or 128; page_size >= 1;
// length >= 1; page ids >= 0; FP8 scales present. Page ids beyond the pool cannot be checked here
// (the view carries no page count): the caller (isolation) validates page tables.
void PagedDecodeAttention(const PagedKvView& kv, int num_heads, float softmax_scale,
                          const DecodeQuery* queries, int num_queries, ThreadPool* pool);

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
