// kernels/cpu/internal/attention_task.h: what the paged attention kernels share (not public).
//
// PagedDecodeAttention (attention.cc) cuts a step into tasks, one (request, kv head, token
// range) each, and runs them on one of two task kernels:
//   * the Highway kernel in attention.cc (every target; FP32 arithmetic on exactly dequantised
//     K and V);
//   * the BF16 dot-product kernel in attention_bf16dot.cc (x86-64 with AVX-512 BF16 and VBMI,
//     FP8 and BF16 KV, head_dim a multiple of 64), which rounds the scaled query and the
//     softmax probabilities to BF16 and sums the products in FP32 with VDPBF16PS: twice the
//     multiply-adds per instruction, which is what decode attention with GQA is bound by on a
//     CPU (attention.h, PagedAttentionArithmetic).
// Both write results the same way: a task either owns its request's whole range for its kv
// head and writes the output rows, or writes a partial state that MergeSplit combines.
#ifndef KVGUARD_KERNELS_CPU_INTERNAL_ATTENTION_TASK_H_
#define KVGUARD_KERNELS_CPU_INTERNAL_ATTENTION_TASK_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>

#include "kernels/cpu/thread_pool.h"
#include "kernels/formats.h"

namespace kvguard::kernels::attention_internal {

// Task is one (request, kv heads) item, or one page-aligned token range of it (split-K). The
// Highway kernel's tasks cover one kv head; the BF16 dot-product kernel's cover all of them, so
// that each page is read front to back (see attention_bf16dot.cc).
struct Task {
  int query = 0;
  int kv_head = 0;      // first kv head
  int kv_heads = 1;     // kv heads [kv_head, kv_head + kv_heads)
  int token_begin = 0;  // a multiple of page_size
  int token_end = 0;    // exclusive, <= the request's length
  int partial = -1;     // partial-state slot of kv_head to write, or -1: write the output rows
  int partial_head_stride = 0;  // slots between consecutive kv heads' partial states
};

// PartialFloats returns the size of one partial state: [group] running max, [group] running
// sum, [group, head_dim] unnormalised accumulator (output units before VFactor).
inline size_t PartialFloats(int group, int head_dim) {
  return static_cast<size_t>(group) * static_cast<size_t>(head_dim + 2);
}

// VFactor returns what the Highway kernel's accumulator is multiplied by (before dividing by
// the sum): the V scale times 2^8 for FP8 (see attention.cc), else 1.
inline float VFactor(const PagedKvView& kv, int kv_head) {
  return kv.dtype == KvDtype::kFp8E4m3 ? kv.v_scale[kv_head] * 256.0f : 1.0f;
}

// GatherK copies the valid tokens of K pages[i] (counts[i] of page_size columns in each of dim
// rows, elements of elem_bytes) side by side into dst [dim, width], width = the sum of counts
// rounded up to a multiple of `multiple`, and zero-fills the padding. Exactly the valid
// elements are read. Returns width.
inline size_t GatherK(const void* const* pages, const int* counts, int num_pages, int page_size,
                      int dim, size_t elem_bytes, size_t multiple, void* dst) {
  size_t total = 0;
  for (int i = 0; i < num_pages; ++i) total += static_cast<size_t>(counts[i]);
  const size_t width = (total + multiple - 1) / multiple * multiple;
  for (int d = 0; d < dim; ++d) {
    char* row = static_cast<char*>(dst) + static_cast<size_t>(d) * width * elem_bytes;
    size_t col = 0;
    for (int i = 0; i < num_pages; ++i) {
      std::memcpy(row + col * elem_bytes,
                  static_cast<const char*>(pages[i]) +
                      static_cast<size_t>(d) * static_cast<size_t>(page_size) * elem_bytes,
                  static_cast<size_t>(counts[i]) * elem_bytes);
      col += static_cast<size_t>(counts[i]);
    }
    std::memset(row + col * elem_bytes, 0, (width - col) * elem_bytes);
  }
  return width;
}

// RunTaskList calls fn(i) for every i in [0, n) on `pool` (may be null). Threads claim tasks
// one at a time, so requests of different lengths balance themselves.
void RunTaskList(size_t n, ThreadPool* pool, const std::function<void(size_t)>& fn);

// Bf16DotTakes returns whether the BF16 dot-product kernel handles `kv`'s shape: FP8 or BF16
// elements and head_dim a multiple of 64 (any page size).
inline bool Bf16DotTakes(const PagedKvView& kv) {
  return kv.dtype != KvDtype::kFp32 && kv.head_dim % 64 == 0;
}

// AttendTaskBf16Dot runs `task` (all `group` query heads of each of its kv heads over one token
// range) with the BF16 dot-product kernel. Only call it when internal::HasAvx512Bf16Vbmi() and
// Bf16DotTakes(kv). A task with partial < 0 writes the query.out rows of its heads; else kv
// head kv_head + i writes the partial state at slot partial + i * partial_head_stride, its
// accumulator in output units times 1 / VFactor(kv, head), as the Highway kernel does.
void AttendTaskBf16Dot(const PagedKvView& kv, int group, float softmax_scale,
                       const DecodeQuery& query, const Task& task, float* partials);

}  // namespace kvguard::kernels::attention_internal

#endif  // KVGUARD_KERNELS_CPU_INTERNAL_ATTENTION_TASK_H_
