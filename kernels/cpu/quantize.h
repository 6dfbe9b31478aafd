// kernels/cpu/quantize.h: FP32 weights -> FP32 / BF16 / FP8 / INT4 weight matrices.
//
// Quantisation runs once at load time, so these are plain scalar code; the layouts and
// conventions are the ones in kernels/formats.h.
#ifndef KVGUARD_KERNELS_CPU_QUANTIZE_H_
#define KVGUARD_KERNELS_CPU_QUANTIZE_H_

#include <cstdint>
#include <vector>

#include "kernels/cpu/huge_page_allocator.h"
#include "kernels/formats.h"

namespace kvguard::kernels {

// QuantizedMatrix owns the storage of one weight matrix in one format; view() lends it out.
struct QuantizedMatrix {
  WeightFormat format = WeightFormat::kFp32;
  int rows = 0;
  int cols = 0;
  int group = 0;                       // INT4 only
  HugePageVector<uint8_t> data;        // bytes of the codes, layout per format (formats.h)
  std::vector<float> row_scales;       // FP8: [rows]
  std::vector<uint16_t> group_scales;  // INT4: fp16, per block of 16 rows [cols / group][16]

  WeightView view() const;
};

// QuantizeMatrix quantises the row-major FP32 matrix w [rows, cols] into `format`.
// `group` is the INT4 group size (32, 64 or 128; cols % group == 0) and ignored otherwise.
// Preconditions (CHECKed): rows, cols > 0; a valid group for INT4; all of w finite; for INT4,
// every group's max |w| / 7 must round to a finite FP16 (max |w| < 7 * 65520).
// FP8: a row whose max |w| / 448 is 0 (all zeros) gets scale 1 and all codes 0, never NaN.
// INT4: a group whose FP16 scale is 0 (all zeros, or max |w| / 7 < 2^-25) stores q = 0.
QuantizedMatrix QuantizeMatrix(const float* w, int rows, int cols, WeightFormat format,
                               int group = 128);

// DequantizeMatrix returns the FP32 values [rows, cols] that `w` stands for: exactly the
// numbers every matmul backend multiplies by (the reference for error budgets). FP32, BF16 and
// INT4 values are exact; an FP8 value is code value x row scale rounded once to FP32 (the
// kernels apply the row scale to the exact sum instead).
std::vector<float> DequantizeMatrix(const WeightView& w);

}  // namespace kvguard::kernels

#endif  // KVGUARD_KERNELS_CPU_QUANTIZE_H_
