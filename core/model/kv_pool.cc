#include "core/model/kv_pool.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "absl/base/internal/raw_logging.h"
#include "absl/strings/str_cat.h"
#include "kernels/cpu/codec.h"
#include "kernels/cpu/huge_page_allocator.h"

namespace kvguard::core {

using kernels::KvDtype;

absl::StatusOr<KvDtype> ParseKvDtype(const std::string& name) {
  if (name == "fp8_e4m3" || name == "fp8") return KvDtype::kFp8E4m3;
  if (name == "bf16") return KvDtype::kBf16;
  if (name == "fp32") return KvDtype::kFp32;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown KV cache dtype '", name, "' (fp8_e4m3, bf16, fp32)"));
}

absl::StatusOr<std::unique_ptr<KvPool>> KvPool::Create(const ModelConfig& config,
                                                       const KvPoolOptions& options) {
  if (absl::Status s = config.Validate(); !s.ok()) return s;
  if (options.page_size < 1 || options.page_size > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV page size ", options.page_size, " must be in [1, 1024]"));
  }
  const size_t elem = kernels::KvDtypeBytes(options.dtype);
  const size_t page_bytes = size_t{2} * config.n_layers * config.n_kv_heads *
                            static_cast<size_t>(options.page_size) * config.head_dim * elem;
  const size_t pages = options.budget_bytes / page_bytes;
  if (pages < 1) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache budget of ", options.budget_bytes,
                                                   " bytes does not hold one page of ", page_bytes,
                                                   " bytes (", options.page_size, " tokens of ",
                                                   kernels::KvDtypeName(options.dtype), ")"));
  }
  if (pages > (size_t{1} << 30)) {
    return absl::InvalidArgumentError("KV cache budget exceeds 2^30 pages");
  }
  // 2 MiB alignment lets a large pool sit on transparent huge pages; a pool smaller than one
  // huge page (tests, fuzzing) is only cache-line aligned rather than rounded up to 2 MiB.
  const size_t used = pages * page_bytes;
  const bool huge = used >= kernels::kHugePageBytes;
  const size_t align = huge ? kernels::kHugePageBytes : size_t{64};
  const size_t bytes = (used + align - 1) / align * align;
  // Huge-page advice comes before the first touch (AllocateHugePageBacked): advice given after
  // the pages are faulted in (as this code did until 2026-12-02) leaves them on 4 KiB pages until
  // khugepaged gets round to them (measured: `kvguard generate --model medium --kv-cache-bytes
  // 256M` had 16 MiB of AnonHugePages with the old order, 1.34 GiB with this one and huge-page
  // weights, 1.08 GiB with huge-page weights alone). Advisory: refused advice costs speed.
  void* base = huge ? kernels::AllocateHugePageBacked(bytes) : std::aligned_alloc(align, bytes);
  if (base == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", bytes, " bytes for the KV cache"));
  }
  // Zeroed before any page is granted: heap memory may hold a previous pool's KV, and a
  // page's first owner must never be able to see leftovers from before this pool existed. This
  // also faults every page in now, not inside a decode step.
  std::memset(base, 0, bytes);
  KvPoolOptions opts = options;
  if (opts.tag_keys == nullptr) {
    absl::StatusOr<std::unique_ptr<isolation::TagKeyRing>> ring =
        isolation::TagKeyRing::CreateEphemeral();
    if (!ring.ok()) {
      std::free(base);
      return ring.status();
    }
    opts.tag_keys = std::move(*ring);
  }
  return std::unique_ptr<KvPool>(
      new KvPool(config, opts, page_bytes, static_cast<int>(pages), static_cast<uint8_t*>(base)));
}

KvPool::KvPool(const ModelConfig& config, const KvPoolOptions& options, size_t page_bytes,
               int num_pages, uint8_t* base)
    : config_(config),
      options_(options),
      page_bytes_(page_bytes),
      head_elems_(static_cast<size_t>(options.page_size) * config.head_dim),
      num_pages_(num_pages),
      base_(base),
      table_(std::make_unique<isolation::OwnershipTable>(
          num_pages, options_.tag_keys.get(), [this](int32_t page) { ScrubPage(page); })) {}

KvPool::~KvPool() { std::free(base_); }

absl::Status KvPool::SetFp8Scales(std::vector<float> k_scales, std::vector<float> v_scales) {
  const size_t n = static_cast<size_t>(config_.n_layers) * config_.n_kv_heads;
  if (k_scales.size() != n || v_scales.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("FP8 KV scales: want ", n, " per K and V, got ",
                                                   k_scales.size(), " and ", v_scales.size()));
  }
  for (size_t i = 0; i < n; ++i) {
    if (!(std::isfinite(k_scales[i]) && k_scales[i] > 0 && std::isfinite(v_scales[i]) &&
          v_scales[i] > 0)) {
      return absl::InvalidArgumentError(absl::StrCat("FP8 KV scale ", i, " is not finite > 0"));
    }
  }
  k_scales_ = std::move(k_scales);
  v_scales_ = std::move(v_scales);
  return absl::OkStatus();
}

kernels::PagedKvView KvPool::LayerView(int layer) const {
  const size_t elem = kernels::KvDtypeBytes(options_.dtype);
  const size_t layer_elems = 2 * config_.n_kv_heads * head_elems_;
  kernels::PagedKvView view;
  view.dtype = options_.dtype;
  view.page_size = options_.page_size;
  view.num_kv_heads = config_.n_kv_heads;
  view.head_dim = config_.head_dim;
  view.k = base_ + layer * layer_elems * elem;
  view.v = base_ + (layer * layer_elems + config_.n_kv_heads * head_elems_) * elem;
  view.page_stride = static_cast<int64_t>(page_bytes_ / elem);
  view.page_tags = table_->tags();
  view.num_pages = num_pages();
  view.head_stride = static_cast<int64_t>(head_elems_);
  if (!k_scales_.empty()) {
    view.k_scale = &k_scales_[static_cast<size_t>(layer) * config_.n_kv_heads];
    view.v_scale = &v_scales_[static_cast<size_t>(layer) * config_.n_kv_heads];
  }
  return view;
}

void KvPool::WriteToken(int layer, const PageGrant& grant, int slot, const float* k,
                        const float* v) {
  ABSL_RAW_CHECK(grant.page >= 0 && grant.page < num_pages(), "WriteToken: invalid grant");
  ABSL_RAW_CHECK(slot >= 0 && slot < options_.page_size, "WriteToken: slot out of page");
  const KvDtype dtype = options_.dtype;
  ABSL_RAW_CHECK(dtype != KvDtype::kFp8E4m3 || !k_scales_.empty(),
                 "WriteToken: FP8 KV cache without calibrated scales");
  const int hd = config_.head_dim, P = options_.page_size;
  const size_t layer_elems = 2 * config_.n_kv_heads * head_elems_;
  uint8_t* page = PageBase(grant.page);
  for (int h = 0; h < config_.n_kv_heads; ++h) {
    const size_t k_off = layer * layer_elems + h * head_elems_;  // [head_dim, P]
    const size_t v_off = k_off + config_.n_kv_heads * head_elems_ + size_t(slot) * hd;  // [P, hd]
    const float* kh = k + size_t(h) * hd;
    const float* vh = v + size_t(h) * hd;
    const size_t si = static_cast<size_t>(layer) * config_.n_kv_heads + h;
    switch (dtype) {
      case KvDtype::kFp32: {
        float* kd = reinterpret_cast<float*>(page) + k_off;
        for (int d = 0; d < hd; ++d) kd[size_t(d) * P + slot] = kh[d];
        std::memcpy(reinterpret_cast<float*>(page) + v_off, vh, size_t(hd) * 4);
        break;
      }
      case KvDtype::kBf16: {
        uint16_t* kd = reinterpret_cast<uint16_t*>(page) + k_off;
        for (int d = 0; d < hd; ++d) kd[size_t(d) * P + slot] = kernels::Bf16FromFloat(kh[d]);
        kernels::EncodeBf16(vh, hd, reinterpret_cast<uint16_t*>(page) + v_off);
        break;
      }
      case KvDtype::kFp8E4m3: {
        const float ks = k_scales_[si];
        uint8_t* kd = page + k_off;
        for (int d = 0; d < hd; ++d)
          kd[size_t(d) * P + slot] = kernels::Fp8E4m3FromFloat(kh[d] / ks);
        kernels::EncodeFp8(vh, hd, v_scales_[si], page + v_off);
        break;
      }
    }
  }
}

void KvPool::ScrubPage(int32_t page) {
  ABSL_RAW_CHECK(page >= 0 && page < num_pages(), "ScrubPage: invalid page");
  std::memset(PageBase(page), 0, page_bytes_);
}

}  // namespace kvguard::core
