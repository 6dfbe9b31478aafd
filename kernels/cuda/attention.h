// kernels/cuda/attention.h: paged decode attention on the GPU, with the in-kernel tag check.
//
// The contract of kernels/cpu/attention.h (one query token per request, GQA, causal to the
// request's length, online softmax, FP32 accumulation), on device memory, for FP8 e4m3 and BF16
// pages (formats.h layout), head_dim 64 or 128, at most kMaxGroup query heads per kv head, page
// sizes that divide 128. K and V are dequantised exactly (every e4m3 code, subnormals
// included); scores and outputs are FP32, so results match the CPU kernel's FP32 arithmetic
// within its budget (tests/kernels/cuda_kernels_test.cc).
//
// Long requests are split over several blocks (split-K: kSplitTokens tokens each, FlashDecoding)
// whose partial states a second kernel merges. Tag check: when kv.page_tags and
// batch.expected_tags are set, every block compares the current tag of each page of its range
// (and the page id against kv.num_pages) with the expected one before it loads any of those
// pages' K or V; a mismatch records the smallest failing page index in batch.tag_faults[r]
// (an unsigned atomic min over the -1 the launcher stores; -1 when all matched) and the block
// reads none of its pages. The merge then writes zeros instead of an output for that request,
// and the caller aborts it. Pages of other blocks of that request that did match may have been
// read; a page that did not match never is. A length above batch.max_length (device metadata
// out of step with the launch) fails the request too: tag_faults[r] = INT32_MAX, zero output.
#ifndef KVGUARD_KERNELS_CUDA_ATTENTION_H_
#define KVGUARD_KERNELS_CUDA_ATTENTION_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/formats.h"

namespace kvguard::kernels::cuda {

inline constexpr int kMaxGroup = 8;       // query heads per kv head
inline constexpr int kSplitTokens = 512;  // tokens per block of a long request

// DeviceDecodeBatch is a decode step's queries, every array in device memory.
struct DeviceDecodeBatch {
  int num_queries = 0;
  int max_length = 0;                      // >= every lengths[r]: sizes the split grid
  const float* q = nullptr;                // [num_queries, num_heads, head_dim]
  float* out = nullptr;                    // [num_queries, num_heads, head_dim]
  const int32_t* lengths = nullptr;        // [num_queries], each >= 1
  const int32_t* table_offsets = nullptr;  // [num_queries] first entry of r in page_ids
  const int32_t* page_ids = nullptr;       // concatenated page tables, token order
  const PageTag* expected_tags = nullptr;  // parallel to page_ids, or null: no tag check
  int32_t* tag_faults = nullptr;           // [num_queries] (with expected_tags)
};

// AttentionWorkspaceBytes returns the device scratch PagedDecodeAttention needs for this shape.
size_t AttentionWorkspaceBytes(const PagedKvView& kv, int num_heads, int num_queries,
                               int max_length);

// PagedDecodeAttention computes batch.out (see above). InvalidArgument for a shape it does not
// take (dtype, head_dim, group, page size); the launch error otherwise. `workspace` holds at
// least AttentionWorkspaceBytes(...) bytes of device memory.
absl::Status PagedDecodeAttention(const PagedKvView& kv, int num_heads, float softmax_scale,
                                  const DeviceDecodeBatch& batch, void* workspace,
                                  size_t workspace_bytes, void* stream);

}  // namespace kvguard::kernels::cuda

#endif  // KVGUARD_KERNELS_CUDA_ATTENTION_H_
