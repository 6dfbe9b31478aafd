// Tests for BF16: the scalar codec in kernels/formats.h against the format's definition, and the
// bulk codecs (ref and SIMD on every supported Highway target) against it.
//
// The oracle is written from the definition: a bf16 value is (-1)^S * 2^(E-127) * (1 + M/128)
// (normal) or (-1)^S * 2^-126 * M/128 (subnormal); encoding picks the nearer of the two bf16
// neighbours of |x| by an exact comparison in double (ties to the even code), with IEEE's
// overflow rule: past the largest finite value, the next "neighbour" is 2^128, i.e. inf.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/codec.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/formats.h"

namespace kvguard::kernels {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr uint16_t kMaxFinite = 0x7F7F;
constexpr uint16_t kPlusInf = 0x7F80;

template <typename Body>
void ForEachTarget(Body body) {
  struct Reset {
    ~Reset() { ResetTarget(); }
  } reset;
  const std::vector<int64_t> targets = SupportedTargets();
  ASSERT_FALSE(targets.empty());
  for (int64_t t : targets) {
    SCOPED_TRACE(TargetName(t));
    ForceTarget(t);
    body();
  }
}

uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }
float FromBits(uint32_t b) { return std::bit_cast<float>(b); }

bool IsNanCode(uint16_t h) { return (h & 0x7F80) == 0x7F80 && (h & 0x7F) != 0; }

// DefinitionValue returns the value of bf16 bits `h` from the definition (inf for E = 255 and
// M = 0, NaN for E = 255 and M != 0).
double DefinitionValue(uint16_t h) {
  const int s = h >> 15;
  const int e = (h >> 7) & 0xFF;
  const int m = h & 0x7F;
  double magnitude;
  if (e == 255) {
    magnitude =
        m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else if (e == 0) {
    magnitude = std::ldexp(m / 128.0, -126);
  } else {
    magnitude = std::ldexp(1.0 + m / 128.0, e - 127);
  }
  return s ? -magnitude : magnitude;
}

// OracleEncode returns the bf16 code nearest to finite or infinite `x` (see the file comment).
// NaN inputs are checked separately (any quiet NaN of the same sign is right).
uint16_t OracleEncode(float x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(x));
  if (std::isinf(a)) return sign | kPlusInf;
  // Dropping the low 16 bits of a non-negative float moves it toward zero onto a bf16 value:
  // the largest one <= a. `hi` is the next one up.
  const uint16_t lo = static_cast<uint16_t>((Bits(x) & 0x7FFFFFFFu) >> 16);
  const uint16_t hi = static_cast<uint16_t>(lo + 1);
  const double lo_value = DefinitionValue(lo);
  const double hi_value = lo == kMaxFinite ? std::ldexp(1.0, 128) : DefinitionValue(hi);
  const double below = a - lo_value;  // exact: both are floats within a factor of 2
  const double above = hi_value - a;
  if (below < above) return sign | lo;
  if (above < below) return sign | hi;
  return sign | (lo % 2 == 0 ? lo : hi);
}

// Midpoints returns, for every pair of neighbouring non-negative bf16 values (the largest
// finite one and inf included), both signs of the midpoint and of the floats just around it.
std::vector<float> MidpointsAndNeighbours() {
  std::vector<float> v;
  for (uint32_t h = 0; h < kPlusInf; ++h) {
    const double hi = h == kMaxFinite ? std::ldexp(1.0, 128) : DefinitionValue(h + 1);
    const float mid = static_cast<float>((DefinitionValue(static_cast<uint16_t>(h)) + hi) / 2);
    for (float m : {mid, -mid}) {
      v.push_back(m);
      v.push_back(std::nextafter(m, -kInf));
      v.push_back(std::nextafter(m, kInf));
    }
  }
  return v;
}

std::vector<float> SpecialInputs() {
  return {0.0f,
          -0.0f,
          kInf,
          -kInf,
          FLT_MAX,
          -FLT_MAX,
          FLT_MIN,
          -FLT_MIN,
          1e-40f,
          FLT_TRUE_MIN,
          -FLT_TRUE_MIN,
          1.0f,
          -1.0f,
          3.0e38f,
          1e30f,
          1e-30f,
          FromBits(0x7F7F8000u),
          FromBits(0x7F7F7FFFu),
          FromBits(0x00008000u),
          FromBits(0x00018000u)};
}

std::vector<float> NanInputs() {
  std::vector<float> v;
  for (uint32_t b :
       {0x7FC00000u, 0x7F800001u, 0x7FFFFFFFu, 0x7F80FFFFu, 0x7FA00000u, 0x7F810000u}) {
    v.push_back(FromBits(b));
    v.push_back(FromBits(b | 0x80000000u));
  }
  return v;
}

// ---------------------------------------------------------------------------------------------
// The scalar codec (formats.h) against the definition.
// ---------------------------------------------------------------------------------------------

TEST(Bf16Scalar, EveryCodeDecodesToItsDefinition) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const double want = DefinitionValue(static_cast<uint16_t>(h));
    const float got = Bf16ToFloat(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << h;
    } else {
      ASSERT_EQ(static_cast<double>(got), want) << h;
    }
    ASSERT_EQ(std::signbit(got), h >= 0x8000) << h;
  }
  EXPECT_EQ(Bf16ToFloat(0x3F80), 1.0f);
  EXPECT_EQ(Bf16ToFloat(0xC040), -3.0f);
}

TEST(Bf16Scalar, EveryNonNanCodeRoundTripsExactly) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    if (IsNanCode(static_cast<uint16_t>(h))) continue;
    ASSERT_EQ(Bf16FromFloat(Bf16ToFloat(static_cast<uint16_t>(h))), h);
  }
  EXPECT_EQ(Bf16FromFloat(-0.0f), 0x8000);
  EXPECT_EQ(Bf16FromFloat(0.0f), 0x0000);
}

TEST(Bf16Scalar, MidpointsTieToEvenAndNeighboursRoundToNearest) {
  for (uint32_t h = 0; h < kPlusInf; ++h) {
    const double lo = DefinitionValue(static_cast<uint16_t>(h));
    const double hi = h == kMaxFinite ? std::ldexp(1.0, 128) : DefinitionValue(h + 1);
    const float mid = static_cast<float>((lo + hi) / 2);
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2) << h;  // exact: 9 significant bits
    const uint32_t even = h % 2 == 0 ? h : h + 1;
    ASSERT_EQ(Bf16FromFloat(mid), even) << h;
    ASSERT_EQ(Bf16FromFloat(std::nextafter(mid, 0.0f)), h) << h;
    ASSERT_EQ(Bf16FromFloat(std::nextafter(mid, kInf)), h + 1) << h;
    ASSERT_EQ(Bf16FromFloat(-mid), 0x8000 | even) << h;
  }
}

TEST(Bf16Scalar, OverflowsToInfOnlyByRounding) {
  EXPECT_EQ(Bf16FromFloat(FLT_MAX), kPlusInf);
  EXPECT_EQ(Bf16FromFloat(-FLT_MAX), 0x8000 | kPlusInf);
  EXPECT_EQ(Bf16FromFloat(FromBits(0x7F7F8000u)), kPlusInf);  // tie: 0x7F7F is odd
  EXPECT_EQ(Bf16FromFloat(kInf), kPlusInf);
  // Twins: below the midpoint the largest finite value stays finite.
  EXPECT_EQ(Bf16FromFloat(FromBits(0x7F7F7FFFu)), kMaxFinite);
  EXPECT_EQ(Bf16FromFloat(FromBits(0x7F7F0000u)), kMaxFinite);
}

TEST(Bf16Scalar, NanStaysQuietNanOfTheSameSign) {
  for (float x : NanInputs()) {
    const uint16_t h = Bf16FromFloat(x);
    EXPECT_TRUE(IsNanCode(h)) << std::hex << Bits(x);
    EXPECT_NE(h & 0x40, 0) << "not quiet: " << std::hex << Bits(x);
    EXPECT_EQ(h >> 15, Bits(x) >> 31) << std::hex << Bits(x);
  }
  EXPECT_FALSE(IsNanCode(Bf16FromFloat(kInf)));  // twin
}

TEST(Bf16Scalar, Subnormals) {
  EXPECT_EQ(Bf16FromFloat(FromBits(0x00010000u)), 0x0001);  // smallest bf16 subnormal
  EXPECT_EQ(Bf16FromFloat(FromBits(0x00008000u)), 0x0000);  // tie with 0: even
  EXPECT_EQ(Bf16FromFloat(FromBits(0x00008001u)), 0x0001);
  EXPECT_EQ(Bf16FromFloat(FromBits(0x00018000u)), 0x0002);  // tie between 1 and 2
  EXPECT_EQ(Bf16FromFloat(FromBits(0x007FFFFFu)), 0x0080);  // rounds up to FLT_MIN
  EXPECT_EQ(Bf16FromFloat(FLT_TRUE_MIN), 0x0000);
  EXPECT_EQ(Bf16FromFloat(-FLT_TRUE_MIN), 0x8000);
}

TEST(Bf16Scalar, AgreesWithTheOracle) {
  std::vector<float> xs = SpecialInputs();
  std::mt19937 rng(3);
  for (int i = 0; i < 100000; ++i) {
    const float x = FromBits(static_cast<uint32_t>(rng()));
    if (!std::isnan(x)) xs.push_back(x);
  }
  for (float x : xs) ASSERT_EQ(Bf16FromFloat(x), OracleEncode(x)) << std::hex << Bits(x);
}

// ---------------------------------------------------------------------------------------------
// Bulk codecs: ref and SIMD (every target) against the definition and the oracle.
// ---------------------------------------------------------------------------------------------

TEST(DecodeBf16, EveryCodeMatchesDefinition) {
  std::vector<uint16_t> codes(0x10000);
  for (uint32_t h = 0; h <= 0xFFFF; ++h) codes[h] = static_cast<uint16_t>(h);
  auto check = [&](const std::vector<float>& got) {
    for (uint32_t h = 0; h <= 0xFFFF; ++h) {
      const double want = DefinitionValue(static_cast<uint16_t>(h));
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(got[h])) << h;
      } else {
        ASSERT_EQ(static_cast<double>(got[h]), want) << h;
      }
      ASSERT_EQ(std::signbit(got[h]), h >= 0x8000) << h;
    }
  };
  std::vector<float> out(codes.size());
  ref::DecodeBf16(codes.data(), codes.size(), out.data());
  check(out);
  ForEachTarget([&] {
    std::vector<float> simd(codes.size());
    DecodeBf16(codes.data(), codes.size(), simd.data());
    check(simd);
  });
}

void ExpectMatchesOracle(const std::vector<float>& x, const std::vector<uint16_t>& got) {
  ASSERT_EQ(got.size(), x.size());
  int failures = 0;
  for (size_t i = 0; i < x.size() && failures < 10; ++i) {
    if (std::isnan(x[i])) {
      if (!IsNanCode(got[i]) || (got[i] & 0x40) == 0 || (got[i] >> 15) != (Bits(x[i]) >> 31)) {
        ++failures;
        ADD_FAILURE() << "NaN 0x" << std::hex << Bits(x[i]) << " gave 0x" << got[i];
      }
    } else if (got[i] != OracleEncode(x[i])) {
      ++failures;
      ADD_FAILURE() << "x=" << x[i] << " (0x" << std::hex << Bits(x[i]) << "): got 0x" << got[i]
                    << ", want 0x" << OracleEncode(x[i]);
    }
  }
}

std::vector<float> OracleInputs() {
  std::vector<float> v = MidpointsAndNeighbours();
  for (float x : SpecialInputs()) v.push_back(x);
  for (float x : NanInputs()) v.push_back(x);
  std::mt19937 rng(4);
  for (int i = 0; i < 20000; ++i) v.push_back(FromBits(static_cast<uint32_t>(rng())));
  return v;
}

TEST(EncodeBf16, RefMatchesOracle) {
  const std::vector<float> x = OracleInputs();
  std::vector<uint16_t> out(x.size());
  ref::EncodeBf16(x.data(), x.size(), out.data());
  ExpectMatchesOracle(x, out);
}

TEST(EncodeBf16, SimdMatchesOracleOnEveryTarget) {
  const std::vector<float> x = OracleInputs();
  ForEachTarget([&] {
    std::vector<uint16_t> out(x.size());
    EncodeBf16(x.data(), x.size(), out.data());
    ExpectMatchesOracle(x, out);
  });
}

// ---------------------------------------------------------------------------------------------
// SIMD == scalar, bit for bit, every length 0..1000, unaligned starts, every target.
// ---------------------------------------------------------------------------------------------

constexpr size_t kMaxLength = 1000;
constexpr size_t kGuard = 64;

// RandomEncoderInput mixes ordinary values, exact midpoints and their neighbours, specials,
// NaNs with payloads and raw random bit patterns.
std::vector<float> RandomEncoderInput(std::mt19937& rng, size_t n) {
  static const std::vector<float> mids = MidpointsAndNeighbours();
  static const std::vector<float> specials = SpecialInputs();
  static const std::vector<float> nans = NanInputs();
  std::normal_distribution<float> normal(0.0f, 10.0f);
  std::vector<float> x(n);
  for (float& v : x) {
    switch (rng() % 5) {
      case 0:
        v = FromBits(static_cast<uint32_t>(rng()));
        break;
      case 1:
        v = normal(rng);
        break;
      case 2:
        v = mids[rng() % mids.size()];
        break;
      case 3:
        v = specials[rng() % specials.size()];
        break;
      default:
        v = nans[rng() % nans.size()];
        break;
    }
  }
  return x;
}

TEST(EncodeBf16, SimdEqualsScalarEveryLengthUnaligned) {
  std::mt19937 rng(5);
  ForEachTarget([&] {
    for (size_t n = 0; n <= kMaxLength; ++n) {
      for (size_t offset = 1; offset <= 3; ++offset) {
        const std::vector<float> values = RandomEncoderInput(rng, n);
        std::vector<float> in(offset + n);  // exactly sized: ASan flags reads past the end
        std::copy(values.begin(), values.end(), in.begin() + offset);
        std::vector<uint16_t> want(n);
        ref::EncodeBf16(in.data() + offset, n, want.data());
        std::vector<uint16_t> got(offset + n + kGuard, 0xA5A5);
        EncodeBf16(in.data() + offset, n, got.data() + offset);
        ASSERT_TRUE(std::equal(want.begin(), want.end(), got.begin() + offset))
            << "n=" << n << " offset=" << offset;
        for (size_t i = 0; i < offset; ++i) ASSERT_EQ(got[i], 0xA5A5) << "write before start";
        for (size_t i = offset + n; i < got.size(); ++i) ASSERT_EQ(got[i], 0xA5A5) << "past end";
      }
    }
  });
}

TEST(DecodeBf16, SimdEqualsScalarEveryLengthUnaligned) {
  std::mt19937 rng(6);
  ForEachTarget([&] {
    for (size_t n = 0; n <= kMaxLength; ++n) {
      for (size_t offset = 1; offset <= 3; ++offset) {
        std::vector<uint16_t> in(offset + n);
        for (uint16_t& h : in) h = static_cast<uint16_t>(rng());
        std::vector<float> want(n);
        ref::DecodeBf16(in.data() + offset, n, want.data());
        std::vector<float> got(offset + n + kGuard, FromBits(0xDEADBEEFu));
        DecodeBf16(in.data() + offset, n, got.data() + offset);
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(Bits(got[offset + i]), Bits(want[i])) << "n=" << n << " i=" << i;
        }
        for (size_t i = 0; i < offset; ++i) ASSERT_EQ(Bits(got[i]), 0xDEADBEEFu);
        for (size_t i = offset + n; i < got.size(); ++i) ASSERT_EQ(Bits(got[i]), 0xDEADBEEFu);
      }
    }
  });
}

}  // namespace
}  // namespace kvguard::kernels
