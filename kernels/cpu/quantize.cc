// kernels/cpu/quantize.cc: FP32 -> FP32 / BF16 / FP8 / INT4 weight matrices, and back.
//
// Plain scalar code on purpose: it runs once per weight at load time, and it is the place where
// the conventions of kernels/formats.h are turned into bytes, so it should read like them.
#include "kernels/cpu/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/base/internal/raw_logging.h"

namespace kvguard::kernels {
namespace {

float RowAbsMax(const float* w, int n) {
  float m = 0.0f;
  for (int i = 0; i < n; ++i) m = std::max(m, std::fabs(w[i]));
  return m;
}

void QuantizeBf16(const float* w, size_t n, QuantizedMatrix& q) {
  q.data.resize(n * sizeof(uint16_t));
  for (size_t i = 0; i < n; ++i) {
    const uint16_t bits = Bf16FromFloat(w[i]);
    std::memcpy(q.data.data() + i * sizeof(uint16_t), &bits, sizeof(bits));
  }
}

// One scale per output row, so that the row's largest magnitude lands on e4m3's largest finite
// value (448) and the whole 2^-9..448 range of the format is spent on that row.
void QuantizeFp8(const float* w, QuantizedMatrix& q) {
  const int rows = q.rows, cols = q.cols;
  q.data.resize(static_cast<size_t>(rows) * cols);
  q.row_scales.resize(rows);
  for (int r = 0; r < rows; ++r) {
    const float* row = w + static_cast<size_t>(r) * cols;
    float scale = RowAbsMax(row, cols) / kFp8E4m3Max;
    // An all-zero row (or one so small that max/448 underflows FP32 to 0) gets scale 1: never a
    // 0/0 NaN, and every code rounds to 0 (anything below 2^-10 does), so it dequantises to 0.
    if (scale == 0.0f) scale = 1.0f;
    q.row_scales[r] = scale;
    uint8_t* out = q.data.data() + static_cast<size_t>(r) * cols;
    for (int c = 0; c < cols; ++c) out[c] = Fp8E4m3FromFloat(row[c] / scale);
  }
}

// Symmetric INT4 groups, exactly as formats.h lays them out: rows in blocks of 16, the rows past
// `rows` in the last block stored as code 8 (q = 0) with scale 0.
void QuantizeInt4(const float* w, QuantizedMatrix& q) {
  const int rows = q.rows, cols = q.cols, g = q.group;
  const int groups_per_row = cols / g;
  const int64_t padded = Int4PaddedRows(rows);
  q.data.assign(static_cast<size_t>(padded) * cols / 2, 0x88);
  q.group_scales.assign(static_cast<size_t>(padded) * groups_per_row, 0);
  for (int r = 0; r < rows; ++r) {
    for (int gi = 0; gi < groups_per_row; ++gi) {
      const float* src = w + static_cast<size_t>(r) * cols + static_cast<size_t>(gi) * g;
      const uint16_t scale_bits = Fp16FromFloat(RowAbsMax(src, g) / 7.0f);
      ABSL_RAW_CHECK((scale_bits & 0x7C00u) != 0x7C00u,
                     "QuantizeMatrix: INT4 group scale overflows FP16 (needs max |w| < 7 * 65520)");
      q.group_scales[Int4ScaleIndex(r, gi, groups_per_row)] = scale_bits;
      const float scale = Fp16ToFloat(scale_bits);
      for (int i = 0; i < g; ++i) {
        // scale == 0: an all-zero group, or one whose max/7 is below half the smallest FP16
        // subnormal (2^-25); q = 0 keeps it finite, with |w - 0| < 3.5 * 2^-24.
        const float v = scale == 0.0f ? 0.0f : std::nearbyint(src[i] / scale);
        const int code = static_cast<int>(std::clamp(v, -8.0f, 7.0f)) + kInt4ZeroPoint;
        const int c = gi * g + i;
        uint8_t& byte = q.data[Int4CodeByte(r, c, cols)];
        byte = c % 8 < 4 ? static_cast<uint8_t>((byte & 0xF0) | code)
                         : static_cast<uint8_t>((byte & 0x0F) | (code << 4));
      }
    }
  }
}

}  // namespace

WeightView QuantizedMatrix::view() const {
  WeightView v;
  v.format = format;
  v.rows = rows;
  v.cols = cols;
  v.group = format == WeightFormat::kInt4 ? group : 0;
  v.data = data.data();
  v.row_scales = format == WeightFormat::kFp8 ? row_scales.data() : nullptr;
  v.group_scales = format == WeightFormat::kInt4 ? group_scales.data() : nullptr;
  return v;
}

QuantizedMatrix QuantizeMatrix(const float* w, int rows, int cols, WeightFormat format, int group) {
  ABSL_RAW_CHECK(rows > 0 && cols > 0, "QuantizeMatrix: rows and cols must be positive");
  ABSL_RAW_CHECK(w != nullptr, "QuantizeMatrix: null weights");
  const size_t n = static_cast<size_t>(rows) * static_cast<size_t>(cols);
  for (size_t i = 0; i < n; ++i) {
    ABSL_RAW_CHECK(std::isfinite(w[i]), "QuantizeMatrix: weights must be finite");
  }
  QuantizedMatrix q;
  q.format = format;
  q.rows = rows;
  q.cols = cols;
  switch (format) {
    case WeightFormat::kFp32:
      q.data.resize(n * sizeof(float));
      std::memcpy(q.data.data(), w, n * sizeof(float));
      break;
    case WeightFormat::kBf16:
      QuantizeBf16(w, n, q);
      break;
    case WeightFormat::kFp8:
      QuantizeFp8(w, q);
      break;
    case WeightFormat::kInt4:
      ABSL_RAW_CHECK(IsValidInt4Group(group), "QuantizeMatrix: INT4 group must be 32, 64 or 128");
      ABSL_RAW_CHECK(cols % group == 0, "QuantizeMatrix: INT4 needs cols % group == 0");
      q.group = group;
      QuantizeInt4(w, q);
      break;
  }
  return q;
}

std::vector<float> DequantizeMatrix(const WeightView& w) {
  ABSL_RAW_CHECK(w.rows > 0 && w.cols > 0 && w.data != nullptr, "DequantizeMatrix: empty view");
  const size_t rows = static_cast<size_t>(w.rows), cols = static_cast<size_t>(w.cols);
  std::vector<float> out(rows * cols);
  const uint8_t* bytes = static_cast<const uint8_t*>(w.data);
  switch (w.format) {
    case WeightFormat::kFp32:
      std::memcpy(out.data(), w.data, out.size() * sizeof(float));
      break;
    case WeightFormat::kBf16:
      for (size_t i = 0; i < out.size(); ++i) {
        uint16_t bits;
        std::memcpy(&bits, bytes + i * sizeof(uint16_t), sizeof(bits));
        out[i] = Bf16ToFloat(bits);
      }
      break;
    case WeightFormat::kFp8:
      ABSL_RAW_CHECK(w.row_scales != nullptr, "DequantizeMatrix: FP8 needs row scales");
      for (size_t r = 0; r < rows; ++r) {
        for (size_t c = 0; c < cols; ++c) {
          out[r * cols + c] = Fp8E4m3ToFloat(bytes[r * cols + c]) * w.row_scales[r];
        }
      }
      break;
    case WeightFormat::kInt4: {
      ABSL_RAW_CHECK(IsValidInt4Group(w.group) && w.cols % w.group == 0,
                     "DequantizeMatrix: bad INT4 group");
      ABSL_RAW_CHECK(w.group_scales != nullptr, "DequantizeMatrix: INT4 needs group scales");
      const size_t g = static_cast<size_t>(w.group);
      for (size_t r = 0; r < rows; ++r) {
        for (size_t c = 0; c < cols; ++c) {
          const int code = Int4Code(bytes, r, c, cols);
          const float scale = Fp16ToFloat(w.group_scales[Int4ScaleIndex(r, c / g, cols / g)]);
          // |q| <= 8 and an FP16 scale has 11 significant bits, so the product is exact.
          out[r * cols + c] = static_cast<float>(code - kInt4ZeroPoint) * scale;
        }
      }
      break;
    }
  }
  return out;
}

}  // namespace kvguard::kernels
