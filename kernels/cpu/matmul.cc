// kernels/cpu/matmul.cc: y = W x for FP32 / BF16 / FP8 / INT4 weights (Highway, runtime dispatch).
//
// Decode is bound by memory bandwidth, so every format is written to keep up with DRAM on one or
// two cores: W is read once per call (batch > 1 reuses each block of W rows, from L1/L2, for every
// column of x, kBatchTile columns per pass), decoding a weight costs a few integer ops, and at
// small batches several rows share each load of x (x loads, not W's, would otherwise fill the
// load ports). The per-call preprocessing of x (FP8: scaling; INT4: quantisation) is done by every
// thread into its own scratch, not once and shared: scratch written on one core and read on
// another moves every line between cores on every call, which cost more (measured: ~10 us per
// call at 2 threads) than preparing 4096 elements twice (~1 us).
//
// FP32, BF16, FP8: W is decoded to FP32 lanes and FMA'd with x, exactly as given (FP32
// accumulation error only). FP8 decodes like Fp8E4m3ToFloat in formats.h: the 7 magnitude bits of
// code b placed at bits 26..20 and its sign at bit 31 are the FP32 bits of value(b) * 2^-120,
// exactly (e4m3 subnormals become FP32 denormals), in three integer ops and no float op. To keep
// the products away from FP32's denormal range, each column of x is first scaled by a power of
// two 2^k (k from max |x|, so max |x| 2^k < 2^126: exact), and 2^(120 - k) is folded, with the row
// scale, into one FP64 multiply per output. Products below 2^-126 after that scaling (|x_c| under
// ~2^-120 max |x|) lose bits as FP32 denormals would. The e4m3 NaN code decodes as 480
// (QuantizeMatrix never produces it). Assumes denormals are not flushed (formats.h).
//
// INT4: integer dot products. x is quantised once per call, per weight group, to int8:
//   s_b = max_{c in b} |x_c| / 127,  q_c = rne(x_c * fl(1 / s_b))   (FP32, ties-to-even)
// so that sum_c (code_c - 8) * q_c is an exact int32 per group, converted to FP32 once per group
// and FMA'd with (group scale * s_b). The AVX3_DL target uses VPDPBUSD (u8 codes 0..15 x s8 q) on
// raw 64-byte loads of codes, AVX2 VPMADDUBSW + VPMADDWD on 32-byte halves; the zero point is
// removed exactly, in int32, by starting each lane from -8 * (sum of the q it multiplies). Other
// targets promote to int16 and subtract 8 first.
// Error: x_c is replaced by q_c s_b with |x_c - q_c s_b| <= s_b (1/2 + 254 u), u = 2^-24 (the
// reciprocal and the product each round, relative u, before rne, and |x_c / s_b| <= 127), so
// with w the dequantised weights
//   |y_kernel - y_exact| <= sum_b s_b (1/2 + 2^-16) sum_{c in b} |w_c|   (activation rounding)
//                          + FP32 accumulation error on sum_c |w_c| (|x_c| + s_b).
// A block with max |x| < 2^-100 is taken as zero (its FP32 scale would be imprecise): its error is
// at most 2^-100 sum |w_c|. A block holding inf or NaN makes the column's outputs NaN.
#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "absl/base/internal/raw_logging.h"
#include "kernels/cpu/internal/cache_info.h"
#include "kernels/cpu/internal/cpu_features.h"
#include "kernels/cpu/internal/matmul_bf16dot.h"

#ifndef KVGUARD_KERNELS_CPU_MATMUL_SHARED_
#define KVGUARD_KERNELS_CPU_MATMUL_SHARED_
namespace kvguard::kernels::matmul_internal {

// Rows per ParallelFor unit, and per block of W that a batch > 1 revisits for every column tile
// (16 rows of 4096 FP32 weights = 256 KiB: stays in L2 between tiles).
inline constexpr int64_t kRowBlock = 16;
// Columns of x that share one pass over a row block of W.
inline constexpr int kBatchTile = 4;
// Below this max |x|, an INT4 activation block is taken as zero.
inline constexpr float kXFlushBelow = 0x1p-100f;
// Most INT4 groups per row: a row of 131072 weights at group 128, 32768 at group 32.
inline constexpr int kMaxInt4Groups = 1024;
// The most columns one call of the FP32 and INT4 kernels takes (their per-call scratch, e.g.
// the INT4 kernel's quantised x, is sized for the decode batches they serve).
inline constexpr int kMaxKernelBatch = 64;

// XChunk is x quantised for one 128-element chunk of a W row: the elements whose codes one
// 64-byte run of W holds. Its int8 values are stored in the order of that run's nibbles, so that
// one 64-byte load of codes lines up with `lo` (low nibbles) and `hi` (high nibbles).
struct alignas(64) XChunk {
  int8_t lo[64];
  int8_t hi[64];
  // AVX3_DL and AVX2 only: -8 * the sum of the 8 q that int32 lane l of VPDPBUSD (or of
  // VPMADDUBSW + VPMADDWD) multiplies (bytes 4l..4l+3, low and high nibbles): the zero point,
  // removed exactly in int32.
  int32_t bias[16];
};
static_assert(sizeof(XChunk) == 192);

// PrefetchIntoL2 says whether the matmul kernels' software prefetch, which runs `lead_bytes` ahead
// of the loads it serves, should fill L2 (prefetcht1) rather than L1 (prefetcht0): L2 once the
// lead exceeds half of L1D. The cut-off is a choice between what was measured, not a measured
// optimum: on Zen 4 (32 KiB L1D) medium's down projection (5632 columns, a 22 KiB lead for FP8
// and INT4 alike) ran far faster with L2 (bench/results/kernels.md, "Matmul software prefetch on
// Zen 4": two A B A B runs, FP8 18.9 / 20.6 -> 33.6 / 30.0 GB/s, INT4 18.4 / 20.8 -> 26.0 / 29.3,
// batch 1, 2 threads; an exploration before them, 3 rounds, gave FP8 18.5 / 18.2 / 17.3 -> 25.5
// / 28.5 / 27.9 and INT4 21.5 / 24.4 / 22.2 -> 28.3 / 27.8 / 33.1), while at 2048 columns (an
// 8 KiB lead) L2 was within noise for FP8 and faster for INT4 in 8 of 9 kernel pairs but gave no
// clear answer in the engine, so those stay in L1. On Zen 5 (48 KiB L1D) L1 was faster in 17 of
// 24 pairs at leads of 8 and 16 KiB (see FpRows); there every medium shape's lead (at most 22
// KiB) stays in L1, as before. The likely reason a long lead hurts, that its lines are evicted
// from L1 before use, is not measured (no cache counters in these VMs). Also moved to L2 by
// this: BF16 and FP32 weights (the non-default formats) of more than 3072 / 1536 columns on Zen
// 5, 2048 / 1024 on Zen 4; not measured.
bool PrefetchIntoL2(size_t lead_bytes);

// NextCall returns a number no earlier MatMul call of this process got (never 0). A thread runs
// several of one call's row chunks (RunRows: about four per thread), and its Scratch records the
// call whose x it holds, so that x is prepared once per thread and call, not once per chunk.
// Measured on Ice Lake, 2 threads, `medium` INT4 decode (perf record -e cpu-clock over
// `kvguard generate`, bench/results/kernels.md): QuantizeColumn 1.9% of the samples before, 0.5%
// after; the expected engine gain (~1.4%) is below what this host's noise lets a few runs show.
uint64_t NextCall();

// Per-call scratch of one thread.
struct Scratch {
  std::vector<XChunk> chunks;      // INT4: [batch, ceil(cols / 128)]
  std::vector<float> group_scale;  // INT4: [batch, cols / group] s_b (0 for a zero block)
  std::vector<float> x_scaled;     // FP8: [batch, cols] x * 2^k
  std::vector<double> x_factor;    // FP8: [batch] 2^(120 - k)
  uint64_t prepared_for = 0;       // the NextCall() of the call whose x this holds; 0: none
};

}  // namespace kvguard::kernels::matmul_internal
#endif  // KVGUARD_KERNELS_CPU_MATMUL_SHARED_

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/matmul.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace kvguard::kernels {
namespace HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using matmul_internal::kBatchTile;
using matmul_internal::kMaxInt4Groups;
using matmul_internal::kRowBlock;
using matmul_internal::kXFlushBelow;
using matmul_internal::NextCall;
using matmul_internal::PrefetchIntoL2;
using matmul_internal::Scratch;
using matmul_internal::XChunk;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
constexpr size_t kLanes = hn::MaxLanes(DF());

// Every loop over accumulators (r < R, j < NB, u < kU) carries "#pragma GCC unroll": only fully
// unrolled loops let GCC keep the accumulator arrays in registers rather than on the stack.

// RowsPerPass returns how many rows share each load of x when NB columns are processed together:
// enough that x loads stop dominating at small batches, few enough to stay in registers (wide
// vectors only; 128-bit targets have too few registers).
// With 32 vector registers (AVX-512), tiles of 3 and 4 columns (prefill, and decode batches of 3
// and more with FP8/BF16/FP32 weights) take 3 and 2 rows: R x NB x 2 = 18 and 16 accumulators,
// 2R weight vectors and one column's x fit. With one row, each x load fed a single FMA. Measured
// on Zen 4, 2 threads, A B A B, 3 reps each (bench/results/kernels.md, "Prefill matmul rows per
// pass"): BM_MatMulPrefill FP8 at medium's four shapes 51-86 GFLOP/s with one row, 95-121 with
// two; BF16 59-70 -> 83-106; FP8 4096x4096 at batch 8 57-78 -> 113. Accumulation order is the
// same for every R (Accumulators), so outputs are unchanged bit for bit.
template <int NB>
constexpr int RowsPerPass() {
  if (kLanes < 8) return 1;
  if (NB == 1) return 4;
  if (NB == 2) return 2;
#if HWY_TARGET <= HWY_AVX3
  return NB == 3 ? 3 : 2;
#else
  return 1;
#endif
}

// Accumulators per (row, column): at least 16 partial sums per output on every target, which is
// what bounds the FP32 accumulation error (each partial sum chains at most cols / 16 products),
// and at least 2 per pair step. The same count for every R and NB, so a row's sum is computed in
// the same order whichever pass (or thread) takes it: stacking matrices by rows (the engine's
// fused Q/K/V and gate/up) then leaves every output unchanged bit for bit. Independent FMA
// chains come from the R x NB x 2 accumulators of a pass (8 at batch 1 on 256- and 512-bit
// targets, where R = 4); only the at most 3 leftover rows of a row range run with 2.
template <int NB, int R>
constexpr int Accumulators() {
  return static_cast<int>(std::max<size_t>(16 / kLanes, 2));
}

// Weight decoders: Load returns kLanes weights starting at p as FP32 lanes. Load2 returns the
// 2 * kLanes weights starting at p as two vectors, in the order the caller's x must follow: FP32
// and BF16 first and second half; FP8 even and odd elements (ScaleForFp8 orders x to match).
struct Fp32Weights {
  using T = float;
  static VF Load(DF df, const T* HWY_RESTRICT p) { return hn::LoadU(df, p); }
  static void Load2(DF df, const T* HWY_RESTRICT p, VF& a, VF& b) {
    a = Load(df, p);
    b = Load(df, p + kLanes);
  }
};

struct Bf16Weights {
  using T = uint16_t;
  static VF Load(DF df, const T* HWY_RESTRICT p) {
    const hn::Rebind<uint16_t, DF> d16;
    const hn::Rebind<uint32_t, DF> d32;
    return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(d32, hn::LoadU(d16, p))));
  }
  static void Load2(DF df, const T* HWY_RESTRICT p, VF& a, VF& b) {
    a = Load(df, p);
    b = Load(df, p + kLanes);
  }
};

struct Fp8Weights {
  using T = uint8_t;
  // Returns value(b) * 2^-120 (see the file comment).
  static VF Load(DF df, const T* HWY_RESTRICT p) {
    const hn::Rebind<int8_t, DF> d8;
    const hn::RebindToSigned<DF> di;
    // Sign-extended, so bit 7 (the sign) also lands on bit 31 after the shift.
    const auto b = hn::PromoteTo(di, hn::LoadU(d8, reinterpret_cast<const int8_t*>(p)));
    return hn::BitCast(df, hn::And(hn::ShiftLeft<20>(b), SignAndMagnitude(di)));
  }
  // One widening to int16 serves two int32 results: an int32 lane holds an even code in its low
  // half and the next odd code in its high half, and a shift by 20 or by 4 (then the mask) moves
  // either into place: half the widening shuffles of two Loads.
  static void Load2(DF df, const T* HWY_RESTRICT p, VF& even, VF& odd) {
#if HWY_TARGET == HWY_SCALAR
    even = Load(df, p);
    odd = Load(df, p + 1);
#else
    const hn::RebindToSigned<DF> di;
    const hn::Repartition<int16_t, DF> d16;
    const hn::Rebind<int8_t, decltype(d16)> d8;
    const auto pairs =
        hn::BitCast(di, hn::PromoteTo(d16, hn::LoadU(d8, reinterpret_cast<const int8_t*>(p))));
    even = hn::BitCast(df, hn::And(hn::ShiftLeft<20>(pairs), SignAndMagnitude(di)));
    odd = hn::BitCast(df, hn::And(hn::ShiftLeft<4>(pairs), SignAndMagnitude(di)));
#endif
  }

 private:
  template <class DI>
  static hn::Vec<DI> SignAndMagnitude(DI di) {
    return hn::Set(di, static_cast<int32_t>(0x87F00000u));  // bit 31 and bits 26..20
  }
};

// PairStep adds 2 * kLanes weights of R rows (row r at w + r * cols) times the matching x of NB
// columns to acc[r][j][u] and acc[r][j][u + 1].
template <int NB, int R, class Weights, class Acc>
HWY_INLINE void PairStep(const typename Weights::T* HWY_RESTRICT w, size_t cols,
                         const float* HWY_RESTRICT x, size_t x_stride, Acc& acc, int u) {
  const DF df;
  VF wa[R], wb[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) Weights::Load2(df, w + r * cols, wa[r], wb[r]);
#pragma GCC unroll 16
  for (int j = 0; j < NB; ++j) {
    const VF xa = hn::LoadU(df, x + j * x_stride);
    const VF xb = hn::LoadU(df, x + j * x_stride + kLanes);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      acc[r][j][u] = hn::MulAdd(wa[r], xa, acc[r][j][u]);
      acc[r][j][u + 1] = hn::MulAdd(wb[r], xb, acc[r][j][u + 1]);
    }
  }
}

// PrefetchLine prefetches the line at p for reading into L2 (prefetcht1) or L1 (prefetcht0).
// The branch is the same for a whole call, so it predicts perfectly.
HWY_INLINE void PrefetchLine(const void* p, bool into_l2) {
  if (into_l2) {
    __builtin_prefetch(p, 0, 2);
  } else {
    __builtin_prefetch(p, 0, 3);
  }
}

// FpRows computes sums[r * NB + j] = sum_c W[r, c] * x[j * x_stride + c] for R consecutive rows of
// W (row r at w + r * cols) and NB columns of x.
template <int NB, int R, class Weights>
HWY_INLINE void FpRows(const typename Weights::T* HWY_RESTRICT w, size_t cols,
                       const float* HWY_RESTRICT x, size_t x_stride, bool prefetch_l2,
                       float* HWY_RESTRICT sums) {
  using T = typename Weights::T;
  constexpr int kU = Accumulators<NB, R>();
  static_assert(kU % 2 == 0, "the main loop steps in pairs of vectors");
  const DF df;
  VF acc[R][NB][kU];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int j = 0; j < NB; ++j) {
#pragma GCC unroll 16
      for (int u = 0; u < kU; ++u) acc[r][j][u] = hn::Zero(df);
    }
  }
  // The R rows are R streams; the hardware prefetcher starts each one late, so the next group
  // of rows (contiguous after these) is prefetched at the pace this one is read: R rows ahead,
  // into L1 (prefetcht0) unless prefetch_l2 (PrefetchIntoL2 of that lead; so does the AVX3_DL
  // Int4Rows, while the AVX2 and portable ones, not measured on an AVX2-only host since, keep
  // L2). Into L1 on Zen 5 (48 KiB L1D, leads up to 16 KiB) measured faster than into L2 in 17 of
  // 24 interleaved pairs (BM_MatMul, INT4 and FP8 at 4096x4096 and medium's shapes, 2 threads, 3
  // rounds; INT4 medians 2048x2048 36.2 -> 37.9 GB/s, 4096x4096 38.4 -> 42.2, 5632x2048 37.5 ->
  // 40.6; FP8 within a few percent), and `medium` INT4 decode went 70.3 -> 82.8 tok/s in one pair
  // of kvguard bench runs; on Zen 4 (32 KiB L1D) a 22 KiB lead into L1 was the slowest case
  // (PrefetchIntoL2).
  const char* next_rows = reinterpret_cast<const char*>(w + R * cols);
  constexpr size_t kStepBytes = kU * kLanes * R * sizeof(T);
  size_t c = 0;
  for (; c + kU * kLanes <= cols; c += kU * kLanes) {
#pragma GCC unroll 16
    for (size_t line = 0; line < kStepBytes; line += 64) {
      PrefetchLine(next_rows + c * R * sizeof(T) + line, prefetch_l2);
    }
#pragma GCC unroll 16
    for (int u = 0; u < kU; u += 2) {
      PairStep<NB, R, Weights>(w + c + u * kLanes, cols, x + c + u * kLanes, x_stride, acc, u);
    }
  }
  for (; c + 2 * kLanes <= cols; c += 2 * kLanes) {
    PairStep<NB, R, Weights>(w + c, cols, x + c, x_stride, acc, 0);
  }
  for (; c + kLanes <= cols; c += kLanes) {
    VF wv[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) wv[r] = Weights::Load(df, w + r * cols + c);
#pragma GCC unroll 16
    for (int j = 0; j < NB; ++j) {
      const VF xv = hn::LoadU(df, x + j * x_stride + c);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) acc[r][j][0] = hn::MulAdd(wv[r], xv, acc[r][j][0]);
    }
  }
  if (c < cols) {
    // Tail: zero-padded copies, so no load reads past the end of W or x (0 * 0 adds nothing).
    const size_t n = cols - c;
    VF wv[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      HWY_ALIGN T wbuf[kLanes] = {};
      std::memcpy(wbuf, w + r * cols + c, n * sizeof(T));
      wv[r] = Weights::Load(df, wbuf);
    }
#pragma GCC unroll 16
    for (int j = 0; j < NB; ++j) {
      HWY_ALIGN float xbuf[kLanes] = {};
      std::memcpy(xbuf, x + j * x_stride + c, n * sizeof(float));
      const VF xv = hn::Load(df, xbuf);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) acc[r][j][0] = hn::MulAdd(wv[r], xv, acc[r][j][0]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int j = 0; j < NB; ++j) {
#pragma GCC unroll 16
      for (int step = 1; step < kU; step *= 2) {
#pragma GCC unroll 16
        for (int u = 0; u + step < kU; u += 2 * step) {
          acc[r][j][u] = hn::Add(acc[r][j][u], acc[r][j][u + step]);
        }
      }
      sums[r * NB + j] = hn::GetLane(hn::SumOfLanes(df, acc[r][j][0]));
    }
  }
}

// Weight bytes per ParallelFor chunk below which RunRows gives each thread one chunk.
inline constexpr size_t kMinChunkBytes = size_t{256} << 10;

// RunRows splits the rows of w over the pool in whole row blocks. A matrix of fewer than
// kChunksPerThread x kMinChunkBytes per thread is cut into fewer chunks: each chunk starts a new
// stream whose first lines arrive at full DRAM latency, and on a small matrix those starts are a
// large share of the call. Measured on Zen 5, 2 threads, batch 1, A B A B (BM_MatMul, 5 reps):
// INT4 256 x 2048 (`medium`'s K/V projection before Q/K/V were fused) 22 -> 29 GB/s with one chunk
// per thread instead of four; 2048 x 2048 and larger within noise of each other. Larger matrices
// keep four per thread, so that one running thread can take over a descheduled one's share.
template <class Fn>
void RunRows(ThreadPool* pool, const WeightView& w, const Fn& fn) {
  if (pool == nullptr) {
    fn(int64_t{0}, w.rows);
  } else {
    const size_t per_thread = WeightBytes(w) / static_cast<size_t>(pool->size());
    pool->ParallelFor(w.rows, kRowBlock, fn, static_cast<int64_t>(per_thread / kMinChunkBytes));
  }
}

// ForEachTile calls block(r_begin, r_end, j0, nb) over the row blocks of [r0, r1) and, inside
// each, the tiles of at most kBatchTile columns (nb: a std::integral_constant with the tile's
// width), so one block of W is decoded from DRAM once and then served from cache to every tile.
// The batch is cut into ceil(batch / kBatchTile) tiles of balanced widths (29 = 5 x 4 + 3 x 3,
// not 7 x 4 + 1): a 1-wide tile unpacks the weights for a single column, the costliest shape
// per column (measured: batch 29-31 spent 5% of a step in 1-wide tiles).
template <class Block>
HWY_INLINE void ForEachTile(int64_t r0, int64_t r1, int batch, const Block& block) {
  static_assert(kBatchTile == 4, "the switch below enumerates tiles of 1..4 columns");
  const int tiles = (batch + kBatchTile - 1) / kBatchTile;
  const int narrow = batch / tiles, wide = batch % tiles;  // `wide` tiles are narrow + 1
  for (int64_t rb = r0; rb < r1; rb += kRowBlock) {
    const int64_t re = std::min(rb + kRowBlock, r1);
    for (int t = 0, j0 = 0; t < tiles; ++t) {
      const int width = narrow + (t < wide ? 1 : 0);
      const int start = j0;
      j0 += width;
      switch (width) {
        case 1:
          block(rb, re, start, std::integral_constant<int, 1>());
          break;
        case 2:
          block(rb, re, start, std::integral_constant<int, 2>());
          break;
        case 3:
          block(rb, re, start, std::integral_constant<int, 3>());
          break;
        default:
          block(rb, re, start, std::integral_constant<int, 4>());
          break;
      }
    }
  }
}

// ForEachRowGroup calls rows(r, R) over [rb, re): groups of RowsPerPass<NB>() rows, then single
// rows for the remainder. Where that is 3, the remainder is made of groups of 2 when it can be
// (a 16-row block: 3 x 4 + 2 x 2, not 3 x 5 + 1, whose single row runs alone with 6
// accumulators); outputs do not depend on R (see Accumulators). Measured on Zen 4, one thread, in
// cache (BM_MatMulCached/fp8/2048x2048/batch:3, A B A B, 3 pairs): 55 / 57 / 55 GFLOP/s with the
// single row, 73 / 56 / 56 without: within noise, as expected for 1 row in 16; kept because it
// leaves no row to the slowest pass shape.
template <int NB, class Rows>
HWY_INLINE void ForEachRowGroup(int64_t rb, int64_t re, const Rows& rows) {
  constexpr int kR = RowsPerPass<NB>();
  int64_t pairs = 0;  // groups of 2 at the end
  if constexpr (kR == 3) {
    const int64_t n = re - rb;
    pairs = n % 3 == 2 ? 1 : (n % 3 == 1 && n >= 4) ? 2 : 0;
  }
  int64_t r = rb;
  for (; r + kR <= re - 2 * pairs; r += kR) rows(r, std::integral_constant<int, kR>());
  if constexpr (kR == 3) {
    for (int64_t i = 0; i < pairs; ++i, r += 2) rows(r, std::integral_constant<int, 2>());
  }
  for (; r < re; ++r) rows(r, std::integral_constant<int, 1>());
}

// ScaleForFp8 writes x * 2^k to x_scaled, in the element order Fp8Weights::Load2 needs, and
// 2^(120 - k) to factor, per column, with k chosen so that max |x| 2^k < 2^126 (see the file
// comment). Exact: a power-of-two scaling within range.
void ScaleForFp8(const float* HWY_RESTRICT x, int batch, size_t cols, float* HWY_RESTRICT x_scaled,
                 double* HWY_RESTRICT factor) {
  const DF df;
  for (int b = 0; b < batch; ++b) {
    const float* xb = x + b * cols;
    float* out = x_scaled + b * cols;
    VF m = hn::Zero(df);
    size_t c = 0;
    for (; c + kLanes <= cols; c += kLanes) m = hn::Max(m, hn::Abs(hn::LoadU(df, xb + c)));
    float amax = hn::GetLane(hn::MaxOfLanes(df, m));
    for (; c < cols; ++c) amax = std::max(amax, std::fabs(xb[c]));
    int k = 0;  // inf (or NaN) in x: leave x alone, the result is inf or NaN anyway
    if (amax <= std::numeric_limits<float>::max()) {
      int e;
      std::frexp(amax, &e);  // amax < 2^e
      k = std::min(126 - e, 126);
    }
    factor[b] = std::ldexp(1.0, 120 - k);
    const float scale = std::ldexp(1.0f, k);
    // Full blocks of 2 * kLanes in Fp8Weights::Load2's order (evens, then odds); the rest as is.
    for (c = 0; c + 2 * kLanes <= cols; c += 2 * kLanes) {
      const VF lo = hn::Mul(hn::LoadU(df, xb + c), hn::Set(df, scale));
      const VF hi = hn::Mul(hn::LoadU(df, xb + c + kLanes), hn::Set(df, scale));
#if HWY_TARGET == HWY_SCALAR
      hn::StoreU(lo, df, out + c);
      hn::StoreU(hi, df, out + c + 1);
#else
      hn::StoreU(hn::ConcatEven(df, hi, lo), df, out + c);
      hn::StoreU(hn::ConcatOdd(df, hi, lo), df, out + c + kLanes);
#endif
    }
    for (; c < cols; ++c) out[c] = xb[c] * scale;
  }
}

template <class Weights>
void FpMatMul(const WeightView& w, const float* x, int batch, float* y, ThreadPool* pool) {
  using T = typename Weights::T;
  constexpr bool kFp8 = std::is_same_v<Weights, Fp8Weights>;
  const T* data = static_cast<const T*>(w.data);
  const size_t cols = static_cast<size_t>(w.cols);
  const int64_t rows = w.rows;
  const uint64_t call = kFp8 ? NextCall() : 0;
  RunRows(pool, w, [&](int64_t r0, int64_t r1) {
    const float* xs = x;
    const double* x_factor = nullptr;
    if constexpr (kFp8) {
      // Every thread scales x into its own scratch (see the file comment), once per call.
      thread_local Scratch scratch;
      if (scratch.prepared_for != call) {
        scratch.x_scaled.resize(batch * cols);
        scratch.x_factor.resize(batch);
        ScaleForFp8(x, batch, cols, scratch.x_scaled.data(), scratch.x_factor.data());
        scratch.prepared_for = call;
      }
      xs = scratch.x_scaled.data();
      x_factor = scratch.x_factor.data();
    }
    ForEachTile(r0, r1, batch, [&](int64_t rb, int64_t re, int j0, auto nb) {
      constexpr int kNb = decltype(nb)::value;
      // FpRows prefetches R rows ahead; the leftover single rows follow the full groups' choice.
      const bool prefetch_l2 = PrefetchIntoL2(RowsPerPass<kNb>() * cols * sizeof(T));
      ForEachRowGroup<kNb>(rb, re, [&](int64_t r, auto rows_tag) {
        constexpr int kR = decltype(rows_tag)::value;
        float sums[kR * kNb];
        FpRows<kNb, kR, Weights>(data + r * cols, cols, xs + j0 * cols, cols, prefetch_l2, sums);
#pragma GCC unroll 16
        for (int i = 0; i < kR; ++i) {
#pragma GCC unroll 16
          for (int j = 0; j < kNb; ++j) {
            float out = sums[i * kNb + j];
            if constexpr (kFp8) {
              // One rounding: the FP64 product of FP32 values and a power of two is exact.
              out = static_cast<float>(static_cast<double>(out) * w.row_scales[r + i] *
                                       x_factor[j0 + j]);
            }
            y[(j0 + j) * rows + r + i] = out;
          }
        }
      });
    });
  });
}

// ------------------------------------------------------------------------------------------
// INT4
// ------------------------------------------------------------------------------------------

// PrefetchGroupScalesAhead prefetches the FP16 group scales of the R rows `passes` row groups
// after the one whose scales start at gs. They are a second, small stream beside the codes
// (at group 128, 2 bytes per 64 code bytes) that the codes' prefetches do not cover, and every pass
// of Int4Rows starts by reading its rows' scales, before its short main loop (16 chunks at 2048
// columns). Measured on Zen 5, 2 threads, `medium` INT4 decode (perf record -e cpu-clock over
// `kvguard generate`): 30% of Int4Rows' samples sat on those scale loads without this, 7% with
// it; `kvguard bench --model medium` INT4/FP8 tok/s ratio 1.67 / 1.65 / 1.62 before, 1.86 /
// 1.87 / 1.87 after (runs interleaved A B A B, together with the engine's fused Q/K/V and
// gate/up, core/model/model.h). BM_MatMul, whose weight copies keep the scales on huge pages beside
// the codes (in the engine each matrix's scales are a small separate allocation), did not show
// it: faster in 13 of 24 interleaved pairs (INT4 at 6 shapes x 4 rounds, bench/results/
// kernels.md). The AVX2 path prefetches them as it does its codes (one pass ahead, into L2);
// not measured, there being no AVX2-only host here.
template <int R>
HWY_INLINE void PrefetchGroupScalesAhead(const uint16_t* gs, int groups, int passes, bool into_l2) {
  // Addresses as integers: past the matrix's last rows the range lies beyond the array (a
  // prefetch there is harmless; forming such a pointer would not be).
  const size_t row_bytes = static_cast<size_t>(groups) * sizeof(uint16_t);
  const uintptr_t begin =
      reinterpret_cast<uintptr_t>(gs) + static_cast<size_t>(passes) * R * row_bytes;
  const uintptr_t end = begin + R * row_bytes;
  // Every line the range touches, the first one included when begin is not line-aligned.
  for (uintptr_t line = begin & ~uintptr_t{63}; line < end; line += 64) {
    PrefetchLine(reinterpret_cast<const void*>(line), into_l2);
  }
}

#if HWY_TARGET == HWY_AVX3_DL
// Highway 1.0.3 compiles AVX3_DL with "avxvnni" (the VEX form) instead of "avx512vnni"; its
// runtime check does test AVX512-VNNI, so enabling it here for the EVEX VPDPBUSD is safe.
// The target's whole feature string is repeated: clang lets a function's own target
// attribute replace the one HWY_BEFORE_NAMESPACE applies (gcc adds them up).
#define KVGUARD_AVX512VNNI __attribute__((target(HWY_TARGET_STR ",avx512vnni")))

// Rows that share each load of x: 4 at every tile width. With NB columns the R x NB = up to 16
// accumulators, the 2R unpacked code vectors and one column's x (3 vectors) fill the 32
// registers; 4 x 4 is what keeps the dot-product/FMA pipes busy (measured on Zen 4: 42
// multiply-adds per cycle for the 4 x 4 instruction mix, against 31 for 1 x 4, where every
// x load serves one row; the kernel went from ~20 to ~35 per cycle at batch >= 4).
template <int NB>
constexpr int Int4RowsPerPass() {
  return 4;
}

// SetBiases fills XChunk::bias: VPDPBUSD with all-ones bytes sums each lane's 4 q.
KVGUARD_AVX512VNNI void SetBiases(XChunk* HWY_RESTRICT chunks, int count) {
  const __m512i ones = _mm512_set1_epi8(1);
  for (int k = 0; k < count; ++k) {
    __m512i sum =
        _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, _mm512_load_si512(chunks[k].lo));
    sum = _mm512_dpbusd_epi32(sum, ones, _mm512_load_si512(chunks[k].hi));
    _mm512_store_si512(chunks[k].bias, _mm512_mullo_epi32(sum, _mm512_set1_epi32(-kInt4ZeroPoint)));
  }
}

// CombinedStride returns the floats per (row, column) that Int4Rows needs in `scratch`: a
// compile-time constant, so that the 16 (row, column) scale streams of a 4 x 4 tile are one base
// pointer plus immediate offsets (16 runtime-strided pointers spill the integer registers).
// Up to kMaxInt4Groups groups per row (MatMul CHECKs it).
constexpr size_t CombinedStride(int /*groups*/) { return kMaxInt4Groups + 16; }

// SumLanes16 returns the vector whose lane i is the sum of the 16 lanes of v[i]: a transpose-add
// tree (45 instructions, against ~160 for 16 separate horizontal sums, which cost as much as the
// main loop of a 768-wide matrix).
KVGUARD_AVX512VNNI HWY_INLINE __m512 SumLanes16(const __m512* v) {
  __m512 x[8], y[4];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {  // per 128-bit lane: v[2i] partials at 0, 2; v[2i+1] at 1, 3
    x[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                         _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {  // per 128-bit lane: partials of v[4i .. 4i + 3] in order
    y[i] = _mm512_add_ps(_mm512_shuffle_ps(x[2 * i], x[2 * i + 1], 0x44),
                         _mm512_shuffle_ps(x[2 * i], x[2 * i + 1], 0xEE));
  }
  // Sum the four 128-bit lanes of each y[i]; y[i]'s totals end up in lane i.
  const __m512 w01 =
      _mm512_add_ps(_mm512_shuffle_f32x4(y[0], y[1], 0x44), _mm512_shuffle_f32x4(y[0], y[1], 0xEE));
  const __m512 w23 =
      _mm512_add_ps(_mm512_shuffle_f32x4(y[2], y[3], 0x44), _mm512_shuffle_f32x4(y[2], y[3], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_f32x4(w01, w23, 0x88), _mm512_shuffle_f32x4(w01, w23, 0xDD));
}

// GroupScaleLanes returns the combined scales (group scale * s_b) of chunk k, lane l holding the
// one of the group that bytes 4l..4l+3 of the chunk's codes belong to.
template <int G>
KVGUARD_AVX512VNNI HWY_INLINE __m512 GroupScaleLanes(const float* HWY_RESTRICT combined, int k) {
  if constexpr (G == 128) {
    return _mm512_set1_ps(combined[k]);
  } else if constexpr (G == 64) {
    const __m128 two =
        _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(combined + 2 * k)));
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                                 _mm512_castps128_ps512(two));
  } else {
    static_assert(G == 32);
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                                 _mm512_castps128_ps512(_mm_loadu_ps(combined + 4 * k)));
  }
}

// Int4Chunk adds chunk k (64 bytes of codes = 128 weights) of R rows, w[r], times each of NB
// columns to acc[r][j]; the x loads are shared by the R rows.
template <int G, int NB, int R>
KVGUARD_AVX512VNNI HWY_INLINE void Int4Chunk(const __m512i* w, const XChunk* const* xc,
                                             const float* HWY_RESTRICT combined, int k,
                                             __m512 (*acc)[NB]) {
  constexpr size_t stride = CombinedStride(0);
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  __m512i lo[R], hi[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    lo[r] = _mm512_and_si512(w[r], nibble);
    hi[r] = _mm512_and_si512(_mm512_srli_epi16(w[r], 4), nibble);
  }
#pragma GCC unroll 16
  for (int j = 0; j < NB; ++j) {
    const XChunk& x = xc[j][k];
    const __m512i bias = _mm512_load_si512(x.bias);
    const __m512i xlo = _mm512_load_si512(x.lo);
    const __m512i xhi = _mm512_load_si512(x.hi);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512i dot = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(bias, lo[r], xlo), hi[r], xhi);
      acc[r][j] =
          _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot),
                          GroupScaleLanes<G>(combined + (r * NB + j) * stride, k), acc[r][j]);
    }
  }
}

// Int4Rows computes sums[r * NB + j] = sum_c W[r, c] x_j[c] for R consecutive rows (codes and
// gs: the first row's codes and group scales) and the NB quantised columns xc[j] with scales
// group_scale[j]. `scratch` holds R * NB * CombinedStride(cols / G) floats.
template <int G, int NB, int R>
KVGUARD_AVX512VNNI void Int4Rows(const uint8_t* HWY_RESTRICT codes, const uint16_t* HWY_RESTRICT gs,
                                 int cols, const XChunk* const* xc, const float* const* group_scale,
                                 bool prefetch_l2, float* HWY_RESTRICT sums,
                                 float* HWY_RESTRICT scratch) {
  const int groups = cols / G;
  constexpr size_t stride = CombinedStride(0);
  PrefetchGroupScalesAhead<R>(gs, groups, 2, prefetch_l2);  // as the codes' prefetch below
  // Per row, once: the FP32 product of each group scale with s_b, so that a chunk costs one FMA
  // (with a broadcast or a lane permute) on top of its two VPDPBUSD. Lanes past the last group
  // are 0, which the partial chunk below relies on.
  for (int g0 = 0; g0 < groups; g0 += 16) {
    const __mmask16 m =
        static_cast<__mmask16>(groups - g0 >= 16 ? 0xFFFF : (1u << (groups - g0)) - 1);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512 ws = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, gs + r * groups + g0));
#pragma GCC unroll 16
      for (int j = 0; j < NB; ++j) {
        _mm512_storeu_ps(scratch + (r * NB + j) * stride + g0,
                         _mm512_mul_ps(ws, _mm512_maskz_loadu_ps(m, group_scale[j] + g0)));
      }
    }
  }
  if (groups % 16 == 0) {
#pragma GCC unroll 16
    for (int i = 0; i < R * NB; ++i) {
      _mm512_storeu_ps(scratch + i * stride + groups, _mm512_setzero_ps());
    }
  }
  __m512 acc[R][NB];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int j = 0; j < NB; ++j) acc[r][j] = _mm512_setzero_ps();
  }
  const size_t row_bytes = static_cast<size_t>(cols) / 2;
  const int full = cols / 128;
  for (int k = 0; k < full; ++k) {
    __m512i w[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      // The group of rows after the next, at this group's pace (see FpRows): at 2048 columns
      // one group is 4 KiB of codes, too short a lead for DRAM latency under load. Measured on
      // Zen 5, 2 threads, A B A B (BM_MatMul, 5 reps): 2048 x 2048 28.2 / 29.7 -> 32.0 / 32.2
      // GB/s, 4096 x 4096 32.8 / 35.2 -> 35.4 / 36.2; `medium` decode (kvguard bench, INT4,
      // batch 1) 56.2 -> 59.5 tok/s in one pair of runs. (On Zen 4, one thread, it made no
      // difference.) Into L1 or L2 as PrefetchIntoL2 says for this two-group lead.
      PrefetchLine(codes + 2 * R * row_bytes + (k * R + r) * 64, prefetch_l2);
      w[r] = _mm512_loadu_si512(codes + r * row_bytes + 64 * k);
    }
    Int4Chunk<G, NB, R>(w, xc, scratch, k, acc);
  }
  if (const int rest = cols % 128; rest != 0) {
    // A partial chunk (G < 128 only): the masked load reads only this row's codes; the zeroed
    // code bytes, XChunk lanes and combined scales past the end add exactly 0.
    const __mmask64 m = (__mmask64{1} << (rest / 2)) - 1;
    __m512i w[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
      w[r] = _mm512_maskz_loadu_epi8(m, codes + r * row_bytes + 64 * full);
    Int4Chunk<G, NB, R>(w, xc, scratch, full, acc);
  }
  __m512 all[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) all[i] = i < R * NB ? acc[i / NB][i % NB] : _mm512_setzero_ps();
  alignas(64) float total[16];
  _mm512_store_ps(total, SumLanes16(all));
#pragma GCC unroll 16
  for (int i = 0; i < R * NB; ++i) sums[i] = total[i];
}
#undef KVGUARD_AVX512VNNI

#elif HWY_TARGET == HWY_AVX2
// AVX2 (no VNNI): VPMADDUBSW multiplies the u8 codes 0..15 by the s8 q and adds adjacent pairs
// into int16 (at most 2 * 15 * 127 = 3810; low and high nibbles together 7620: no saturation),
// VPMADDWD by ones adds adjacent int16 pairs into int32. Int32 lane l then holds bytes
// 4l..4l+3 of a 32-byte half-chunk, the lane layout of VPDPBUSD, so XChunk::bias serves both.
// Measured on Zen 3, 2 threads: the portable int16 path below (about 12 vector ops per 16 code
// bytes per row, x reloaded for every row) held INT4 at batch 1 to 71% of STREAM read at
// 4096 x 4096 and the medium model to 1.18x FP8's tokens/s; this one (about 11 ops per 32 bytes,
// fewer at group 128) reaches 89% and 1.89x, and twice the weight rate at batch 8.

// Rows that share each load of x: with 16 registers, 4 rows at one column, 2 rows at more.
template <int NB>
constexpr int Int4RowsPerPass() {
  return NB == 1 ? 4 : 2;
}

// SetBiases fills XChunk::bias: -8 times the sum of the 8 q that each int32 lane multiplies.
void SetBiases(XChunk* HWY_RESTRICT chunks, int count) {
  const __m256i ones8 = _mm256_set1_epi8(1);
  const __m256i ones16 = _mm256_set1_epi16(1);
  for (int k = 0; k < count; ++k) {
    for (int h = 0; h < 2; ++h) {
      const __m256i lo = _mm256_load_si256(reinterpret_cast<const __m256i*>(chunks[k].lo + 32 * h));
      const __m256i hi = _mm256_load_si256(reinterpret_cast<const __m256i*>(chunks[k].hi + 32 * h));
      const __m256i pairs =
          _mm256_add_epi16(_mm256_maddubs_epi16(ones8, lo), _mm256_maddubs_epi16(ones8, hi));
      const __m256i sum = _mm256_madd_epi16(pairs, ones16);
      _mm256_store_si256(reinterpret_cast<__m256i*>(chunks[k].bias + 8 * h),
                         _mm256_mullo_epi32(sum, _mm256_set1_epi32(-kInt4ZeroPoint)));
    }
  }
}

// CombinedStride: floats per (row, column) in `scratch` (group scale * s_b per group, then 4
// zeros for the partial chunk's lanes past the last group).
constexpr size_t CombinedStride(int /*groups*/) { return kMaxInt4Groups + 16; }

// GroupScaleLanes256 returns the combined scales of half h of chunk k, lane l holding the one
// of the group that bytes 4l..4l+3 of that half belong to.
template <int G>
HWY_INLINE __m256 GroupScaleLanes256(const float* HWY_RESTRICT combined, int k, int h) {
  if constexpr (G == 128) {
    return _mm256_set1_ps(combined[k]);
  } else if constexpr (G == 64) {
    return _mm256_set1_ps(combined[2 * k + h]);
  } else {
    static_assert(G == 32);
    const __m128 two =
        _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(combined + 4 * k + 2 * h)));
    return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(two),
                                    _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
  }
}

// Int4Rows computes sums[r * NB + j] = sum_c W[r, c] x_j[c] for R consecutive rows (codes and
// gs: the first row's codes and group scales) and the NB quantised columns xc[j] with scales
// group_scale[j]. `scratch` holds R * NB * CombinedStride(cols / G) floats.
template <int G, int NB, int R>
void Int4Rows(const uint8_t* HWY_RESTRICT codes, const uint16_t* HWY_RESTRICT gs, int cols,
              const XChunk* const* xc, const float* const* group_scale, bool /*prefetch_l2*/,
              float* HWY_RESTRICT sums, float* HWY_RESTRICT scratch) {
  const int groups = cols / G;
  constexpr size_t stride = CombinedStride(0);
  PrefetchGroupScalesAhead<R>(gs, groups, 1, true);  // as the codes' prefetch below
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < NB; ++j) {
      float* combined = scratch + (r * NB + j) * stride;
      const uint16_t* row_gs = gs + r * groups;
      int g = 0;
      for (; g + 8 <= groups; g += 8) {  // F16C: a scalar FP16 decode per group cost ~10%
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row_gs + g));
        _mm256_storeu_ps(combined + g,
                         _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_loadu_ps(group_scale[j] + g)));
      }
      for (; g < groups; ++g) combined[g] = Fp16ToFloat(row_gs[g]) * group_scale[j][g];
      for (; g < groups + 4; ++g) combined[g] = 0.0f;
    }
  }
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  const __m256i ones16 = _mm256_set1_epi16(1);
  __m256 acc[R][NB];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int j = 0; j < NB; ++j) acc[r][j] = _mm256_setzero_ps();
  }
  const size_t row_bytes = static_cast<size_t>(cols) / 2;
  const int chunk_count = (cols + 127) / 128;
  const int full = cols / 128;
  // A partial last chunk (G < 128 only) is copied, zero-padded, so no load reads past the row;
  // its zero codes, XChunk lanes and combined scales add exactly 0.
  alignas(32) uint8_t tail[R][64];
  if (full < chunk_count) {
    for (int r = 0; r < R; ++r) {
      std::memset(tail[r], 0, 64);
      std::memcpy(tail[r], codes + r * row_bytes + 64 * full, (cols % 128) / 2);
    }
  }
  if constexpr (G == 128) {
    // One group per chunk: both halves' int16 pair sums add up before one VPMADDWD, convert and
    // FMA per (row, column) and chunk (four VPMADDUBSW results: at most 15240, no saturation).
    for (int k = 0; k < full; ++k) {
      __m256i lo0[R], hi0[R], lo1[R], hi1[R];
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const uint8_t* src = codes + r * row_bytes + 64 * k;
        __builtin_prefetch(codes + R * row_bytes + (k * R + r) * 64, 0, 2);
        const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
        const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 32));
        lo0[r] = _mm256_and_si256(w0, nibble);
        hi0[r] = _mm256_and_si256(_mm256_srli_epi16(w0, 4), nibble);
        lo1[r] = _mm256_and_si256(w1, nibble);
        hi1[r] = _mm256_and_si256(_mm256_srli_epi16(w1, 4), nibble);
      }
#pragma GCC unroll 16
      for (int j = 0; j < NB; ++j) {
        const XChunk& x = xc[j][k];
        const auto* xlo = reinterpret_cast<const __m256i*>(x.lo);
        const auto* xhi = reinterpret_cast<const __m256i*>(x.hi);
        const auto* xb = reinterpret_cast<const __m256i*>(x.bias);
        const __m256i bias = _mm256_add_epi32(_mm256_load_si256(xb), _mm256_load_si256(xb + 1));
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
          const __m256i p0 = _mm256_add_epi16(_mm256_maddubs_epi16(lo0[r], _mm256_load_si256(xlo)),
                                              _mm256_maddubs_epi16(hi0[r], _mm256_load_si256(xhi)));
          const __m256i p1 =
              _mm256_add_epi16(_mm256_maddubs_epi16(lo1[r], _mm256_load_si256(xlo + 1)),
                               _mm256_maddubs_epi16(hi1[r], _mm256_load_si256(xhi + 1)));
          const __m256i dot =
              _mm256_add_epi32(_mm256_madd_epi16(_mm256_add_epi16(p0, p1), ones16), bias);
          acc[r][j] =
              _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot),
                              _mm256_set1_ps(scratch[(r * NB + j) * stride + k]), acc[r][j]);
        }
      }
    }
  }
  for (int k = G == 128 ? full : 0; k < chunk_count; ++k) {
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      __m256i lo[R], hi[R];
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const uint8_t* src = k < full ? codes + r * row_bytes + 64 * k : tail[r];
        if (h == 0) __builtin_prefetch(codes + R * row_bytes + (k * R + r) * 64, 0, 2);
        const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 32 * h));
        lo[r] = _mm256_and_si256(w, nibble);
        hi[r] = _mm256_and_si256(_mm256_srli_epi16(w, 4), nibble);
      }
#pragma GCC unroll 16
      for (int j = 0; j < NB; ++j) {
        const XChunk& x = xc[j][k];
        const __m256i xlo = _mm256_load_si256(reinterpret_cast<const __m256i*>(x.lo + 32 * h));
        const __m256i xhi = _mm256_load_si256(reinterpret_cast<const __m256i*>(x.hi + 32 * h));
        const __m256i bias = _mm256_load_si256(reinterpret_cast<const __m256i*>(x.bias + 8 * h));
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
          const __m256i pairs =
              _mm256_add_epi16(_mm256_maddubs_epi16(lo[r], xlo), _mm256_maddubs_epi16(hi[r], xhi));
          const __m256i dot = _mm256_add_epi32(_mm256_madd_epi16(pairs, ones16), bias);
          acc[r][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot),
                                      GroupScaleLanes256<G>(scratch + (r * NB + j) * stride, k, h),
                                      acc[r][j]);
        }
      }
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int j = 0; j < NB; ++j) {
      const __m128 four =
          _mm_add_ps(_mm256_castps256_ps128(acc[r][j]), _mm256_extractf128_ps(acc[r][j], 1));
      const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
      sums[r * NB + j] = _mm_cvtss_f32(_mm_add_ss(two, _mm_movehdup_ps(two)));
    }
  }
}

#else  // HWY_TARGET != HWY_AVX3_DL, HWY_AVX2

template <int NB>
constexpr int Int4RowsPerPass() {
  return 1;
}

// SetBiases: the portable Int4Rows subtracts the zero point from the codes instead.
void SetBiases(XChunk* /*chunks*/, int /*count*/) {}

// CombinedStride: the portable Int4Rows needs no scratch.
constexpr size_t CombinedStride(int /*groups*/) { return 0; }

// Int4Rows (portable, one row): per group, codes become int16 (code - 8) and x int16, and
// ReorderWidenMulAccumulate sums their products into int32 lanes exactly; each group's int32
// lanes are converted to FP32 once and FMA'd with (group scale * s_b).
template <int G, int NB, int R>
void Int4Rows(const uint8_t* HWY_RESTRICT codes, const uint16_t* HWY_RESTRICT gs, int cols,
              const XChunk* const* xc, const float* const* group_scale, bool /*prefetch_l2*/,
              float* HWY_RESTRICT sums, float* /*scratch*/) {
  static_assert(R == 1, "Int4RowsPerPass is 1 here");
  constexpr int kGroupsPerChunk = 128 / G;
  // At most half a group per vector, so one vector never mixes two groups or two nibble runs.
  const hn::CappedTag<int16_t, G / 2> d16;
  const hn::Rebind<uint8_t, decltype(d16)> du8;
  const hn::Rebind<int8_t, decltype(d16)> di8;
  const hn::Repartition<int32_t, decltype(d16)> d32;
  const hn::Repartition<float, decltype(d16)> df32;
  using V32 = hn::Vec<decltype(d32)>;
  using VF32 = hn::Vec<decltype(df32)>;
  constexpr int kStep = static_cast<int>(hn::MaxLanes(d16));
  const auto low_mask = hn::Set(d16, 0x0F);
  const auto zero_point = hn::Set(d16, static_cast<int16_t>(kInt4ZeroPoint));
  VF32 acc[NB];
#pragma GCC unroll 16
  for (int j = 0; j < NB; ++j) acc[j] = hn::Zero(df32);
  for (int g = 0; g < cols / G; ++g) {
    const uint8_t* wg = codes + static_cast<size_t>(g) * (G / 2);
    const int k = g / kGroupsPerChunk;
    const int offset = (g % kGroupsPerChunk) * (G / 2);
    V32 dot[NB], dot1[NB];
#pragma GCC unroll 16
    for (int j = 0; j < NB; ++j) dot[j] = dot1[j] = hn::Zero(d32);
    for (int o = 0; o < G / 2; o += kStep) {
      const auto w = hn::PromoteTo(d16, hn::LoadU(du8, wg + o));
      const auto lo = hn::Sub(hn::And(w, low_mask), zero_point);
      const auto hi = hn::Sub(hn::ShiftRight<4>(w), zero_point);
#pragma GCC unroll 16
      for (int j = 0; j < NB; ++j) {
        const XChunk& x = xc[j][k];
        const auto xl = hn::PromoteTo(d16, hn::LoadU(di8, x.lo + offset + o));
        const auto xh = hn::PromoteTo(d16, hn::LoadU(di8, x.hi + offset + o));
        dot[j] = hn::ReorderWidenMulAccumulate(d32, lo, xl, dot[j], dot1[j]);
        dot[j] = hn::ReorderWidenMulAccumulate(d32, hi, xh, dot[j], dot1[j]);
      }
    }
    const float ws = Fp16ToFloat(gs[g]);
#pragma GCC unroll 16
    for (int j = 0; j < NB; ++j) {
      const VF32 scale = hn::Set(df32, ws * group_scale[j][g]);
      const V32 total = hn::RearrangeToOddPlusEven(dot[j], dot1[j]);
      acc[j] = hn::MulAdd(hn::ConvertTo(df32, total), scale, acc[j]);
    }
  }
#pragma GCC unroll 16
  for (int j = 0; j < NB; ++j) sums[j] = hn::GetLane(hn::SumOfLanes(df32, acc[j]));
}

#endif  // HWY_TARGET == HWY_AVX3_DL / HWY_AVX2

// QuantizeColumn quantises one column of x (cols elements, group g) into `chunks` and
// `group_scale` (see XChunk and the file comment).
template <int G>
void QuantizeColumn(const float* HWY_RESTRICT x, int cols, XChunk* HWY_RESTRICT chunks,
                    float* HWY_RESTRICT group_scale) {
  static_assert(G / 2 >= static_cast<int>(kLanes), "a vector must not straddle a half-group");
  constexpr int kGroupsPerChunk = 128 / G;
  const DF df;
  const hn::Rebind<int8_t, DF> d8;
  const int chunk_count = (cols + 127) / 128;
  // The last chunk may be partial (cols % 128 != 0): its unused lanes must add exactly 0.
  std::memset(&chunks[chunk_count - 1], 0, sizeof(XChunk));
  for (int g = 0; g < cols / G; ++g) {
    const float* xg = x + static_cast<size_t>(g) * G;
    VF m = hn::Zero(df);
    VF finite = hn::Zero(df);  // stays 0 unless some v - v is NaN (v = +-inf or NaN)
    for (int i = 0; i < G; i += kLanes) {
      const VF v = hn::LoadU(df, xg + i);
      m = hn::Max(m, hn::Abs(v));
      finite = hn::Add(finite, hn::Sub(v, v));
    }
    const float amax = hn::GetLane(hn::MaxOfLanes(df, m));
    float s = amax / 127.0f;
    if (hn::GetLane(hn::SumOfLanes(df, finite)) != 0.0f) {
      s = std::numeric_limits<float>::quiet_NaN();  // inf or NaN in x: NaN out, not garbage
    } else if (amax < kXFlushBelow) {
      s = 0.0f;
    }
    group_scale[g] = s;
    const float inv = s > 0.0f ? 1.0f / s : 0.0f;
    XChunk& chunk = chunks[g / kGroupsPerChunk];
    const int offset = (g % kGroupsPerChunk) * (G / 2);
    for (int i = 0; i < G; i += kLanes) {
      int8_t* dst = (i < G / 2 ? chunk.lo : chunk.hi) + offset + i % (G / 2);
      if (s > 0.0f) {
        const auto q = hn::NearestInt(hn::Mul(hn::LoadU(df, xg + i), hn::Set(df, inv)));
        hn::StoreU(hn::DemoteTo(d8, q), d8, dst);
      } else {
        hn::StoreU(hn::Zero(d8), d8, dst);
      }
    }
  }
  SetBiases(chunks, chunk_count);
}

// From this batch on, x is quantised once per call, its columns split over the threads, into a
// buffer they all read; below it every thread quantises all of x into its own scratch (see the
// file comment: at batch 1 that beats moving the lines between cores). Measured at 768 x 768,
// batch 16, 2 threads: the duplicated quantisation was a quarter of the call.
inline constexpr int kSharedQuantizeBatch = 4;

template <int G>
void Int4MatMul(const WeightView& w, const float* x, int batch, float* y, ThreadPool* pool) {
  const int cols = w.cols;
  const int64_t rows = w.rows;
  const int chunk_count = (cols + 127) / 128;
  const int group_count = cols / G;
  const uint8_t* codes = static_cast<const uint8_t*>(w.data);
  // The caller's scratch for a shared quantisation (each caller thread has its own). Used through
  // a reference: inside the lambdas below the name would mean the executing thread's instance.
  thread_local Scratch caller_scratch;
  Scratch& shared = caller_scratch;
  const bool share = pool != nullptr && pool->size() > 1 && batch >= kSharedQuantizeBatch;
  auto quantize = [&](Scratch& xq, int b0, int b1) {
    xq.chunks.resize(static_cast<size_t>(batch) * chunk_count);
    xq.group_scale.resize(static_cast<size_t>(batch) * group_count);
    for (int b = b0; b < b1; ++b) {
      QuantizeColumn<G>(x + static_cast<size_t>(b) * cols, cols,
                        xq.chunks.data() + static_cast<size_t>(b) * chunk_count,
                        xq.group_scale.data() + static_cast<size_t>(b) * group_count);
    }
  };
  if (share) {
    shared.chunks.resize(static_cast<size_t>(batch) * chunk_count);
    shared.group_scale.resize(static_cast<size_t>(batch) * group_count);
    pool->ParallelFor(batch, 1, [&](int64_t b0, int64_t b1) {
      quantize(shared, static_cast<int>(b0), static_cast<int>(b1));
    });
  }
  const uint64_t call = NextCall();
  RunRows(pool, w, [&](int64_t r0, int64_t r1) {
    thread_local Scratch own;
    thread_local std::vector<float> scratch;
    scratch.resize(16 * CombinedStride(group_count));
    if (!share && own.prepared_for != call) {
      quantize(own, 0, batch);
      own.prepared_for = call;
    }
    const Scratch& xq = share ? shared : own;
    const XChunk* chunks = xq.chunks.data();
    const float* group_scale = xq.group_scale.data();
    ForEachTile(r0, r1, batch, [&](int64_t rb, int64_t re, int j0, auto nb) {
      constexpr int kNb = decltype(nb)::value;
      const XChunk* xc[kNb];
      const float* gsc[kNb];
      for (int j = 0; j < kNb; ++j) {
        xc[j] = chunks + static_cast<size_t>(j0 + j) * chunk_count;
        gsc[j] = group_scale + static_cast<size_t>(j0 + j) * group_count;
      }
      constexpr int kR = Int4RowsPerPass<kNb>();
      // The AVX3_DL Int4Rows prefetches two row groups ahead (the other targets ignore this).
      const bool prefetch_l2 = PrefetchIntoL2(2 * static_cast<size_t>(kR) * (cols / 2));
      static_assert(kR * kNb <= 16, "scratch holds 16 (row, column) pairs");
      int64_t r = rb;
      auto rows_at = [&](auto rows_tag) {
        constexpr int kRows = decltype(rows_tag)::value;
        float sums[kRows * kNb];
        Int4Rows<G, kNb, kRows>(codes + r * (cols / 2), w.group_scales + r * group_count, cols, xc,
                                gsc, prefetch_l2, sums, scratch.data());
        for (int i = 0; i < kRows; ++i) {
          for (int j = 0; j < kNb; ++j) y[(j0 + j) * rows + r + i] = sums[i * kNb + j];
        }
      };
      for (; r + kR <= re; r += kR) rows_at(std::integral_constant<int, kR>());
      for (; r < re; ++r) rows_at(std::integral_constant<int, 1>());
    });
  });
}

}  // namespace

// UsesBf16Dot: FP8 and BF16 weights with MatMulActivations::kBf16 run on BF16 dot products
// (matmul_bf16dot.cc) where runtime dispatch picks AVX3_DL (so that ForceTarget steers it in tests)
// and the CPU has AVX-512 BF16 and VBMI.
bool UsesBf16Dot(WeightFormat format, MatMulActivations activations) {
#if HWY_TARGET == HWY_AVX3_DL
  return (format == WeightFormat::kFp8 || format == WeightFormat::kBf16) &&
         activations == MatMulActivations::kBf16 && internal::HasAvx512Bf16Vbmi();
#else
  (void)format, (void)activations;
  return false;
#endif
}

// KernelMatMul runs the kernel for `w`'s format and `activations` on one call's batch (at most
// the kernel's kMax...Batch).
void KernelMatMul(const WeightView& w, const float* x, int batch, float* y, ThreadPool* pool,
                  MatMulActivations activations) {
  if (UsesBf16Dot(w.format, activations)) {
    return matmul_internal::MatMulBf16Dot(w, x, batch, y, pool, NextCall());
  }
  switch (w.format) {
    case WeightFormat::kFp32:
      return FpMatMul<Fp32Weights>(w, x, batch, y, pool);
    case WeightFormat::kBf16:
      return FpMatMul<Bf16Weights>(w, x, batch, y, pool);
    case WeightFormat::kFp8:
      return FpMatMul<Fp8Weights>(w, x, batch, y, pool);
    case WeightFormat::kInt4:
      switch (w.group) {
        case 32:
          return Int4MatMul<32>(w, x, batch, y, pool);
        case 64:
          return Int4MatMul<64>(w, x, batch, y, pool);
        default:
          return Int4MatMul<128>(w, x, batch, y, pool);
      }
  }
}

// MatMulImpl cuts the batch into calls of balanced sizes the kernel takes (130 columns on a
// 64-column kernel: 44 + 43 + 43, not 64 + 64 + 2: the kernels' rate per column falls steeply
// at the smallest batches). The split never changes a column's outputs (matmul.h).
void MatMulImpl(const WeightView& w, const float* x, int batch, float* y, ThreadPool* pool,
                MatMulActivations activations) {
  const int most = UsesBf16Dot(w.format, activations) ? matmul_internal::kMaxBf16DotBatch
                                                      : matmul_internal::kMaxKernelBatch;
  const int calls = (batch + most - 1) / most;
  for (int k = 0, b = 0; k < calls; ++k) {
    const int n = batch / calls + (k < batch % calls ? 1 : 0);
    KernelMatMul(w, x + static_cast<size_t>(b) * w.cols, n, y + static_cast<size_t>(b) * w.rows,
                 pool, activations);
    b += n;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace kvguard::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvguard::kernels {
namespace matmul_internal {

bool PrefetchIntoL2(size_t lead_bytes) { return lead_bytes > internal::L1DataCacheBytes() / 2; }

uint64_t NextCall() {
  static std::atomic<uint64_t> calls{0};
  return calls.fetch_add(1, std::memory_order_relaxed) + 1;
}

}  // namespace matmul_internal

HWY_EXPORT(MatMulImpl);
HWY_EXPORT(UsesBf16Dot);

const char* MatMulArithmeticName(MatMulArithmetic arithmetic) {
  switch (arithmetic) {
    case MatMulArithmetic::kFp32:
      return "fp32";
    case MatMulArithmetic::kBf16Products:
      return "bf16-products";
    case MatMulArithmetic::kInt8Activations:
      return "int8-activations";
  }
  return "?";
}

MatMulArithmetic MatMulArithmeticFor(WeightFormat format, MatMulActivations activations) {
  if (format == WeightFormat::kInt4) return MatMulArithmetic::kInt8Activations;
  return HWY_DYNAMIC_DISPATCH(UsesBf16Dot)(format, activations) ? MatMulArithmetic::kBf16Products
                                                                : MatMulArithmetic::kFp32;
}

void MatMul(const WeightView& w, const float* x, int batch, float* y, ThreadPool* pool,
            MatMulActivations activations) {
  ABSL_RAW_CHECK(w.rows > 0 && w.cols > 0 && w.data != nullptr, "MatMul: empty weights");
  ABSL_RAW_CHECK(x != nullptr && y != nullptr, "MatMul: null x or y");
  ABSL_RAW_CHECK(batch >= 1, "MatMul: batch must be at least 1");
  ABSL_RAW_CHECK(w.format != WeightFormat::kFp8 || w.row_scales != nullptr,
                 "MatMul: FP8 needs row scales");
  ABSL_RAW_CHECK(
      w.format != WeightFormat::kInt4 ||
          (IsValidInt4Group(w.group) && w.cols % w.group == 0 && w.group_scales != nullptr),
      "MatMul: INT4 needs group 32/64/128 dividing cols, and group scales");
  ABSL_RAW_CHECK(
      w.format != WeightFormat::kInt4 || w.cols / w.group <= matmul_internal::kMaxInt4Groups,
      "MatMul: INT4 rows hold at most 1024 groups");
  HWY_DYNAMIC_DISPATCH(MatMulImpl)(w, x, batch, y, pool, activations);
}

}  // namespace kvguard::kernels
#endif  // HWY_ONCE
