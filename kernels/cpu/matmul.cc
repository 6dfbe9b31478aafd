// kernels/cpu/matmul.cc: y = W x for FP32 / BF16 / FP8 / INT4 weights (Highway, runtime dispatch).
//
// Decode is bound by memory bandwidth, so every format is written to keep up with DRAM on one or
// two cores: W is read once per call (batch > 1 reuses each block of W rows, from L1/L2, for every
// column of x, a tile of columns per pass: kBatchTile, INT4 kInt4TileColumns), decoding a weight
// costs a few integer ops, and at small batches several rows share each load of x (x loads, not
// W's, would otherwise fill the load ports). The per-call preprocessing of x (FP8: scaling; INT4:
// quantisation) is done by every thread into its own scratch, not once and shared: scratch written
// on one core and read on another moves every line between cores on every call, which cost more
// (measured: ~10 us per call at 2 threads) than preparing 4096 elements twice (~1 us).
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
// so that sum_c (code_c - 8) * q_c is an exact int32 per group and row, converted to FP32 once per
// group and FMA'd with (group scale * s_b). The weights keep 16 rows in the lanes (formats.h): the
// AVX3_DL target runs VPDPBUSD (u8 codes 0..15 x s8 q, 4 bytes of q broadcast) on raw 64-byte
// loads of codes, AVX2 VPMADDUBSW + VPMADDWD on 32-byte halves, other targets int32 lanes; the
// zero point is removed exactly, in int32, by starting each group's sums from -8 * (sum of its q).
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
// (16 rows of 4096 FP32 weights = 256 KiB: stays in L2 between tiles). INT4 needs it equal to
// kInt4BlockRows (formats.h: a thread's rows start on a block; static_assert in Int4MatMul).
inline constexpr int64_t kRowBlock = 16;
// Columns of x that share one pass over a row block of W.
inline constexpr int kBatchTile = 4;
// Below this max |x|, an INT4 activation block is taken as zero.
inline constexpr float kXFlushBelow = 0x1p-100f;
// The most columns one call of the FP32 and INT4 kernels takes (their per-call scratch, e.g.
// the INT4 kernel's quantised x, is sized for the decode batches they serve).
inline constexpr int kMaxKernelBatch = 64;

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
  std::vector<int8_t> q;           // INT4: [batch, cols] x quantised per group
  std::vector<float> group_scale;  // INT4: [batch, cols / group] s_b (0 for a zero block)
  std::vector<int32_t> bias;       // INT4: [batch, cols / group] -8 * the group's sum of q
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
using matmul_internal::kRowBlock;
using matmul_internal::kXFlushBelow;
using matmul_internal::NextCall;
using matmul_internal::PrefetchIntoL2;
using matmul_internal::Scratch;

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
  // into L1 (prefetcht0) unless prefetch_l2 (PrefetchIntoL2 of that lead; so do the INT4
  // kernels, Int4Blocks, the AVX2 one included, whose row-major predecessor always used L2: not
  // measured, there being no AVX2-only host here). Into L1 on Zen 5 (48 KiB L1D, leads up to 16
  // KiB) measured faster than into L2 in 17 of 24 interleaved pairs (BM_MatMul, INT4 and FP8 at
  // 4096x4096 and medium's shapes, 2 threads, 3 rounds; INT4 medians 2048x2048 36.2 -> 37.9 GB/s,
  // 4096x4096 38.4 -> 42.2, 5632x2048 37.5 -> 40.6; FP8 within a few percent), and `medium` INT4
  // decode went 70.3 -> 82.8 tok/s in one pair of kvguard bench runs; on Zen 4 (32 KiB L1D) a 22
  // KiB lead into L1 was the slowest case (PrefetchIntoL2).
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

// Int4Column is one column of x as the INT4 kernels read it: quantised to int8 per weight group
// (q, cols values), each group's s_b (scale) and -8 * (sum of its q) (bias: the zero point,
// removed exactly in int32 by starting the group's sums there).
struct Int4Column {
  const int8_t* q;
  const float* scale;
  const int32_t* bias;
};

// Int4Prefetch says whether an Int4Blocks call prefetches (the first column tile of a pass does),
// how far ahead of what it reads, and into which cache (PrefetchIntoL2 of that lead).
struct Int4Prefetch {
  bool on;
  bool into_l2;
  size_t lead;
};

// PrefetchAhead prefetches `bytes` bytes starting `lead` bytes after p, every line they touch.
// Addresses as integers: past the matrix's last block the range lies beyond the array (a prefetch
// there is harmless; forming such a pointer would not be).
[[maybe_unused]] HWY_INLINE void PrefetchAhead(const void* p, size_t lead, size_t bytes,
                                               bool into_l2) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p) + lead;
  for (uintptr_t line = begin & ~uintptr_t{63}; line < begin + bytes; line += 64) {
    PrefetchLine(reinterpret_cast<const void*>(line), into_l2);
  }
}

// The INT4 kernels below all compute, for R blocks of 16 rows (formats.h) and NB columns,
//   out[(j * R + b) * 16 + i] = sum over groups g, in order, of
//       fma(float(int32 sum_{c in g} (code - 8) q_j[c]), fl(ws[b, i, g] * s_j[g]), .)
// The int32 sum is exact, so within a target a row's output depends on nothing but its row and
// its column: not on R, NB, how the int32 sums are split, or the other rows and columns of the
// call (the batch invariance the engine relies on). Each target's R and NB per tile come from
// Int4BlocksPerPass and kInt4TileColumns.

#if HWY_TARGET == HWY_AVX3_DL
// Highway 1.0.3 compiles AVX3_DL with "avxvnni" (the VEX form) instead of "avx512vnni"; its
// runtime check does test AVX512-VNNI, so enabling it here for the EVEX VPDPBUSD is safe.
// The target's whole feature string is repeated: clang lets a function's own target
// attribute replace the one HWY_BEFORE_NAMESPACE applies (gcc adds them up).
#define KVGUARD_AVX512VNNI __attribute__((target(HWY_TARGET_STR ",avx512vnni")))

// Columns per tile, and blocks of 16 rows per pass at NB columns: every tile keeps R x NB x
// Int4Chains int32 sums, R x NB FP32 sums and 2R unpacked code vectors in the 32 registers.
inline constexpr int kInt4TileColumns = 4;
template <int NB>
constexpr int Int4BlocksPerPass() {
  return NB == 1 ? 1 : 2;
}
// Int4Chains: int32 sums per (block, column), so that at least 4 VPDPBUSD chains hide the
// instruction's latency (tiles alternate between pairs of chains; the int32 sums are exact, so
// how they are split does not change the result).
template <int R, int NB>
constexpr int Int4Chains() {
  return R * NB >= 8 ? 1 : R * NB >= 2 ? 2 : 4;
}

// Int4Blocks: see above. codes and gs: the first block's codes and scales.
template <int G, int NB, int R>
KVGUARD_AVX512VNNI void Int4Blocks(const uint8_t* HWY_RESTRICT codes,
                                   const uint16_t* HWY_RESTRICT gs, int cols, const Int4Column* x,
                                   const Int4Prefetch& prefetch, float* HWY_RESTRICT out) {
  constexpr int kChains = Int4Chains<R, NB>();
  const int groups = cols / G;
  const size_t block_bytes = static_cast<size_t>(cols) * (kInt4BlockRows / 2);
  const size_t block_scales = static_cast<size_t>(groups) * kInt4BlockRows;
  if (prefetch.on) PrefetchAhead(gs, R * block_scales * 2, R * block_scales * 2, prefetch.into_l2);
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  __m512 acc[R][NB];
#pragma GCC unroll 16
  for (int b = 0; b < R; ++b) {
#pragma GCC unroll 16
    for (int j = 0; j < NB; ++j) acc[b][j] = _mm512_setzero_ps();
  }
  for (int g = 0; g < groups; ++g) {
    __m512i sum[R][NB][kChains];
#pragma GCC unroll 16
    for (int j = 0; j < NB; ++j) {
      const __m512i bias = _mm512_set1_epi32(x[j].bias[g]);
#pragma GCC unroll 16
      for (int b = 0; b < R; ++b) {
        sum[b][j][0] = bias;
#pragma GCC unroll 4
        for (int c = 1; c < kChains; ++c) sum[b][j][c] = _mm512_setzero_si512();
      }
    }
    const uint8_t* group_codes = codes + static_cast<size_t>(g) * (G / 8) * 64;
#pragma GCC unroll 4
    for (int t = 0; t < G / 8; ++t) {
      __m512i lo[R], hi[R];
#pragma GCC unroll 16
      for (int b = 0; b < R; ++b) {
        const uint8_t* tile = group_codes + b * block_bytes + t * 64;
        if (prefetch.on) PrefetchAhead(tile, prefetch.lead, 1, prefetch.into_l2);
        const __m512i w = _mm512_loadu_si512(tile);
        lo[b] = _mm512_and_si512(w, nibble);
        hi[b] = _mm512_and_si512(_mm512_srli_epi16(w, 4), nibble);
      }
#pragma GCC unroll 16
      for (int j = 0; j < NB; ++j) {
        int32_t four_lo, four_hi;  // columns 8t .. 8t + 3 and 8t + 4 .. 8t + 7 of the group
        std::memcpy(&four_lo, x[j].q + g * G + t * 8, 4);
        std::memcpy(&four_hi, x[j].q + g * G + t * 8 + 4, 4);
        const __m512i xlo = _mm512_set1_epi32(four_lo), xhi = _mm512_set1_epi32(four_hi);
#pragma GCC unroll 16
        for (int b = 0; b < R; ++b) {
          const int c_lo = (2 * t) % kChains, c_hi = (2 * t + 1) % kChains;
          sum[b][j][c_lo] = _mm512_dpbusd_epi32(sum[b][j][c_lo], lo[b], xlo);
          sum[b][j][c_hi] = _mm512_dpbusd_epi32(sum[b][j][c_hi], hi[b], xhi);
        }
      }
    }
#pragma GCC unroll 16
    for (int b = 0; b < R; ++b) {
      const __m512 ws = _mm512_cvtph_ps(_mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(gs + b * block_scales + g * kInt4BlockRows)));
#pragma GCC unroll 16
      for (int j = 0; j < NB; ++j) {
        __m512i total = sum[b][j][0];
#pragma GCC unroll 4
        for (int c = 1; c < kChains; ++c) total = _mm512_add_epi32(total, sum[b][j][c]);
        acc[b][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total),
                                    _mm512_mul_ps(ws, _mm512_set1_ps(x[j].scale[g])), acc[b][j]);
      }
    }
  }
#pragma GCC unroll 16
  for (int j = 0; j < NB; ++j) {
#pragma GCC unroll 16
    for (int b = 0; b < R; ++b) _mm512_storeu_ps(out + (j * R + b) * kInt4BlockRows, acc[b][j]);
  }
}
#undef KVGUARD_AVX512VNNI

#elif HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3
// AVX2, and AVX3 (AVX-512 without the VNNI and VBMI that AVX3_DL needs: Skylake-SP, Cascade
// Lake), whose target includes AVX2: VPMADDUBSW multiplies the u8 codes 0..15 by the s8 q and adds
// adjacent pairs into int16 (at most 2 * 15 * 127 = 3810; low and high nibbles together 7620: no
// saturation), VPMADDWD by ones adds adjacent int16 pairs into int32. Int32 lane i of a 32-byte
// half-tile then holds the 8 products of row i (or 8 + i) with the tile's 8 columns, the lanes
// VPDPBUSD fills. With 16 registers: one block (two halves) and up to 2 columns per tile.
inline constexpr int kInt4TileColumns = 2;
template <int NB>
constexpr int Int4BlocksPerPass() {
  return 1;
}

template <int G, int NB, int R>
void Int4Blocks(const uint8_t* HWY_RESTRICT codes, const uint16_t* HWY_RESTRICT gs, int cols,
                const Int4Column* x, const Int4Prefetch& prefetch, float* HWY_RESTRICT out) {
  static_assert(R == 1, "Int4BlocksPerPass is 1 here");
  const int groups = cols / G;
  const size_t block_bytes = static_cast<size_t>(cols) * (kInt4BlockRows / 2);
  const size_t block_scales = static_cast<size_t>(groups) * kInt4BlockRows;
  if (prefetch.on) PrefetchAhead(gs, block_scales * 2, block_scales * 2, prefetch.into_l2);
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[NB][2];
#pragma GCC unroll 16
  for (int j = 0; j < NB; ++j) acc[j][0] = acc[j][1] = _mm256_setzero_ps();
  for (int g = 0; g < groups; ++g) {
    __m256i sum[NB][2];
#pragma GCC unroll 16
    for (int j = 0; j < NB; ++j) sum[j][0] = sum[j][1] = _mm256_set1_epi32(x[j].bias[g]);
    const uint8_t* group_codes = codes + static_cast<size_t>(g) * (G / 8) * 64;
#pragma GCC unroll 4
    for (int t = 0; t < G / 8; ++t) {
      const uint8_t* tile = group_codes + t * 64;
      if (prefetch.on) PrefetchAhead(tile, prefetch.lead, 1, prefetch.into_l2);
      __m256i lo[2], hi[2];
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + 32 * h));
        lo[h] = _mm256_and_si256(w, nibble);
        hi[h] = _mm256_and_si256(_mm256_srli_epi16(w, 4), nibble);
      }
#pragma GCC unroll 16
      for (int j = 0; j < NB; ++j) {
        int32_t four_lo, four_hi;
        std::memcpy(&four_lo, x[j].q + g * G + t * 8, 4);
        std::memcpy(&four_hi, x[j].q + g * G + t * 8 + 4, 4);
        const __m256i xlo = _mm256_set1_epi32(four_lo), xhi = _mm256_set1_epi32(four_hi);
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
          const __m256i pairs =
              _mm256_add_epi16(_mm256_maddubs_epi16(lo[h], xlo), _mm256_maddubs_epi16(hi[h], xhi));
          sum[j][h] = _mm256_add_epi32(sum[j][h], _mm256_madd_epi16(pairs, ones));
        }
      }
    }
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m256 ws = _mm256_cvtph_ps(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(gs + g * kInt4BlockRows + 8 * h)));
#pragma GCC unroll 16
      for (int j = 0; j < NB; ++j) {
        acc[j][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[j][h]),
                                    _mm256_mul_ps(ws, _mm256_set1_ps(x[j].scale[g])), acc[j][h]);
      }
    }
  }
#pragma GCC unroll 16
  for (int j = 0; j < NB; ++j) {
    _mm256_storeu_ps(out + j * kInt4BlockRows, acc[j][0]);
    _mm256_storeu_ps(out + j * kInt4BlockRows + 8, acc[j][1]);
  }
}

#else  // HWY_TARGET != HWY_AVX3_DL, HWY_AVX3, HWY_AVX2
// Portable (SCALAR, EMU128): int32 lanes are rows, as above. Each lane loads its row's 4 bytes of a
// tile as one int32; shifts and masks take out the 8 codes, each multiplied by its q broadcast.
inline constexpr int kInt4TileColumns = 1;
template <int NB>
constexpr int Int4BlocksPerPass() {
  return 1;
}

template <int G, int NB, int R>
void Int4Blocks(const uint8_t* HWY_RESTRICT codes, const uint16_t* HWY_RESTRICT gs, int cols,
                const Int4Column* x, const Int4Prefetch& /*prefetch*/, float* HWY_RESTRICT out) {
  static_assert(R == 1 && NB == 1, "one block and one column here");
  const hn::CappedTag<int32_t, kInt4BlockRows> d32;
  const hn::Rebind<float, decltype(d32)> df32;
  constexpr int kStep = static_cast<int>(hn::MaxLanes(d32));
  static_assert(kInt4BlockRows % kStep == 0);
  using V32 = hn::Vec<decltype(d32)>;
  using VF32 = hn::Vec<decltype(df32)>;
  const V32 nibble = hn::Set(d32, 0x0F), zero_point = hn::Set(d32, kInt4ZeroPoint);
  const int groups = cols / G;
  for (int i0 = 0; i0 < kInt4BlockRows; i0 += kStep) {
    VF32 acc = hn::Zero(df32);
    for (int g = 0; g < groups; ++g) {
      V32 sum = hn::Zero(d32);
      for (int t = 0; t < G / 8; ++t) {
        const uint8_t* rows_i0 = codes + (static_cast<size_t>(g) * (G / 8) + t) * 64 + 4 * i0;
        const V32 w = hn::LoadU(d32, reinterpret_cast<const int32_t*>(rows_i0));
        const int8_t* q = x[0].q + g * G + t * 8;
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) {
          const V32 lo = hn::Sub(hn::And(hn::ShiftRightSame(w, 8 * k), nibble), zero_point);
          const V32 hi = hn::Sub(hn::And(hn::ShiftRightSame(w, 8 * k + 4), nibble), zero_point);
          sum = hn::Add(sum, hn::Mul(lo, hn::Set(d32, q[k])));
          sum = hn::Add(sum, hn::Mul(hi, hn::Set(d32, q[4 + k])));
        }
      }
      alignas(64) float ws[kInt4BlockRows];
      for (int i = 0; i < kStep; ++i) ws[i] = Fp16ToFloat(gs[g * kInt4BlockRows + i0 + i]);
      const VF32 scale = hn::Mul(hn::Load(df32, ws), hn::Set(df32, x[0].scale[g]));
      acc = hn::MulAdd(hn::ConvertTo(df32, sum), scale, acc);
    }
    hn::StoreU(acc, df32, out + i0);
  }
}

#endif  // HWY_TARGET == HWY_AVX3_DL / HWY_AVX2, HWY_AVX3

// QuantizeColumn quantises one column of x (cols elements, group G) into q (cols int8), the
// groups' scales s_b and their biases (see Int4Column and the file comment).
template <int G>
void QuantizeColumn(const float* HWY_RESTRICT x, int cols, int8_t* HWY_RESTRICT q,
                    float* HWY_RESTRICT group_scale, int32_t* HWY_RESTRICT bias) {
  const DF df;
  const hn::Rebind<int8_t, DF> d8;
  const hn::Rebind<int32_t, DF> d32;
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
    if (!(s > 0.0f)) {  // zero, or NaN: q = 0 (a NaN scale makes the outputs NaN)
      std::memset(q + g * G, 0, G);
      bias[g] = 0;
      continue;
    }
    const VF inv = hn::Set(df, 1.0f / s);
    auto total = hn::Zero(d32);
    for (int i = 0; i < G; i += kLanes) {
      const auto qv = hn::NearestInt(hn::Mul(hn::LoadU(df, xg + i), inv));  // |qv| <= 127
      total = hn::Add(total, qv);
      hn::StoreU(hn::DemoteTo(d8, qv), d8, q + g * G + i);
    }
    bias[g] = -kInt4ZeroPoint * hn::GetLane(hn::SumOfLanes(d32, total));
  }
}

// From this batch on, x is quantised once per call, its columns split over the threads, into a
// buffer they all read; below it every thread quantises all of x into its own scratch (see the
// file comment: at batch 1 that beats moving the lines between cores). Measured at 768 x 768,
// batch 16, 2 threads: the duplicated quantisation was a quarter of the call.
inline constexpr int kSharedQuantizeBatch = 4;

// Rows per pass over W: each pass's blocks are read from DRAM once and then served from cache to
// every column tile of the batch.
inline constexpr int64_t kInt4PassRows = 4 * kInt4BlockRows;

// ForEachInt4Tile calls tile(j0, nb) over the batch cut into tiles of at most kInt4TileColumns,
// balanced as ForEachTile's (nb: a std::integral_constant with the tile's width).
template <class Tile>
HWY_INLINE void ForEachInt4Tile(int batch, const Tile& tile) {
  static_assert(kInt4TileColumns <= 4, "the switch below enumerates tiles of 1..4 columns");
  const int tiles = (batch + kInt4TileColumns - 1) / kInt4TileColumns;
  const int narrow = batch / tiles, wide = batch % tiles;  // `wide` tiles are narrow + 1
  for (int t = 0, j0 = 0; t < tiles; ++t) {
    const int width = narrow + (t < wide ? 1 : 0);
    if constexpr (kInt4TileColumns >= 4) {
      if (width == 4) tile(j0, std::integral_constant<int, 4>());
    }
    if constexpr (kInt4TileColumns >= 3) {
      if (width == 3) tile(j0, std::integral_constant<int, 3>());
    }
    if constexpr (kInt4TileColumns >= 2) {
      if (width == 2) tile(j0, std::integral_constant<int, 2>());
    }
    if (width == 1) tile(j0, std::integral_constant<int, 1>());
    j0 += width;
  }
}

template <int G>
void Int4MatMul(const WeightView& w, const float* x, int batch, float* y, ThreadPool* pool) {
  const int cols = w.cols;
  const int64_t rows = w.rows;
  const int group_count = cols / G;
  const uint8_t* codes = static_cast<const uint8_t*>(w.data);
  const size_t block_bytes = static_cast<size_t>(cols) * (kInt4BlockRows / 2);
  const size_t block_scales = static_cast<size_t>(group_count) * kInt4BlockRows;
  // The caller's scratch for a shared quantisation (each caller thread has its own). Used through
  // a reference: inside the lambdas below the name would mean the executing thread's instance.
  thread_local Scratch caller_scratch;
  Scratch& shared = caller_scratch;
  const bool share = pool != nullptr && pool->size() > 1 && batch >= kSharedQuantizeBatch;
  auto resize = [&](Scratch& xq) {
    xq.q.resize(static_cast<size_t>(batch) * cols);
    xq.group_scale.resize(static_cast<size_t>(batch) * group_count);
    xq.bias.resize(static_cast<size_t>(batch) * group_count);
  };
  auto quantize = [&](Scratch& xq, int b0, int b1) {
    for (int b = b0; b < b1; ++b) {
      QuantizeColumn<G>(x + static_cast<size_t>(b) * cols, cols,
                        xq.q.data() + static_cast<size_t>(b) * cols,
                        xq.group_scale.data() + static_cast<size_t>(b) * group_count,
                        xq.bias.data() + static_cast<size_t>(b) * group_count);
    }
  };
  if (share) {
    resize(shared);
    pool->ParallelFor(batch, 1, [&](int64_t b0, int64_t b1) {
      quantize(shared, static_cast<int>(b0), static_cast<int>(b1));
    });
  }
  const uint64_t call = NextCall();
  // Rows [r0, r1) start on a block (RunRows hands out whole kRowBlock = 16-row blocks).
  static_assert(kRowBlock == kInt4BlockRows);
  RunRows(pool, w, [&](int64_t r0, int64_t r1) {
    thread_local Scratch own;
    if (!share && own.prepared_for != call) {
      resize(own);
      quantize(own, 0, batch);
      own.prepared_for = call;
    }
    const Scratch& xq = share ? shared : own;
    for (int64_t pass = r0; pass < r1; pass += kInt4PassRows) {
      const int64_t pass_end = std::min(pass + kInt4PassRows, r1);
      ForEachInt4Tile(batch, [&](int j0, auto nb) {
        constexpr int kNb = decltype(nb)::value;
        Int4Column columns[kNb];
        for (int j = 0; j < kNb; ++j) {
          const size_t b = static_cast<size_t>(j0 + j);
          columns[j] = {xq.q.data() + b * cols, xq.group_scale.data() + b * group_count,
                        xq.bias.data() + b * group_count};
        }
        constexpr int kR = Int4BlocksPerPass<kNb>();
        int64_t r = pass;
        auto blocks_at = [&](auto blocks_tag) {
          constexpr int kBlocks = decltype(blocks_tag)::value;
          const int64_t block = r / kInt4BlockRows;
          // The first column tile of a pass prefetches. One block is one sequential stream that
          // runs on into the next block: it prefetches 4 * cols bytes (half a block) ahead, the
          // lead of the row-major kernel before it (two groups of 4 rows; see FpRows). Measured
          // on Zen 4, 2 threads, batch 1, `medium`'s shapes: a lead of the next 4 blocks (4
          // streams at once, 16 blocks ahead in bytes) ran up to 20% slower in fast minutes.
          // Several blocks at once prefetch the next call's blocks, at their pace.
          const size_t lead = kBlocks == 1 ? 4 * static_cast<size_t>(cols) : kBlocks * block_bytes;
          const Int4Prefetch prefetch{j0 == 0, PrefetchIntoL2(lead), lead};
          float out[kNb * kBlocks * kInt4BlockRows];
          Int4Blocks<G, kNb, kBlocks>(codes + block * block_bytes,
                                      w.group_scales + block * block_scales, cols, columns,
                                      prefetch, out);
          const int64_t n = std::min<int64_t>(kBlocks * kInt4BlockRows, pass_end - r);
          for (int j = 0; j < kNb; ++j) {
            std::memcpy(y + (j0 + j) * rows + r, out + j * kBlocks * kInt4BlockRows,
                        static_cast<size_t>(n) * sizeof(float));
          }
          r += kBlocks * kInt4BlockRows;
        };
        while (r + kR * kInt4BlockRows <= pass_end) blocks_at(std::integral_constant<int, kR>());
        while (r < pass_end) blocks_at(std::integral_constant<int, 1>());
      });
    }
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
  HWY_DYNAMIC_DISPATCH(MatMulImpl)(w, x, batch, y, pool, activations);
}

}  // namespace kvguard::kernels
#endif  // HWY_ONCE
