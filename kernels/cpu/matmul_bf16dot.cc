// kernels/cpu/matmul_bf16dot.cc: y = W x for FP8 and BF16 weights with BF16 dot products
// (VDPBF16PS), for batches of many columns: the prefill chunks and large decode batches.
//
// Why: at many columns the FP32 kernel (matmul.cc) is bound by its FMAs, not by memory: each
// weight is decoded once per row block and then multiplied by every column. VDPBF16PS does two
// multiply-adds per FP32 lane and per issue slot, on the same pipes, so the same work takes half
// the issue slots. Prefill is the published deployment's compute-bound phase, kept in FP8 for
// that reason; on a CPU that means it must run on the widest multiply-add it has.
//
// What changes numerically (MatMulArithmetic in matmul.h says which kernel runs):
//   * x is rounded to BF16 (round to nearest even, VCVTNE2PS2BF16): BF16 keeps 8 significant
//     bits, so a relative error of at most 2^-8 per element, and FP32's exponent range; denormal
//     x (below 2^-126) read as zero. This is how GPU prefill treats activations (BF16 or FP8).
//   * the weights are used exactly: every e4m3 value, subnormals included, is a BF16 number (3
//     mantissa bits, exponents 2^-9 .. 2^8), and BF16 weights are BF16. The e4m3 NaN code, which
//     the quantiser never writes, reads as 480, as in the FP32 kernel. The per-row FP8 scale
//     multiplies each FP32 output once.
//   * products and sums are FP32 (VDPBF16PS flushes denormal results, far below anything the
//     rounding of x leaves).
//   So |y - y_exact| <= 2^-8 sum_c |w_c x_c| + FP32 accumulation error.
//
// Layouts: VDPBF16PS sums, per FP32 lane, the products of two adjacent BF16 pairs. Two ways to
// lay one matmul out on it, which give the same results bit for bit (each output is the same
// chain of VDPBF16PS lane operations, pair 0 first, then one multiply by the row scale), so that
// a column's outputs never depend on the batch it came in:
//   * column lanes (16 or more columns): a lane is one column of x and holds the pair
//     (x[n][2p], x[n][2p+1]); x is packed so once per call (each thread its own copy, as
//     matmul.cc does for the same reason), in register tiles of up to 4 column vectors. A weight
//     pair (W[r][2p], W[r][2p+1]) is one 32-bit word of the row in its natural layout, broadcast
//     to every lane: the weights need no transposing, only (FP8) widening to BF16. The work is
//     blocked as a GEMM: per block of 48 rows, a chunk of 256 pairs is widened once into a
//     buffer that stays in cache while every register tile of up to 256 columns runs over it
//     (R rows x NV column vectors of accumulators, R x NV <= 24), and the block's FP32 sums
//     wait in a per-thread buffer between chunks (stored and reloaded exactly, so the chain of
//     operations per output is unchanged). At the end each 16 x 16 square of sums is scaled,
//     transposed and stored a column at a time. (Before the blocking, each call of up to 64
//     columns widened its rows again and stored each sum on its own: 15% and 12% of prefill on
//     `medium`; bench/results/prefill.md.)
//   * row lanes (fewer columns, where column lanes would leave most lanes empty): a lane is one
//     row of W; 48 rows at a time are widened and transposed (16 x 16 blocks of pairs) so that
//     a vector holds one pair of 16 rows, and each column's x pair is broadcast. 3 row vectors x
//     up to 8 columns of accumulators.
//
// FP8 -> BF16: two VPERMI2B table lookups (the high and the low byte of the BF16 encoding of
// each of the 128 magnitudes), the sign ORed in, and a byte interleave: exact, and at 64 codes
// per 8 instructions a few percent of the multiply-adds at the batches this kernel takes.
#include "kernels/cpu/internal/matmul_bf16dot.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/internal/avx512_bf16.h"

namespace kvguard::kernels::matmul_internal {
namespace {

// Fp8ToBf16Bits returns the BF16 encoding of e4m3 magnitude code `c` (0..127): exact for every
// value; 127, the NaN code, as 480 (see the file comment).
constexpr uint16_t Fp8ToBf16Bits(int c) {
  if (c == 0x7F) return 0x43F0;  // 480 = 1.875 * 2^8
  const int e = c >> 3, m = c & 7;
  if (e > 0) return static_cast<uint16_t>(((e + 120) << 7) | (m << 4));
  if (m == 0) return 0;
  // Subnormal m * 2^-9: normalise m (1..7) to 1.f * 2^k.
  int k = 0, mm = m;
  while (mm < 8) mm <<= 1, --k;  // mm = m * 2^-k in [8, 16)
  // value = (mm / 8) * 2^(k - 6): BF16 exponent k - 6 + 127, mantissa (mm - 8) in the top 3 bits.
  return static_cast<uint16_t>(((k - 6 + 127) << 7) | ((mm - 8) << 4));
}

struct Fp8Tables {
  std::array<uint8_t, 128> hi{}, lo{};
};
constexpr Fp8Tables MakeFp8Tables() {
  Fp8Tables t;
  for (int c = 0; c < 128; ++c) {
    t.hi[static_cast<size_t>(c)] = static_cast<uint8_t>(Fp8ToBf16Bits(c) >> 8);
    t.lo[static_cast<size_t>(c)] = static_cast<uint8_t>(Fp8ToBf16Bits(c) & 0xFF);
  }
  return t;
}
alignas(64) constexpr Fp8Tables kFp8Tables = MakeFp8Tables();

}  // namespace

uint16_t Fp8CodeToBf16(uint8_t code) {
  return static_cast<uint16_t>(Fp8ToBf16Bits(code & 0x7F) | ((code & 0x80u) << 8));
}

#if KVGUARD_AVX512_BF16
KVG_AVX512_BF16_BEGIN
namespace {

constexpr int kLanes = 16;  // columns of x per vector
// Rows per ParallelFor grain and per block of W that a call widens once (kBlockRows): a
// multiple of every RowsPerPass and of the row-lane layout's 48, so a thread's share splits
// into whole blocks and passes.
constexpr int kBlockRows = 48;
constexpr int64_t kRowGrain = kBlockRows;
// Column lanes: column vectors per register tile (the most NV), weight pairs per pass over a
// block (the block's widened chunk, 48 x 256 pairs = 48 KiB, and a tile's x chunk, 4 x 16 x 256
// pairs = 64 KiB, stay in L2 while every tile of the block uses them), and column vectors per
// block tile (its FP32 sums, 48 x 256 floats = 48 KiB; more columns take another pass over W).
constexpr int kTileVectors = 4;
constexpr int kChunkPairs = 256;
constexpr int kPassVectors = 16;

// RowsPerPass: R for NV column vectors (R x NV accumulators, see the file comment).
template <int NV>
constexpr int RowsPerPass() {
  return NV == 1 ? 12 : NV == 2 ? 12 : NV == 3 ? 8 : 6;
}
static_assert(kBlockRows % RowsPerPass<1>() == 0 && kBlockRows % RowsPerPass<3>() == 0 &&
              kBlockRows % RowsPerPass<4>() == 0);

// Per-call scratch of one thread.
struct Scratch {
  std::vector<uint32_t> xp;     // column lanes: x as tiles of <= 4 column vectors (PackX)
  std::vector<uint32_t> xrows;  // row lanes: [batch, pairs] BF16 pairs of x, column by column
  std::vector<uint16_t> xrow;   // [2 * pairs] one column of x in BF16
  std::vector<uint32_t> rows;   // [48, chunk pairs] a block of W rows widened to BF16
  std::vector<uint32_t> wt;     // row lanes: [pairs, 48] the rows transposed (lane = row)
  std::vector<float> sums;      // column lanes: [48, 16 x pass vectors] a block's FP32 sums
  uint64_t prepared_for = 0;    // the NextCall() of the call whose x this holds
};

// ToBf16Row writes x[0, n) rounded to BF16 (VCVTNE2PS2BF16: nearest even) to out[0, n), and a
// zero at out[n] when n is odd.
KVG_AVX512_BF16_TARGET void ToBf16Row(const float* x, int n, uint16_t* out) {
  int c = 0;
  for (; c + 32 <= n; c += 32) {
    const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + c + 16), _mm512_loadu_ps(x + c));
    _mm512_storeu_si512(out + c, reinterpret_cast<const __m512i&>(b));
  }
  if (c < n) {
    const int left = n - c;
    const __mmask16 lo = static_cast<__mmask16>(left >= 16 ? 0xFFFF : (1u << left) - 1);
    const __mmask16 hi = static_cast<__mmask16>(left <= 16 ? 0 : (1u << (left - 16)) - 1);
    const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(hi, x + c + 16),
                                           _mm512_maskz_loadu_ps(lo, x + c));
    alignas(64) uint16_t tmp[32];
    _mm512_store_si512(tmp, reinterpret_cast<const __m512i&>(b));
    std::memcpy(out + c, tmp, static_cast<size_t>(left) * sizeof(uint16_t));
  }
  if (n % 2 != 0) out[n] = 0;
}

// TileVectors: the column vectors of the register tile that starts at vector v of nv.
inline int TileVectors(int v, int nv) { return std::min(kTileVectors, nv - v); }

// PackX lays the batch's columns of x out as VDPBF16PS operands, in register tiles of up to 4
// column vectors (v = 4 t .. 4 t + 3): tile t starts at word 4 t x 16 x pairs and holds, at
// (p x nvt + v - 4 t) x 16 + l, the BF16 pair (x[n][2p], x[n][2p + 1]) of column n = 16 v + l
// (zero for n >= batch), nvt being the tile's vectors. A tile's pairs [p0, p1) are contiguous.
KVG_AVX512_BF16_TARGET void PackX(const float* x, int batch, int cols, Scratch& s) {
  const int pairs = (cols + 1) / 2, nv = (batch + kLanes - 1) / kLanes;
  s.xp.assign(static_cast<size_t>(pairs) * nv * kLanes, 0);
  s.xrow.resize(static_cast<size_t>(pairs) * 2);
  for (int n = 0; n < batch; ++n) {
    ToBf16Row(x + static_cast<size_t>(n) * cols, cols, s.xrow.data());
    const int v = n / kLanes, t0 = v - v % kTileVectors, nvt = TileVectors(t0, nv);
    uint32_t* dst = s.xp.data() + static_cast<size_t>(t0) * kLanes * pairs +
                    static_cast<size_t>(v - t0) * kLanes + n % kLanes;
    const size_t stride = static_cast<size_t>(nvt) * kLanes;
    for (int p = 0; p < pairs; ++p) {
      uint32_t pair;
      std::memcpy(&pair, s.xrow.data() + 2 * p, sizeof(pair));
      dst[static_cast<size_t>(p) * stride] = pair;
    }
  }
}

// Fp8RowToBf16 widens `n` e4m3 codes to BF16 (exactly; see the file comment) into out[0, n).
KVG_AVX512_BF16_TARGET void Fp8RowToBf16(const uint8_t* codes, int n, uint16_t* out) {
  // vpunpcklbw / vpunpckhbw interleave the low / high 8 bytes of each 128-bit lane. So that they
  // give codes 0..31 and 32..63 in order, the 64 codes are first permuted: lane L holds codes
  // 8L..8L+7 in its low half and 32+8L..32+8L+7 in its high half.
  alignas(64) static constexpr std::array<uint8_t, 64> kOrder = [] {
    std::array<uint8_t, 64> o{};
    for (int l = 0; l < 4; ++l) {
      for (int i = 0; i < 8; ++i) {
        o[static_cast<size_t>(16 * l + i)] = static_cast<uint8_t>(8 * l + i);
        o[static_cast<size_t>(16 * l + 8 + i)] = static_cast<uint8_t>(32 + 8 * l + i);
      }
    }
    return o;
  }();
  const __m512i order = _mm512_load_si512(kOrder.data());
  const __m512i hi0 = _mm512_load_si512(kFp8Tables.hi.data());
  const __m512i hi1 = _mm512_load_si512(kFp8Tables.hi.data() + 64);
  const __m512i lo0 = _mm512_load_si512(kFp8Tables.lo.data());
  const __m512i lo1 = _mm512_load_si512(kFp8Tables.lo.data() + 64);
  const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));
  int c = 0;
  for (; c + 64 <= n; c += 64) {
    const __m512i p = _mm512_permutexvar_epi8(order, _mm512_loadu_si512(codes + c));
    // Index bits 0..6 pick the magnitude's entry (bit 6: the second table); bit 7 is ignored.
    const __m512i hi =
        _mm512_or_si512(_mm512_permutex2var_epi8(hi0, p, hi1), _mm512_and_si512(p, sign));
    const __m512i lo = _mm512_permutex2var_epi8(lo0, p, lo1);
    _mm512_storeu_si512(out + c, _mm512_unpacklo_epi8(lo, hi));
    _mm512_storeu_si512(out + c + 32, _mm512_unpackhi_epi8(lo, hi));
  }
  for (; c < n; ++c) out[c] = Fp8CodeToBf16(codes[c]);
}

// WidenBlock writes W's rows [r, r + 48), pairs [p0, p0 + np), as BF16 pairs to
// s.rows[i * np, (i + 1) * np) for row r + i: FP8 widened, BF16 copied, a zero past the last
// column when it is odd, and zero rows from `last` on.
KVG_AVX512_BF16_TARGET void WidenBlock(const WeightView& w, int64_t r, int64_t last, int p0, int np,
                                       Scratch& s) {
  const int cols = w.cols, c0 = 2 * p0, n = std::min(2 * np, cols - c0);
  s.rows.resize(static_cast<size_t>(kBlockRows) * np);
  for (int i = 0; i < kBlockRows; ++i) {
    uint16_t* out = reinterpret_cast<uint16_t*>(s.rows.data() + static_cast<size_t>(i) * np);
    if (r + i >= last) {
      std::memset(out, 0, static_cast<size_t>(np) * sizeof(uint32_t));
      continue;
    }
    const size_t at = static_cast<size_t>(r + i) * cols + c0;
    if (w.format == WeightFormat::kFp8) {
      Fp8RowToBf16(static_cast<const uint8_t*>(w.data) + at, n, out);
    } else {
      std::memcpy(out, static_cast<const uint16_t*>(w.data) + at, size_t(n) * sizeof(uint16_t));
    }
    if (n < 2 * np) out[n] = 0;  // the odd last column's pair
  }
}

// Rows accumulates, for R widened weight rows (row i at w + i x stride) and the NV column
// vectors of a packed x tile, sums[r][v] += sum_{p < np} W[r] pair p . x pair p of the vector's
// 16 columns; sums row r at t + r x ld, vector v at + 16 v; `first` starts them from zero. A
// chain split over chunks is the same chain: the FP32 sums are stored and reloaded exactly.
template <int R, int NV>
KVG_AVX512_BF16_TARGET void Rows(const uint32_t* w, size_t stride, const uint32_t* xp, int np,
                                 float* t, int ld, bool first) {
  __m512 acc[R][NV];
#pragma GCC unroll 32
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      acc[r][v] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(t + r * ld + v * kLanes);
    }
  }
  for (int p = 0; p < np; ++p) {
    __m512bh xv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      const __m512i u = _mm512_loadu_si512(xp + (static_cast<size_t>(p) * NV + v) * kLanes);
      xv[v] = reinterpret_cast<const __m512bh&>(u);
    }
#pragma GCC unroll 32
    for (int r = 0; r < R; ++r) {
      const __m512i b = _mm512_set1_epi32(static_cast<int>(w[r * stride + p]));
      const __m512bh wv = reinterpret_cast<const __m512bh&>(b);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], wv, xv[v]);
    }
  }
#pragma GCC unroll 32
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(t + r * ld + v * kLanes, acc[r][v]);
  }
}

// BlockTile runs Rows over the block's `n` live rows (of 48) for one register tile of NV vectors.
template <int NV>
KVG_AVX512_BF16_TARGET void BlockTile(const Scratch& s, int np, const uint32_t* xp, int n, float* t,
                                      int ld, bool first) {
  constexpr int R = RowsPerPass<NV>();
  for (int i = 0; i < n; i += R) {
    Rows<R, NV>(s.rows.data() + static_cast<size_t>(i) * np, static_cast<size_t>(np), xp, np,
                t + static_cast<ptrdiff_t>(i) * ld, ld, first);
  }
}

// RowScale: what row `row`'s FP32 sums are multiplied by (the FP8 row scale; 1 for BF16).
KVG_AVX512_BF16_TARGET inline float RowScale(const WeightView& w, int64_t row) {
  return w.format == WeightFormat::kFp8 ? w.row_scales[row] : 1.0f;
}

// Transpose16 transposes a 16 x 16 block of 32-bit words in place: r[i] lane j <- r[j] lane i.
KVG_AVX512_BF16_TARGET inline void Transpose16(__m512i r[16]) {
  __m512i t[16];
#pragma GCC unroll 8
  for (int i = 0; i < 16; i += 2) {  // 2 x 2 blocks of words
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 16; i += 4) {  // 4 x 4 blocks: pairs of words
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  // Now r[4a + b] lane 4q + k holds input row 4a + k, word 4q + b. Move the 128-bit quarters.
#pragma GCC unroll 4
  for (int b = 0; b < 4; ++b) {
    // Quarters q of rows 4a + b, a = 0..3: output row 4q + b takes quarter q of each.
    const __m512i a01lo = _mm512_shuffle_i32x4(r[b], r[4 + b], 0x44);  // q0,q1 of a0; q0,q1 of a1
    const __m512i a01hi = _mm512_shuffle_i32x4(r[b], r[4 + b], 0xEE);  // q2,q3 of a0; q2,q3 of a1
    const __m512i a23lo = _mm512_shuffle_i32x4(r[8 + b], r[12 + b], 0x44);  // q0,q1 of a2; of a3
    const __m512i a23hi = _mm512_shuffle_i32x4(r[8 + b], r[12 + b], 0xEE);  // q2,q3 of a2; of a3
    t[b] = _mm512_shuffle_i32x4(a01lo, a23lo, 0x88);                        // q0 of a0, a1, a2, a3
    t[4 + b] = _mm512_shuffle_i32x4(a01lo, a23lo, 0xDD);                    // q1
    t[8 + b] = _mm512_shuffle_i32x4(a01hi, a23hi, 0x88);                    // q2
    t[12 + b] = _mm512_shuffle_i32x4(a01hi, a23hi, 0xDD);                   // q3
  }
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}

// StoreBlock writes a block's sums (rows [r, r + n), the pass's columns from 16 v0 on) to y,
// each multiplied by its row scale: 16 x 16 squares transposed so that each column's 16 rows go
// out as one store.
KVG_AVX512_BF16_TARGET void StoreBlock(const WeightView& w, int batch, float* y, int64_t r, int n,
                                       int v0, int pv, const float* t, int ld) {
  for (int rs = 0; rs < n; rs += kLanes) {
    const int nr = std::min(kLanes, n - rs);
    const __mmask16 rows_mask = static_cast<__mmask16>(nr == kLanes ? 0xFFFF : (1u << nr) - 1);
    float scale[kLanes];
    for (int i = 0; i < kLanes; ++i) scale[i] = i < nr ? RowScale(w, r + rs + i) : 0.0f;
    for (int v = 0; v < pv; ++v) {
      __m512i square[kLanes];
#pragma GCC unroll 16
      for (int i = 0; i < kLanes; ++i) {
        const __m512 sums = _mm512_loadu_ps(t + static_cast<ptrdiff_t>(rs + i) * ld + v * kLanes);
        square[i] = _mm512_castps_si512(_mm512_mul_ps(sums, _mm512_set1_ps(scale[i])));
      }
      Transpose16(square);
      const int c0 = (v0 + v) * kLanes, nc = std::min(kLanes, batch - c0);
      for (int j = 0; j < nc; ++j) {
        _mm512_mask_storeu_ps(y + static_cast<size_t>(c0 + j) * w.rows + r + rs, rows_mask,
                              _mm512_castsi512_ps(square[j]));
      }
    }
  }
}

// ColumnLanes computes y for W's rows [r0, r1), 16 or more columns (see the file comment): per
// block of 48 rows and pass of up to 256 columns, W is widened a chunk of 256 pairs at a time,
// and each register tile of the pass runs over the chunk, the block's FP32 sums kept in s.sums.
KVG_AVX512_BF16_TARGET void ColumnLanes(const WeightView& w, int batch, float* y, int64_t r0,
                                        int64_t r1, Scratch& s) {
  const int pairs = (w.cols + 1) / 2, nv = (batch + kLanes - 1) / kLanes;
  for (int64_t r = r0; r < r1; r += kBlockRows) {
    const int n = static_cast<int>(std::min<int64_t>(kBlockRows, r1 - r));
    for (int v0 = 0; v0 < nv; v0 += kPassVectors) {
      const int pv = std::min(kPassVectors, nv - v0), ld = pv * kLanes;
      s.sums.resize(static_cast<size_t>(kBlockRows) * ld);
      for (int p0 = 0; p0 < pairs; p0 += kChunkPairs) {
        const int np = std::min(kChunkPairs, pairs - p0);
        WidenBlock(w, r, r1, p0, np, s);
        for (int v = v0; v < v0 + pv; v += kTileVectors) {
          const int nvt = TileVectors(v, nv);
          const uint32_t* xp = s.xp.data() + static_cast<size_t>(v) * kLanes * pairs +
                               static_cast<size_t>(p0) * nvt * kLanes;
          float* t = s.sums.data() + (v - v0) * kLanes;
          switch (nvt) {
            case 1:
              BlockTile<1>(s, np, xp, n, t, ld, p0 == 0);
              break;
            case 2:
              BlockTile<2>(s, np, xp, n, t, ld, p0 == 0);
              break;
            case 3:
              BlockTile<3>(s, np, xp, n, t, ld, p0 == 0);
              break;
            default:
              BlockTile<4>(s, np, xp, n, t, ld, p0 == 0);
              break;
          }
        }
      }
      StoreBlock(w, batch, y, r, n, v0, pv, s.sums.data(), ld);
    }
  }
}

// kRowLanesRows: rows per pass of the row-lane layout (3 vectors of 16).
constexpr int kRowVectors = 3;
constexpr int kRowLanesRows = kRowVectors * kLanes;
static_assert(kRowGrain % kRowLanesRows == 0 && kBlockRows == kRowLanesRows);

// TransposeRows lays rows[0, 48) (BF16 pairs) out as s.wt[p][48]: lane i of vector (p, g) is
// row 16 g + i's pair p.
KVG_AVX512_BF16_TARGET void TransposeRows(const uint32_t* const* rows, int pairs, Scratch& s) {
  __m512i block[16];
  for (int g = 0; g < kRowVectors; ++g) {
    for (int p0 = 0; p0 < pairs; p0 += kLanes) {
      const int n = std::min(kLanes, pairs - p0);
      const __mmask16 mask = static_cast<__mmask16>(n == kLanes ? 0xFFFF : (1u << n) - 1);
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) {
        block[i] = _mm512_maskz_loadu_epi32(mask, rows[g * kLanes + i] + p0);
      }
      Transpose16(block);
      for (int j = 0; j < n; ++j) {
        _mm512_storeu_si512(s.wt.data() + (static_cast<size_t>(p0 + j) * kRowVectors + g) * kLanes,
                            block[j]);
      }
    }
  }
}

// RowLanesTile accumulates, for the 48 transposed rows in s.wt and NC columns of x (BF16 pair
// rows x[c]), acc[g][c] = sum_p (rows 16 g .. 16 g + 15, pair p) . x[c] pair p.
template <int NC>
KVG_AVX512_BF16_TARGET void RowLanesTile(const uint32_t* wt, const uint32_t* const* x, int pairs,
                                         __m512* out) {
  __m512 acc[kRowVectors][NC];
#pragma GCC unroll 3
  for (int g = 0; g < kRowVectors; ++g) {
#pragma GCC unroll 8
    for (int c = 0; c < NC; ++c) acc[g][c] = _mm512_setzero_ps();
  }
  for (int p = 0; p < pairs; ++p) {
    __m512bh wv[kRowVectors];
#pragma GCC unroll 3
    for (int g = 0; g < kRowVectors; ++g) {
      const __m512i t =
          _mm512_loadu_si512(wt + (static_cast<size_t>(p) * kRowVectors + g) * kLanes);
      wv[g] = reinterpret_cast<const __m512bh&>(t);
    }
#pragma GCC unroll 8
    for (int c = 0; c < NC; ++c) {
      const __m512i b = _mm512_set1_epi32(static_cast<int>(x[c][p]));
      const __m512bh xb = reinterpret_cast<const __m512bh&>(b);
      // The same operand order as Rows (weights, then x): every lane runs the same operations.
#pragma GCC unroll 3
      for (int g = 0; g < kRowVectors; ++g) acc[g][c] = _mm512_dpbf16_ps(acc[g][c], wv[g], xb);
    }
  }
#pragma GCC unroll 3
  for (int g = 0; g < kRowVectors; ++g) {
#pragma GCC unroll 8
    for (int c = 0; c < NC; ++c) out[g * NC + c] = acc[g][c];
  }
}

// RowLanes computes y for W's rows [r0, r1), fewer than 16 columns (see the file comment).
KVG_AVX512_BF16_TARGET void RowLanes(const WeightView& w, int batch, float* y, int64_t r0,
                                     int64_t r1, Scratch& s) {
  const int pairs = (w.cols + 1) / 2;
  s.wt.resize(static_cast<size_t>(pairs) * kRowLanesRows);
  const uint32_t* rows[kRowLanesRows];
  // Columns in tiles of at most 8, of balanced widths.
  const int tiles = (batch + 7) / 8;
  __m512 acc[kRowVectors * 8];
  alignas(64) float lanes[kLanes];
  for (int64_t r = r0; r < r1; r += kRowLanesRows) {
    WidenBlock(w, r, r1, 0, pairs, s);
    for (int i = 0; i < kRowLanesRows; ++i)
      rows[i] = s.rows.data() + static_cast<size_t>(i) * pairs;
    TransposeRows(rows, pairs, s);
    for (int t = 0, c0 = 0; t < tiles; ++t) {
      const int nc = batch / tiles + (t < batch % tiles ? 1 : 0);
      const uint32_t* x[8];
      for (int c = 0; c < nc; ++c) x[c] = s.xrows.data() + static_cast<size_t>(c0 + c) * pairs;
      switch (nc) {
#define KVG_ROW_LANES_CASE(N)                    \
  case N:                                        \
    RowLanesTile<N>(s.wt.data(), x, pairs, acc); \
    break;
        KVG_ROW_LANES_CASE(1)
        KVG_ROW_LANES_CASE(2)
        KVG_ROW_LANES_CASE(3)
        KVG_ROW_LANES_CASE(4)
        KVG_ROW_LANES_CASE(5)
        KVG_ROW_LANES_CASE(6)
        KVG_ROW_LANES_CASE(7)
        default:
          RowLanesTile<8>(s.wt.data(), x, pairs, acc);
          break;
#undef KVG_ROW_LANES_CASE
      }
      for (int g = 0; g < kRowVectors; ++g) {
        for (int c = 0; c < nc; ++c) {
          _mm512_store_ps(lanes, acc[g * nc + c]);
          for (int l = 0; l < kLanes; ++l) {
            const int64_t row = r + g * kLanes + l;
            if (row >= r1) break;
            y[static_cast<size_t>(c0 + c) * w.rows + row] = lanes[l] * RowScale(w, row);
          }
        }
      }
      c0 += nc;
    }
  }
}

// PrepareX converts x for the layout `batch` takes, once per call and thread.
KVG_AVX512_BF16_TARGET void PrepareX(const float* x, int batch, int cols, Scratch& s) {
  const int pairs = (cols + 1) / 2;
  if (batch >= kLanes) {
    PackX(x, batch, cols, s);
    return;
  }
  s.xrows.resize(static_cast<size_t>(batch) * pairs);
  for (int n = 0; n < batch; ++n) {
    ToBf16Row(x + static_cast<size_t>(n) * cols, cols,
              reinterpret_cast<uint16_t*>(s.xrows.data() + static_cast<size_t>(n) * pairs));
  }
}

}  // namespace

void MatMulBf16Dot(const WeightView& w, const float* x, int batch, float* y, ThreadPool* pool,
                   uint64_t call) {
  auto fn = [&](int64_t r0, int64_t r1) {
    thread_local Scratch scratch;
    if (scratch.prepared_for != call) {
      PrepareX(x, batch, w.cols, scratch);
      scratch.prepared_for = call;
    }
    if (batch < kLanes) return RowLanes(w, batch, y, r0, r1, scratch);
    return ColumnLanes(w, batch, y, r0, r1, scratch);
  };
  if (pool == nullptr || pool->size() == 1) {
    fn(0, w.rows);
  } else {
    pool->ParallelFor(w.rows, kRowGrain, fn);
  }
}

KVG_AVX512_BF16_END

#else  // !KVGUARD_AVX512_BF16

void MatMulBf16Dot(const WeightView&, const float*, int, float*, ThreadPool*, uint64_t) {
  __builtin_trap();  // unreachable: callers check internal::HasAvx512Bf16Vbmi()
}

#endif  // KVGUARD_AVX512_BF16

}  // namespace kvguard::kernels::matmul_internal
