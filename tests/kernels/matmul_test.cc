// Tests for MatMul: every weight format x batch {1, 2, 3, 7, 8, 16, 37, 64} x shapes (odd row
// counts, partial 16-row INT4 blocks, cols from 1 to 4096) x {no pool, 2 threads} x every Highway
// target this CPU supports, each output checked against ref::MatMul on the dequantised weights
// with a named error budget computed from the data of that output.
#include "kernels/cpu/matmul.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/internal/cpu_features.h"
#include "kernels/cpu/internal/matmul_bf16dot.h"
#include "kernels/cpu/quantize.h"

namespace kvguard::kernels {
namespace {

constexpr double kU = 0x1p-24;  // FP32 unit roundoff

// Error budgets (|y - y_ref| <= budget, per output):
//
// FpAccumulationBudget: FP32 accumulation. Every kernel keeps >= 16 independent partial sums
// per output (lanes x accumulators; INT4: one FMA per group, cols / 32 at most), so each
// partial sum chains at most cols/16 + 9 rounded FMAs (remainder steps included); combining
// them adds <= 8 levels (accumulators, then lanes), the row scale (FP8) or group scale product
// (INT4) 2 more, and the reference's own rounding to FP32 (and FP8's FP32 dequantised weights)
// 2 more. The classical bound |fl(sum) - sum| <= n u sum |terms| with n = cols/16 + 32 covers
// all of it; for cols = 4096 that is 1.7e-5 of sum |w x|.
double FpAccumulationBudget(int cols) { return (cols / 16 + 32) * kU; }

// DenormalFloor: below 2^-126 FP32 rounds to an absolute quantum, 2^-149, not a relative one, so
// each of the at most cols + 32 roundings may add 2^-150 however small sum |w x| is (relevant only
// when products land in the denormal range, as with denormal x).
double DenormalFloor(int cols) { return (cols + 32) * 0x1p-150; }

// kActivationRounding: INT4 replaces x_c by q_c s_b with s_b = max_b |x| / 127 and
// q_c = rne(fl(x_c * fl(1 / s_b))); the reciprocal's and the product's roundings add at most
// 127 (2u + u^2) to |x_c / s_b| <= 127 before rne, so |x_c - q_c s_b| <= s_b (1/2 + 254.1 u)
// <= s_b (1/2 + 2^-16).
constexpr double kActivationRounding = 0.5 + 0x1p-16;
constexpr float kXFlushBelow = 0x1p-100f;  // blocks below this max |x| are taken as zero

const int kBatches[] = {1, 2, 3, 7, 8, 16, 37, 64};

struct Shape {
  int rows, cols, group;
};

// Row counts 1, 13, 257 and others not multiples of the row block (16): INT4's padded last block,
// passes of 64 rows with blocks left over; INT4 cols multiples of each group size, including
// cols % 128 != 0.
const Shape kInt4Shapes[] = {{1, 4096, 128}, {13, 96, 32},  {257, 32, 32}, {16, 160, 32},
                             {17, 192, 64},  {3, 384, 128}, {1, 4096, 32}, {5, 128, 64}};
// Float formats also take any cols: tails of every length below a vector.
const Shape kFloatShapes[] = {{1, 4096, 0}, {13, 96, 0}, {257, 32, 0}, {16, 160, 0},
                              {17, 37, 0},  {3, 1, 0},   {5, 23, 0}};

std::vector<float> RandomWeights(int rows, int cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w(static_cast<size_t>(rows) * cols);
  for (int r = 0; r < rows; ++r) {
    const float magnitude = std::ldexp(1.0f, r % 5 - 2);  // rows differ: scales matter
    for (int c = 0; c < cols; ++c) w[static_cast<size_t>(r) * cols + c] = normal(rng) * magnitude;
  }
  return w;
}

// Bf16Rounded returns x as MatMulArithmetic::kBf16Products uses it: each element rounded to
// BF16 to nearest even, denormals as zero.
std::vector<float> Bf16Rounded(const std::vector<float>& x) {
  std::vector<float> r(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    r[i] = std::fabs(x[i]) < 0x1p-126f ? 0.0f : Bf16ToFloat(Bf16FromFloat(x[i]));
  }
  return r;
}

std::vector<float> RandomActivations(int batch, int cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 63);
  std::vector<float> x(static_cast<size_t>(batch) * cols);
  for (float& v : x) v = normal(rng) * (pick(rng) == 0 ? 30.0f : 1.0f);  // LLM-like outliers
  return x;
}

// Budget returns the allowed |y - y_ref| for every output [batch, rows], from the data (against
// a reference that rounds x as the kernel does: see Check).
std::vector<double> Budget(WeightFormat format, int group, const std::vector<float>& deq, int rows,
                           int cols, const std::vector<float>& x, int batch) {
  std::vector<double> budget(static_cast<size_t>(batch) * rows);
  const double accumulation = FpAccumulationBudget(cols);
  for (int b = 0; b < batch; ++b) {
    const float* xb = x.data() + static_cast<size_t>(b) * cols;
    // INT4's per-block activation scale s_b, computed the way the kernel does.
    std::vector<double> s(cols, 0.0), flush(cols, 0.0);
    if (format == WeightFormat::kInt4) {
      for (int c0 = 0; c0 < cols; c0 += group) {
        float amax = 0;
        for (int c = c0; c < c0 + group; ++c) amax = std::max(amax, std::fabs(xb[c]));
        for (int c = c0; c < c0 + group; ++c) {
          if (amax < kXFlushBelow) {
            flush[c] = amax;
          } else {
            s[c] = amax / 127.0f;
          }
        }
      }
    }
    for (int r = 0; r < rows; ++r) {
      const float* wr = deq.data() + static_cast<size_t>(r) * cols;
      double activation = 0, magnitude = 0;
      for (int c = 0; c < cols; ++c) {
        const double aw = std::fabs(static_cast<double>(wr[c]));
        const double ax = std::fabs(static_cast<double>(xb[c]));
        activation += aw * (s[c] * kActivationRounding + flush[c]);
        magnitude += aw * (ax + s[c]);
      }
      budget[static_cast<size_t>(b) * rows + r] =
          activation + accumulation * magnitude + DenormalFloor(cols);
    }
  }
  return budget;
}

class MatMulTest : public ::testing::Test {
 protected:
  void SetUp() override { targets_ = SupportedTargets(); }
  void TearDown() override { ResetTarget(); }

  // Check runs MatMul on `w` (quantised from `wf`) for every target and both thread settings,
  // and compares each output with ref::MatMul on the dequantised weights within its budget. The
  // reference multiplies x as the kernel uses it: rounded to BF16 (Bf16Rounded) where
  // MatMulArithmeticFor says kBf16Products, else as given.
  void Check(const std::vector<float>& wf, const Shape& shape, WeightFormat format,
             const std::vector<float>& x, int batch,
             MatMulActivations act = MatMulActivations::kExact) {
    SCOPED_TRACE(std::string(WeightFormatName(format)) + " " + std::to_string(shape.rows) + "x" +
                 std::to_string(shape.cols) + " group " + std::to_string(shape.group) + " batch " +
                 std::to_string(batch) + (act == MatMulActivations::kBf16 ? " bf16 x" : ""));
    const QuantizedMatrix q =
        QuantizeMatrix(wf.data(), shape.rows, shape.cols, format, shape.group ? shape.group : 128);
    const std::vector<float> deq = DequantizeMatrix(q.view());
    WeightView deq_view;
    deq_view.rows = shape.rows;
    deq_view.cols = shape.cols;
    deq_view.data = deq.data();
    for (int64_t target : targets_) {
      SCOPED_TRACE(TargetName(target));
      ForceTarget(target);
      const bool bf16 = MatMulArithmeticFor(format, act) == MatMulArithmetic::kBf16Products;
      const std::vector<float> xr = bf16 ? Bf16Rounded(x) : x;
      std::vector<float> want(static_cast<size_t>(batch) * shape.rows);
      ref::MatMul(deq_view, xr.data(), batch, want.data(), nullptr);
      const std::vector<double> budget =
          Budget(format, shape.group, deq, shape.rows, shape.cols, xr, batch);
      for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool2_}) {
        SCOPED_TRACE(pool ? "2 threads" : "no pool");
        std::vector<float> got(want.size(), std::numeric_limits<float>::quiet_NaN());
        MatMul(q.view(), x.data(), batch, got.data(), pool, act);
        int bad = 0;
        for (size_t i = 0; i < got.size(); ++i) {
          const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
          if (!(err <= budget[i]) && bad++ < 3) {
            ADD_FAILURE() << "y[batch " << i / shape.rows << ", row " << i % shape.rows
                          << "] = " << got[i] << ", ref " << want[i] << ", error " << err
                          << " > budget " << budget[i];
          }
        }
        if (bad > 0) {
          ADD_FAILURE() << bad << " of " << got.size() << " outputs out of budget";
          return;
        }
      }
    }
    ResetTarget();
  }

  void RunTable(WeightFormat format, const Shape* shapes, size_t count,
                MatMulActivations act = MatMulActivations::kExact) {
    uint32_t seed = 100;
    for (size_t s = 0; s < count; ++s) {
      const Shape& shape = shapes[s];
      const std::vector<float> w = RandomWeights(shape.rows, shape.cols, ++seed);
      for (int batch : kBatches) {
        const std::vector<float> x = RandomActivations(batch, shape.cols, ++seed);
        Check(w, shape, format, x, batch, act);
        if (HasFailure()) return;
      }
    }
  }

  std::vector<int64_t> targets_;
  ThreadPool pool2_{2};
};

TEST_F(MatMulTest, Fp32MatchesReference) {
  RunTable(WeightFormat::kFp32, kFloatShapes, std::size(kFloatShapes));
}

TEST_F(MatMulTest, Bf16MatchesReference) {
  RunTable(WeightFormat::kBf16, kFloatShapes, std::size(kFloatShapes));
}

TEST_F(MatMulTest, Fp8MatchesReference) {
  RunTable(WeightFormat::kFp8, kFloatShapes, std::size(kFloatShapes));
}

TEST_F(MatMulTest, Int4MatchesReference) {
  RunTable(WeightFormat::kInt4, kInt4Shapes, std::size(kInt4Shapes));
}

// BF16 activations (prefill): FP8 and BF16 weights run on BF16 dot products where the CPU has
// them; FP32 and INT4 weights, and CPUs without them, compute as with exact activations.
TEST_F(MatMulTest, Fp8WithBf16ActivationsMatchesReference) {
  RunTable(WeightFormat::kFp8, kFloatShapes, std::size(kFloatShapes), MatMulActivations::kBf16);
}

TEST_F(MatMulTest, Bf16WithBf16ActivationsMatchesReference) {
  RunTable(WeightFormat::kBf16, kFloatShapes, std::size(kFloatShapes), MatMulActivations::kBf16);
}

TEST_F(MatMulTest, Fp32AndInt4IgnoreBf16Activations) {
  RunTable(WeightFormat::kFp32, kFloatShapes, std::size(kFloatShapes), MatMulActivations::kBf16);
  RunTable(WeightFormat::kInt4, kInt4Shapes, std::size(kInt4Shapes), MatMulActivations::kBf16);
}

// A column's outputs do not depend on what else is in the batch, bit for bit, for every format,
// both activation modes and every target: the engine's tokens must not depend on which other
// requests share a step.
TEST_F(MatMulTest, AColumnsOutputsDoNotDependOnTheBatch) {
  // 60 rows: a 48-row block and a partial one; 601 columns: odd, a tail of FP8 codes, and two
  // 256-pair chunks of the blocked BF16 kernel; 600 columns of x: two calls of that kernel (512
  // at most), passes of 256 columns, and tiles of 1 to 4 column vectors. (Sized for the ASan
  // build, where every target's kernels run unoptimised.)
  const int rows = 60, total = 600;
  for (WeightFormat f :
       {WeightFormat::kFp32, WeightFormat::kBf16, WeightFormat::kFp8, WeightFormat::kInt4}) {
    const int cols = f == WeightFormat::kInt4 ? 640 : 601;
    const std::vector<float> w = RandomWeights(rows, cols, 21);
    const std::vector<float> x = RandomActivations(total, cols, 22);
    // INT4 at every group size: 4, 8 or 16 tiles of 8 columns per group.
    for (int group :
         f == WeightFormat::kInt4 ? std::vector<int>{32, 64, 128} : std::vector<int>{128}) {
      const QuantizedMatrix q = QuantizeMatrix(w.data(), rows, cols, f, group);
      for (MatMulActivations act : {MatMulActivations::kExact, MatMulActivations::kBf16}) {
        // INT4 ignores the activation mode (Fp32AndInt4IgnoreBf16Activations): once is enough.
        if (f == WeightFormat::kInt4 && act == MatMulActivations::kBf16) continue;
        for (int64_t target : targets_) {
          ForceTarget(target);
          std::vector<float> all(static_cast<size_t>(total) * rows);
          MatMul(q.view(), x.data(), total, all.data(), &pool2_, act);
          for (int batch : {1, 3, 16, 17, 40, 64, 65, 257, 512}) {
            for (int first : {0, total - batch}) {
              SCOPED_TRACE(std::string(WeightFormatName(f)) + " group " + std::to_string(group) +
                           " " + TargetName(target) +
                           (act == MatMulActivations::kBf16 ? " bf16 x" : "") + " batch " +
                           std::to_string(batch) + " from column " + std::to_string(first));
              std::vector<float> part(static_cast<size_t>(batch) * rows);
              MatMul(q.view(), x.data() + static_cast<size_t>(first) * cols, batch, part.data(),
                     &pool2_, act);
              for (size_t i = 0; i < part.size(); ++i) {
                ASSERT_EQ(std::bit_cast<uint32_t>(part[i]),
                          std::bit_cast<uint32_t>(all[static_cast<size_t>(first) * rows + i]))
                    << "output " << i;
              }
            }
          }
        }
        ResetTarget();
      }
    }
  }
}

// Batches past one kernel call (64 columns; 512 on BF16 dot products) match the reference, as
// do rows past one block (48) and columns past one chunk (512) of the blocked BF16 kernel (601
// columns: two chunks, the second of 45 pairs, its last one half).
TEST_F(MatMulTest, ManyColumnsMatchReference) {
  struct Case {
    WeightFormat format;
    MatMulActivations act;
    int batch;
  };
  constexpr auto kExact = MatMulActivations::kExact, kBf16 = MatMulActivations::kBf16;
  const Case cases[] = {{WeightFormat::kFp32, kExact, 130}, {WeightFormat::kInt4, kExact, 130},
                        {WeightFormat::kFp8, kExact, 130},  {WeightFormat::kBf16, kBf16, 300},
                        {WeightFormat::kFp8, kBf16, 300},   {WeightFormat::kFp8, kBf16, 513}};
  uint32_t seed = 300;
  for (const Case& c : cases) {
    const Shape shape = c.format == WeightFormat::kInt4 ? Shape{60, 640, 128} : Shape{60, 601, 0};
    const std::vector<float> w = RandomWeights(shape.rows, shape.cols, ++seed);
    const std::vector<float> x = RandomActivations(c.batch, shape.cols, ++seed);
    Check(w, shape, c.format, x, c.batch, c.act);
    if (HasFailure()) return;
  }
}

// A thread prepares x (FP8: scaling; INT4: quantisation) once per call and reuses it for every
// row chunk it runs of that call. Matrices of several chunks per thread (2 MiB and more at 2
// threads: RunRows cuts 256 KiB chunks), and one x buffer rewritten in place between calls: a
// thread that kept the previous call's x (same buffer, same shape) would give the old outputs.
TEST_F(MatMulTest, NewActivationsInTheSameBufferGiveNewOutputs) {
  const Shape shape{2048, 2048, 128};
  const std::vector<float> w = RandomWeights(shape.rows, shape.cols, 31);
  for (WeightFormat format : {WeightFormat::kFp8, WeightFormat::kInt4}) {
    for (int batch : {1, 5}) {  // INT4: per-thread quantisation, then the shared one (batch >= 4)
      std::vector<float> x(static_cast<size_t>(batch) * shape.cols);
      for (uint32_t round = 0; round < 3; ++round) {
        SCOPED_TRACE("round " + std::to_string(round));
        const std::vector<float> fresh = RandomActivations(batch, shape.cols, 40 + round);
        std::copy(fresh.begin(), fresh.end(), x.begin());
        Check(w, shape, format, x, batch);
        if (HasFailure()) return;
      }
    }
  }
}

// With x already on each block's int8 grid (every block holds +-127 * 2^k, all else integer
// multiples of 2^k), INT4's activation rounding is exact: only FP32 accumulation error is left,
// so a kernel error hiding under the activation budget would show here.
TEST_F(MatMulTest, Int4ExactWhenActivationsAreOnTheGrid) {
  for (int group : {32, 64, 128}) {
    const Shape shape{19, 4 * group + (group < 128 ? group : 0), group};
    const std::vector<float> w = RandomWeights(shape.rows, shape.cols, 7 + group);
    for (int batch : {1, 5}) {
      std::mt19937 rng(group + batch);
      std::uniform_int_distribution<int> q(-127, 127);
      std::vector<float> x(static_cast<size_t>(batch) * shape.cols);
      for (size_t c = 0; c < x.size(); ++c) {
        const int exponent = static_cast<int>(c / group % 5) - 2;
        const int v = c % group == 3 ? (c % 2 ? 127 : -127) : q(rng);
        x[c] = std::ldexp(static_cast<float>(v), exponent);
      }
      // Budget() would add the activation term; here it must be zero, so check it directly.
      SCOPED_TRACE(group);
      const QuantizedMatrix qm =
          QuantizeMatrix(w.data(), shape.rows, shape.cols, WeightFormat::kInt4, group);
      const std::vector<float> deq = DequantizeMatrix(qm.view());
      WeightView dv;
      dv.rows = shape.rows;
      dv.cols = shape.cols;
      dv.data = deq.data();
      std::vector<float> want(static_cast<size_t>(batch) * shape.rows);
      ref::MatMul(dv, x.data(), batch, want.data(), nullptr);
      for (int64_t target : targets_) {
        SCOPED_TRACE(TargetName(target));
        ForceTarget(target);
        std::vector<float> got(want.size());
        MatMul(qm.view(), x.data(), batch, got.data(), &pool2_);
        for (int b = 0; b < batch; ++b) {
          for (int r = 0; r < shape.rows; ++r) {
            double magnitude = 0;
            for (int c = 0; c < shape.cols; ++c) {
              magnitude +=
                  std::fabs(static_cast<double>(deq[r * shape.cols + c]) * x[b * shape.cols + c]);
            }
            const size_t i = static_cast<size_t>(b) * shape.rows + r;
            ASSERT_LE(std::fabs(static_cast<double>(got[i]) - want[i]),
                      FpAccumulationBudget(shape.cols) * magnitude)
                << "batch " << b << " row " << r;
          }
        }
      }
      ResetTarget();
    }
  }
}

// The engine stacks the Q, K and V projections (and gate and up) into one matrix by rows, so
// that each is one call; that is exact only if every format quantises row by row and a row's
// output does not depend on where it sits (which pass of rows, which thread, which chunk). Parts
// of 37, 8 and 19 rows put part boundaries inside row passes and row blocks.
TEST_F(MatMulTest, StackedRowsGiveTheSeparateOutputsBitForBit) {
  const int part_rows[] = {37, 8, 19};
  const int cols = 384;
  std::vector<std::vector<float>> parts;
  std::vector<float> stacked;
  for (int rows : part_rows) {
    parts.push_back(RandomWeights(rows, cols, 70 + rows));
    stacked.insert(stacked.end(), parts.back().begin(), parts.back().end());
  }
  const int total = static_cast<int>(stacked.size() / cols);
  for (WeightFormat f :
       {WeightFormat::kFp32, WeightFormat::kBf16, WeightFormat::kFp8, WeightFormat::kInt4}) {
    for (int group : {64, 128}) {
      if (f != WeightFormat::kInt4 && group != 128) continue;
      SCOPED_TRACE(std::string(WeightFormatName(f)) + " group " + std::to_string(group));
      const QuantizedMatrix whole = QuantizeMatrix(stacked.data(), total, cols, f, group);
      std::vector<QuantizedMatrix> separate;
      for (size_t i = 0; i < parts.size(); ++i) {
        separate.push_back(QuantizeMatrix(parts[i].data(), part_rows[i], cols, f, group));
      }
      for (int batch : {1, 2, 3, 5, 8}) {
        const std::vector<float> x = RandomActivations(batch, cols, 90 + batch);
        for (int64_t target : targets_) {
          ForceTarget(target);
          for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool2_}) {
            SCOPED_TRACE(std::string(TargetName(target)) + " batch " + std::to_string(batch) +
                         (pool ? " 2 threads" : " no pool"));
            std::vector<float> y(static_cast<size_t>(batch) * total);
            MatMul(whole.view(), x.data(), batch, y.data(), pool);
            int row0 = 0;
            for (size_t i = 0; i < separate.size(); ++i) {
              const int rows = part_rows[i];
              std::vector<float> yp(static_cast<size_t>(batch) * rows);
              MatMul(separate[i].view(), x.data(), batch, yp.data(), pool);
              for (int b = 0; b < batch; ++b) {
                for (int r = 0; r < rows; ++r) {
                  ASSERT_EQ(std::bit_cast<uint32_t>(y[static_cast<size_t>(b) * total + row0 + r]),
                            std::bit_cast<uint32_t>(yp[static_cast<size_t>(b) * rows + r]))
                      << "part " << i << " batch " << b << " row " << r;
                }
              }
              row0 += rows;
            }
          }
        }
        ResetTarget();
      }
    }
  }
}

TEST_F(MatMulTest, ZeroWeightsGiveExactZeros) {
  const int rows = 21, cols = 256;
  const std::vector<float> w(static_cast<size_t>(rows) * cols, 0.0f);
  const std::vector<float> x = RandomActivations(3, cols, 9);
  for (WeightFormat f :
       {WeightFormat::kFp32, WeightFormat::kBf16, WeightFormat::kFp8, WeightFormat::kInt4}) {
    SCOPED_TRACE(WeightFormatName(f));
    const QuantizedMatrix q = QuantizeMatrix(w.data(), rows, cols, f, 64);
    for (int64_t target : targets_) {
      SCOPED_TRACE(TargetName(target));
      ForceTarget(target);
      std::vector<float> y(3 * rows, std::numeric_limits<float>::quiet_NaN());
      MatMul(q.view(), x.data(), 3, y.data(), &pool2_);
      for (float v : y) ASSERT_EQ(v, 0.0f);
    }
    ResetTarget();
  }
}

// INT4 turns a non-finite x into NaN outputs for that column (documented), never into a finite
// wrong answer; the other columns are unaffected.
TEST_F(MatMulTest, Int4NonFiniteActivationGivesNaN) {
  const int rows = 5, cols = 128;
  const std::vector<float> w = RandomWeights(rows, cols, 11);
  const QuantizedMatrix q = QuantizeMatrix(w.data(), rows, cols, WeightFormat::kInt4, 32);
  for (float bad : {std::numeric_limits<float>::infinity(), std::nanf("")}) {
    std::vector<float> x = RandomActivations(2, cols, 12);
    x[cols + 70] = bad;  // column 1 only
    for (int64_t target : targets_) {
      SCOPED_TRACE(TargetName(target));
      ForceTarget(target);
      std::vector<float> y(2 * rows);
      MatMul(q.view(), x.data(), 2, y.data(), nullptr);
      for (int r = 0; r < rows; ++r) {
        EXPECT_TRUE(std::isfinite(y[r])) << r;  // the twin: column 0 stays finite
        EXPECT_TRUE(std::isnan(y[rows + r])) << r;
      }
    }
    ResetTarget();
  }
}

// A block whose max |x| is below 2^-100 counts as zero; the others are unaffected, and the
// budget accounts for it (|error| <= max |x| of the block * sum |w|).
TEST_F(MatMulTest, Int4TinyActivationBlocks) {
  const Shape shape{6, 256, 64};
  const std::vector<float> w = RandomWeights(shape.rows, shape.cols, 13);
  std::vector<float> x = RandomActivations(1, shape.cols, 14);
  for (int c = 64; c < 128; ++c) x[c] = std::ldexp(x[c], -110);
  Check(w, shape, WeightFormat::kInt4, x, 1);
}

// Activations near both ends of FP32's range: FP8 scales each column of x by a power of two so
// that products of tiny x with e4m3's small codes stay out of the denormal range (where they
// would lose bits), and huge x must not overflow on the way.
TEST_F(MatMulTest, ExtremeActivationMagnitudes) {
  const Shape shape{7, 64, 32};
  const std::vector<float> w = RandomWeights(shape.rows, shape.cols, 17);
  std::vector<float> x = RandomActivations(3, shape.cols, 18);
  x[5] = 1e36f;  // column 0: one huge element
  for (int c = 0; c < shape.cols; ++c) {
    x[shape.cols + c] *= 1e-35f;      // column 1: tiny normals
    x[2 * shape.cols + c] *= 1e-40f;  // column 2: denormals
  }
  for (WeightFormat f :
       {WeightFormat::kFp32, WeightFormat::kBf16, WeightFormat::kFp8, WeightFormat::kInt4}) {
    Check(w, shape, f, x, 3);
  }
}

TEST_F(MatMulTest, ReferenceOnQuantisedViewMatchesDequantised) {
  const Shape shape{9, 192, 64};
  const std::vector<float> w = RandomWeights(shape.rows, shape.cols, 15);
  const std::vector<float> x = RandomActivations(2, shape.cols, 16);
  for (WeightFormat f :
       {WeightFormat::kFp32, WeightFormat::kBf16, WeightFormat::kFp8, WeightFormat::kInt4}) {
    SCOPED_TRACE(WeightFormatName(f));
    const QuantizedMatrix q = QuantizeMatrix(w.data(), shape.rows, shape.cols, f, shape.group);
    const std::vector<float> deq = DequantizeMatrix(q.view());
    WeightView dv;
    dv.rows = shape.rows;
    dv.cols = shape.cols;
    dv.data = deq.data();
    std::vector<float> a(2 * shape.rows), b(2 * shape.rows);
    ref::MatMul(q.view(), x.data(), 2, a.data(), &pool2_);
    ref::MatMul(dv, x.data(), 2, b.data(), nullptr);
    for (size_t i = 0; i < a.size(); ++i) {
      double magnitude = 0;
      for (int c = 0; c < shape.cols; ++c) {
        magnitude += std::fabs(static_cast<double>(deq[(i % shape.rows) * shape.cols + c]) *
                               x[(i / shape.rows) * shape.cols + c]);
      }
      // FP8's dequantised FP32 weights are rounded (u each); the rest is one rounding each.
      EXPECT_LE(std::fabs(static_cast<double>(a[i]) - b[i]), 3 * kU * magnitude) << i;
    }
  }
}

// Every e4m3 code widens to the BF16 encoding of its exact value (the NaN codes as +-480, as
// the FP32 kernel reads them); a widening that dropped the subnormals or the sign would not.
TEST(MatMulBf16DotTest, EveryFp8CodeWidensToItsExactValue) {
  for (int code = 0; code < 256; ++code) {
    SCOPED_TRACE(code);
    const uint8_t c = static_cast<uint8_t>(code);
    const float want = (c & 0x7F) == 0x7F ? ((c & 0x80) ? -480.0f : 480.0f) : Fp8E4m3ToFloat(c);
    const uint32_t bits = uint32_t{matmul_internal::Fp8CodeToBf16(c)} << 16;
    EXPECT_EQ(std::bit_cast<float>(bits), want);
  }
}

// BF16 activations run on BF16 dot products exactly where the CPU has them, for FP8 and BF16
// weights only, and under the AVX3_DL target only (a forced lower target keeps FP32).
TEST(MatMulBf16DotTest, Bf16ActivationsUseBf16ProductsWhereTheCpuHasThem) {
  const bool cpu = internal::HasAvx512Bf16Vbmi();
  for (WeightFormat f : {WeightFormat::kFp8, WeightFormat::kBf16}) {
    EXPECT_EQ(MatMulArithmeticFor(f, MatMulActivations::kBf16),
              cpu ? MatMulArithmetic::kBf16Products : MatMulArithmetic::kFp32);
    EXPECT_EQ(MatMulArithmeticFor(f, MatMulActivations::kExact), MatMulArithmetic::kFp32);
  }
  EXPECT_EQ(MatMulArithmeticFor(WeightFormat::kFp32, MatMulActivations::kBf16),
            MatMulArithmetic::kFp32);
  EXPECT_EQ(MatMulArithmeticFor(WeightFormat::kInt4, MatMulActivations::kBf16),
            MatMulArithmetic::kInt8Activations);
  for (int64_t target : SupportedTargets()) {
    if (TargetName(target) == "AVX3_DL") continue;
    ForceTarget(target);
    EXPECT_EQ(MatMulArithmeticFor(WeightFormat::kFp8, MatMulActivations::kBf16),
              MatMulArithmetic::kFp32)
        << TargetName(target);
  }
  ResetTarget();
}

TEST(MatMulDeathTest, BadArgumentsRefused) {
  const std::vector<float> w(64 * 4, 0.5f), x(64 * 64, 1.0f);
  std::vector<float> y(64 * 4);
  const QuantizedMatrix q = QuantizeMatrix(w.data(), 4, 64, WeightFormat::kInt4, 32);
  EXPECT_DEATH(MatMul(q.view(), x.data(), 0, y.data(), nullptr), "batch");
  EXPECT_DEATH(MatMul(q.view(), x.data(), -1, y.data(), nullptr), "batch");
  WeightView bad = q.view();
  bad.group = 48;
  EXPECT_DEATH(MatMul(bad, x.data(), 1, y.data(), nullptr), "INT4");
  bad = q.view();
  bad.cols = 80;  // not a multiple of the group
  EXPECT_DEATH(MatMul(bad, x.data(), 1, y.data(), nullptr), "INT4");
  const QuantizedMatrix f8 = QuantizeMatrix(w.data(), 4, 64, WeightFormat::kFp8);
  bad = f8.view();
  bad.row_scales = nullptr;
  EXPECT_DEATH(MatMul(bad, x.data(), 1, y.data(), nullptr), "row scales");
}

TEST(MatMulDeathTest, GoodArgumentsAccepted) {  // positive twin of BadArgumentsRefused
  // 7 is exact in both formats: INT4 group scale 1, FP8 row scale 7/448 = 2^-6.
  const std::vector<float> w(64 * 4, 7.0f), x(130 * 64, 1.0f);
  std::vector<float> y(130 * 4);
  const QuantizedMatrix q = QuantizeMatrix(w.data(), 4, 64, WeightFormat::kInt4, 32);
  MatMul(q.view(), x.data(), 1, y.data(), nullptr);
  MatMul(q.view(), x.data(), 130, y.data(), nullptr);              // three kernel calls
  for (int i = 0; i < 130 * 4; ++i) ASSERT_EQ(y[i], 448.0f) << i;  // 64 * 7 * 1
  const QuantizedMatrix f8 = QuantizeMatrix(w.data(), 4, 64, WeightFormat::kFp8);
  MatMul(f8.view(), x.data(), 1, y.data(), nullptr);
  for (int i = 0; i < 4; ++i) ASSERT_EQ(y[i], 448.0f) << i;
}

}  // namespace
}  // namespace kvguard::kernels
