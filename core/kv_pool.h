// core/kv_pool.h: the physical paged KV cache: one byte budget, pages of P tokens holding K
// and V of every layer and kv head, in FP8 e4m3 (default), BF16 or FP32.
//
// Memory layout of one page (kernels/formats.h owns the per-head layouts the attention
// kernels read):
//   page p: [n_layers][K, V][n_kv_heads][...]
//     K of one (layer, head): [head_dim, P]  (transposed)
//     V of one (layer, head): [P, head_dim]
// A page is one contiguous block, so releasing, scrubbing or copying a page is one range.
//
// The pool never hands out page indices: callers hold PageGrants from allocator() and every
// accessor here takes one.
#ifndef KVGUARD_CORE_KV_POOL_H_
#define KVGUARD_CORE_KV_POOL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model_config.h"
#include "core/page_allocator.h"
#include "kernels/formats.h"

namespace kvguard::core {

struct KvPoolOptions {
  kernels::KvDtype dtype = kernels::KvDtype::kFp8E4m3;
  int page_size = 16;       // P, tokens per page
  size_t budget_bytes = 0;  // total bytes for pages (rounded down to whole pages)
};

// ParseKvDtype maps "fp8_e4m3" | "bf16" | "fp32" to a KvDtype; InvalidArgument otherwise.
absl::StatusOr<kernels::KvDtype> ParseKvDtype(const std::string& name);

class KvPool {
 public:
  // Create allocates budget_bytes / page_bytes pages. InvalidArgument if the budget does not
  // hold one page; ResourceExhausted if the memory cannot be allocated.
  static absl::StatusOr<std::unique_ptr<KvPool>> Create(const ModelConfig& config,
                                                        const KvPoolOptions& options);
  ~KvPool();
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;

  kernels::KvDtype dtype() const { return options_.dtype; }
  int page_size() const { return options_.page_size; }
  size_t page_bytes() const { return page_bytes_; }
  int num_pages() const { return allocator_.total_pages(); }
  int64_t capacity_tokens() const { return int64_t{num_pages()} * page_size(); }

  PageAllocator& allocator() { return allocator_; }
  const PageAllocator& allocator() const { return allocator_; }

  // SetFp8Scales installs the per-(layer, kv head) scales [n_layers * n_kv_heads] of K and V
  // (FP8 only; ignored for other dtypes). Every scale must be finite and > 0.
  absl::Status SetFp8Scales(std::vector<float> k_scales, std::vector<float> v_scales);
  bool has_fp8_scales() const { return !k_scales_.empty(); }

  // LayerView returns the attention kernels' view of `layer` (all pages; the page tables
  // passed with each query decide which are read).
  kernels::PagedKvView LayerView(int layer) const;

  // WriteToken quantises one token's K and V ([n_kv_heads, head_dim] each, FP32) of `layer`
  // into slot `slot` (0 <= slot < P) of the page of `grant`. The caller must hold the grant.
  void WriteToken(int layer, const PageGrant& grant, int slot, const float* k, const float* v);

  // ScrubPage zeroes the page of `grant` (every layer, K and V).
  void ScrubPage(const PageGrant& grant);

 private:
  KvPool(const ModelConfig& config, const KvPoolOptions& options, size_t page_bytes, int num_pages,
         uint8_t* base);
  uint8_t* PageBase(int32_t page) const { return base_ + static_cast<size_t>(page) * page_bytes_; }

  ModelConfig config_;
  KvPoolOptions options_;
  size_t page_bytes_;
  size_t head_elems_;  // P * head_dim: one (layer, K|V, head) block, in elements
  PageAllocator allocator_;
  uint8_t* base_;                           // [num_pages * page_bytes], 2 MiB aligned
  std::vector<float> k_scales_, v_scales_;  // [n_layers * n_kv_heads]
};

}  // namespace kvguard::core

#endif  // KVGUARD_CORE_KV_POOL_H_
