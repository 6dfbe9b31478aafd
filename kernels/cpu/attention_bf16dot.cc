// kernels/cpu/attention_bf16dot.cc: paged decode attention with BF16 dot products (VDPBF16PS).
//
// Why: with GQA every K and V element is multiplied by each of the `group` query heads that
// share its kv head. In FP32 that is `group` FMA lanes per element for K and again for V, and on
// a core with two 256-bit FMA pipes (Zen 4) the FP8 kernel is bound by those FMAs at ~7 GB/s,
// far below what the core can stream. VDPBF16PS does two multiply-adds per FP32 lane and per
// issue slot, on the same pipes, so the same work takes half the issue slots.
//
// What changes numerically (PagedAttentionArithmetic in attention.h):
//   * the query, scaled by softmax_scale (and the FP8 K scale), is rounded to BF16 once per
//     task, and so are the softmax probabilities before they weight V (the sum that normalises
//     the output adds up exactly the rounded probabilities, so the output is a convex
//     combination of V rows up to FP32 rounding). Products and sums are FP32. This is how GPU
//     attention kernels treat the query and the probabilities (P is cast to 16 bits for P V).
//   * BF16 K and V are used exactly. FP8 K and V are used exactly except the e4m3 subnormal
//     codes (|value| < 2^-6 * scale, i.e. below 1/29000 of the largest value the per-head scale
//     allows), which count as zero: the conversion below maps codes to BF16 with shifts, and
//     VDPBF16PS treats the subnormal BF16 numbers that subnormal codes become as zero. The
//     exact alternative (two VPERMI2B table lookups per 64 codes) was measured 15-20% slower on
//     Zen 4, where VPERMI2B competes with the dot products for the same pipes. The e4m3 NaN
//     codes, which the quantiser never writes, read as +-480.
//
// FP8 -> BF16: an e4m3 code c in the high byte of a 16-bit lane (c << 8), shifted right
// arithmetically by 4 and masked with 0x87F0, is the BF16 encoding of value(c) * 2^-120 (the
// sign lands on bit 15, the 4 exponent bits and 3 mantissa bits on BF16's exponent and
// mantissa). So that products stay far from FP32's flushed range, each head's query is scaled
// by a power of two 2^s (max |q| 2^s near 2^125; the score is multiplied back by 2^(120 - s)) and
// the probabilities by 2^110 (the output by 2^10 back): products below 2^-126 in those units,
// which VDPBF16PS flushes, are below 2^-126 of the largest one and cannot matter.
//
// Data movement, per kv head (layouts in formats.h; nothing beyond a request's length is read):
//   K [head_dim, P]: VDPBF16PS sums pairs of adjacent BF16 values per FP32 lane, so a lane must
//     hold (K[d][t], K[d+1][t]) for one token t. Four 16-token K rows (64 FP8 bytes, one load
//     when P == 16) are spread by two zero-masking VPERMB into the high bytes of two vectors:
//     dims (d, d+1) and (d+2, d+3) of 16 tokens in order. BF16 K takes one VPERMW per two rows.
//     The query pair (q[d], q[d+1]) is broadcast as one 32-bit lane.
//   V [P, head_dim]: a lane must hold (V[t][c], V[t+1][c]) for one dim c, so rows t and t+1 are
//     interleaved (VPUNPCKL/HBW, for FP8 twice: rows, then zeros below each code), which leaves
//     the dims of an accumulator in a fixed permuted order (kDimOrder) that the final store
//     undoes. The probability pair (p[t], p[t+1]) is broadcast; an odd last token is paired
//     with zeros.
// A task covers all kv heads of a request (or of a piece of it: split-K); blocks of 64 tokens
// are the outer loop and kv heads the inner one, so each page is read front to back (a page's
// heads are contiguous), and the next head's share is prefetched while one head runs. The
// online softmax keeps its running max while a block's max does not exceed it by more than 8
// (the exponentials then reach at most e^8), which skips most rescaling in long contexts.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/internal/attention_task.h"
#include "kernels/cpu/internal/avx512_bf16.h"
#include "kernels/cpu/internal/cache_info.h"
#include "kernels/formats.h"

namespace kvguard::kernels::attention_internal {

#if KVGUARD_AVX512_BF16
KVG_AVX512_BF16_BEGIN
namespace {

// Tokens per block and kv head: enough that the softmax and the accumulator loads are amortised,
// few enough that one head's K and V of the block (8 KiB each for FP8 at head_dim 128) stay in
// L1 between the score pass and the V pass. (32, 64 and 128 measured within noise of each other
// on Zen 4.) kMaxBlockPages: one-token pages.
constexpr int kBlockTokens = 64;
constexpr int kMaxBlockPages = kBlockTokens;
// Query heads whose scores share one pass over K (2 accumulators each), and whose outputs share
// one pass over V (4 accumulators each): both fit the 32 vector registers with the operands.
constexpr int kScoreTile = 8;
constexpr int kVTile = 4;

// kFp8Dims[s]: the dim (within a 64-dim chunk) that accumulator slot s (vector s / 16, lane
// s % 16) of an FP8 V chunk holds; kBf16Dims likewise for BF16 (see the file comment).
struct DimOrder {
  int fp8[64];
  int bf16[64];
};
constexpr DimOrder MakeDimOrder() {
  DimOrder o{};
  for (int k = 0; k < 4; ++k) {
    for (int l = 0; l < 4; ++l) {
      for (int i = 0; i < 4; ++i) {
        o.fp8[16 * k + 4 * l + i] = 16 * l + 4 * k + i;
        o.bf16[16 * k + 4 * l + i] = 32 * (k / 2) + 8 * l + 4 * (k % 2) + i;
      }
    }
  }
  return o;
}
constexpr DimOrder kDimOrder = MakeDimOrder();

// kSlotOf: the inverse of kDimOrder (the slot that holds each dim), for the final store.
struct SlotOf {
  alignas(64) int32_t fp8[64];
  alignas(64) int32_t bf16[64];
};
constexpr SlotOf MakeSlotOf() {
  SlotOf o{};
  for (int s = 0; s < 64; ++s) {
    o.fp8[kDimOrder.fp8[s]] = s;
    o.bf16[kDimOrder.bf16[s]] = s;
  }
  return o;
}
alignas(64) constexpr SlotOf kSlotOf = MakeSlotOf();

// The VPERMB patterns that spread four 16-token FP8 K rows d..d+3 (64 bytes) into the high
// bytes of 16-bit lanes: k_lo puts (row d, row d+1) of token t into lanes 2t, 2t + 1, k_hi rows
// d+2, d+3 (the low bytes are zeroed by the mask); and the VPERMW pattern that puts BF16 rows
// d, d+1 of token t into lanes 2t, 2t + 1.
struct Constants {
  alignas(64) uint8_t k_lo[64];
  alignas(64) uint8_t k_hi[64];
  alignas(64) uint16_t k_pairs16[32];
};
constexpr Constants MakeConstants() {
  Constants c{};
  for (int w = 0; w < 32; ++w) {
    const int token = w / 2, row = w % 2;
    c.k_lo[2 * w + 1] = static_cast<uint8_t>(16 * row + token);
    c.k_hi[2 * w + 1] = static_cast<uint8_t>(32 + 16 * row + token);
    c.k_pairs16[w] = static_cast<uint16_t>(16 * row + token);
  }
  return c;
}
alignas(64) constexpr Constants kConstants = MakeConstants();
constexpr __mmask64 kHighBytes = 0xAAAAAAAAAAAAAAAAull;

// Fp8Words returns the BF16 encodings of value(c) * 2^-120 of the e4m3 codes c held in the high
// bytes of the 16-bit lanes of `w` (low bytes zero); see the file comment.
KVG_AVX512_BF16_TARGET inline __m512i Fp8Words(__m512i w) {
  return _mm512_and_si512(_mm512_srai_epi16(w, 4), _mm512_set1_epi16(static_cast<short>(0x87F0)));
}

KVG_AVX512_BF16_TARGET inline __m512 Dot(__m512 acc, __m512i a, __m512i b) {
  return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}

// Load4Rows returns 16 bytes from each of rows r, r + stride, r + 2 stride, r + 3 stride.
KVG_AVX512_BF16_TARGET inline __m512i Load4Rows(const uint8_t* r, size_t stride) {
  if (stride == 16) return _mm512_loadu_si512(r);
  __m512i x = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r)));
  x = _mm512_inserti32x4(x, _mm_loadu_si128(reinterpret_cast<const __m128i*>(r + stride)), 1);
  x = _mm512_inserti32x4(x, _mm_loadu_si128(reinterpret_cast<const __m128i*>(r + 2 * stride)), 2);
  return _mm512_inserti32x4(x, _mm_loadu_si128(reinterpret_cast<const __m128i*>(r + 3 * stride)),
                            3);
}

// Load2Rows16 returns 16 BF16 values from each of rows r and r + stride (elements).
KVG_AVX512_BF16_TARGET inline __m512i Load2Rows16(const uint16_t* r, size_t stride) {
  if (stride == 16) return _mm512_loadu_si512(r);
  return _mm512_inserti64x4(
      _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(r))),
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r + stride)), 1);
}

// Prefetcher spreads the prefetches of the next (kv head, block) over the inner loops of the
// current one: a few lines per loop iteration, so that the requests stay within what the core's
// miss buffers hold while the work they cover keeps the core busy. (Issuing a block's hundreds
// of lines at once stalls the core on its full miss buffers; not prefetching at all leaves each
// 2-4 KiB slice of a head to the hardware prefetcher, which starts too late on every slice.)
// Lines go to L1 (prefetcht0). prefetcht1 (into L2 only, to spare the block being worked on in
// L1) was the choice on Zen 4; on Zen 5 (48 KiB L1D) prefetcht0 measured faster in 23 of 27
// interleaved pairs (kvguard bench kernels, BM_PagedAttention at the DRAM-sized steps, 2
// threads, 3-5 rounds x 3 reps, GB/s medians): BF16 ctx 4096 x 16 26.8 -> 34.2, 16384 x 4
// 26.4 -> 28.7, 512 x 128 26.4 -> 29.0; FP8 4096 x 16 31.8 -> 34.1, 512 x 128 32.8 -> 34.8.
// Without software prefetch at all: BF16 ~20 GB/s, FP8 ~15.
// BF16 also prefetches the pair after the next one into L2 (prefetcht1, Add with `far`), at the
// same pace: its pairs are twice FP8's (32 KiB at head_dim 128), so the running pair and the next
// already exceed the 48 KiB L1D, and the L1 misses alone do not keep enough lines in flight.
// Measured on Zen 5, A B A B, three sessions of 4 rounds x 3 reps, 2 threads
// (bench/results/kernels.md): BF16 GB/s +5.9% / +3.4% / +3.4% (median per-pair ratio) at ctx 512 x
// 128, 4096 x 16, 16384 x 4, faster in 25 of 36 pairs; FP8 with it measured slower (in 13 of 16
// pairs), so FP8 keeps one pair ahead there. Two pairs ahead into L1 measured slower for both
// (kernels.md). On Zen 4 (32 KiB L1D) the far pair made FP8 faster in all 6 pairs at DRAM-sized
// steps, GQA (ctx 4096 x 16, 512 x 128) and `small`'s shape (group 1, head_dim 64: 8 KiB pairs,
// the fewest instructions per byte; without it a profile of that step put 18% of the samples just
// after prefetcht0 and 40% just after the K and V loads: the core waits on memory with its miss
// buffers full), and in 1 of 2 at `small`'s partly L3-resident batch 7: 2 threads, A B A B, 3
// reps each (bench/results/kernels.md, "FP8 attention's far prefetch on Zen 4"). So
// FP8 takes it where L1D is 32 KiB or less (FarPair). Which cache property decides is a guess
// from the two hosts (no cache counters in these VMs); Zen 5 at `small`'s shape is not measured.
// Where the OS does not report the L1D size, L1DataCacheBytes assumes 32 KiB, so FP8 takes the
// far pair there too (not measured on such a host).
inline bool FarPair(bool fp8) { return !fp8 || internal::L1DataCacheBytes() <= (size_t{32} << 10); }

class Prefetcher {
 public:
  static constexpr int kMaxRanges = 2 * kMaxBlockPages;
  void Reset() { near_.Reset(), far_.Reset(); }
  // Add queues [p, p + bytes) for L1, or with `far` for L2.
  void Add(const void* p, size_t bytes, bool far) { (far ? far_ : near_).Add(p, bytes); }
  // Issue asks for the next `lines` queued cache lines of each queue.
  inline void Issue(int lines) {
    near_.Issue<3>(lines);
    far_.Issue<2>(lines);
  }
  // Lines returns how many lines are queued for L1.
  size_t Lines() const { return near_.Lines(); }

 private:
  struct Queue {
    void Reset() { n_ = range_ = 0, pos_ = 0; }
    void Add(const void* p, size_t bytes) {
      if (bytes == 0 || n_ == kMaxRanges) return;
      begin_[n_] = static_cast<const char*>(p);
      bytes_[n_++] = bytes;
    }
    template <int kLocality>
    inline void Issue(int lines) {
      while (lines > 0 && range_ < n_) {
        const char* p = begin_[range_] + pos_;
        const size_t left = (bytes_[range_] - pos_ + 63) / 64;
        const int take = static_cast<int>(std::min<size_t>(static_cast<size_t>(lines), left));
        for (int i = 0; i < take; ++i) {
          if constexpr (kLocality == 3) {
            asm volatile("prefetcht0 (%0)" : : "r"(p + 64 * i));
          } else {
            asm volatile("prefetcht1 (%0)" : : "r"(p + 64 * i));
          }
        }
        lines -= take;
        pos_ += 64 * static_cast<size_t>(take);
        if (pos_ >= bytes_[range_]) ++range_, pos_ = 0;
      }
    }
    size_t Lines() const {
      size_t total = 0;
      for (int i = 0; i < n_; ++i) total += (bytes_[i] + 63) / 64;
      return total;
    }
    const char* begin_[kMaxRanges];
    size_t bytes_[kMaxRanges];
    int n_ = 0, range_ = 0;
    size_t pos_ = 0;
  };
  Queue near_, far_;
};

// Column is 16 tokens of one kv head's K: row d of them starts at k + d * stride (elements).
struct Column {
  const void* k;
  size_t stride;
};

// KPairs returns, for 16 tokens of one kv head's K (column `col`), dims (d, d+1) of each token
// in *lo and dims (d+2, d+3) in *hi, as BF16 pairs in token order (see the file comment).
template <bool kFp8>
KVG_AVX512_BF16_TARGET inline void KPairs(const Column& col, int d, __m512i idx_lo, __m512i idx_hi,
                                          __m512i* lo, __m512i* hi) {
  if constexpr (kFp8) {
    const uint8_t* r = static_cast<const uint8_t*>(col.k) + static_cast<size_t>(d) * col.stride;
    const __m512i x = Load4Rows(r, col.stride);
    *lo = Fp8Words(_mm512_maskz_permutexvar_epi8(kHighBytes, idx_lo, x));
    *hi = Fp8Words(_mm512_maskz_permutexvar_epi8(kHighBytes, idx_hi, x));
  } else {
    const uint16_t* r = static_cast<const uint16_t*>(col.k) + static_cast<size_t>(d) * col.stride;
    *lo = _mm512_permutexvar_epi16(idx_lo, Load2Rows16(r, col.stride));
    *hi = _mm512_permutexvar_epi16(idx_lo, Load2Rows16(r + 2 * col.stride, col.stride));
  }
}

// ScoresColumns writes, for the GT heads of a tile and each of `n` columns,
// scores[h * score_stride + 16 i + j] (j < 16) = the dot product of head h's query (BF16 pairs
// qp + h * qp_stride) with token j of column i. NC columns share one pass over the query pairs
// (n must be a multiple of NC): each query broadcast then feeds NC columns, and the 2 GT NC
// accumulators are independent dependency chains: with one column a 4-head tile has only 8
// chains of a multi-cycle VDPBF16PS latency. Two columns at once measured +10% (FP8) and +13%
// (BF16) on a cache-resident step on Zen 5 (bench/results/kernels.md, together with the
// vectorised per-task code below). `pf_lines` queued lines are requested per column.
template <int GT, int NC, bool kFp8>
KVG_AVX512_BF16_TARGET void ScoresColumns(const Column* cols, int n, int dim, const uint32_t* qp,
                                          size_t qp_stride, const float* unscale, float* scores,
                                          size_t score_stride, Prefetcher& pf, int pf_lines) {
  const __m512i idx_lo = _mm512_load_si512(kFp8 ? static_cast<const void*>(kConstants.k_lo)
                                                : static_cast<const void*>(kConstants.k_pairs16));
  const __m512i idx_hi = _mm512_load_si512(kConstants.k_hi);
  for (int i = 0; i < n; i += NC) {
    pf.Issue(NC * pf_lines);
    __m512 a[NC][GT], b[NC][GT];
#pragma GCC unroll 2
    for (int c = 0; c < NC; ++c) {
#pragma GCC unroll 8
      for (int h = 0; h < GT; ++h) a[c][h] = b[c][h] = _mm512_setzero_ps();
    }
    for (int d = 0; d < dim; d += 4) {
      __m512i lo[NC], hi[NC];  // dims (d, d+1) and (d+2, d+3) of tokens 0..15 of each column
#pragma GCC unroll 2
      for (int c = 0; c < NC; ++c) KPairs<kFp8>(cols[i + c], d, idx_lo, idx_hi, &lo[c], &hi[c]);
      const uint32_t* q = qp + d / 2;
#pragma GCC unroll 8
      for (int h = 0; h < GT; ++h) {
        const __m512i q01 = _mm512_set1_epi32(static_cast<int>(q[h * qp_stride]));
        const __m512i q23 = _mm512_set1_epi32(static_cast<int>(q[h * qp_stride + 1]));
#pragma GCC unroll 2
        for (int c = 0; c < NC; ++c) {
          a[c][h] = Dot(a[c][h], lo[c], q01);
          b[c][h] = Dot(b[c][h], hi[c], q23);
        }
      }
    }
#pragma GCC unroll 2
    for (int c = 0; c < NC; ++c) {
#pragma GCC unroll 8
      for (int h = 0; h < GT; ++h) {
        _mm512_storeu_ps(
            scores + h * score_stride + 16 * (i + c),
            _mm512_mul_ps(_mm512_add_ps(a[c][h], b[c][h]), _mm512_set1_ps(unscale[h])));
      }
    }
  }
}

// ScoresTile runs ScoresColumns for one tile of GT heads: columns in pairs while the tile is
// small enough for the 2 x 2 GT accumulators and 4 operands to fit the 32 vector registers.
template <int GT, bool kFp8>
KVG_AVX512_BF16_TARGET void ScoresTile(const Column* cols, int n, int dim, const uint32_t* qp,
                                       size_t qp_stride, const float* unscale, float* scores,
                                       size_t score_stride, Prefetcher& pf, int pf_lines) {
  int paired = 0;
  if constexpr (GT <= 4) {
    paired = n / 2 * 2;
    ScoresColumns<GT, 2, kFp8>(cols, paired, dim, qp, qp_stride, unscale, scores, score_stride, pf,
                               pf_lines);
  }
  ScoresColumns<GT, 1, kFp8>(cols + paired, n - paired, dim, qp, qp_stride, unscale,
                             scores + 16 * paired, score_stride, pf, pf_lines);
}

template <bool kFp8>
KVG_AVX512_BF16_TARGET void ScoresTiles(int group, const Column* cols, int n, int dim,
                                        const uint32_t* qp, size_t qp_stride, const float* unscale,
                                        float* scores, size_t score_stride, Prefetcher& pf,
                                        int pf_lines) {
  for (int h = 0; h < group; h += kScoreTile) {
    const uint32_t* q = qp + static_cast<size_t>(h) * qp_stride;
    const float* u = unscale + h;
    float* s = scores + static_cast<size_t>(h) * score_stride;
    switch (std::min(kScoreTile, group - h)) {
#define KVG_CASE(g)                                                                    \
  case g:                                                                              \
    ScoresTile<g, kFp8>(cols, n, dim, q, qp_stride, u, s, score_stride, pf, pf_lines); \
    break;
      KVG_CASE(1)
      KVG_CASE(2)
      KVG_CASE(3)
      KVG_CASE(4)
      KVG_CASE(5)
      KVG_CASE(6)
      KVG_CASE(7)
      default:
        ScoresTile<8, kFp8>(cols, n, dim, q, qp_stride, u, s, score_stride, pf, pf_lines);
        break;
#undef KVG_CASE
    }
  }
}

// AccumulateVChunk rescales the GT heads' accumulators of one 64-dim chunk (acc + h *
// acc_stride, 64 floats in slot order) by alpha[h] and adds sum_j p_pairs[j] * (row 2j, row 2j+1)
// over the block's `tokens` V rows (rows[t] + offset + chunk: the chunk's first element of row t
// of this kv head; an odd last row is paired with zeros). p_pairs: BF16 probability pairs of
// head h at pp + h * pp_stride. `pf_lines` queued lines are requested per 8 pairs.
template <int GT, bool kFp8>
KVG_AVX512_BF16_TARGET void AccumulateVChunk(const uint8_t* const* rows, size_t offset, int tokens,
                                             const uint32_t* pp, size_t pp_stride,
                                             const float* alpha, float* acc, size_t acc_stride,
                                             Prefetcher& pf, int pf_lines) {
  __m512 a[4][GT];
#pragma GCC unroll 4
  for (int h = 0; h < GT; ++h) {
    const __m512 s = _mm512_set1_ps(alpha[h]);
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      a[k][h] = _mm512_mul_ps(_mm512_loadu_ps(acc + h * acc_stride + 16 * k), s);
    }
  }
  const int pairs = (tokens + 1) / 2;
  for (int j = 0; j < pairs; ++j) {
    if (j % 8 == 0) pf.Issue(pf_lines);
    const uint8_t* r0 = rows[2 * j] + offset;
    const bool odd = 2 * j + 1 == tokens;  // the partner of an odd last row is zero
    const uint8_t* r1 = odd ? nullptr : rows[2 * j + 1] + offset;
    __m512i v[4];
    if constexpr (kFp8) {
      const __m512i x0 = _mm512_loadu_si512(r0);
      const __m512i x1 = odd ? _mm512_setzero_si512() : _mm512_loadu_si512(r1);
      const __m512i zero = _mm512_setzero_si512();
      const __m512i i0 = _mm512_unpacklo_epi8(x0, x1), i1 = _mm512_unpackhi_epi8(x0, x1);
      v[0] = Fp8Words(_mm512_unpacklo_epi8(zero, i0));
      v[1] = Fp8Words(_mm512_unpackhi_epi8(zero, i0));
      v[2] = Fp8Words(_mm512_unpacklo_epi8(zero, i1));
      v[3] = Fp8Words(_mm512_unpackhi_epi8(zero, i1));
    } else {
      const __m512i x0a = _mm512_loadu_si512(r0), x0b = _mm512_loadu_si512(r0 + 64);
      const __m512i x1a = odd ? _mm512_setzero_si512() : _mm512_loadu_si512(r1);
      const __m512i x1b = odd ? _mm512_setzero_si512() : _mm512_loadu_si512(r1 + 64);
      v[0] = _mm512_unpacklo_epi16(x0a, x1a);
      v[1] = _mm512_unpackhi_epi16(x0a, x1a);
      v[2] = _mm512_unpacklo_epi16(x0b, x1b);
      v[3] = _mm512_unpackhi_epi16(x0b, x1b);
    }
#pragma GCC unroll 4
    for (int h = 0; h < GT; ++h) {
      const __m512i p = _mm512_set1_epi32(static_cast<int>(pp[h * pp_stride + j]));
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) a[k][h] = Dot(a[k][h], v[k], p);
    }
  }
#pragma GCC unroll 4
  for (int h = 0; h < GT; ++h) {
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) _mm512_storeu_ps(acc + h * acc_stride + 16 * k, a[k][h]);
  }
}

template <bool kFp8>
KVG_AVX512_BF16_TARGET void AccumulateVTiles(int group, const uint8_t* const* rows, size_t offset,
                                             int tokens, const uint32_t* pp, size_t pp_stride,
                                             const float* alpha, float* acc, size_t acc_stride,
                                             Prefetcher& pf, int pf_lines) {
  for (int h = 0; h < group; h += kVTile) {
    const uint32_t* p = pp + static_cast<size_t>(h) * pp_stride;
    float* a = acc + static_cast<size_t>(h) * acc_stride;
    switch (std::min(kVTile, group - h)) {
#define KVG_CASE(g)                                                                             \
  case g:                                                                                       \
    AccumulateVChunk<g, kFp8>(rows, offset, tokens, p, pp_stride, alpha + h, a, acc_stride, pf, \
                              pf_lines);                                                        \
    break;
      KVG_CASE(1)
      KVG_CASE(2)
      KVG_CASE(3)
      default:
        AccumulateVChunk<4, kFp8>(rows, offset, tokens, p, pp_stride, alpha + h, a, acc_stride, pf,
                                  pf_lines);
        break;
#undef KVG_CASE
    }
  }
}

// Exp returns e^x for x <= 0 (and 0 for x = -inf): x log2(e) = n + f with n an integer and
// |f| <= 1/2, 2^f by its Taylor polynomial of degree 5 in f ln 2 (truncation error < 2.5e-6
// relative, a thousandth of the BF16 rounding every probability gets next), then VSCALEFPS
// multiplies by 2^n (0 below FP32's range).
KVG_AVX512_BF16_TARGET inline __m512 Exp(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-150.0f));  // e^-150 is 0 in FP32; keeps -inf out
  const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_set1_ps(1.3333558146428443e-03f);  // ln2^5 / 5!
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076284772e-03f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108664821580e-02f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650695910071e-01f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718055994531e-01f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

inline __mmask16 FirstLanes(int n) {
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1);
}

// Below this much growth of a block's max over the running max, the running max is kept (the
// new probabilities may reach e^8 ~ 3e3, harmless in FP32) and the accumulator is not rescaled:
// in a long context the max settles early, so most blocks skip the rescale. The result is the
// same softmax; only the reference point of the exponentials differs.
constexpr float kLazyRescale = 8.0f;

// SoftmaxToBf16 folds `count` scores of one head into its running max and its running sum, a
// vector whose lanes add up to the sum (reduced once, at the end of the task): probs[0, count)
// receives exp(score - max) * p_scale (a power of two) rounded to BF16 and
// probs[count, RoundUp(count, 32)) zero; the sum adds exactly the rounded values over p_scale;
// *alpha receives the factor the accumulator must be rescaled by (exp(old max - new max), or 1
// when the max is kept). The keep-or-raise decision compares lanes with old max + kLazyRescale
// (no horizontal max unless some lane exceeds it). scores[RoundUp(count, 16)) must be readable.
KVG_AVX512_BF16_TARGET void SoftmaxToBf16(const float* scores, int count, float p_scale, float* max,
                                          float* sum_lanes, float* alpha, uint16_t* probs) {
  const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
  __m512 m = neg_inf;
  for (int i = 0; i < count; i += 16) {
    m = _mm512_max_ps(m, _mm512_mask_loadu_ps(neg_inf, FirstLanes(count - i), scores + i));
  }
  float new_max = *max;
  *alpha = 1.0f;
  // Not "<=": also the first block, whose old max is -inf, and a NaN score.
  if (_mm512_cmp_ps_mask(m, _mm512_set1_ps(*max + kLazyRescale), _CMP_NLE_UQ) != 0) {
    new_max = std::max(*max, _mm512_reduce_max_ps(m));
    *alpha = std::exp(*max - new_max);  // 0 for the first block
  }
  const __m512 shift = _mm512_set1_ps(new_max);
  const __m512 scale = _mm512_set1_ps(p_scale);
  __m512 total = _mm512_setzero_ps();
  for (int i = 0; i < count; i += 32) {
    const __mmask16 m0 = FirstLanes(count - i);
    const __mmask16 m1 = FirstLanes(count - i - 16 > 0 ? count - i - 16 : 0);
    const __m512 p0 = _mm512_maskz_mul_ps(
        m0, Exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(m0, scores + i), shift)), scale);
    const __m512 p1 = _mm512_maskz_mul_ps(
        m1, Exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(m1, scores + i + 16), shift)), scale);
    const __m512bh bf = _mm512_cvtne2ps_pbh(p1, p0);  // p0 in words 0..15, p1 in 16..31
    const __m512i bits = (__m512i)bf;
    _mm512_storeu_si512(probs + i, bits);
    // The rounded values back in FP32: low and high 16-bit halves of each 32-bit lane.
    total = _mm512_add_ps(total, _mm512_castsi512_ps(_mm512_slli_epi32(bits, 16)));
    total = _mm512_add_ps(total,
                          _mm512_castsi512_ps(_mm512_and_si512(bits, _mm512_set1_epi32(~0xFFFF))));
  }
  // Kept in units of 1 (not p_scale): a lane may add up thousands of blocks of values up to
  // e^kLazyRescale, which times p_scale = 2^110 would overflow FP32.
  _mm512_storeu_ps(sum_lanes,
                   _mm512_fmadd_ps(_mm512_loadu_ps(sum_lanes), _mm512_set1_ps(*alpha),
                                   _mm512_mul_ps(total, _mm512_set1_ps(1.0f / p_scale))));
  *max = new_max;
}

// StoreInDimOrder writes out[d] = acc[slot_of[d]] * norm for the 64 dims of one chunk (acc in
// slot order): two two-source permutes per 16 dims, picked by bit 5 of the slot.
KVG_AVX512_BF16_TARGET inline void StoreInDimOrder(const float* acc, const int32_t* slot_of,
                                                   float norm, float* out) {
  const __m512 a0 = _mm512_loadu_ps(acc), a1 = _mm512_loadu_ps(acc + 16);
  const __m512 a2 = _mm512_loadu_ps(acc + 32), a3 = _mm512_loadu_ps(acc + 48);
  const __m512 n = _mm512_set1_ps(norm);
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    const __m512i idx = _mm512_load_si512(slot_of + 16 * j);
    const __mmask16 upper = _mm512_test_epi32_mask(idx, _mm512_set1_epi32(32));
    const __m512 lo = _mm512_permutex2var_ps(a0, idx, a1);  // slot bits 0-4
    const __m512 hi = _mm512_permutex2var_ps(a2, idx, a3);
    _mm512_storeu_ps(out + 16 * j, _mm512_mul_ps(_mm512_mask_blend_ps(upper, lo, hi), n));
  }
}

// Per-thread working memory, grown on demand and reused across calls.
struct Scratch {
  std::vector<uint32_t> qp;          // [heads, dim / 2] BF16 query pairs
  std::vector<float> acc;            // [heads, dim] accumulators, in slot order per 64-dim chunk
  std::vector<float> state;          // [heads] each: max, alpha, unscale, sum
  std::vector<float> sum_lanes;      // [heads, 16] running sums, one per lane
  std::vector<float> scores;         // [group, score_stride]
  std::vector<uint16_t> probs;       // [group, prob_stride] BF16 probabilities
  std::vector<uint8_t> kbuf;         // gathered K rows of a partial page or of a block
  std::vector<const uint8_t*> rows;  // [block tokens] V rows of the first kv head, token order
  std::vector<Column> cols;          // [block tokens / 16 + 1] K columns of one kv head
};

Scratch& ThreadScratch() {
  thread_local Scratch scratch;
  return scratch;
}

// Attend runs one task. The block loop is outermost and the kv heads inside it, so that the
// pages of a block are read front to back (all heads of a page are contiguous in the pool)
// while the next block's pages are prefetched; each head keeps its own running max, sum and
// accumulator across blocks.
template <bool kFp8>
KVG_AVX512_BF16_TARGET void Attend(const PagedKvView& kv, int group, float softmax_scale,
                                   const DecodeQuery& query, const Task& task, float* partials) {
  constexpr size_t kElem = kFp8 ? 1 : 2;
  // Probabilities are multiplied by this before rounding (FP8: the V codes convert to value *
  // 2^-120, and p * v * 2^-10 keeps the products far above FP32's flush threshold).
  constexpr float kProbScale = kFp8 ? 0x1p110f : 1.0f;
  const int dim = kv.head_dim;
  const int page_size = kv.page_size;
  const int heads = task.kv_heads * group;  // query heads of the task
  const int first_head = task.kv_head * group;
  Scratch& s = ThreadScratch();

  const int block_pages = std::clamp(kBlockTokens / page_size, 1, kMaxBlockPages);
  const size_t block_tokens = static_cast<size_t>(block_pages) * page_size;
  const size_t score_stride = block_tokens + 16;
  const size_t prob_stride = (block_tokens + 31) / 32 * 32;
  const size_t qp_stride = static_cast<size_t>(dim) / 2;
  s.qp.resize(static_cast<size_t>(heads) * qp_stride);
  s.acc.assign(static_cast<size_t>(heads) * dim, 0.0f);
  s.state.resize(4 * static_cast<size_t>(heads));
  s.sum_lanes.assign(16 * static_cast<size_t>(heads), 0.0f);
  s.scores.resize(static_cast<size_t>(group) * score_stride);
  s.probs.resize(static_cast<size_t>(group) * prob_stride);
  s.kbuf.resize(static_cast<size_t>(dim) * (block_tokens + 16) * kElem);
  s.rows.resize(block_tokens);
  s.cols.resize(block_tokens / 16 + 1);
  float* max = s.state.data();
  float* alpha = max + heads;
  float* unscale = alpha + heads;  // what each head's raw scores are multiplied by
  float* sum = unscale + heads;    // filled from sum_lanes at the end
  for (int h = 0; h < heads; ++h) max[h] = -INFINITY;

  // The query of each head, times softmax_scale, rounded to BF16 pairs once for the whole task.
  // FP8: also times its kv head's K scale and 2^s (the codes convert to value * 2^-120; see the
  // file comment), s such that max |q| * factor * 2^s lies in [2^124, 2^125); the raw scores
  // are then 2^(s - 120) times the real ones.
  for (int h = 0; h < heads; ++h) {
    const float* q = query.q + static_cast<size_t>(first_head + h) * dim;
    float factor = softmax_scale;
    int shift = 0;
    unscale[h] = 1.0f;
    if constexpr (kFp8) {
      factor *= kv.k_scale[task.kv_head + h / group];
      // max |q[d] * factor| = max |q[d]| * |factor| (rounding is monotonic); a NaN q[d] is
      // skipped (MAXPS returns its second operand when the first is NaN).
      __m512 qmax = _mm512_setzero_ps();
      for (int d = 0; d < dim; d += 16) {
        qmax = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(q + d)), qmax);
      }
      const float amax = _mm512_reduce_max_ps(qmax) * std::fabs(factor);
      int e = 0;
      if (amax > 0.0f && std::isfinite(amax)) std::frexp(amax, &e);  // amax < 2^e
      shift = std::clamp(125 - e, 0, 250);
      unscale[h] = std::ldexp(1.0f, 120 - shift);
    }
    // (q * factor) * 2^shift, the power of two applied exactly by VSCALEFPS: factor * 2^shift
    // alone may exceed FP32's range (a tiny K scale) where the product does not.
    const __m512 q_scale = _mm512_set1_ps(factor);
    const __m512 q_shift = _mm512_set1_ps(static_cast<float>(shift));
    for (int d = 0; d < dim; d += 32) {
      const __m512 lo = _mm512_scalef_ps(_mm512_mul_ps(_mm512_loadu_ps(q + d), q_scale), q_shift);
      const __m512 hi =
          _mm512_scalef_ps(_mm512_mul_ps(_mm512_loadu_ps(q + d + 16), q_scale), q_shift);
      _mm512_storeu_si512(s.qp.data() + static_cast<size_t>(h) * qp_stride + d / 2,
                          (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
  }

  const size_t head_bytes = static_cast<size_t>(kv.head_stride) * kElem;
  const uint8_t* k_base = static_cast<const uint8_t*>(kv.k) + task.kv_head * head_bytes;
  const uint8_t* v_base = static_cast<const uint8_t*>(kv.v) + task.kv_head * head_bytes;
  const int first_page = task.token_begin / page_size;
  const int end_page = (task.token_end + page_size - 1) / page_size;
  auto page_count = [&](int p) { return std::min(page_size, task.token_end - p * page_size); };
  auto page_offset = [&](int p) {
    return static_cast<size_t>(query.page_table[p]) * static_cast<size_t>(kv.page_stride) * kElem;
  };
  // Prefetch: while kv head g of a block runs, the next (head, block) pair's K and V lines are
  // requested a few per inner-loop iteration (Prefetcher); the first pair is requested at once.
  Prefetcher pf;
  auto add = [&](int block, int g, bool far) {
    for (int i = 0; i < block_pages && block + i < end_page; ++i) {
      const size_t offset = page_offset(block + i) + static_cast<size_t>(g) * head_bytes;
      const int count = page_count(block + i);
      pf.Add(k_base + offset, (static_cast<size_t>(dim - 1) * page_size + count) * kElem, far);
      pf.Add(v_base + offset, static_cast<size_t>(count) * dim * kElem, far);
    }
  };
  // queue(block, g), while pair (block, g) runs: the next pair for L1, and where FarPair says so
  // the one after it for L2 (see Prefetcher).
  const bool far_pair = FarPair(kFp8);
  auto queue = [&](int block, int g) {
    pf.Reset();
    for (int ahead = 1; ahead <= (far_pair ? 2 : 1); ++ahead) {
      const int idx = g + ahead;
      add(block + idx / task.kv_heads * block_pages, idx % task.kv_heads, ahead == 2);
    }
  };
  pf.Reset();
  add(first_page, 0, false);
  pf.Issue(1 << 30);
  const int tiles_k = (group + kScoreTile - 1) / kScoreTile;
  const int tiles_v = (group + kVTile - 1) / kVTile;
  const void* k_pages[kMaxBlockPages];
  size_t offsets[kMaxBlockPages];
  int counts[kMaxBlockPages];
  Column* cols = s.cols.data();
  const bool whole_columns = page_size % 16 == 0;
  for (int block = first_page; block < end_page; block += block_pages) {
    const int num_pages = std::min(block_pages, end_page - block);
    int tokens = 0;
    for (int i = 0; i < num_pages; ++i) {
      offsets[i] = page_offset(block + i);
      counts[i] = page_count(block + i);
      // V rows of kv head task.kv_head; the other heads' are a fixed offset away.
      const uint8_t* v_page = v_base + offsets[i];
      for (int j = 0; j < counts[i]; ++j) {
        s.rows[static_cast<size_t>(tokens + j)] = v_page + static_cast<size_t>(j) * dim * kElem;
      }
      tokens += counts[i];
    }
    const int num_cols = (tokens + 15) / 16;
    // Prefetch requests of the next (head, block) are spread over this one's columns (score
    // pass) and groups of 8 row pairs (V pass).
    const size_t steps = static_cast<size_t>(num_cols) * tiles_k +
                         static_cast<size_t>(((tokens + 1) / 2 + 7) / 8) * (dim / 64) * tiles_v;
    for (int g = 0; g < task.kv_heads; ++g) {
      queue(block, g);
      const int pf_lines = static_cast<int>((pf.Lines() + steps - 1) / steps);
      const size_t head_offset = static_cast<size_t>(g) * head_bytes;
      const uint32_t* qp = s.qp.data() + static_cast<size_t>(g) * group * qp_stride;
      // The block's K as 16-token columns: in place for whole pages, gathered (valid tokens
      // only, zero-padded) for the request's partial last page or for narrow pages.
      int n = 0;
      if (whole_columns) {
        for (int i = 0; i < num_pages; ++i) {
          const void* k = k_base + offsets[i] + head_offset;
          size_t stride = static_cast<size_t>(page_size);
          if (counts[i] != page_size) {
            stride = GatherK(&k, &counts[i], 1, page_size, dim, kElem, 16, s.kbuf.data());
            k = s.kbuf.data();
          }
          for (int c = 0; c < counts[i]; c += 16) {
            cols[n++] = {static_cast<const uint8_t*>(k) + c * kElem, stride};
          }
        }
      } else {
        for (int i = 0; i < num_pages; ++i) k_pages[i] = k_base + offsets[i] + head_offset;
        const size_t width =
            GatherK(k_pages, counts, num_pages, page_size, dim, kElem, 16, s.kbuf.data());
        for (int c = 0; c < tokens; c += 16) cols[n++] = {s.kbuf.data() + c * kElem, width};
      }
      ScoresTiles<kFp8>(group, cols, n, dim, qp, qp_stride, unscale + g * group, s.scores.data(),
                        score_stride, pf, pf_lines);

      float* hmax = max + g * group;
      float* halpha = alpha + g * group;
      for (int h = 0; h < group; ++h) {
        SoftmaxToBf16(s.scores.data() + h * score_stride, tokens, kProbScale, &hmax[h],
                      s.sum_lanes.data() + 16 * static_cast<size_t>(g * group + h), &halpha[h],
                      s.probs.data() + h * prob_stride);
      }
      float* acc = s.acc.data() + static_cast<size_t>(g) * group * dim;
      for (int c = 0; c < dim; c += 64) {
        AccumulateVTiles<kFp8>(group, s.rows.data(), head_offset + c * kElem, tokens,
                               reinterpret_cast<const uint32_t*>(s.probs.data()), prob_stride / 2,
                               halpha, acc + c, static_cast<size_t>(dim), pf, pf_lines);
      }
    }
  }

  for (int h = 0; h < heads; ++h) {
    sum[h] =
        _mm512_reduce_add_ps(_mm512_loadu_ps(s.sum_lanes.data() + 16 * static_cast<size_t>(h)));
  }
  // Accumulator slots back into dim order. The accumulator is sum_t p_t v_t * kProbScale * (FP8:
  // 2^-120 / v_scale), so output = acc * kOutScale / sum, with kOutScale = v_scale * 2^10 for FP8
  // and 1 for BF16; a partial state holds acc * kOutScale / VFactor (attention.cc's units).
  const int32_t* slot_of = kFp8 ? kSlotOf.fp8 : kSlotOf.bf16;
  for (int g = 0; g < task.kv_heads; ++g) {
    const int kv_head = task.kv_head + g;
    const float out_scale = kFp8 ? kv.v_scale[kv_head] * 1024.0f : 1.0f;
    const int base = g * group;
    float* dst = query.out + static_cast<size_t>(kv_head) * group * dim;
    if (task.partial >= 0) {
      float* state = partials + static_cast<size_t>(task.partial + g * task.partial_head_stride) *
                                    PartialFloats(group, dim);
      std::memcpy(state, max + base, sizeof(float) * group);
      std::memcpy(state + group, sum + base, sizeof(float) * group);
      dst = state + 2 * group;
    }
    for (int h = 0; h < group; ++h) {
      const float norm =
          task.partial >= 0 ? out_scale / VFactor(kv, kv_head) : out_scale / sum[base + h];
      const float* a = s.acc.data() + static_cast<size_t>(base + h) * dim;
      float* out = dst + static_cast<size_t>(h) * dim;
      for (int c = 0; c < dim; c += 64) StoreInDimOrder(a + c, slot_of, norm, out + c);
    }
  }
}

}  // namespace

void AttendTaskBf16Dot(const PagedKvView& kv, int group, float softmax_scale,
                       const DecodeQuery& query, const Task& task, float* partials) {
  if (kv.dtype == KvDtype::kFp8E4m3) {
    Attend<true>(kv, group, softmax_scale, query, task, partials);
  } else {
    Attend<false>(kv, group, softmax_scale, query, task, partials);
  }
}

KVG_AVX512_BF16_END

#else  // !KVGUARD_AVX512_BF16

void AttendTaskBf16Dot(const PagedKvView&, int, float, const DecodeQuery&, const Task&, float*) {
  __builtin_trap();  // unreachable: callers check internal::HasAvx512Bf16Vbmi()
}

#endif  // KVGUARD_AVX512_BF16

}  // namespace kvguard::kernels::attention_internal
