// core/model/kv_pool.h: the physical paged KV cache: one byte budget, pages of P tokens holding K
// and V of every layer and kv head, in FP8 e4m3 (default), BF16 or FP32.
//
// Memory layout of one page (kernels/formats.h owns the per-head layouts the attention
// kernels read):
//   page p: [n_layers][K, V][n_kv_heads][...]
//     K of one (layer, head): [head_dim, P]  (transposed)
//     V of one (layer, head): [P, head_dim]
// A page is one contiguous block, so releasing, scrubbing or copying a page is one range.
//
// The pool never hands out page indices: callers hold PageGrants from table(), the isolation
// layer's ownership table (isolation/ownership_table.h), and every accessor here takes one.
// The pool owns the table because the table is the only way into the pool's memory.
#ifndef KVGUARD_CORE_MODEL_KV_POOL_H_
#define KVGUARD_CORE_MODEL_KV_POOL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model/model_config.h"
#include "isolation/ownership_table.h"
#include "isolation/tag_key.h"
#include "kernels/formats.h"

namespace kvguard::core {

struct KvPoolOptions {
  kernels::KvDtype dtype = kernels::KvDtype::kFp8E4m3;
  int page_size = 16;       // P, tokens per page
  size_t budget_bytes = 0;  // total bytes for pages (rounded down to whole pages)
  // Derives the page tags; null: a fresh ephemeral ring (keys die with the process).
  std::shared_ptr<isolation::TagKeyRing> tag_keys;
};

using isolation::Owner;
using isolation::PageGrant;

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
  int num_pages() const { return num_pages_; }
  int64_t capacity_tokens() const { return int64_t{num_pages()} * page_size(); }

  isolation::OwnershipTable& table() { return *table_; }
  const isolation::OwnershipTable& table() const { return *table_; }
  const std::shared_ptr<isolation::TagKeyRing>& tag_keys() const { return options_.tag_keys; }

  // SetFp8Scales installs the per-(layer, kv head) scales [n_layers * n_kv_heads] of K and V
  // (FP8 only; ignored for other dtypes). Every scale must be finite and > 0.
  absl::Status SetFp8Scales(std::vector<float> k_scales, std::vector<float> v_scales);
  bool has_fp8_scales() const { return !k_scales_.empty(); }

  // LayerView returns the attention kernels' view of `layer` (all pages; the page tables
  // passed with each query decide which are read), with the table's page tags for the
  // kernels' own check.
  kernels::PagedKvView LayerView(int layer) const;

  // WriteToken quantises one token's K and V ([n_kv_heads, head_dim] each, FP32) of `layer`
  // into slot `slot` (0 <= slot < P) of the page of `grant`. The caller must hold the grant.
  void WriteToken(int layer, const PageGrant& grant, int slot, const float* k, const float* v);

 private:
  KvPool(const ModelConfig& config, const KvPoolOptions& options, size_t page_bytes, int num_pages,
         uint8_t* base);
  uint8_t* PageBase(int32_t page) const { return base_ + static_cast<size_t>(page) * page_bytes_; }
  // ScrubPage zeroes one physical page (every layer, K and V): the table calls it before a
  // page released with scrub is free again.
  void ScrubPage(int32_t page);

  ModelConfig config_;
  KvPoolOptions options_;
  size_t page_bytes_;
  size_t head_elems_;  // P * head_dim: one (layer, K|V, head) block, in elements
  int num_pages_;
  uint8_t* base_;                           // [num_pages * page_bytes], 2 MiB aligned if >= 2 MiB
  std::vector<float> k_scales_, v_scales_;  // [n_layers * n_kv_heads]
  std::unique_ptr<isolation::OwnershipTable> table_;  // after base_: it scrubs through it
};

}  // namespace kvguard::core

#endif  // KVGUARD_CORE_MODEL_KV_POOL_H_
