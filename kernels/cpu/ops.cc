// kernels/cpu/ops.cc: SIMD per-token operators, compiled once per Highway target.
//
// Tails shorter than a vector go through a stack buffer padded with a neutral value (0 for
// sums, -inf for max and exp, NaN for argmax), so no load or store passes the caller's arrays.
#include "kernels/cpu/ops.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "absl/base/internal/raw_logging.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/ops.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// After highway.h (per-target header; a separate block so include sorting keeps the order).
#include "hwy/contrib/math/math-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvguard::kernels {
namespace HWY_NAMESPACE {
// Anonymous: other kernel files define helpers in the same per-target namespace.
namespace {

namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using DI = hn::RebindToSigned<DF>;
using VF = hn::Vec<DF>;

constexpr size_t kMaxLanes = HWY_MAX_BYTES / sizeof(float);
constexpr float kInf = std::numeric_limits<float>::infinity();

// LoadTail returns x[0, count) (count < Lanes) padded with `pad`.
HWY_INLINE VF LoadTail(DF df, const float* x, size_t count, float pad) {
  HWY_ALIGN float buf[kMaxLanes];
  for (size_t i = 0; i < kMaxLanes; ++i) buf[i] = pad;
  std::memcpy(buf, x, count * sizeof(float));
  return hn::Load(df, buf);
}

// StoreTail writes the first `count` lanes of v to out.
HWY_INLINE void StoreTail(DF df, VF v, size_t count, float* out) {
  HWY_ALIGN float buf[kMaxLanes];
  hn::Store(v, df, buf);
  std::memcpy(out, buf, count * sizeof(float));
}

void RmsNormImpl(const float* x, const float* weight, size_t n, float eps, float* out) {
  const DF df;
  const size_t N = hn::Lanes(df);
  // Four accumulators hide the FMA latency and shorten each lane's summation chain.
  VF s0 = hn::Zero(df), s1 = hn::Zero(df), s2 = hn::Zero(df), s3 = hn::Zero(df);
  size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    const VF a = hn::LoadU(df, x + i), b = hn::LoadU(df, x + i + N);
    const VF c = hn::LoadU(df, x + i + 2 * N), d = hn::LoadU(df, x + i + 3 * N);
    s0 = hn::MulAdd(a, a, s0);
    s1 = hn::MulAdd(b, b, s1);
    s2 = hn::MulAdd(c, c, s2);
    s3 = hn::MulAdd(d, d, s3);
  }
  for (; i + N <= n; i += N) {
    const VF a = hn::LoadU(df, x + i);
    s0 = hn::MulAdd(a, a, s0);
  }
  if (i < n) {
    const VF a = LoadTail(df, x + i, n - i, 0.0f);
    s1 = hn::MulAdd(a, a, s1);
  }
  const float sum = hn::GetLane(hn::SumOfLanes(df, hn::Add(hn::Add(s0, s1), hn::Add(s2, s3))));
  const float inv_rms = 1.0f / std::sqrt(sum / static_cast<float>(n) + eps);

  const VF vinv = hn::Set(df, inv_rms);
  for (i = 0; i + N <= n; i += N) {
    const VF v = hn::Mul(hn::LoadU(df, x + i), vinv);
    hn::StoreU(hn::Mul(v, hn::LoadU(df, weight + i)), df, out + i);
  }
  if (i < n) {
    const VF v = hn::Mul(LoadTail(df, x + i, n - i, 0.0f), vinv);
    StoreTail(df, hn::Mul(v, LoadTail(df, weight + i, n - i, 0.0f)), n - i, out + i);
  }
}

// RopeChunk is the number of frequencies whose cos/sin are tabulated at a time (on the
// stack); a head_dim of up to 2 * RopeChunk takes one pass.
constexpr int kRopeChunk = 128;

void RopeImpl(float* x, int num_heads, int head_dim, int pos, float theta) {
  const DF df;
  const int N = static_cast<int>(hn::Lanes(df));
  const int half = head_dim / 2;
  HWY_ALIGN float cos_table[kRopeChunk];
  HWY_ALIGN float sin_table[kRopeChunk];
  for (int begin = 0; begin < half; begin += kRopeChunk) {
    const int count = half - begin < kRopeChunk ? half - begin : kRopeChunk;
    // The angle reaches 1e5 rad at long positions, where FP32 would lose ~1e-2 rad; double
    // keeps it to ~1e-11. The trigonometry runs once per frequency, shared by all heads.
    for (int i = 0; i < count; ++i) {
      const double angle = static_cast<double>(pos) *
                           std::pow(static_cast<double>(theta), -2.0 * (begin + i) / head_dim);
      cos_table[i] = static_cast<float>(std::cos(angle));
      sin_table[i] = static_cast<float>(std::sin(angle));
    }
    for (int h = 0; h < num_heads; ++h) {
      float* lo = x + static_cast<ptrdiff_t>(h) * head_dim + begin;
      float* hi = lo + half;
      int i = 0;
      for (; i + N <= count; i += N) {
        const VF a = hn::LoadU(df, lo + i);
        const VF b = hn::LoadU(df, hi + i);
        const VF c = hn::Load(df, cos_table + i);
        const VF s = hn::Load(df, sin_table + i);
        hn::StoreU(hn::MulSub(a, c, hn::Mul(b, s)), df, lo + i);
        hn::StoreU(hn::MulAdd(a, s, hn::Mul(b, c)), df, hi + i);
      }
      for (; i < count; ++i) {
        const float a = lo[i];
        const float b = hi[i];
        lo[i] = a * cos_table[i] - b * sin_table[i];
        hi[i] = a * sin_table[i] + b * cos_table[i];
      }
    }
  }
}

// SiluMulVec returns silu(g) * u.
HWY_INLINE VF SiluMulVec(DF df, VF g, VF u) {
  // Highway's Exp is valid up to +104 (inf beyond ~88.7, garbage far beyond); clamping keeps
  // exp(-g) = inf for very negative g, so silu -> -0 as in IEEE arithmetic.
  const VF e = hn::Exp(df, hn::Min(hn::Neg(g), hn::Set(df, 104.0f)));
  return hn::Mul(hn::Div(g, hn::Add(hn::Set(df, 1.0f), e)), u);
}

void SiluMulImpl(const float* gate, const float* up, size_t n, float* out) {
  const DF df;
  const size_t N = hn::Lanes(df);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    hn::StoreU(SiluMulVec(df, hn::LoadU(df, gate + i), hn::LoadU(df, up + i)), df, out + i);
  }
  if (i < n) {
    const VF g = LoadTail(df, gate + i, n - i, 0.0f);
    const VF u = LoadTail(df, up + i, n - i, 0.0f);
    StoreTail(df, SiluMulVec(df, g, u), n - i, out + i);
  }
}

void SoftmaxImpl(float* x, size_t n) {
  const DF df;
  const size_t N = hn::Lanes(df);
  VF m0 = hn::Set(df, -kInf), m1 = m0, m2 = m0, m3 = m0;
  size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    m0 = hn::Max(m0, hn::LoadU(df, x + i));
    m1 = hn::Max(m1, hn::LoadU(df, x + i + N));
    m2 = hn::Max(m2, hn::LoadU(df, x + i + 2 * N));
    m3 = hn::Max(m3, hn::LoadU(df, x + i + 3 * N));
  }
  for (; i + N <= n; i += N) m0 = hn::Max(m0, hn::LoadU(df, x + i));
  if (i < n) m1 = hn::Max(m1, LoadTail(df, x + i, n - i, -kInf));
  const VF max = hn::MaxOfLanes(df, hn::Max(hn::Max(m0, m1), hn::Max(m2, m3)));

  // exp(x - max) <= 1, so nothing overflows whatever the logits; a -inf pad gives exp = 0.
  VF s0 = hn::Zero(df), s1 = hn::Zero(df), s2 = hn::Zero(df), s3 = hn::Zero(df);
  for (i = 0; i + 4 * N <= n; i += 4 * N) {
    const VF e0 = hn::Exp(df, hn::Sub(hn::LoadU(df, x + i), max));
    const VF e1 = hn::Exp(df, hn::Sub(hn::LoadU(df, x + i + N), max));
    const VF e2 = hn::Exp(df, hn::Sub(hn::LoadU(df, x + i + 2 * N), max));
    const VF e3 = hn::Exp(df, hn::Sub(hn::LoadU(df, x + i + 3 * N), max));
    hn::StoreU(e0, df, x + i);
    hn::StoreU(e1, df, x + i + N);
    hn::StoreU(e2, df, x + i + 2 * N);
    hn::StoreU(e3, df, x + i + 3 * N);
    s0 = hn::Add(s0, e0);
    s1 = hn::Add(s1, e1);
    s2 = hn::Add(s2, e2);
    s3 = hn::Add(s3, e3);
  }
  for (; i + N <= n; i += N) {
    const VF e = hn::Exp(df, hn::Sub(hn::LoadU(df, x + i), max));
    hn::StoreU(e, df, x + i);
    s0 = hn::Add(s0, e);
  }
  if (i < n) {
    const VF e = hn::Exp(df, hn::Sub(LoadTail(df, x + i, n - i, -kInf), max));
    StoreTail(df, e, n - i, x + i);
    s1 = hn::Add(s1, e);
  }
  const float sum = hn::GetLane(hn::SumOfLanes(df, hn::Add(hn::Add(s0, s1), hn::Add(s2, s3))));
  const VF inv_sum = hn::Set(df, 1.0f / sum);
  for (i = 0; i + N <= n; i += N) hn::StoreU(hn::Mul(hn::LoadU(df, x + i), inv_sum), df, x + i);
  if (i < n) StoreTail(df, hn::Mul(LoadTail(df, x + i, n - i, 0.0f), inv_sum), n - i, x + i);
}

// ArgmaxBlock returns the argmax of x[0, n) for n < 2^31 (indices fit int32 lanes), with the
// contract of Argmax.
size_t ArgmaxBlock(const float* x, size_t n) {
  const DF df;
  const DI di;
  const size_t N = hn::Lanes(df);
  // Per lane: the largest value seen and the first index holding it. A strict > keeps the
  // first index on ties and never takes a NaN; lanes that only saw NaN or -inf stay at -inf.
  VF best = hn::Set(df, -kInf);
  auto best_index = hn::Zero(di);
  auto index = hn::Iota(di, 0);
  const auto step = hn::Set(di, static_cast<int32_t>(N));
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const VF v = hn::LoadU(df, x + i);
    const auto greater = hn::Gt(v, best);
    best = hn::IfThenElse(greater, v, best);
    best_index = hn::IfThenElse(hn::RebindMask(di, greater), index, best_index);
    index = hn::Add(index, step);
  }
  if (i < n) {
    const VF v = LoadTail(df, x + i, n - i, std::numeric_limits<float>::quiet_NaN());
    const auto greater = hn::Gt(v, best);
    best = hn::IfThenElse(greater, v, best);
    best_index = hn::IfThenElse(hn::RebindMask(di, greater), index, best_index);
  }
  const VF max = hn::MaxOfLanes(df, best);
  if (hn::GetLane(max) == -kInf) {
    // Every non-NaN element is -inf (or there is none): the first -inf wins, else index 0.
    for (size_t j = 0; j < n; ++j) {
      if (x[j] == -kInf) return j;
    }
    return 0;
  }
  // Among the lanes that reached the maximum, the smallest index is the first occurrence.
  const auto candidates = hn::IfThenElse(hn::RebindMask(di, hn::Eq(best, max)), best_index,
                                         hn::Set(di, std::numeric_limits<int32_t>::max()));
  return static_cast<size_t>(hn::GetLane(hn::MinOfLanes(di, candidates)));
}

size_t ArgmaxImpl(const float* x, size_t n) {
  constexpr size_t kBlock = size_t{1} << 30;
  size_t best = ArgmaxBlock(x, n < kBlock ? n : kBlock);
  for (size_t begin = kBlock; begin < n; begin += kBlock) {
    const size_t i = begin + ArgmaxBlock(x + begin, n - begin < kBlock ? n - begin : kBlock);
    if (!std::isnan(x[i]) && (std::isnan(x[best]) || x[i] > x[best])) best = i;
  }
  return best;
}

}  // namespace
}  // namespace HWY_NAMESPACE
}  // namespace kvguard::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvguard::kernels {

HWY_EXPORT(RmsNormImpl);
HWY_EXPORT(RopeImpl);
HWY_EXPORT(SiluMulImpl);
HWY_EXPORT(SoftmaxImpl);
HWY_EXPORT(ArgmaxImpl);

void RmsNorm(const float* x, const float* weight, size_t n, float eps, float* out) {
  HWY_DYNAMIC_DISPATCH(RmsNormImpl)(x, weight, n, eps, out);
}

void Rope(float* x, int num_heads, int head_dim, int pos, float theta) {
  ABSL_RAW_CHECK(head_dim > 0 && head_dim % 2 == 0, "Rope: head_dim must be even and > 0");
  ABSL_RAW_CHECK(num_heads >= 0, "Rope: num_heads must be >= 0");
  HWY_DYNAMIC_DISPATCH(RopeImpl)(x, num_heads, head_dim, pos, theta);
}

void SiluMul(const float* gate, const float* up, size_t n, float* out) {
  HWY_DYNAMIC_DISPATCH(SiluMulImpl)(gate, up, n, out);
}

void Softmax(float* x, size_t n) {
  ABSL_RAW_CHECK(n >= 1, "Softmax: n must be >= 1");
  HWY_DYNAMIC_DISPATCH(SoftmaxImpl)(x, n);
}

size_t Argmax(const float* x, size_t n) {
  ABSL_RAW_CHECK(n >= 1, "Argmax: n must be >= 1");
  return HWY_DYNAMIC_DISPATCH(ArgmaxImpl)(x, n);
}

}  // namespace kvguard::kernels
#endif  // HWY_ONCE
