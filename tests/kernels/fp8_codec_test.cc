// Tests for FP8 e4m3 (OCP e4m3fn): the scalar codec in kernels/formats.h against the format's
// definition, and the bulk codecs (ref and SIMD on every supported Highway target) against it.
//
// The oracles here are written from the definition, independently of the implementation:
// a code's value is (-1)^S * 2^(E-7) * (1 + M/8) (normal) or (-1)^S * 2^-6 * M/8 (subnormal),
// and encoding is an exhaustive nearest-value search over the 127 finite magnitudes.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/codec.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/formats.h"

namespace kvguard::kernels {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// ForEachTarget runs `body` once per Highway target this CPU supports (forced), then restores
// normal dispatch even when `body` fails.
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

// DefinitionValue returns the value of code `c` from the format's definition (NaN for
// S.1111.111, with the code's sign).
double DefinitionValue(uint8_t c) {
  const int s = c >> 7;
  const int e = (c >> 3) & 0xF;
  const int m = c & 7;
  if (e == 15 && m == 7) return std::copysign(std::numeric_limits<double>::quiet_NaN(), s ? -1 : 1);
  const double magnitude = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -magnitude : magnitude;
}

// OracleEncode returns the e4m3 code nearest to `y` by exhaustive search (ties to the even
// code, |y| clamped to 448 first), with the sign of `y`; NaN gives sign | 0x7F.
uint8_t OracleEncode(float y) {
  const uint8_t sign = std::signbit(y) ? 0x80 : 0x00;
  if (std::isnan(y)) return sign | 0x7F;
  const double a = std::min(std::fabs(static_cast<double>(y)), 448.0);
  uint8_t best = 0;
  double best_distance = std::numeric_limits<double>::infinity();
  for (int c = 0; c <= 0x7E; ++c) {
    const double distance = std::fabs(DefinitionValue(static_cast<uint8_t>(c)) - a);
    if (distance < best_distance || (distance == best_distance && c % 2 == 0)) {
      best = static_cast<uint8_t>(c);
      best_distance = distance;
    }
  }
  return sign | best;
}

uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }

// SameBits says whether a[0, n) and b[0, n) are equal bit for bit (NaN payloads included).
bool SameBits(const float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (Bits(a[i]) != Bits(b[i])) return false;
  }
  return true;
}
float FromBits(uint32_t b) { return std::bit_cast<float>(b); }

// Midpoints returns, for every pair of neighbouring finite codes of both signs, the midpoint
// and the floats just below and above it.
std::vector<float> MidpointsAndNeighbours() {
  std::vector<float> v;
  for (int c = 0; c < 0x7E; ++c) {
    const float mid = static_cast<float>(
        (DefinitionValue(static_cast<uint8_t>(c)) + DefinitionValue(static_cast<uint8_t>(c + 1))) /
        2);
    for (float m : {mid, -mid}) {
      v.push_back(m);
      v.push_back(std::nextafter(m, -kInf));
      v.push_back(std::nextafter(m, kInf));
    }
  }
  return v;
}

// SpecialInputs returns values every encoder test should see: zeros, NaNs of both signs and
// several payloads, infinities, saturation, FP32 subnormals and e4m3 subnormals.
std::vector<float> SpecialInputs() {
  return {0.0f,
          -0.0f,
          std::numeric_limits<float>::quiet_NaN(),
          -std::numeric_limits<float>::quiet_NaN(),
          FromBits(0x7F800001u),  // signalling NaN
          FromBits(0xFFFFFFFFu),
          FromBits(0x7FFFFFFFu),
          kInf,
          -kInf,
          FLT_MAX,
          -FLT_MAX,
          1e30f,
          -1e30f,
          448.0f,
          -448.0f,
          450.0f,
          463.999f,
          464.0f,
          -464.0f,
          464.0001f,
          1000.0f,
          FLT_TRUE_MIN,
          -FLT_TRUE_MIN,
          1e-40f,
          FLT_MIN,
          0x1p-6f,
          0x1p-9f,
          0x1p-10f,
          -0x1p-10f,
          0x1p-11f,
          15 * 0x1p-10f};
}

// ---------------------------------------------------------------------------------------------
// The scalar codec (formats.h) against the definition.
// ---------------------------------------------------------------------------------------------

TEST(Fp8E4m3Scalar, EveryCodeDecodesToItsDefinition) {
  for (int i = 0; i < 256; ++i) {
    const uint8_t c = static_cast<uint8_t>(i);
    SCOPED_TRACE(testing::Message() << "code 0x" << std::hex << i);
    const double want = DefinitionValue(c);
    const float got = Fp8E4m3ToFloat(c);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got));
    } else {
      EXPECT_EQ(static_cast<double>(got), want);
    }
    EXPECT_EQ(std::signbit(got), (c & 0x80) != 0);
  }
}

TEST(Fp8E4m3Scalar, HandPickedCodes) {
  EXPECT_EQ(Fp8E4m3ToFloat(0x38), 1.0f);
  EXPECT_EQ(Fp8E4m3ToFloat(0xB8), -1.0f);
  EXPECT_EQ(Fp8E4m3ToFloat(0x7E), 448.0f);
  EXPECT_EQ(Fp8E4m3ToFloat(0x7D), 416.0f);
  EXPECT_EQ(Fp8E4m3ToFloat(0x08), 0x1p-6f);      // smallest normal
  EXPECT_EQ(Fp8E4m3ToFloat(0x07), 7 * 0x1p-9f);  // largest subnormal
  EXPECT_EQ(Fp8E4m3ToFloat(0x01), 0x1p-9f);      // smallest subnormal
  EXPECT_EQ(Bits(Fp8E4m3ToFloat(0x80)), Bits(-0.0f));
  EXPECT_TRUE(std::isnan(Fp8E4m3ToFloat(0x7F)));
  EXPECT_TRUE(std::isnan(Fp8E4m3ToFloat(0xFF)));
  EXPECT_TRUE(std::signbit(Fp8E4m3ToFloat(0xFF)));
  EXPECT_FALSE(std::isnan(Fp8E4m3ToFloat(0x7E)));  // twin: S.1111.110 is a number
  EXPECT_EQ(Fp8E4m3FromFloat(1.0f), 0x38);
  EXPECT_EQ(Fp8E4m3FromFloat(3.0f), 0x44);
  EXPECT_EQ(Fp8E4m3FromFloat(-1.5f), 0xBC);
}

TEST(Fp8E4m3Scalar, EveryFiniteCodeRoundTripsExactly) {
  for (int i = 0; i < 256; ++i) {
    const uint8_t c = static_cast<uint8_t>(i);
    if ((c & 0x7F) == 0x7F) continue;
    EXPECT_EQ(Fp8E4m3FromFloat(Fp8E4m3ToFloat(c)), c) << "code " << i;
  }
  EXPECT_EQ(Fp8E4m3FromFloat(0.0f), 0x00);
  EXPECT_EQ(Fp8E4m3FromFloat(-0.0f), 0x80);
}

TEST(Fp8E4m3Scalar, MidpointsTieToEvenAndNeighboursRoundToNearest) {
  for (int c = 0; c < 0x7E; ++c) {
    SCOPED_TRACE(testing::Message() << "between codes " << c << " and " << c + 1);
    const double lo = DefinitionValue(static_cast<uint8_t>(c));
    const double hi = DefinitionValue(static_cast<uint8_t>(c + 1));
    const float mid = static_cast<float>((lo + hi) / 2);
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2);  // exact: at most 5 significant bits
    const uint8_t even = static_cast<uint8_t>(c % 2 == 0 ? c : c + 1);
    EXPECT_EQ(Fp8E4m3FromFloat(mid), even);
    EXPECT_EQ(Fp8E4m3FromFloat(std::nextafter(mid, 0.0f)), c);
    EXPECT_EQ(Fp8E4m3FromFloat(std::nextafter(mid, kInf)), c + 1);
    EXPECT_EQ(Fp8E4m3FromFloat(-mid), 0x80 | even);
    EXPECT_EQ(Fp8E4m3FromFloat(-std::nextafter(mid, 0.0f)), 0x80 | c);
    EXPECT_EQ(Fp8E4m3FromFloat(-std::nextafter(mid, kInf)), 0x80 | (c + 1));
  }
}

TEST(Fp8E4m3Scalar, SaturatesToPlusMinus448) {
  for (float x : {448.0f, 448.5f, 455.0f, 460.0f, 463.999f, 464.0f, 464.0001f, 500.0f, 1e30f,
                  FLT_MAX, kInf}) {
    EXPECT_EQ(Fp8E4m3FromFloat(x), 0x7E) << x;
    EXPECT_EQ(Fp8E4m3FromFloat(-x), 0xFE) << -x;
  }
  // Twins: just below the top, values still round to the neighbouring finite codes.
  EXPECT_EQ(Fp8E4m3FromFloat(431.99f), 0x7D);
  EXPECT_EQ(Fp8E4m3FromFloat(432.0f), 0x7E);  // tie between 416 (odd code) and 448
  EXPECT_EQ(Fp8E4m3FromFloat(-431.99f), 0xFD);
}

TEST(Fp8E4m3Scalar, NanKeepsItsSign) {
  for (uint32_t b : {0x7FC00000u, 0x7F800001u, 0x7FFFFFFFu, 0x7FA00000u}) {
    EXPECT_EQ(Fp8E4m3FromFloat(FromBits(b)), 0x7F) << std::hex << b;
    EXPECT_EQ(Fp8E4m3FromFloat(FromBits(b | 0x80000000u)), 0xFF) << std::hex << b;
  }
  EXPECT_NE(Fp8E4m3FromFloat(kInf), 0x7F);  // twin: inf is not NaN
}

TEST(Fp8E4m3Scalar, SubnormalsAndTheNormalBoundary) {
  EXPECT_EQ(Fp8E4m3FromFloat(0x1p-9f), 0x01);
  EXPECT_EQ(Fp8E4m3FromFloat(0x1p-10f), 0x00);  // tie between 0 and 2^-9: even is 0
  EXPECT_EQ(Fp8E4m3FromFloat(std::nextafter(0x1p-10f, 1.0f)), 0x01);
  EXPECT_EQ(Fp8E4m3FromFloat(-0x1p-10f), 0x80);
  EXPECT_EQ(Fp8E4m3FromFloat(3 * 0x1p-10f), 0x02);  // tie between 1 and 2
  EXPECT_EQ(Fp8E4m3FromFloat(5 * 0x1p-10f), 0x02);  // tie between 2 and 3
  EXPECT_EQ(Fp8E4m3FromFloat(FLT_TRUE_MIN), 0x00);
  EXPECT_EQ(Fp8E4m3FromFloat(-FLT_TRUE_MIN), 0x80);
  EXPECT_EQ(Fp8E4m3FromFloat(1e-40f), 0x00);
  // Subnormal/normal boundary: 7 * 2^-9 | 7.5 * 2^-9 | 8 * 2^-9 = 2^-6.
  EXPECT_EQ(Fp8E4m3FromFloat(7 * 0x1p-9f), 0x07);
  EXPECT_EQ(Fp8E4m3FromFloat(15 * 0x1p-10f), 0x08);
  EXPECT_EQ(Fp8E4m3FromFloat(std::nextafter(15 * 0x1p-10f, 0.0f)), 0x07);
  EXPECT_EQ(Fp8E4m3FromFloat(std::nextafter(0x1p-6f, 0.0f)), 0x08);
  EXPECT_EQ(Fp8E4m3FromFloat(0x1p-6f), 0x08);
  EXPECT_EQ(Fp8E4m3FromFloat(0x1p-6f * 1.125f), 0x09);
}

TEST(Fp8E4m3Scalar, AgreesWithTheOracleOnEverySpecialAndMidpoint) {
  std::vector<float> xs = MidpointsAndNeighbours();
  const std::vector<float> specials = SpecialInputs();
  xs.insert(xs.end(), specials.begin(), specials.end());
  for (float x : xs) EXPECT_EQ(Fp8E4m3FromFloat(x), OracleEncode(x)) << x;
}

// ---------------------------------------------------------------------------------------------
// Bulk codecs: ref and SIMD (every target) against the oracle, with scales.
// ---------------------------------------------------------------------------------------------

constexpr float kScales[] = {1.0f, 0.5f, 3.0f, 1e-3f, 0x1p-12f, 1000.0f};

// ScaledInputs returns `values` times `scale` (the ties survive exactly for power-of-two and
// small-integer scales).
std::vector<float> ScaledInputs(const std::vector<float>& values, float scale) {
  std::vector<float> x(values.size());
  for (size_t i = 0; i < values.size(); ++i) x[i] = values[i] * scale;
  return x;
}

std::vector<float> OracleInputs() {
  std::vector<float> v = MidpointsAndNeighbours();
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) != 0x7F)
      v.push_back(static_cast<float>(DefinitionValue(static_cast<uint8_t>(c))));
  }
  const std::vector<float> specials = SpecialInputs();
  v.insert(v.end(), specials.begin(), specials.end());
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> wide(-500.0f, 500.0f);
  std::uniform_real_distribution<float> tiny(-0x1p-5f, 0x1p-5f);
  for (int i = 0; i < 500; ++i) {
    v.push_back(wide(rng));
    v.push_back(tiny(rng));
    v.push_back(FromBits(static_cast<uint32_t>(rng())));
  }
  return v;
}

void ExpectEncodesMatchOracle(const std::vector<float>& x, float scale,
                              const std::vector<uint8_t>& got) {
  ASSERT_EQ(got.size(), x.size());
  int failures = 0;
  for (size_t i = 0; i < x.size() && failures < 10; ++i) {
    const uint8_t want = OracleEncode(x[i] / scale);
    if (got[i] != want) {
      ++failures;
      ADD_FAILURE() << "x=" << x[i] << " (bits 0x" << std::hex << Bits(x[i]) << ") scale=" << scale
                    << ": got 0x" << int{got[i]} << ", want 0x" << int{want};
    }
  }
}

TEST(EncodeFp8, RefMatchesOracleWithScales) {
  const std::vector<float> values = OracleInputs();
  for (float scale : kScales) {
    const std::vector<float> x = ScaledInputs(values, scale);
    std::vector<uint8_t> out(x.size());
    ref::EncodeFp8(x.data(), x.size(), scale, out.data());
    ExpectEncodesMatchOracle(x, scale, out);
  }
}

TEST(EncodeFp8, SimdMatchesOracleWithScalesOnEveryTarget) {
  const std::vector<float> values = OracleInputs();
  ForEachTarget([&] {
    for (float scale : kScales) {
      const std::vector<float> x = ScaledInputs(values, scale);
      std::vector<uint8_t> out(x.size());
      EncodeFp8(x.data(), x.size(), scale, out.data());
      ExpectEncodesMatchOracle(x, scale, out);
    }
  });
}

TEST(EncodeFp8, ScaleDividesByHand) {
  ForEachTarget([] {
    const float x[] = {1.5f, -1.5f, 448.0f, 0.75f};
    uint8_t out[4];
    EncodeFp8(x, 4, 0.5f, out);  // stored values 3, -3, 896 -> 448, 1.5
    EXPECT_EQ(out[0], 0x44);
    EXPECT_EQ(out[1], 0xC4);
    EXPECT_EQ(out[2], 0x7E);
    EXPECT_EQ(out[3], 0x3C);
    EncodeFp8(x, 4, 1.0f, out);  // twin: scale 1 stores the values themselves
    EXPECT_EQ(out[0], 0x3C);
    EXPECT_EQ(out[3], 0x34);
  });
}

TEST(DecodeFp8, EveryCodeWithScalesMatchesDefinition) {
  std::vector<uint8_t> codes(256);
  for (int i = 0; i < 256; ++i) codes[i] = static_cast<uint8_t>(i);
  auto check = [&](const std::vector<float>& got, float scale) {
    for (int i = 0; i < 256; ++i) {
      const double def = DefinitionValue(static_cast<uint8_t>(i));
      SCOPED_TRACE(testing::Message() << "code " << i << " scale " << scale);
      if (std::isnan(def)) {
        EXPECT_TRUE(std::isnan(got[i]));
      } else {
        // One FP32 rounding of the exact product is the contract.
        EXPECT_EQ(Bits(got[i]), Bits(static_cast<float>(def) * scale));
      }
      EXPECT_EQ(std::signbit(got[i]), i >= 0x80);
    }
  };
  for (float scale : kScales) {
    std::vector<float> out(256);
    ref::DecodeFp8(codes.data(), 256, scale, out.data());
    check(out, scale);
  }
  ForEachTarget([&] {
    for (float scale : kScales) {
      std::vector<float> out(256);
      DecodeFp8(codes.data(), 256, scale, out.data());
      check(out, scale);
    }
  });
}

TEST(DecodeFp8, ScaleMultipliesByHand) {
  ForEachTarget([] {
    const uint8_t c[] = {0x44, 0xC4, 0x7E, 0x01};
    float out[4];
    DecodeFp8(c, 4, 0.5f, out);
    EXPECT_EQ(out[0], 1.5f);
    EXPECT_EQ(out[1], -1.5f);
    EXPECT_EQ(out[2], 224.0f);
    EXPECT_EQ(out[3], 0x1p-10f);
    DecodeFp8(c, 4, 1.0f, out);  // twin
    EXPECT_EQ(out[0], 3.0f);
    EXPECT_EQ(out[2], 448.0f);
  });
}

// ---------------------------------------------------------------------------------------------
// SIMD == scalar, bit for bit, every length 0..1000, unaligned starts, every target.
// ---------------------------------------------------------------------------------------------

constexpr size_t kMaxLength = 1000;
constexpr size_t kGuard = 64;  // output elements checked untouched on each side

// RandomEncoderInput returns n floats: FP8-range values, exact midpoints, e4m3 subnormals,
// specials and raw random bit patterns (huge, tiny, FP32 subnormals, NaN payloads).
std::vector<float> RandomEncoderInput(std::mt19937& rng, size_t n, float scale) {
  static const std::vector<float> mids = MidpointsAndNeighbours();
  static const std::vector<float> specials = SpecialInputs();
  std::uniform_real_distribution<float> wide(-480.0f, 480.0f);
  std::uniform_real_distribution<float> tiny(-0x1p-5f, 0x1p-5f);
  std::vector<float> x(n);
  for (float& v : x) {
    switch (rng() % 6) {
      case 0:
        v = FromBits(static_cast<uint32_t>(rng()));
        break;
      case 1:
        v = wide(rng) * scale;
        break;
      case 2:
        v = mids[rng() % mids.size()] * scale;
        break;
      case 3:
        v = tiny(rng) * scale;
        break;
      case 4:
        v = specials[rng() % specials.size()];
        break;
      default:
        v = wide(rng);
        break;
    }
  }
  return x;
}

TEST(EncodeFp8, SimdEqualsScalarEveryLengthUnaligned) {
  std::mt19937 rng(1);
  ForEachTarget([&] {
    for (size_t n = 0; n <= kMaxLength; ++n) {
      for (size_t offset = 1; offset <= 3; ++offset) {
        const float scale = kScales[(n + offset) % std::size(kScales)];
        const std::vector<float> values = RandomEncoderInput(rng, n, scale);
        // Exactly sized, so ASan flags any read past the end.
        std::vector<float> in(offset + n);
        std::copy(values.begin(), values.end(), in.begin() + offset);
        std::vector<uint8_t> want(n);
        ref::EncodeFp8(in.data() + offset, n, scale, want.data());
        std::vector<uint8_t> got(offset + n + kGuard, 0xA5);
        EncodeFp8(in.data() + offset, n, scale, got.data() + offset);
        ASSERT_TRUE(std::equal(want.begin(), want.end(), got.begin() + offset))
            << "n=" << n << " offset=" << offset << " scale=" << scale;
        for (size_t i = 0; i < offset; ++i) ASSERT_EQ(got[i], 0xA5) << "write before start";
        for (size_t i = offset + n; i < got.size(); ++i)
          ASSERT_EQ(got[i], 0xA5) << "write past end";
      }
    }
  });
}

TEST(DecodeFp8, SimdEqualsScalarEveryLengthUnaligned) {
  std::mt19937 rng(2);
  ForEachTarget([&] {
    for (size_t n = 0; n <= kMaxLength; ++n) {
      for (size_t offset = 1; offset <= 3; ++offset) {
        const float scale = kScales[(n + offset) % std::size(kScales)];
        std::vector<uint8_t> in(offset + n);
        for (uint8_t& c : in) c = static_cast<uint8_t>(rng());
        std::vector<float> want(n);
        ref::DecodeFp8(in.data() + offset, n, scale, want.data());
        std::vector<float> got(offset + n + kGuard, FromBits(0xDEADBEEFu));
        DecodeFp8(in.data() + offset, n, scale, got.data() + offset);
        ASSERT_TRUE(SameBits(want.data(), got.data() + offset, n))
            << "n=" << n << " offset=" << offset << " scale=" << scale;
        for (size_t i = 0; i < offset; ++i) ASSERT_EQ(Bits(got[i]), 0xDEADBEEFu);
        for (size_t i = offset + n; i < got.size(); ++i) ASSERT_EQ(Bits(got[i]), 0xDEADBEEFu);
      }
    }
  });
}

TEST(EncodeFp8Death, RejectsNonPositiveOrNonFiniteScale) {
  const float x[1] = {1.0f};
  uint8_t out[1];
  EXPECT_DEATH(EncodeFp8(x, 1, 0.0f, out), "scale");
  EXPECT_DEATH(EncodeFp8(x, 1, -1.0f, out), "scale");
  EXPECT_DEATH(EncodeFp8(x, 1, kInf, out), "scale");
  EXPECT_DEATH(ref::EncodeFp8(x, 1, std::numeric_limits<float>::quiet_NaN(), out), "scale");
  EncodeFp8(x, 1, FLT_TRUE_MIN, out);  // twin: any finite positive scale is accepted
  EXPECT_EQ(out[0], 0x7E);
}

}  // namespace
}  // namespace kvguard::kernels
