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

// AttentionArithmetic says how PagedDecodeAttention computes a step on this machine:
//   kFp32          scores q . k and outputs p . v in FP32 from exactly dequantised K and V (the
//                  reference arithmetic; every Highway target, every dtype).
//   kBf16Products  q (times softmax_scale and the K scale) and the softmax probabilities are
//                  rounded to BF16 (relative error <= 2^-8 each) and multiplied with K and V,
//                  which are exact in BF16 (every FP8 e4m3 code is), in pairs summed in FP32
//                  (AVX-512 VDPBF16PS: twice the multiply-adds of an FP32 FMA per instruction).
//                  The output is an exact convex combination of V rows with the rounded
//                  probabilities as weights, up to FP32 rounding. Chosen for FP8 and BF16 KV
//                  with head_dim a multiple of 64 where runtime dispatch picks AVX3_DL and the
//                  CPU has AVX-512 BF16 (Zen 4, Sapphire Rapids and newer); FP32 KV always gets
//                  kFp32. Error bound: attention_test.cc.
enum class AttentionArithmetic { kFp32, kBf16Products };

// PagedAttentionArithmetic returns the arithmetic PagedDecodeAttention uses for `kv` now.
AttentionArithmetic PagedAttentionArithmetic(const PagedKvView& kv);

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

// Bf16ProductsErrorBound returns the largest |out - exact| (absolute, per output element) that
// the kBf16Products arithmetic may add for query head `head` of `query`, beyond FP32 rounding,
// derived from the data: rounding q to BF16 moves each score by at most
// delta_t = 2^-8 softmax_scale sum_d |q_d k_td| (FP8: plus softmax_scale 2^-6 k_scale
// sum_d |q_d| for subnormal K codes read as zero), so each softmax weight by a factor within
// e^(+-2 max_t delta_t); rounding the probabilities and normalising by their own sum moves each
// weight by at most 2^-8 (1 + 2^-8) relative; the weights sum to 1, so the output moves by at
// most max|V| times the sum of both, plus (FP8) 2^-6 v_scale for subnormal V codes read as
// zero. A worst-case bound: random data stays several times below it. Used by the tests and
// the kernel_diff fuzz target as the budget of that arithmetic.
double Bf16ProductsErrorBound(const PagedKvView& kv, int num_heads, float softmax_scale,
                              const DecodeQuery& query, int head);
}  // namespace ref

}  // namespace kvguard::kernels

#endif  // KVGUARD_KERNELS_CPU_ATTENTION_H_
