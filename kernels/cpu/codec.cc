// kernels/cpu/codec.cc: SIMD bulk FP8 e4m3 and BF16 codecs, compiled once per Highway target.
//
// Each kernel computes what the scalar codec of kernels/formats.h computes, lane-wise and with
// the same round-to-nearest-even on the FP32 bit pattern, so the results match the scalar twins
// in codec_ref.cc bit for bit (NaN codes included); the tests hold them to that. Tails shorter than
// a vector go through a stack buffer, never a load or store past the caller's arrays: masked loads
// of 8/16-bit lanes are full-width loads on SSE4/AVX2 in Highway 1.0.3.
#include "kernels/cpu/codec.h"

#include <cmath>
#include <cstring>

#include "absl/base/internal/raw_logging.h"
#include "kernels/formats.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/codec.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace kvguard::kernels {
namespace HWY_NAMESPACE {
// Anonymous: other kernel files define helpers in the same per-target namespace.
namespace {

namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using DU = hn::RebindToUnsigned<DF>;
using DI = hn::RebindToSigned<DF>;
using D8 = hn::Rebind<uint8_t, DF>;
using D16 = hn::Rebind<uint16_t, DF>;
using VF = hn::Vec<DF>;
using VU = hn::Vec<DU>;

// Lanes of the widest float vector of this target: the size of the tail buffers.
constexpr size_t kMaxLanes = HWY_MAX_BYTES / sizeof(float);

// Fp8Codes returns the e4m3 codes of `y` (one per 32-bit lane, in [0, 255]), as
// Fp8E4m3FromFloat computes them.
HWY_INLINE VU Fp8Codes(DF df, VF y) {
  const DU du;
  const VU bits = hn::BitCast(du, y);
  const VU sign = hn::And(hn::ShiftRight<24>(bits), hn::Set(du, 0x80u));
  const VU abs_bits = hn::And(bits, hn::Set(du, 0x7FFFFFFFu));
  const VF a = hn::BitCast(df, abs_bits);

  // Normal range: round the 20 dropped mantissa bits to nearest even on the bit pattern. Bits
  // 30..20 of the result are then (FP32 exponent << 3 | mantissa), and rebiasing the exponent
  // from 127 to 7 is a subtraction of 120 << 3. The result grows with |y|, so everything from
  // 464 up (inf included) lands above 0x7E and Min saturates it; [448, 464) rounds to 0x7E.
  const VU lsb = hn::And(hn::ShiftRight<20>(abs_bits), hn::Set(du, 1u));
  const VU rounded = hn::Add(abs_bits, hn::Add(hn::Set(du, 0x7FFFFu), lsb));
  const VU normal = hn::Min(hn::Sub(hn::ShiftRight<20>(rounded), hn::Set(du, 120u << 3)),
                            hn::Set(du, uint32_t{kFp8E4m3MaxCode}));

  // Subnormal range (|y| < 2^-6, quantum 2^-9): adding 2^14, whose ulp is 2^-9, makes the FPU
  // round |y| * 512 to nearest even into the low mantissa bits; 8 is the code of 2^-6.
  const VF kMagic = hn::Set(df, 0x1p14f);
  const VU subnormal = hn::Sub(hn::BitCast(du, hn::Add(a, kMagic)), hn::BitCast(du, kMagic));

  VU code = hn::IfThenElse(hn::RebindMask(du, hn::Lt(a, hn::Set(df, 0x1p-6f))), subnormal, normal);
  code = hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(y)), hn::Set(du, uint32_t{kFp8E4m3NanCode}),
                        code);
  return hn::Or(code, sign);
}

// LowBytes returns the low byte of each 32-bit lane of `v` (all lanes are < 256).
HWY_INLINE hn::Vec<D8> LowBytes(VU v) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  // One VPMOVDB. Not hn::TruncateTo: Highway 1.0.3's AVX3_DL version of it permutes 32-bit
  // lanes where it means bytes and returns wrong codes (fp8_codec_test catches it).
  return hn::Vec<D8>{_mm512_cvtepi32_epi8(v.raw)};
#else
  const DI di;
  return hn::DemoteTo(D8(), hn::BitCast(di, v));
#endif
}

// EncodeFp8Vec encodes one full vector x[0, Lanes) into out[0, Lanes).
HWY_INLINE void EncodeFp8Vec(const float* HWY_RESTRICT x, VF scale, uint8_t* HWY_RESTRICT out) {
  const DF df;
  const D8 d8;
  // Div, not Mul by 1/scale: the two round differently and the contract is x / scale.
  const VU code = Fp8Codes(df, hn::Div(hn::LoadU(df, x), scale));
  hn::StoreU(LowBytes(code), d8, out);
}

void EncodeFp8Impl(const float* HWY_RESTRICT x, size_t n, float scale, uint8_t* HWY_RESTRICT out) {
  const DF df;
  const size_t N = hn::Lanes(df);
  const VF vscale = hn::Set(df, scale);
  size_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    EncodeFp8Vec(x + i, vscale, out + i);
    EncodeFp8Vec(x + i + N, vscale, out + i + N);
  }
  for (; i + N <= n; i += N) EncodeFp8Vec(x + i, vscale, out + i);
  if (i < n) {
    HWY_ALIGN float xbuf[kMaxLanes] = {};
    HWY_ALIGN uint8_t obuf[kMaxLanes];
    std::memcpy(xbuf, x + i, (n - i) * sizeof(float));
    EncodeFp8Vec(xbuf, vscale, obuf);
    std::memcpy(out + i, obuf, n - i);
  }
}

// DecodeFp8Vec decodes one full vector in[0, Lanes) into out[0, Lanes).
HWY_INLINE void DecodeFp8Vec(const uint8_t* HWY_RESTRICT in, VF scale, float* HWY_RESTRICT out) {
  const DF df;
  const DU du;
  const D8 d8;
  const VU c = hn::PromoteTo(du, hn::LoadU(d8, in));
  const VU sign = hn::ShiftLeft<24>(hn::And(c, hn::Set(du, 0x80u)));
  const VU mag = hn::And(c, hn::Set(du, 0x7Fu));
  // Not formats.h's multiply by 2^120: that makes FP32 denormals of the subnormal codes, and
  // denormal operands cost a microcode assist on some x86 cores (1.5x slower here). Instead,
  // normal codes get their exponent rebiased from 7 to 127 (exact), and subnormal codes
  // 2^-6 * M/8 are (2^-6 * (1 + M/8)) - 2^-6, exact by Sterbenz. Both equal formats.h's value.
  const VU shifted = hn::ShiftLeft<20>(mag);
  const VF normal = hn::BitCast(df, hn::Add(shifted, hn::Set(du, 120u << 23)));
  const VF kMinNormal = hn::Set(df, 0x1p-6f);
  const VF subnormal =
      hn::Sub(hn::BitCast(df, hn::Or(shifted, hn::BitCast(du, kMinNormal))), kMinNormal);
  const DI di;
  const auto is_subnormal = hn::RebindMask(df, hn::Lt(hn::BitCast(di, mag), hn::Set(di, 8)));
  const VF value = hn::Or(hn::IfThenElse(is_subnormal, subnormal, normal), hn::BitCast(df, sign));
  const VF nan = hn::BitCast(df, hn::Or(sign, hn::Set(du, 0x7FC00000u)));
  const auto is_nan = hn::RebindMask(df, hn::Eq(mag, hn::Set(du, 0x7Fu)));
  hn::StoreU(hn::Mul(hn::IfThenElse(is_nan, nan, value), scale), df, out);
}

void DecodeFp8Impl(const uint8_t* HWY_RESTRICT in, size_t n, float scale, float* HWY_RESTRICT out) {
  const DF df;
  const size_t N = hn::Lanes(df);
  const VF vscale = hn::Set(df, scale);
  size_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    DecodeFp8Vec(in + i, vscale, out + i);
    DecodeFp8Vec(in + i + N, vscale, out + i + N);
  }
  for (; i + N <= n; i += N) DecodeFp8Vec(in + i, vscale, out + i);
  if (i < n) {
    HWY_ALIGN uint8_t ibuf[kMaxLanes] = {};
    HWY_ALIGN float obuf[kMaxLanes];
    std::memcpy(ibuf, in + i, n - i);
    DecodeFp8Vec(ibuf, vscale, obuf);
    std::memcpy(out + i, obuf, (n - i) * sizeof(float));
  }
}

// EncodeBf16Vec encodes one full vector x[0, Lanes) into out[0, Lanes).
HWY_INLINE void EncodeBf16Vec(const float* HWY_RESTRICT x, uint16_t* HWY_RESTRICT out) {
  const DF df;
  const DU du;
  const D16 d16;
  const VF v = hn::LoadU(df, x);
  const VU bits = hn::BitCast(du, v);
  const VU high = hn::ShiftRight<16>(bits);
  // Round to nearest even on the bit pattern; a carry into the exponent is the right answer
  // (up to inf). Only NaNs could wrap around, and they take the other branch.
  const VU lsb = hn::And(high, hn::Set(du, 1u));
  const VU rounded = hn::ShiftRight<16>(hn::Add(bits, hn::Add(hn::Set(du, 0x7FFFu), lsb)));
  // Setting the quiet bit keeps a signalling NaN from truncating to inf.
  const VU quiet_nan = hn::Or(high, hn::Set(du, 0x40u));
  const VU h = hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), quiet_nan, rounded);
  hn::StoreU(hn::TruncateTo(d16, h), d16, out);
}

void EncodeBf16Impl(const float* HWY_RESTRICT x, size_t n, uint16_t* HWY_RESTRICT out) {
  const DF df;
  const size_t N = hn::Lanes(df);
  size_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    EncodeBf16Vec(x + i, out + i);
    EncodeBf16Vec(x + i + N, out + i + N);
  }
  for (; i + N <= n; i += N) EncodeBf16Vec(x + i, out + i);
  if (i < n) {
    HWY_ALIGN float xbuf[kMaxLanes] = {};
    HWY_ALIGN uint16_t obuf[kMaxLanes];
    std::memcpy(xbuf, x + i, (n - i) * sizeof(float));
    EncodeBf16Vec(xbuf, obuf);
    std::memcpy(out + i, obuf, (n - i) * sizeof(uint16_t));
  }
}

// DecodeBf16Vec decodes one full vector in[0, Lanes) into out[0, Lanes).
HWY_INLINE void DecodeBf16Vec(const uint16_t* HWY_RESTRICT in, float* HWY_RESTRICT out) {
  const DF df;
  const DU du;
  const D16 d16;
  const VU h = hn::PromoteTo(du, hn::LoadU(d16, in));
  hn::StoreU(hn::BitCast(df, hn::ShiftLeft<16>(h)), df, out);
}

void DecodeBf16Impl(const uint16_t* HWY_RESTRICT in, size_t n, float* HWY_RESTRICT out) {
  const DF df;
  const size_t N = hn::Lanes(df);
  size_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    DecodeBf16Vec(in + i, out + i);
    DecodeBf16Vec(in + i + N, out + i + N);
  }
  for (; i + N <= n; i += N) DecodeBf16Vec(in + i, out + i);
  if (i < n) {
    HWY_ALIGN uint16_t ibuf[kMaxLanes] = {};
    HWY_ALIGN float obuf[kMaxLanes];
    std::memcpy(ibuf, in + i, (n - i) * sizeof(uint16_t));
    DecodeBf16Vec(ibuf, obuf);
    std::memcpy(out + i, obuf, (n - i) * sizeof(float));
  }
}

}  // namespace
}  // namespace HWY_NAMESPACE
}  // namespace kvguard::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvguard::kernels {

HWY_EXPORT(EncodeFp8Impl);
HWY_EXPORT(DecodeFp8Impl);
HWY_EXPORT(EncodeBf16Impl);
HWY_EXPORT(DecodeBf16Impl);

void EncodeFp8(const float* x, size_t n, float scale, uint8_t* out) {
  ABSL_RAW_CHECK(std::isfinite(scale) && scale > 0.0f, "EncodeFp8: scale must be finite and > 0");
  HWY_DYNAMIC_DISPATCH(EncodeFp8Impl)(x, n, scale, out);
}

void DecodeFp8(const uint8_t* in, size_t n, float scale, float* out) {
  HWY_DYNAMIC_DISPATCH(DecodeFp8Impl)(in, n, scale, out);
}

void EncodeBf16(const float* x, size_t n, uint16_t* out) {
  HWY_DYNAMIC_DISPATCH(EncodeBf16Impl)(x, n, out);
}

void DecodeBf16(const uint16_t* in, size_t n, float* out) {
  HWY_DYNAMIC_DISPATCH(DecodeBf16Impl)(in, n, out);
}

}  // namespace kvguard::kernels
#endif  // HWY_ONCE
