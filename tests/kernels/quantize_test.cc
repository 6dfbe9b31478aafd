// Tests for QuantizeMatrix / DequantizeMatrix: the byte layouts of kernels/formats.h, the
// rounding conventions, round-trip error bounds per format, zero and extreme inputs, and the
// preconditions (each refusal next to an accepted twin).
#include "kernels/cpu/quantize.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace kvguard::kernels {
namespace {

std::vector<float> RandomMatrix(int rows, int cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w(static_cast<size_t>(rows) * cols);
  for (int r = 0; r < rows; ++r) {
    // Rows of very different magnitudes: scales must follow each row (group).
    const float magnitude = std::ldexp(1.0f, (r % 7) * 3 - 9);
    for (int c = 0; c < cols; ++c) w[static_cast<size_t>(r) * cols + c] = normal(rng) * magnitude;
  }
  return w;
}

uint16_t Bf16At(const QuantizedMatrix& q, size_t i) {
  uint16_t h;
  std::memcpy(&h, q.data.data() + 2 * i, sizeof(h));
  return h;
}

// Nibble returns the stored INT4 code (q + 8) of W[r, c], decoding formats.h's layout by hand:
// blocks of 16 rows, 64-byte tiles of 8 columns, row i's 4 bytes at 4i, columns 0..3 of the tile
// in the low nibbles and 4..7 in the high ones.
int Nibble(const QuantizedMatrix& q, int r, int c) {
  const size_t block = r / 16, row = r % 16, tile = c / 8;
  const uint8_t byte = q.data[block * 16 * q.cols / 2 + tile * 64 + row * 4 + c % 4];
  return c % 8 < 4 ? (byte & 0xF) : (byte >> 4);
}

// GroupScale returns the stored FP16 scale of row r's group gi (per block [groups][16 rows]).
uint16_t GroupScale(const QuantizedMatrix& q, int r, int gi) {
  const size_t groups = q.cols / q.group;
  return q.group_scales[(r / 16 * groups + gi) * 16 + r % 16];
}

TEST(QuantizeTest, Fp32IsACopy) {
  const auto w = RandomMatrix(5, 33, 1);
  const QuantizedMatrix q = QuantizeMatrix(w.data(), 5, 33, WeightFormat::kFp32);
  ASSERT_EQ(q.data.size(), w.size() * sizeof(float));
  EXPECT_EQ(std::memcmp(q.data.data(), w.data(), q.data.size()), 0);
  EXPECT_EQ(DequantizeMatrix(q.view()), w);
  EXPECT_EQ(WeightBytes(q.view()), w.size() * 4);
}

TEST(QuantizeTest, Bf16RoundsToNearestEven) {
  auto w = RandomMatrix(4, 50, 2);
  // Exact ties: 1 + 2^-8 lies halfway between bf16 1 and 1 + 2^-7 and must go to the even 1;
  // 1 + 3 * 2^-8 must go up to the even 1 + 2^-6.
  w[0] = 1.0f + 0x1p-8f;
  w[1] = 1.0f + 3 * 0x1p-8f;
  const QuantizedMatrix q = QuantizeMatrix(w.data(), 4, 50, WeightFormat::kBf16);
  ASSERT_EQ(q.data.size(), w.size() * 2);
  EXPECT_EQ(Bf16At(q, 0), 0x3F80);
  EXPECT_EQ(Bf16At(q, 1), 0x3F82);
  const std::vector<float> deq = DequantizeMatrix(q.view());
  for (size_t i = 0; i < w.size(); ++i) {
    ASSERT_EQ(Bf16At(q, i), Bf16FromFloat(w[i])) << i;
    ASSERT_EQ(deq[i], Bf16ToFloat(Bf16At(q, i))) << i;
    ASSERT_LE(std::fabs(deq[i] - w[i]), std::ldexp(std::fabs(w[i]), -8)) << i;  // half ulp
  }
}

TEST(QuantizeTest, Fp8RowScalesAndRoundTrip) {
  const int rows = 9, cols = 77;
  const auto w = RandomMatrix(rows, cols, 3);
  const QuantizedMatrix q = QuantizeMatrix(w.data(), rows, cols, WeightFormat::kFp8);
  ASSERT_EQ(q.row_scales.size(), static_cast<size_t>(rows));
  ASSERT_EQ(q.data.size(), w.size());
  const std::vector<float> deq = DequantizeMatrix(q.view());
  for (int r = 0; r < rows; ++r) {
    float amax = 0;
    for (int c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(w[r * cols + c]));
    const float scale = q.row_scales[r];
    ASSERT_EQ(scale, amax / 448.0f) << r;
    bool max_hit = false;
    for (int c = 0; c < cols; ++c) {
      const size_t i = static_cast<size_t>(r) * cols + c;
      ASSERT_EQ(q.data[i], Fp8E4m3FromFloat(w[i] / scale)) << r << "," << c;
      ASSERT_EQ(deq[i], Fp8E4m3ToFloat(q.data[i]) * scale);
      ASSERT_FALSE(std::isnan(deq[i]));
      max_hit |= (q.data[i] & 0x7F) == kFp8E4m3MaxCode;
      const float a = std::fabs(w[i]) / scale;
      // e4m3 keeps 3 mantissa bits: a normal is off by at most 2^-4 of itself, a subnormal by
      // half its 2^-9 quantum; the FP32 products add at most a few 2^-24.
      const float bound = a >= 0x1p-6f ? std::ldexp(std::fabs(w[i]), -4) : 0x1p-10f * scale;
      ASSERT_LE(std::fabs(deq[i] - w[i]), bound * (1 + 0x1p-20f)) << r << "," << c;
    }
    EXPECT_TRUE(max_hit) << "row " << r << ": its max |w| must use the top code (448)";
  }
}

TEST(QuantizeTest, Fp8ZeroAndExtremeRows) {
  const int cols = 8;
  std::vector<float> w = {
      0,      0,       0,       0, 0, 0, 0, 0,  // all zero
      3e38f,  -3e38f,  1,       0, 0, 0, 0, 0,  // near FLT_MAX
      1e-45f, -1e-45f, 0,       0, 0, 0, 0, 0,  // max/448 underflows
      1e-30f, 2e-30f,  -4e-30f, 0, 0, 0, 0, 0,  // tiny but normal
  };
  const int rows = static_cast<int>(w.size()) / cols;
  const QuantizedMatrix q = QuantizeMatrix(w.data(), rows, cols, WeightFormat::kFp8);
  const std::vector<float> deq = DequantizeMatrix(q.view());
  // Zero row: scale 1 and codes 0 (documented), never a 0/0 NaN.
  EXPECT_EQ(q.row_scales[0], 1.0f);
  for (int c = 0; c < cols; ++c) EXPECT_EQ(q.data[c], 0);
  EXPECT_EQ(q.row_scales[2], 1.0f);
  for (size_t i = 0; i < deq.size(); ++i) ASSERT_TRUE(std::isfinite(deq[i])) << i;
  EXPECT_EQ(q.data[cols + 0], kFp8E4m3MaxCode);
  EXPECT_EQ(q.data[cols + 1], 0x80 | kFp8E4m3MaxCode);
  EXPECT_NEAR(deq[cols], 3e38f, 3e38f * 0x1p-20f);
  EXPECT_EQ(deq[2 * cols], 0.0f);  // 1e-45 is far below scale 1's smallest code
  EXPECT_NEAR(deq[3 * cols + 2], -4e-30f, 4e-30f * 0x1p-20f);
  EXPECT_NEAR(deq[3 * cols + 1], 2e-30f, 2e-30f / 16);
}

TEST(QuantizeTest, Int4LayoutByHand) {
  // Integers in [-7, 7] with max |w| = 7: the group scale is exactly 1 (FP16 0x3C00) and
  // q = w, so every nibble is known in advance. 17 rows: a full block of 16 and one row of a
  // second, padded with code 8 (q = 0) and scale 0.
  for (int g : {32, 64, 128}) {
    SCOPED_TRACE(g);
    const int rows = 17, cols = 2 * g, padded = 32;
    std::vector<float> w(static_cast<size_t>(rows) * cols);
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < cols; ++c) w[r * cols + c] = static_cast<float>((c * 5 + r) % 15 - 7);
      w[r * cols] = 7;       // each group has a 7 ...
      w[r * cols + g] = -7;  // ... or a -7
    }
    const QuantizedMatrix q = QuantizeMatrix(w.data(), rows, cols, WeightFormat::kInt4, g);
    ASSERT_EQ(q.group, g);
    ASSERT_EQ(q.data.size(), static_cast<size_t>(padded) * cols / 2);
    ASSERT_EQ(q.group_scales.size(), static_cast<size_t>(padded) * 2);
    for (int r = 0; r < padded; ++r) {
      for (int gi = 0; gi < 2; ++gi) {
        EXPECT_EQ(GroupScale(q, r, gi), r < rows ? 0x3C00 : 0) << r << "," << gi;
      }
    }
    for (int r = 0; r < padded; ++r) {
      for (int t = 0; t < cols / 8; ++t) {
        // Byte 4i + k of tile t of the block: column 8t + k (low nibble), 8t + 4 + k (high).
        const uint8_t* bytes = q.data.data() + static_cast<size_t>(r / 16) * 16 * cols / 2 +
                               static_cast<size_t>(t) * 64 + (r % 16) * 4;
        for (int k = 0; k < 4; ++k) {
          const int lo = r < rows ? static_cast<int>(w[r * cols + 8 * t + k]) + 8 : 8;
          const int hi = r < rows ? static_cast<int>(w[r * cols + 8 * t + 4 + k]) + 8 : 8;
          ASSERT_EQ(bytes[k], lo | (hi << 4)) << r << "," << t << "," << k;
        }
      }
    }
    const std::vector<float> deq = DequantizeMatrix(q.view());
    EXPECT_EQ(deq, w);
    const WeightView v = q.view();
    EXPECT_EQ(v.format, WeightFormat::kInt4);
    EXPECT_EQ(v.group, g);
    EXPECT_EQ(v.group_scales, q.group_scales.data());
    EXPECT_EQ(v.row_scales, nullptr);
    EXPECT_EQ(WeightBytes(v), static_cast<size_t>(padded) * cols / 2 + padded * cols / g * 2);
  }
}

TEST(QuantizeTest, Int4RoundTripWithinHalfAScale) {
  for (int g : {32, 64, 128}) {
    SCOPED_TRACE(g);
    const int rows = 11, cols = 4 * g;
    const auto w = RandomMatrix(rows, cols, 4 + g);
    const QuantizedMatrix q = QuantizeMatrix(w.data(), rows, cols, WeightFormat::kInt4, g);
    const std::vector<float> deq = DequantizeMatrix(q.view());
    for (int r = 0; r < rows; ++r) {
      for (int gi = 0; gi < cols / g; ++gi) {
        float amax = 0;
        for (int i = 0; i < g; ++i) amax = std::max(amax, std::fabs(w[r * cols + gi * g + i]));
        const uint16_t s16 = GroupScale(q, r, gi);
        ASSERT_EQ(s16, Fp16FromFloat(amax / 7.0f)) << r << "," << gi;
        const float scale = Fp16ToFloat(s16);
        for (int i = 0; i < g; ++i) {
          const int c = gi * g + i;
          const float x = w[r * cols + c];
          const int code = Nibble(q, r, c);
          // rne, ties to even, of x / scale (no clamping happens for a normal FP16 scale).
          ASSERT_EQ(code - 8, static_cast<int>(std::nearbyint(x / scale))) << r << "," << c;
          ASSERT_EQ(deq[r * cols + c], (code - 8) * scale);
          ASSERT_LE(std::fabs(x - deq[r * cols + c]), scale / 2) << r << "," << c;
        }
      }
    }
  }
}

TEST(QuantizeTest, Int4ZeroSubnormalAndTieGroups) {
  const int g = 32, cols = 4 * g;
  std::vector<float> w(cols, 0.0f);
  // Group 1: max/7 = 1.4 * 2^-24 rounds down to the FP16 quantum 2^-24, so -9.8 clamps to -8
  // (code 0): the error bound there is 3.5 * 2^-24 instead of scale / 2.
  w[g] = -7 * 1.4f * 0x1p-24f;
  w[g + 1] = 7 * 0x1p-24f;
  // Group 2: max/7 = 2^-26 rounds to FP16 0: the whole group is 0.
  w[2 * g] = 7 * 0x1p-26f;
  // Group 3: scale 1 and exact ties: 2.5 -> 2, 3.5 -> 4, -0.5 -> 0 (ties to even).
  w[3 * g] = 7;
  w[3 * g + 1] = 2.5f;
  w[3 * g + 2] = 3.5f;
  w[3 * g + 3] = -0.5f;
  const QuantizedMatrix q = QuantizeMatrix(w.data(), 1, cols, WeightFormat::kInt4, g);
  const std::vector<float> deq = DequantizeMatrix(q.view());
  EXPECT_EQ(GroupScale(q, 0, 0), 0);  // a group of zeros has scale 0 and q = 0
  for (int i = 0; i < g; ++i) EXPECT_EQ(Nibble(q, 0, i), 8) << i;
  EXPECT_EQ(GroupScale(q, 0, 1), 0x0001);
  EXPECT_EQ(Nibble(q, 0, g), 0);       // clamped to -8
  EXPECT_EQ(Nibble(q, 0, g + 1), 15);  // exactly 7
  EXPECT_EQ(GroupScale(q, 0, 2), 0);
  EXPECT_EQ(Nibble(q, 0, 2 * g), 8);
  EXPECT_EQ(GroupScale(q, 0, 3), 0x3C00);
  EXPECT_EQ(Nibble(q, 0, 3 * g + 1), 8 + 2);
  EXPECT_EQ(Nibble(q, 0, 3 * g + 2), 8 + 4);
  EXPECT_EQ(Nibble(q, 0, 3 * g + 3), 8 + 0);
  for (int c = 0; c < cols; ++c) {
    const float scale = Fp16ToFloat(GroupScale(q, 0, c / g));
    ASSERT_TRUE(std::isfinite(deq[c]));
    ASSERT_LE(std::fabs(w[c] - deq[c]), std::max(scale / 2, 3.5f * 0x1p-24f)) << c;
  }
}

TEST(QuantizeTest, Int4LargestScaleAccepted) {
  // max |w| = 7 * 65504 gives the largest finite FP16 scale: accepted, exact round trip.
  std::vector<float> w(32, 0.0f);
  w[0] = 7 * 65504.0f;
  w[5] = -3 * 65504.0f;
  const QuantizedMatrix q = QuantizeMatrix(w.data(), 1, 32, WeightFormat::kInt4, 32);
  EXPECT_EQ(GroupScale(q, 0, 0), 0x7BFF);
  EXPECT_EQ(DequantizeMatrix(q.view()), w);
}

TEST(QuantizeDeathTest, Int4ScaleOverflowRefused) {
  std::vector<float> w(32, 0.0f);
  w[3] = 7 * 65520.0f;  // max / 7 rounds to FP16 inf
  EXPECT_DEATH(QuantizeMatrix(w.data(), 1, 32, WeightFormat::kInt4, 32), "overflows FP16");
}

TEST(QuantizeDeathTest, InvalidInt4GroupsRefused) {
  const auto w = RandomMatrix(2, 192, 5);
  for (int g : {0, 16, 48, 96, 256}) {
    EXPECT_DEATH(QuantizeMatrix(w.data(), 2, 192, WeightFormat::kInt4, g), "32, 64 or 128") << g;
  }
  // 192 is not a multiple of 128.
  EXPECT_DEATH(QuantizeMatrix(w.data(), 2, 192, WeightFormat::kInt4, 128), "cols % group");
}

TEST(QuantizeTest, ValidInt4GroupsAccepted) {  // positive twin of InvalidInt4GroupsRefused
  const auto w = RandomMatrix(2, 192, 5);
  for (int g : {32, 64}) {
    const QuantizedMatrix q = QuantizeMatrix(w.data(), 2, 192, WeightFormat::kInt4, g);
    EXPECT_EQ(q.group_scales.size(), 16u * 192 / g);  // rows padded to a block of 16
  }
  // The group is ignored by the other formats.
  EXPECT_EQ(QuantizeMatrix(w.data(), 2, 192, WeightFormat::kFp8, 0).data.size(), 2u * 192);
}

TEST(QuantizeDeathTest, NonFiniteWeightsRefused) {
  for (WeightFormat f :
       {WeightFormat::kFp32, WeightFormat::kBf16, WeightFormat::kFp8, WeightFormat::kInt4}) {
    for (float bad : {std::nanf(""), INFINITY, -INFINITY}) {
      std::vector<float> w(64, 1.0f);
      w[40] = bad;
      EXPECT_DEATH(QuantizeMatrix(w.data(), 2, 32, f, 32), "finite");
    }
  }
  std::vector<float> w(64, 1.0f);
  EXPECT_DEATH(QuantizeMatrix(w.data(), 0, 32, WeightFormat::kFp32), "positive");
}

TEST(QuantizeTest, FiniteExtremesAccepted) {  // positive twin of NonFiniteWeightsRefused
  for (WeightFormat f : {WeightFormat::kFp32, WeightFormat::kBf16, WeightFormat::kFp8}) {
    std::vector<float> w(64, 1.0f);
    w[40] = 3.4e38f;
    w[41] = -3.4e38f;
    w[42] = 1e-45f;
    const QuantizedMatrix q = QuantizeMatrix(w.data(), 2, 32, f);
    for (float v : DequantizeMatrix(q.view())) EXPECT_FALSE(std::isnan(v));
  }
}

}  // namespace
}  // namespace kvguard::kernels
