// kernels/cpu/attention.cc: SIMD paged decode attention, compiled once per Highway target.
//
// Work is split into (request, kv head) items; all query heads of a kv head (the GQA group) are
// processed together, so each K/V byte is loaded from memory once per step. Within an item,
// pages are processed in blocks of a few pages: scores for the block (K is stored transposed,
// [head_dim, P], so a score vector over P tokens is head_dim broadcast-FMAs), one online-softmax
// update per block, then the block's V rows are accumulated. Everything is FP32.
//
// Security: bytes beyond a request's length in its last page may hold another tenant's data or
// FP8 NaN codes; they are never loaded. A partial page's K rows are copied element-exactly into
// a zero-padded buffer (masked loads of 8/16-bit lanes are full-width loads on SSE4/AVX2 in
// Highway 1.0.3), and only the V rows of valid tokens are read.
//
// Dequantisation is folded into the math: an FP8 e4m3 byte, sign-extended to 16 bits, shifted
// left by 7 and masked with 0xBF80, is the FP16 encoding of value * 2^-8 exactly (subnormals
// included), which one PromoteTo widens. The 2^8 and the K scale are folded into q, and the 2^8
// and the V scale into the final output scaling. BF16 widens by a 16-bit shift. (The FP8 NaN
// codes S.1111.111, which the quantiser never writes for finite input, decode to +-480 here.)
//
// Performance (Zen 4, AVX-512 executed as two 256-bit halves): every KV element costs `group`
// FMA lanes for K and again for V, so with group 4 FP8 is FMA-bound at ~9.5 GB/s per core; BF16
// and FP32 are bound by memory latency on the scattered 2-8 KiB page slices, which software
// prefetch a few pages ahead (into L2) hides in part.
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include "absl/base/internal/raw_logging.h"
#include "kernels/cpu/internal/attention_task.h"
#include "kernels/cpu/internal/cpu_features.h"
#include "kernels/formats.h"

#ifndef KVGUARD_KERNELS_CPU_ATTENTION_CC_ONCE_
#define KVGUARD_KERNELS_CPU_ATTENTION_CC_ONCE_
namespace kvguard::kernels::attention_internal {

// SplitItem is an item whose token range was split over partial-state slots
// [first_partial, first_partial + num_parts).
struct SplitItem {
  int query = 0;
  int kv_head = 0;
  int first_partial = 0;
  int num_parts = 0;
};

struct Plan {
  std::vector<Task> tasks;
  std::vector<SplitItem> splits;
  int num_partials = 0;
};

// Below this many tokens per piece, merging partial states costs more than the balance gains.
constexpr int64_t kMinSplitTokens = 256;

// MakePlan splits the work over `threads` threads. Items are (request, kv head), or whole
// requests with `all_heads` (the BF16 dot-product kernel's tasks); with more than one thread,
// any item longer than a fair share of the total (total work / 2 threads, at least
// kMinSplitTokens) is cut into page-aligned pieces, FlashDecoding's split-K. With many equal
// items nothing is split; with few long items (fewer than 2 per thread), each is cut so that
// every thread gets about two pieces. Longest tasks go first, as threads pull tasks
// dynamically. A split request's partial slots are [first, first + heads * parts): kv head g,
// piece i at first + g * parts + i.
inline Plan MakePlan(const PagedKvView& kv, const DecodeQuery* queries, int num_queries,
                     int threads, bool all_heads) {
  Plan plan;
  const int64_t page = kv.page_size;
  const int heads_per_item = all_heads ? kv.num_kv_heads : 1;
  int64_t total = 0;
  for (int r = 0; r < num_queries; ++r) total += queries[r].length;
  total *= kv.num_kv_heads;
  int64_t piece = INT64_MAX;  // tokens
  if (threads > 1) {
    piece = std::max(kMinSplitTokens, (total + 2 * threads - 1) / (2 * threads) / heads_per_item);
    piece = (piece + page - 1) / page * page;
  }
  plan.tasks.reserve(static_cast<size_t>(num_queries) * static_cast<size_t>(kv.num_kv_heads));
  for (int r = 0; r < num_queries; ++r) {
    const int64_t length = queries[r].length;
    int64_t parts = length > piece ? (length + piece - 1) / piece : 1;
    int64_t per = length;
    if (parts > 1) {
      per = ((length + parts - 1) / parts + page - 1) / page * page;
      parts = (length + per - 1) / per;
    }
    for (int g = 0; g < kv.num_kv_heads; g += heads_per_item) {
      if (parts <= 1) {
        plan.tasks.push_back({r, g, heads_per_item, 0, static_cast<int>(length), -1, 0});
        continue;
      }
      for (int h = 0; h < heads_per_item; ++h) {
        plan.splits.push_back(
            {r, g + h, plan.num_partials + h * static_cast<int>(parts), static_cast<int>(parts)});
      }
      for (int64_t i = 0; i < parts; ++i) {
        plan.tasks.push_back({r, g, heads_per_item, static_cast<int>(i * per),
                              static_cast<int>(std::min(length, (i + 1) * per)),
                              plan.num_partials + static_cast<int>(i), static_cast<int>(parts)});
      }
      plan.num_partials += heads_per_item * static_cast<int>(parts);
    }
  }
  std::stable_sort(plan.tasks.begin(), plan.tasks.end(), [](const Task& a, const Task& b) {
    return a.token_end - a.token_begin > b.token_end - b.token_begin;
  });
  return plan;
}

// MergeSplit combines the partial states of one split item and writes its output rows
// out[group, head_dim]: with M the largest running max, each piece is weighted by
// exp(m_i - M), exactly as if one pass had seen all tokens.
inline void MergeSplit(const SplitItem& item, const float* partials, int group, int head_dim,
                       float v_factor, float* out) {
  const size_t slot = PartialFloats(group, head_dim);
  std::vector<float> weight(static_cast<size_t>(item.num_parts));
  for (int h = 0; h < group; ++h) {
    float max = -INFINITY;
    for (int i = 0; i < item.num_parts; ++i) {
      max = std::max(max, partials[(item.first_partial + i) * slot + h]);
    }
    float sum = 0.0f;
    for (int i = 0; i < item.num_parts; ++i) {
      const float* state = partials + (item.first_partial + i) * slot;
      weight[i] = std::exp(state[h] - max);
      sum += weight[i] * state[group + h];
    }
    const float norm = v_factor / sum;
    for (int d = 0; d < head_dim; ++d) {
      float acc = 0.0f;
      for (int i = 0; i < item.num_parts; ++i) {
        const float* state = partials + (item.first_partial + i) * slot;
        acc += weight[i] * state[2 * group + h * head_dim + d];
      }
      out[h * head_dim + d] = acc * norm;
    }
  }
}

}  // namespace kvguard::kernels::attention_internal
#endif  // KVGUARD_KERNELS_CPU_ATTENTION_CC_ONCE_

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/attention.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

// After highway.h: a per-target header.
#include "hwy/contrib/math/math-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvguard::kernels {
namespace HWY_NAMESPACE {
// Anonymous: other kernel files define helpers in the same per-target namespace.
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using attention_internal::Task;

// At most 16 lanes, so that every supported head_dim (a multiple of 16) is a multiple of the
// lane count on every target.
using DF = hn::CappedTag<float, 16>;
using VF = hn::Vec<DF>;

// Query heads of one kv head that share one pass over a K or V row: their accumulators fit in
// 16 vector registers. Larger groups take several tiles per block; the block is then in L1 or
// L2, so memory still sees each byte once (the dequantisation is repeated per tile).
constexpr int kMaxTile = 8;

// V bytes of one block (per kv head): small enough that the block's V rows stay in L1 while
// AccumulateV walks them once per column chunk.
constexpr size_t kBlockVBytes = 16 << 10;
// Pages in a block at most: one-token pages of FP8 rows of head_dim 64 (narrower heads are
// clamped to it: their blocks hold fewer bytes, which costs nothing measurable).
constexpr int kMaxBlockPages = static_cast<int>(kBlockVBytes / 64);

// How far ahead (K and V bytes of one kv head) PrefetchPage runs. Measured on Zen 4 (FP8, BF16,
// context 4096): 8-48 KiB all within noise of each other and 1.3-1.6x faster than none.
constexpr size_t kPrefetchAheadBytes = 24 << 10;

// LoadRow returns Lanes(df) consecutive elements at `p`, decoded to FP32 (FP8: times 2^-8).
HWY_INLINE VF LoadRow(DF df, const float* HWY_RESTRICT p) { return hn::LoadU(df, p); }

HWY_INLINE VF LoadRow(DF df, const uint16_t* HWY_RESTRICT p) {
  const hn::RebindToUnsigned<DF> du32;
  const hn::Rebind<uint16_t, DF> du16;
  return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du32, hn::LoadU(du16, p))));
}

HWY_INLINE VF LoadRow(DF df, const uint8_t* HWY_RESTRICT p) {
  const hn::Rebind<int8_t, DF> di8;
  const hn::Rebind<int16_t, DF> di16;
  const hn::Rebind<hwy::float16_t, DF> df16;
  const auto wide = hn::PromoteTo(di16, hn::LoadU(di8, reinterpret_cast<const int8_t*>(p)));
  const auto half = hn::And(hn::ShiftLeft<7>(wide), hn::Set(di16, static_cast<int16_t>(0xBF80)));
  return hn::PromoteTo(df, hn::BitCast(df16, half));
}

// ScoresTile writes scores[h * score_stride + j] = sum_d qs[h * dim + d] * K[d][j] for the
// GT heads of a tile and j < vectors * Lanes, where K row d starts at k + d * k_stride.
// Several accumulator sets per head keep enough independent FMA chains in flight.
template <class T, int GT>
HWY_NOINLINE void ScoresTile(const float* HWY_RESTRICT qs, int dim, const T* HWY_RESTRICT k,
                             size_t k_stride, size_t vectors, float* HWY_RESTRICT scores,
                             size_t score_stride) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  constexpr int kSets = GT >= 8 ? 1 : GT >= 4 ? 2 : 4;
  for (size_t v = 0; v < vectors; ++v) {
    const T* HWY_RESTRICT col = k + v * lanes;
    VF acc[kSets][GT];
    HWY_UNROLL(4)
    for (int s = 0; s < kSets; ++s) {
      HWY_UNROLL(8)
      for (int h = 0; h < GT; ++h) acc[s][h] = hn::Zero(df);
    }
    for (int d = 0; d < dim; d += kSets) {
      HWY_UNROLL(4)
      for (int s = 0; s < kSets; ++s) {
        const VF row = LoadRow(df, col + static_cast<size_t>(d + s) * k_stride);
        HWY_UNROLL(8)
        for (int h = 0; h < GT; ++h) {
          acc[s][h] = hn::MulAdd(hn::Set(df, qs[h * dim + d + s]), row, acc[s][h]);
        }
      }
    }
    HWY_UNROLL(8)
    for (int h = 0; h < GT; ++h) {
      VF sum = acc[0][h];
      HWY_UNROLL(4)
      for (int s = 1; s < kSets; ++s) sum = hn::Add(sum, acc[s][h]);
      hn::StoreU(sum, df, scores + h * score_stride + v * lanes);
    }
  }
}

// AccumulateVChunks rescales acc[h, c_begin..c_end) by alpha[h] and adds
// sum_t probs[h * prob_stride + t] * V_t[c_begin..c_end) for the GT heads of a tile, where the
// block's valid V rows are counts[i] rows of dim elements at pages[i], token t numbered across
// the pages in order. kChunks vectors of columns per pass keep enough independent FMA chains in
// flight; c_end - c_begin must be a multiple of kChunks * Lanes.
template <class T, int GT, int kChunks>
HWY_INLINE void AccumulateVChunks(const float* HWY_RESTRICT probs, size_t prob_stride,
                                  const float* HWY_RESTRICT alpha, const T* const* pages,
                                  const int* counts, int num_pages, int dim, size_t c_begin,
                                  size_t c_end, float* HWY_RESTRICT acc) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  for (size_t c = c_begin; c < c_end; c += kChunks * lanes) {
    VF a[kChunks][GT];
    HWY_UNROLL(8)
    for (int h = 0; h < GT; ++h) {
      const VF scale = hn::Set(df, alpha[h]);
      HWY_UNROLL(4)
      for (int j = 0; j < kChunks; ++j) {
        a[j][h] = hn::Mul(hn::LoadU(df, acc + h * dim + c + j * lanes), scale);
      }
    }
    size_t t = 0;
    for (int i = 0; i < num_pages; ++i) {
      const T* HWY_RESTRICT row = pages[i] + c;
      for (int r = 0; r < counts[i]; ++r, ++t, row += dim) {
        HWY_UNROLL(4)
        for (int j = 0; j < kChunks; ++j) {
          const VF v = LoadRow(df, row + j * lanes);
          HWY_UNROLL(8)
          for (int h = 0; h < GT; ++h) {
            a[j][h] = hn::MulAdd(hn::Set(df, probs[h * prob_stride + t]), v, a[j][h]);
          }
        }
      }
    }
    HWY_UNROLL(8)
    for (int h = 0; h < GT; ++h) {
      HWY_UNROLL(4)
      for (int j = 0; j < kChunks; ++j) hn::StoreU(a[j][h], df, acc + h * dim + c + j * lanes);
    }
  }
}

// AccumulateV runs AccumulateVChunks over all dim columns: the widest chunking over the columns
// it divides, then one vector at a time over the rest (head_dim 16..48 on wide targets; head
// dims 64 and 128 never reach the tail, so their loop is what it always was).
template <class T, int GT>
HWY_NOINLINE void AccumulateV(const float* HWY_RESTRICT probs, size_t prob_stride,
                              const float* HWY_RESTRICT alpha, const T* const* pages,
                              const int* counts, int num_pages, int dim, float* HWY_RESTRICT acc) {
  const size_t lanes = hn::Lanes(DF());
  // With 32 vector registers (AVX-512), more chunks per token amortise the GT broadcasts of the
  // probabilities over more FMAs (measured: ~10% on FP8, G=4); with 16, they would spill.
  constexpr int kChunks = HWY_TARGET <= HWY_AVX3 ? (GT >= 8 ? 2 : 4)
                                                 : (GT >= 8   ? 1
                                                    : GT >= 4 ? 2
                                                              : 4);
  const size_t wide = static_cast<size_t>(dim) / (kChunks * lanes) * (kChunks * lanes);
  AccumulateVChunks<T, GT, kChunks>(probs, prob_stride, alpha, pages, counts, num_pages, dim, 0,
                                    wide, acc);
  if (wide < static_cast<size_t>(dim)) {
    AccumulateVChunks<T, GT, 1>(probs, prob_stride, alpha, pages, counts, num_pages, dim, wide,
                                static_cast<size_t>(dim), acc);
  }
}

// Tiles of the group, kMaxTile heads at a time, each through the instantiation for its size.
template <class T>
void ScoresTiles(int group, const float* qs, int dim, const T* k, size_t k_stride, size_t vectors,
                 float* scores, size_t score_stride) {
  for (int h = 0; h < group; h += kMaxTile) {
    const float* q = qs + static_cast<size_t>(h) * dim;
    float* s = scores + static_cast<size_t>(h) * score_stride;
    switch (std::min(kMaxTile, group - h)) {
      case 1:
        ScoresTile<T, 1>(q, dim, k, k_stride, vectors, s, score_stride);
        break;
      case 2:
        ScoresTile<T, 2>(q, dim, k, k_stride, vectors, s, score_stride);
        break;
      case 3:
        ScoresTile<T, 3>(q, dim, k, k_stride, vectors, s, score_stride);
        break;
      case 4:
        ScoresTile<T, 4>(q, dim, k, k_stride, vectors, s, score_stride);
        break;
      case 5:
        ScoresTile<T, 5>(q, dim, k, k_stride, vectors, s, score_stride);
        break;
      case 6:
        ScoresTile<T, 6>(q, dim, k, k_stride, vectors, s, score_stride);
        break;
      case 7:
        ScoresTile<T, 7>(q, dim, k, k_stride, vectors, s, score_stride);
        break;
      default:
        ScoresTile<T, 8>(q, dim, k, k_stride, vectors, s, score_stride);
        break;
    }
  }
}

template <class T>
void AccumulateVTiles(int group, const float* probs, size_t prob_stride, const float* alpha,
                      const T* const* pages, const int* counts, int num_pages, int dim,
                      float* acc) {
  for (int h = 0; h < group; h += kMaxTile) {
    const float* p = probs + static_cast<size_t>(h) * prob_stride;
    const float* al = alpha + h;
    float* a = acc + static_cast<size_t>(h) * dim;
    switch (std::min(kMaxTile, group - h)) {
      case 1:
        AccumulateV<T, 1>(p, prob_stride, al, pages, counts, num_pages, dim, a);
        break;
      case 2:
        AccumulateV<T, 2>(p, prob_stride, al, pages, counts, num_pages, dim, a);
        break;
      case 3:
        AccumulateV<T, 3>(p, prob_stride, al, pages, counts, num_pages, dim, a);
        break;
      case 4:
        AccumulateV<T, 4>(p, prob_stride, al, pages, counts, num_pages, dim, a);
        break;
      case 5:
        AccumulateV<T, 5>(p, prob_stride, al, pages, counts, num_pages, dim, a);
        break;
      case 6:
        AccumulateV<T, 6>(p, prob_stride, al, pages, counts, num_pages, dim, a);
        break;
      case 7:
        AccumulateV<T, 7>(p, prob_stride, al, pages, counts, num_pages, dim, a);
        break;
      default:
        AccumulateV<T, 8>(p, prob_stride, al, pages, counts, num_pages, dim, a);
        break;
    }
  }
}

// SoftmaxUpdate folds `count` new scores of one head into its running (max, sum): the scores
// become exp(score - new max) in place, and `alpha` receives exp(old max - new max), by which
// the accumulator must be rescaled. scores[count, RoundUp(count, Lanes)) must be writable.
void SoftmaxUpdate(float* HWY_RESTRICT scores, size_t count, float* max, float* sum, float* alpha) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  const size_t padded = (count + lanes - 1) / lanes * lanes;
  // -inf pads the last vector: it never wins the max and its exponential is exactly 0.
  for (size_t i = count; i < padded; ++i) scores[i] = -INFINITY;
  VF vmax = hn::LoadU(df, scores);
  for (size_t i = lanes; i < padded; i += lanes) vmax = hn::Max(vmax, hn::LoadU(df, scores + i));
  const float new_max = std::max(*max, hn::GetLane(hn::MaxOfLanes(df, vmax)));
  const VF shift = hn::Set(df, new_max);
  VF vsum = hn::Zero(df);
  for (size_t i = 0; i < padded; i += lanes) {
    const VF p = hn::Exp(df, hn::Sub(hn::LoadU(df, scores + i), shift));
    hn::StoreU(p, df, scores + i);
    vsum = hn::Add(vsum, p);
  }
  *alpha = std::exp(*max - new_max);  // 0 for the first block, whose old max is -inf
  *sum = *sum * *alpha + hn::GetLane(hn::SumOfLanes(df, vsum));
  *max = new_max;
}

// PrefetchToL2 asks for the cache line holding `p` (never faults). Inline asm on x86: GCC deletes
// loops that contain nothing but __builtin_prefetch.
HWY_INLINE void PrefetchToL2(const char* p) {
#if HWY_ARCH_X86
  asm volatile("prefetcht1 (%0)" : : "r"(p));
#else
  __builtin_prefetch(p, /*rw=*/0, /*locality=*/2);
#endif
}

// PrefetchPage asks for the K and V lines of the valid tokens of a page (one kv head) into L2.
// Pages are scattered, so the hardware prefetcher cannot guess them; the request goes out a few
// pages ahead, one page at a time (a whole block at once stalls the core on its miss buffers,
// and prefetching into L1 evicts the block being worked on).
template <class T>
void PrefetchPage(const T* k, const T* v, int count, int page_size, int dim) {
  const char* kc = reinterpret_cast<const char*>(k);
  const char* vc = reinterpret_cast<const char*>(v);
  const size_t k_end = (static_cast<size_t>(dim - 1) * page_size + count) * sizeof(T);
  const size_t v_end = static_cast<size_t>(count) * dim * sizeof(T);
  for (size_t i = 0; i < k_end; i += 64) PrefetchToL2(kc + i);
  for (size_t i = 0; i < v_end; i += 64) PrefetchToL2(vc + i);
}

// Per-thread working memory, grown on demand and reused across calls.
struct Scratch {
  std::vector<float> qs;      // [group, dim] q * softmax_scale * K factor
  std::vector<float> acc;     // [group, dim] unnormalised output
  std::vector<float> state;   // [group] max, [group] sum, [group] alpha
  std::vector<float> scores;  // [group, score_stride] scores, then probabilities
  std::vector<uint8_t> kbuf;  // gathered K rows of a partial or narrow page, raw elements
};

Scratch& ThreadScratch() {
  thread_local Scratch scratch;
  return scratch;
}

// AttendTask runs one task: all `group` query heads of one kv head over one token range.
template <class T>
void AttendTask(const PagedKvView& kv, int group, float softmax_scale, const DecodeQuery& query,
                const Task& task, float* partials) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  const int dim = kv.head_dim;
  const int page_size = kv.page_size;
  const size_t gd = static_cast<size_t>(group) * dim;
  const int first_head = task.kv_head * group;
  Scratch& s = ThreadScratch();

  const int block_pages = std::clamp<int>(
      static_cast<int>(kBlockVBytes / (sizeof(T) * dim)) / page_size, 1, kMaxBlockPages);
  const size_t block_tokens = static_cast<size_t>(block_pages) * page_size;
  const size_t score_stride = block_tokens + lanes;
  s.qs.resize(gd);
  s.acc.assign(gd, 0.0f);
  s.state.resize(3 * static_cast<size_t>(group));
  s.scores.resize(static_cast<size_t>(group) * score_stride);
  s.kbuf.resize(static_cast<size_t>(dim) * (block_tokens + lanes) * sizeof(T));
  float* max = s.state.data();
  float* sum = max + group;
  float* alpha = sum + group;
  for (int h = 0; h < group; ++h) {
    max[h] = -INFINITY;
    sum[h] = 0.0f;
  }

  const float k_factor = kv.dtype == KvDtype::kFp8E4m3 ? kv.k_scale[task.kv_head] * 256.0f : 1.0f;
  const VF q_scale = hn::Set(df, softmax_scale * k_factor);
  const float* q = query.q + static_cast<size_t>(first_head) * dim;
  for (size_t i = 0; i < gd; i += lanes) {
    hn::StoreU(hn::Mul(hn::LoadU(df, q + i), q_scale), df, s.qs.data() + i);
  }

  const T* k_base = static_cast<const T*>(kv.k) + task.kv_head * kv.head_stride;
  const T* v_base = static_cast<const T*>(kv.v) + task.kv_head * kv.head_stride;
  const T* k_pages[kMaxBlockPages];
  const T* v_pages[kMaxBlockPages];
  int counts[kMaxBlockPages];
  T* kbuf = reinterpret_cast<T*>(s.kbuf.data());
  const bool pages_fill_vectors = page_size % lanes == 0;
  const int first_page = task.token_begin / page_size;
  const int end_page = (task.token_end + page_size - 1) / page_size;

  auto page_count = [&](int p) { return std::min(page_size, task.token_end - p * page_size); };
  const int ahead = std::clamp<int>(
      static_cast<int>(kPrefetchAheadBytes / (2 * sizeof(T) * dim * page_size)), 1, 16);
  auto prefetch = [&](int p) {
    if (p >= end_page) return;
    const int64_t offset = query.page_table[p] * kv.page_stride;
    PrefetchPage(k_base + offset, v_base + offset, page_count(p), page_size, dim);
  };
  for (int p = first_page; p < first_page + ahead; ++p) prefetch(p);

  for (int block = first_page; block < end_page; block += block_pages) {
    const int num_pages = std::min(block_pages, end_page - block);
    size_t tokens = 0;
    for (int i = 0; i < num_pages; ++i) {
      const int64_t offset = query.page_table[block + i] * kv.page_stride;
      k_pages[i] = k_base + offset;
      v_pages[i] = v_base + offset;
      counts[i] = page_count(block + i);
      tokens += static_cast<size_t>(counts[i]);
    }
    if (pages_fill_vectors) {
      size_t col = 0;
      for (int i = 0; i < num_pages; ++i) {
        prefetch(block + i + ahead);
        if (counts[i] == page_size) {
          ScoresTiles<T>(group, s.qs.data(), dim, k_pages[i], static_cast<size_t>(page_size),
                         page_size / lanes, s.scores.data() + col, score_stride);
        } else {  // the request's last, partial page
          const size_t width =
              attention_internal::GatherK(reinterpret_cast<const void* const*>(k_pages + i),
                                          &counts[i], 1, page_size, dim, sizeof(T), lanes, kbuf);
          ScoresTiles<T>(group, s.qs.data(), dim, kbuf, width, width / lanes, s.scores.data() + col,
                         score_stride);
        }
        col += static_cast<size_t>(counts[i]);
      }
    } else {  // pages narrower than (or not a multiple of) a vector: gather the whole block
      for (int i = 0; i < num_pages; ++i) prefetch(block + i + ahead);
      const size_t width =
          attention_internal::GatherK(reinterpret_cast<const void* const*>(k_pages), counts,
                                      num_pages, page_size, dim, sizeof(T), lanes, kbuf);
      ScoresTiles<T>(group, s.qs.data(), dim, kbuf, width, width / lanes, s.scores.data(),
                     score_stride);
    }

    for (int h = 0; h < group; ++h) {
      SoftmaxUpdate(s.scores.data() + h * score_stride, tokens, &max[h], &sum[h], &alpha[h]);
    }
    AccumulateVTiles<T>(group, s.scores.data(), score_stride, alpha, v_pages, counts, num_pages,
                        dim, s.acc.data());
  }

  if (task.partial >= 0) {
    float* state = partials + task.partial * attention_internal::PartialFloats(group, dim);
    std::memcpy(state, max, sizeof(float) * group);
    std::memcpy(state + group, sum, sizeof(float) * group);
    std::memcpy(state + 2 * group, s.acc.data(), sizeof(float) * gd);
    return;
  }
  const float v_factor = attention_internal::VFactor(kv, task.kv_head);
  float* out = query.out + static_cast<size_t>(first_head) * dim;
  for (int h = 0; h < group; ++h) {
    const VF norm = hn::Set(df, v_factor / sum[h]);
    for (int d = 0; d < dim; d += static_cast<int>(lanes)) {
      hn::StoreU(hn::Mul(hn::LoadU(df, s.acc.data() + h * dim + d), norm), df, out + h * dim + d);
    }
  }
}

template <class T>
void RunTasksT(const PagedKvView& kv, int group, float softmax_scale, const DecodeQuery* queries,
               const Task* tasks, size_t num_tasks, float* partials, ThreadPool* pool) {
  attention_internal::RunTaskList(num_tasks, pool, [&](size_t i) {
    AttendTask<T>(kv, group, softmax_scale, queries[tasks[i].query], tasks[i], partials);
  });
}

}  // namespace

// RunTasks runs every task of a plan; see PagedDecodeAttention below.
void RunTasks(const PagedKvView& kv, int group, float softmax_scale, const DecodeQuery* queries,
              const Task* tasks, size_t num_tasks, float* partials, ThreadPool* pool) {
  switch (kv.dtype) {
    case KvDtype::kFp32:
      return RunTasksT<float>(kv, group, softmax_scale, queries, tasks, num_tasks, partials, pool);
    case KvDtype::kBf16:
      return RunTasksT<uint16_t>(kv, group, softmax_scale, queries, tasks, num_tasks, partials,
                                 pool);
    case KvDtype::kFp8E4m3:
      return RunTasksT<uint8_t>(kv, group, softmax_scale, queries, tasks, num_tasks, partials,
                                pool);
  }
}

// DispatchesToAvx3Dl returns whether runtime dispatch (ForceTarget included) picked AVX3_DL: a
// cached table lookup, unlike hwy::SupportedTargets(), whose CPUID traps to the hypervisor in a
// VM (measured: ~20 us per call here).
bool DispatchesToAvx3Dl() { return HWY_TARGET == HWY_AVX3_DL; }

}  // namespace HWY_NAMESPACE
}  // namespace kvguard::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvguard::kernels {

HWY_EXPORT(RunTasks);
HWY_EXPORT(DispatchesToAvx3Dl);

namespace attention_internal {

void RunTaskList(size_t n, ThreadPool* pool, const std::function<void(size_t)>& fn) {
  std::atomic<size_t> next{0};
  const std::function<void(int64_t, int64_t)> worker = [&](int64_t, int64_t) {
    for (size_t i = next.fetch_add(1, std::memory_order_relaxed); i < n;
         i = next.fetch_add(1, std::memory_order_relaxed)) {
      fn(i);
    }
  };
  const int threads = pool == nullptr ? 1 : pool->size();
  if (threads > 1 && n > 1) {
    pool->ParallelFor(std::min<int64_t>(threads, static_cast<int64_t>(n)), 1, worker);
  } else {
    worker(0, 1);
  }
}

// UsesBf16Dot: the BF16 dot-product kernel runs where runtime dispatch would pick AVX3_DL (so
// that ForceTarget steers it in tests) and the CPU has AVX-512 BF16, for the shapes it takes.
bool UsesBf16Dot(const PagedKvView& kv) {
  return Bf16DotTakes(kv) && HWY_DYNAMIC_DISPATCH(DispatchesToAvx3Dl)() &&
         internal::HasAvx512Bf16Vbmi();
}

}  // namespace attention_internal

AttentionArithmetic PagedAttentionArithmetic(const PagedKvView& kv) {
  return attention_internal::UsesBf16Dot(kv) ? AttentionArithmetic::kBf16Products
                                             : AttentionArithmetic::kFp32;
}

void PagedDecodeAttention(const PagedKvView& kv, int num_heads, float softmax_scale,
                          const DecodeQuery* all_queries, int num_all, ThreadPool* pool) {
  std::vector<DecodeQuery> live;
  int num_queries = 0;
  const DecodeQuery* queries =
      attention_internal::CheckTags(kv, num_heads, all_queries, num_all, &live, &num_queries);
  ABSL_RAW_CHECK(kv.num_kv_heads > 0 && num_heads > 0, "attention: no heads");
  ABSL_RAW_CHECK(num_heads % kv.num_kv_heads == 0,
                 "attention: num_heads must be a multiple of num_kv_heads");
  ABSL_RAW_CHECK(IsSupportedHeadDim(kv.head_dim),
                 "attention: head_dim must be a multiple of 16 in [16, 256]");
  ABSL_RAW_CHECK(kv.page_size >= 1, "attention: page_size must be >= 1");
  ABSL_RAW_CHECK(kv.k != nullptr && kv.v != nullptr, "attention: null K or V");
  ABSL_RAW_CHECK(kv.head_stride >= int64_t{kv.page_size} * kv.head_dim,
                 "attention: head_stride must be >= page_size * head_dim");
  ABSL_RAW_CHECK(kv.page_stride >= kv.head_stride * kv.num_kv_heads,
                 "attention: page_stride must be >= num_kv_heads * head_stride");
  ABSL_RAW_CHECK(kv.dtype != KvDtype::kFp8E4m3 || (kv.k_scale != nullptr && kv.v_scale != nullptr),
                 "attention: FP8 KV needs k_scale and v_scale");
  ABSL_RAW_CHECK(num_queries >= 0 && (num_queries == 0 || queries != nullptr),
                 "attention: bad query array");
  for (int r = 0; r < num_queries; ++r) {
    const DecodeQuery& query = queries[r];
    ABSL_RAW_CHECK(query.length >= 1, "attention: length must be >= 1");
    ABSL_RAW_CHECK(query.q != nullptr && query.page_table != nullptr && query.out != nullptr,
                   "attention: null q, page_table or out");
    const int pages = (query.length - 1) / kv.page_size + 1;
    for (int i = 0; i < pages; ++i) {
      ABSL_RAW_CHECK(query.page_table[i] >= 0, "attention: negative page id");
    }
  }
  if (num_queries == 0) return;

  const int group = num_heads / kv.num_kv_heads;
  const bool bf16_dot = attention_internal::UsesBf16Dot(kv);
  const attention_internal::Plan plan = attention_internal::MakePlan(
      kv, queries, num_queries, pool == nullptr ? 1 : pool->size(), bf16_dot);
  std::vector<float> partials(static_cast<size_t>(plan.num_partials) *
                              attention_internal::PartialFloats(group, kv.head_dim));
  if (bf16_dot) {
    attention_internal::RunTaskList(plan.tasks.size(), pool, [&](size_t i) {
      const attention_internal::Task& task = plan.tasks[i];
      attention_internal::AttendTaskBf16Dot(kv, group, softmax_scale, queries[task.query], task,
                                            partials.data());
    });
  } else {
    HWY_DYNAMIC_DISPATCH(RunTasks)
    (kv, group, softmax_scale, queries, plan.tasks.data(), plan.tasks.size(), partials.data(),
     pool);
  }
  for (const attention_internal::SplitItem& item : plan.splits) {
    attention_internal::MergeSplit(
        item, partials.data(), group, kv.head_dim, attention_internal::VFactor(kv, item.kv_head),
        queries[item.query].out + static_cast<size_t>(item.kv_head) * group * kv.head_dim);
  }
}

}  // namespace kvguard::kernels
#endif  // HWY_ONCE
