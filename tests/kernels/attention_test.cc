// Tests for paged decode attention (kernels/cpu/attention.h).
//
// Two oracles, two comparisons:
//   * ref::PagedDecodeAttention against NaiveAttention below: FP64 attention over the logical
//     K and V (the dequantised values the test itself wrote into the pages), computed from the
//     definition without pages at all. Budget kRefBudget.
//   * the SIMD kernel against ref::PagedDecodeAttention, on every Highway target this CPU
//     supports, with 1 and 2 threads (2 threads exercise split-K). Budget per KV dtype below.
// Errors are measured per (request, query head) as max |out - expected| / max |V| over the
// tokens of that request and kv head, i.e. relative to the largest value the output averages.
//
// Budgets. Both sides see the same dequantised values, so what remains is FP32 arithmetic:
// scores are head_dim-term FMA chains (relative error ~ sqrt(head_dim) * 2^-24 of sum |q k|,
// about 3e-6 here), exp is accurate to a few ulp, and the output is an FP32 sum of up to 3000
// terms (random-walk error ~ sqrt(T) * 2^-24 ~ 3e-6, worst-case bound T * 2^-24 ~ 2e-4). The
// kernel also folds softmax_scale (and for FP8 2^8 * k_scale) into q and 2^8 * v_scale into
// the output, one extra rounding each. Largest errors measured over this file's cases (all
// six targets on Zen 4, 1 and 2 threads): <= 6e-7 for every dtype at ordinary logits; 3.3e-6
// (FP32), 1.9e-6 (BF16), 1.3e-6 (FP8) at logits of +-150 (ExtremeLogitsDoNotOverflow), where
// the score rounding grows with |score|. The budgets keep a 3x margin over the worst of those,
// and stay far below anything a real bug gives (a wrong scale, a dropped token or a wrong head
// moves outputs by 1e-3 to 1). The reference differs from the definition by <= 6e-8.
//
// Where the kernel rounds q and the probabilities to BF16 (AttentionArithmetic::kBf16Products:
// FP8 and BF16 KV on CPUs with AVX-512 BF16), the budget is derived per (request, query head)
// from the data (ref::Bf16ProductsErrorBound, attention.h) plus the FP32 budget. That bound is a
// worst case, loose for random data (observed errors are 3-10x below it), so the exact tests
// below carry the precision: with one dominant token (DominantTokenSelectsItsV) or equal scores
// (EqualHugeLogitsAverageV) every rounding is exact and the FP32 budget applies to every
// arithmetic (plus, for FP8 V, the bound of its subnormal codes); they catch a wrong token, dim
// or page mapping, which random data only bounds.
#include "kernels/cpu/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/formats.h"

namespace kvguard::kernels {
namespace {

constexpr double kRefBudget = 1e-6;  // FP64 reference vs FP64 definition: output rounding only
constexpr double kFp32Budget = 1e-5;
constexpr double kBf16Budget = 1e-5;
constexpr double kFp8Budget = 1e-5;

double Budget(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kFp32:
      return kFp32Budget;
    case KvDtype::kBf16:
      return kBf16Budget;
    case KvDtype::kFp8E4m3:
      return kFp8Budget;
  }
  return 0.0;
}

std::string DtypeName(KvDtype dtype) {
  return dtype == KvDtype::kFp32 ? "fp32" : dtype == KvDtype::kBf16 ? "bf16" : "fp8";
}

constexpr KvDtype kAllDtypes[] = {KvDtype::kFp32, KvDtype::kBf16, KvDtype::kFp8E4m3};

struct CaseSpec {
  KvDtype dtype = KvDtype::kFp32;
  int head_dim = 128;
  int num_kv_heads = 2;
  int group = 2;  // query heads per kv head
  int page_size = 16;
  std::vector<int> lengths = {1};
  double q_scale = 1.0;   // multiplies q; large values give extreme logits
  double kv_scale = 1.0;  // multiplies K and V: tiny or huge magnitudes (and FP8 scales)
  int head_pad = 0;       // head_stride - page_size * head_dim (elements nobody may read)
  uint64_t seed = 1;

  int num_heads() const { return num_kv_heads * group; }
  std::string Describe() const {
    std::string s = DtypeName(dtype) + " D=" + std::to_string(head_dim) +
                    " kv_heads=" + std::to_string(num_kv_heads) + " G=" + std::to_string(group) +
                    " P=" + std::to_string(page_size) + " lengths=";
    for (int l : lengths) s += std::to_string(l) + ",";
    return s;
  }
};

// Random is SplitMix64: cheap enough for the Debug/ASan build, where std::normal_distribution
// dominates the test's run time.
class Random {
 public:
  explicit Random(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform returns a value in [-sqrt(3), sqrt(3)): mean 0, variance 1.
  double Uniform() { return (static_cast<double>(Next() >> 11) * 0x1p-53 * 2.0 - 1.0) * 1.7320508; }
  void Shuffle(int32_t* p, size_t n) {
    for (size_t i = n; i > 1; --i) std::swap(p[i - 1], p[Next() % i]);
  }

 private:
  uint64_t state_;
};

// What the bytes that no request may read (tokens beyond length in a last page, padding between
// heads, unused pages) hold.
enum class Stale { kZero, kNan };

using AttentionFn = void (*)(const PagedKvView&, int, float, const DecodeQuery*, int, ThreadPool*);

// PagedKvCase builds a paged pool from random logical K and V. Physical pages are shuffled
// (with unused pages among them), and the last page of the first request whose length is not a
// multiple of P is placed at the very end of exact-size K and V allocations, so that reading
// past its length is a heap overflow under ASan.
class PagedKvCase {
 public:
  PagedKvCase(const CaseSpec& spec, Stale stale) : spec_(spec) {
    const int dim = spec.head_dim;
    const int page = spec.page_size;
    const int nkv = spec.num_kv_heads;
    const size_t esize = KvDtypeBytes(spec.dtype);
    Random rng(spec.seed);

    // Logical values, [request][kv head][token][dim].
    const int nreq = static_cast<int>(spec.lengths.size());
    k_.resize(nreq);
    v_.resize(nreq);
    for (int r = 0; r < nreq; ++r) {
      k_[r].assign(nkv, std::vector<double>(static_cast<size_t>(spec.lengths[r]) * dim));
      v_[r].assign(nkv, std::vector<double>(static_cast<size_t>(spec.lengths[r]) * dim));
      for (int g = 0; g < nkv; ++g) {
        // Different magnitudes per kv head and a V offset, so a wrong head or a wrong V scale
        // cannot hide in noise.
        for (double& x : k_[r][g]) x = rng.Uniform() * (1.0 + 0.5 * g) * spec.kv_scale;
        for (double& x : v_[r][g]) x = (rng.Uniform() * (1.0 + 0.25 * g) + 0.5) * spec.kv_scale;
      }
    }
    k_scale_.assign(nkv, 1.0f);
    v_scale_.assign(nkv, 1.0f);
    if (spec.dtype == KvDtype::kFp8E4m3) {
      for (int g = 0; g < nkv; ++g) {
        double kmax = 0.0, vmax = 0.0;
        for (int r = 0; r < nreq; ++r) {
          for (double x : k_[r][g]) kmax = std::max(kmax, std::fabs(x));
          for (double x : v_[r][g]) vmax = std::max(vmax, std::fabs(x));
        }
        k_scale_[g] = static_cast<float>(kmax / kFp8E4m3Max);
        v_scale_[g] = static_cast<float>(vmax / kFp8E4m3Max);
      }
    }
    // Round the logical values to what the pages will hold: from here on they are exact.
    for (int r = 0; r < nreq; ++r) {
      for (int g = 0; g < nkv; ++g) {
        for (double& x : k_[r][g]) x = Quantise(x, k_scale_[g]);
        for (double& x : v_[r][g]) x = Quantise(x, v_scale_[g]);
      }
    }

    // Physical pages: shuffled ids, a few unused ones among them.
    int needed = 0;
    for (int l : spec.lengths) needed += (l + page - 1) / page;
    num_pages_ = needed + needed / 3 + 1;
    std::vector<int32_t> ids(num_pages_);
    std::iota(ids.begin(), ids.end(), 0);
    int guarded = -1;  // request whose partial last page sits at the end of the allocations
    for (int r = 0; r < nreq && guarded < 0; ++r) {
      if (spec.lengths[r] % page != 0) guarded = r;
    }
    rng.Shuffle(ids.data(), ids.size() - (guarded >= 0 ? 1 : 0));
    page_tables_.resize(nreq);
    size_t next = 0;
    for (int r = 0; r < nreq; ++r) {
      const int pages = (spec.lengths[r] + page - 1) / page;
      for (int i = 0; i < pages; ++i) {
        if (r == guarded && i == pages - 1) {
          page_tables_[r].push_back(num_pages_ - 1);
        } else {
          page_tables_[r].push_back(ids[next++]);
        }
      }
    }

    head_stride_ = static_cast<int64_t>(page) * dim + spec.head_pad;
    page_stride_ = head_stride_ * nkv + 5;  // +5: pages are not packed back to back either
    size_t k_elems = static_cast<size_t>(num_pages_) * page_stride_;
    size_t v_elems = k_elems;
    if (guarded >= 0) {
      const int64_t last = static_cast<int64_t>(num_pages_ - 1) * page_stride_ +
                           static_cast<int64_t>(nkv - 1) * head_stride_;
      const int rem = spec.lengths[guarded] % page;
      k_elems = static_cast<size_t>(last + static_cast<int64_t>(dim - 1) * page + rem);
      v_elems = static_cast<size_t>(last + static_cast<int64_t>(rem) * dim);
    }
    k_bytes_ = k_elems * esize;
    v_bytes_ = v_elems * esize;
    k_pool_.reset(new uint8_t[k_bytes_]);
    v_pool_.reset(new uint8_t[v_bytes_]);
    FillStale(k_pool_.get(), k_elems, stale);
    FillStale(v_pool_.get(), v_elems, stale);
    for (int r = 0; r < nreq; ++r) {
      for (int g = 0; g < nkv; ++g) {
        for (int t = 0; t < spec.lengths[r]; ++t) {
          for (int d = 0; d < dim; ++d) {
            StoreElement(k_pool_.get(), KIndex(r, g, t, d), k_[r][g][t * dim + d], k_scale_[g]);
            StoreElement(v_pool_.get(), VIndex(r, g, t, d), v_[r][g][t * dim + d], v_scale_[g]);
          }
        }
      }
    }

    v_max_.assign(nreq, std::vector<double>(nkv, 0.0));
    for (int r = 0; r < nreq; ++r) {
      for (int g = 0; g < nkv; ++g) {
        for (double x : v_[r][g]) v_max_[r][g] = std::max(v_max_[r][g], std::fabs(x));
      }
    }
    q_.resize(nreq);
    for (int r = 0; r < nreq; ++r) {
      q_[r].resize(static_cast<size_t>(spec.num_heads()) * dim);
      for (float& x : q_[r]) x = static_cast<float>(rng.Uniform() * spec.q_scale);
    }
    softmax_scale_ = 1.0f / std::sqrt(static_cast<float>(dim));
  }

  const CaseSpec& spec() const { return spec_; }
  size_t k_bytes() const { return k_bytes_; }

  PagedKvView View() const {
    PagedKvView kv;
    kv.dtype = spec_.dtype;
    kv.page_size = spec_.page_size;
    kv.num_kv_heads = spec_.num_kv_heads;
    kv.head_dim = spec_.head_dim;
    kv.k = k_pool_.get();
    kv.v = v_pool_.get();
    kv.page_stride = page_stride_;
    kv.head_stride = head_stride_;
    if (spec_.dtype == KvDtype::kFp8E4m3) {
      kv.k_scale = k_scale_.data();
      kv.v_scale = v_scale_.data();
    }
    return kv;
  }

  // Run returns the outputs of `fn`, [request][num_heads * head_dim].
  std::vector<std::vector<float>> Run(AttentionFn fn, ThreadPool* pool,
                                      const PagedKvView* view = nullptr, int num_heads = 0) const {
    return RunWith(fn, pool, view != nullptr ? *view : View(), num_heads, nullptr, nullptr);
  }

  // RunTagged runs with the in-kernel tag check: `page_tags` [num_pages] are the pool's tags,
  // expected[r] request r's expected tags; faults[r] receives the kernel's verdict.
  std::vector<std::vector<float>> RunTagged(AttentionFn fn, ThreadPool* pool,
                                            const std::vector<PageTag>& page_tags,
                                            const std::vector<std::vector<PageTag>>& expected,
                                            std::vector<int32_t>* faults) const {
    PagedKvView kv = View();
    kv.page_tags = page_tags.data();
    kv.num_pages = static_cast<int32_t>(page_tags.size());
    faults->assign(spec_.lengths.size(), 7777);
    return RunWith(fn, pool, kv, 0, &expected, faults);
  }
  const std::vector<int32_t>& page_table(int r) const { return page_tables_[r]; }
  int num_pages() const { return num_pages_; }

  // RunWith is Run and RunTagged: with `expected` set, each query carries its expected tags
  // and its fault slot.
  std::vector<std::vector<float>> RunWith(AttentionFn fn, ThreadPool* pool, const PagedKvView& kv,
                                          int num_heads,
                                          const std::vector<std::vector<PageTag>>* expected,
                                          std::vector<int32_t>* faults) const {
    const int nreq = static_cast<int>(spec_.lengths.size());
    std::vector<std::vector<float>> out(nreq);
    std::vector<DecodeQuery> queries(nreq);
    for (int r = 0; r < nreq; ++r) {
      out[r].assign(q_[r].size(), NAN);
      queries[r].q = q_[r].data();
      queries[r].page_table = page_tables_[r].data();
      queries[r].length = spec_.lengths[r];
      queries[r].out = out[r].data();
      if (expected != nullptr) {
        queries[r].expected_tags = (*expected)[r].data();
        queries[r].tag_fault = &(*faults)[r];
      }
    }
    fn(kv, num_heads > 0 ? num_heads : spec_.num_heads(), softmax_scale_, queries.data(), nreq,
       pool);
    return out;
  }

  // Naive returns FP64 attention over the logical values, straight from the definition.
  std::vector<std::vector<double>> Naive() const {
    const int dim = spec_.head_dim;
    const int nreq = static_cast<int>(spec_.lengths.size());
    std::vector<std::vector<double>> out(nreq);
    for (int r = 0; r < nreq; ++r) {
      const int len = spec_.lengths[r];
      out[r].resize(q_[r].size());
      for (int h = 0; h < spec_.num_heads(); ++h) {
        const int g = h / spec_.group;
        std::vector<double> s(len);
        for (int t = 0; t < len; ++t) {
          double dot = 0.0;
          for (int d = 0; d < dim; ++d) dot += q_[r][h * dim + d] * k_[r][g][t * dim + d];
          s[t] = dot * softmax_scale_;
        }
        const double m = *std::max_element(s.begin(), s.end());
        double sum = 0.0;
        for (double& x : s) sum += (x = std::exp(x - m));
        for (int d = 0; d < dim; ++d) {
          double acc = 0.0;
          for (int t = 0; t < len; ++t) acc += s[t] * v_[r][g][t * dim + d];
          out[r][h * dim + d] = acc / sum;
        }
      }
    }
    return out;
  }

  // MaxError returns the largest max_d |a - b| / max |V| over all requests and query heads,
  // each divided by budget(request, head) when given (so that <= 1 is within budget).
  template <class A, class B>
  double MaxError(const std::vector<std::vector<A>>& a, const std::vector<std::vector<B>>& b,
                  const std::vector<std::vector<double>>* budget = nullptr) const {
    const int dim = spec_.head_dim;
    double worst = 0.0;
    for (size_t r = 0; r < a.size(); ++r) {
      for (int h = 0; h < spec_.num_heads(); ++h) {
        const double vmax = v_max_[r][h / spec_.group];
        const double unit = budget != nullptr ? (*budget)[r][h] : 1.0;
        for (int d = 0; d < dim; ++d) {
          const double e = std::fabs(static_cast<double>(a[r][h * dim + d]) -
                                     static_cast<double>(b[r][h * dim + d])) /
                           vmax / unit;
          worst = std::max(worst, std::isnan(e) ? INFINITY : e);
        }
      }
    }
    return worst;
  }

  // SubnormalVBound returns, in units of max |V| of (request r, kv head g), how far the BF16
  // products arithmetic may move an output by reading FP8 V's subnormal codes (|v| < 2^-6
  // v_scale) as zero: the weights sum to 1. Zero for other dtypes.
  double SubnormalVBound(int r, int g) const {
    if (spec_.dtype != KvDtype::kFp8E4m3) return 0.0;
    return 0x1p-6 * v_scale_[g] / v_max_[r][g];
  }

  // Bf16ProductsBudget returns the kBf16Products budget of every (request, query head), in
  // units of max |V|: ref::Bf16ProductsErrorBound plus the FP32 budget.
  std::vector<std::vector<double>> Bf16ProductsBudget() const {
    std::vector<std::vector<double>> budget(spec_.lengths.size());
    const PagedKvView kv = View();
    for (size_t r = 0; r < budget.size(); ++r) {
      DecodeQuery query;
      query.q = q_[r].data();
      query.page_table = page_tables_[r].data();
      query.length = spec_.lengths[r];
      for (int h = 0; h < spec_.num_heads(); ++h) {
        const double bound =
            ref::Bf16ProductsErrorBound(kv, spec_.num_heads(), softmax_scale_, query, h);
        budget[r].push_back(bound / v_max_[r][h / spec_.group] + Budget(spec_.dtype));
      }
    }
    return budget;
  }

  // KElement / VElement return the bytes of element (request r, kv head g, token t, dim d).
  uint8_t* KElement(int r, int g, int t, int d) {
    return k_pool_.get() + KIndex(r, g, t, d) * KvDtypeBytes(spec_.dtype);
  }
  uint8_t* VElement(int r, int g, int t, int d) {
    return v_pool_.get() + VIndex(r, g, t, d) * KvDtypeBytes(spec_.dtype);
  }
  // SetK replaces logical K element (r, g, t, d) by x (rounded to the dtype) in the pool too.
  void SetK(int r, int g, int t, int d, double x) {
    const double rounded = Quantise(x, k_scale_[g]);
    k_[r][g][static_cast<size_t>(t) * spec_.head_dim + d] = rounded;
    StoreElement(k_pool_.get(), KIndex(r, g, t, d), rounded, k_scale_[g]);
  }
  void SetQ(int r, int h, int d, float x) {
    q_[r][static_cast<size_t>(h) * spec_.head_dim + d] = x;
  }

 private:
  double Quantise(double x, float scale) const {
    switch (spec_.dtype) {
      case KvDtype::kFp32:
        return static_cast<float>(x);
      case KvDtype::kBf16:
        return Bf16ToFloat(Bf16FromFloat(static_cast<float>(x)));
      case KvDtype::kFp8E4m3:
        return static_cast<double>(
                   Fp8E4m3ToFloat(Fp8E4m3FromFloat(static_cast<float>(x / scale)))) *
               scale;
    }
    return 0.0;
  }

  void StoreElement(uint8_t* pool, size_t index, double x, float scale) const {
    // FP8: x is already on the FP8 grid times scale, so the division is exact in the codes.
    StoreKvElement(spec_.dtype, static_cast<float>(x), scale, pool, index);
  }

  void FillStale(uint8_t* pool, size_t elems, Stale stale) const {
    const size_t esize = KvDtypeBytes(spec_.dtype);
    if (stale == Stale::kZero) {
      std::memset(pool, 0, elems * esize);
      return;
    }
    for (size_t i = 0; i < elems; ++i) {
      switch (spec_.dtype) {
        case KvDtype::kFp32: {
          const float nan = (i & 1) ? NAN : -NAN;
          std::memcpy(pool + i * 4, &nan, 4);
          break;
        }
        case KvDtype::kBf16: {
          const uint16_t nan = (i & 1) ? 0x7FC0 : 0xFFC1;
          std::memcpy(pool + i * 2, &nan, 2);
          break;
        }
        case KvDtype::kFp8E4m3:
          pool[i] = (i & 1) ? 0x7F : 0xFF;
          break;
      }
    }
  }

  size_t KIndex(int r, int g, int t, int d) const {
    const int page = spec_.page_size;
    return static_cast<size_t>(page_tables_[r][t / page] * page_stride_ + g * head_stride_ +
                               static_cast<int64_t>(d) * page + t % page);
  }
  size_t VIndex(int r, int g, int t, int d) const {
    const int page = spec_.page_size;
    return static_cast<size_t>(page_tables_[r][t / page] * page_stride_ + g * head_stride_ +
                               static_cast<int64_t>(t % page) * spec_.head_dim + d);
  }

  CaseSpec spec_;
  std::vector<std::vector<std::vector<double>>> k_, v_;  // [request][kv head][token * dim]
  std::vector<std::vector<double>> v_max_;               // [request][kv head] max |V|
  std::vector<float> k_scale_, v_scale_;
  std::vector<std::vector<float>> q_;  // [request][num_heads * dim]
  std::vector<std::vector<int32_t>> page_tables_;
  int num_pages_ = 0;
  int64_t head_stride_ = 0, page_stride_ = 0;
  size_t k_bytes_ = 0, v_bytes_ = 0;
  std::unique_ptr<uint8_t[]> k_pool_, v_pool_;
  float softmax_scale_ = 1.0f;
};

// CheckCase compares ref with the definition, and the SIMD kernel with ref on every supported
// target at 1 and 2 threads. Returns the largest SIMD error seen.
double CheckCase(const CaseSpec& spec) {
  SCOPED_TRACE(spec.Describe());
  const PagedKvCase c(spec, Stale::kNan);
  ThreadPool one(1), two(2);
  const auto expected = c.Run(ref::PagedDecodeAttention, &one);
  const double ref_err = c.MaxError(expected, c.Naive());
  EXPECT_LE(ref_err, kRefBudget) << "ref vs definition";
  double worst = 0.0;
  const std::vector<int64_t> targets = SupportedTargets();
  for (int64_t target : targets) {
    SCOPED_TRACE(TargetName(target));
    ForceTarget(target);
    const bool bf16 = PagedAttentionArithmetic(c.View()) == AttentionArithmetic::kBf16Products;
    const auto budget = bf16 ? c.Bf16ProductsBudget() : std::vector<std::vector<double>>();
    for (ThreadPool* pool : {&one, &two}) {
      SCOPED_TRACE("threads " + std::to_string(pool->size()) +
                   (bf16 ? ", BF16 products" : ", FP32"));
      const auto out = c.Run(PagedDecodeAttention, pool);
      if (bf16) {
        EXPECT_LE(c.MaxError(out, expected, &budget), 1.0) << "in units of the derived budget";
      } else {
        EXPECT_LE(c.MaxError(out, expected), Budget(spec.dtype));
      }
      worst = std::max(worst, c.MaxError(out, expected));
    }
  }
  ResetTarget();
  return worst;
}

// Page sizes 1, 8, 16, 32 (narrower than, equal to and wider than a vector) with lengths 1,
// P-1, P, P+1 and longer, all in one call, every head dim (16 and 32: one vector or a few per
// row, through AccumulateV's one-vector tail; 48: the wide pass and the tail; 64 and 128: the
// tuned paths), all dtypes.
TEST(PagedAttentionTest, PageSizesAndPartialPages) {
  for (KvDtype dtype : kAllDtypes) {
    for (int dim : {16, 32, 48, 64, 128}) {
      for (int page : {1, 8, 16, 32}) {
        CaseSpec spec;
        spec.dtype = dtype;
        spec.head_dim = dim;
        spec.page_size = page;
        spec.lengths = {page + 1, 1, std::max(page - 1, 1), page, 3 * page + 5};
        spec.seed = static_cast<uint64_t>(page * 1000 + dim);
        CheckCase(spec);
      }
    }
  }
}

// GQA ratios 1, 2, 4, 8, plus 3 (a tile size that is not a power of two) and 16 (two tiles).
TEST(PagedAttentionTest, GqaRatios) {
  for (KvDtype dtype : kAllDtypes) {
    for (int group : {1, 2, 3, 4, 8, 16}) {
      CaseSpec spec;
      spec.dtype = dtype;
      spec.group = group;
      spec.num_kv_heads = group >= 8 ? 2 : 3;
      spec.head_dim = group == 2 ? 64 : group == 3 ? 16 : 128;
      spec.lengths = {17, 1, 33};
      spec.head_pad = 7;
      spec.seed = static_cast<uint64_t>(group);
      CheckCase(spec);
    }
  }
}

// Long contexts and several requests of different lengths: with 2 threads the long items are
// split (split-K) and their partial states merged.
TEST(PagedAttentionTest, LongContextsAndSplitK) {
  for (KvDtype dtype : kAllDtypes) {
    CaseSpec spec;
    spec.dtype = dtype;
    spec.num_kv_heads = 1;
    spec.group = 2;
    spec.head_dim = 64;
    spec.lengths = {3000};
    spec.seed = 11;
    CheckCase(spec);
  }
  // Mixed lengths with 2 threads: 1100 is split in 3 pieces and 700 in 2, the short ones not.
  CaseSpec spec;
  spec.dtype = KvDtype::kFp8E4m3;
  spec.num_kv_heads = 1;
  spec.page_size = 32;
  spec.lengths = {700, 37, 1100, 1};
  spec.seed = 12;
  CheckCase(spec);
}

// Large q gives logits of +-1e4 and more (q_scale 1e4: one token dominates) or up to about
// +-150 (q_scale 30: several tokens share the weight); exp without the running max overflows
// FP32 beyond 88. The outputs stay finite and within budget: the score rounding error grows with
// |score| (~2^-24 * 150 * sqrt(128), 2e-4 absolute), but only score differences matter, and
// the measured error stays below 2e-6 of max |V|.
TEST(PagedAttentionTest, ExtremeLogitsDoNotOverflow) {
  for (KvDtype dtype : kAllDtypes) {
    CaseSpec spec;
    spec.dtype = dtype;
    spec.q_scale = 1e4;
    spec.lengths = {50, 200};
    spec.seed = 21;
    CheckCase(spec);
    spec.q_scale = 30;
    CheckCase(spec);
  }
}

// K and V of magnitude 1e-6 or 1e6 (FP8 scales of ~1e-9 or ~1e3), q scaled the other way so the
// logits stay ordinary: the kernels must not overflow or flush anything on the way (found by the
// kernel_diff fuzz target: a tiny K scale times the BF16 kernel's power-of-two query scaling
// once overflowed FP32 although the scaled query itself did not).
TEST(PagedAttentionTest, TinyAndHugeKvMagnitudes) {
  for (KvDtype dtype : kAllDtypes) {
    for (double kv_scale : {1e-6, 1e6}) {
      CaseSpec spec;
      spec.dtype = dtype;
      spec.kv_scale = kv_scale;
      spec.q_scale = 1.0 / kv_scale;
      spec.page_size = 7;
      spec.lengths = {5, 40, 3};
      spec.seed = 23;
      CheckCase(spec);
    }
  }
}

// The first 64 tokens score 0 and the 8128 after them 7.75: below the BF16 kernel's lazy
// rescale threshold (8), so the first task's running max stays at 0 and its later probabilities
// are e^7.75 (times the kernel's 2^110 probability scale, 3e36 each). A running sum kept in the
// scaled units would overflow FP32 after about 113 such values per lane; a task here (the
// request is cut into 4096-token pieces even on one thread) adds about 250 per lane. The output
// must be finite and match the reference.
TEST(PagedAttentionTest, ScoresJustBelowTheLazyRescaleThreshold) {
  for (KvDtype dtype : kAllDtypes) {
    CaseSpec spec;
    spec.dtype = dtype;
    spec.num_kv_heads = 1;
    spec.group = 1;
    spec.head_dim = 64;
    spec.lengths = {8192};
    spec.seed = 24;
    SCOPED_TRACE(spec.Describe());
    PagedKvCase c(spec, Stale::kNan);
    for (int t = 0; t < spec.lengths[0]; ++t) {
      for (int d = 0; d < spec.head_dim; ++d) c.SetK(0, 0, t, d, d == 0 && t >= 64 ? 1.0 : 0.0);
    }
    for (int d = 0; d < spec.head_dim; ++d)
      c.SetQ(0, 0, d, d == 0 ? 7.75f * 8.0f : 0.0f);  // softmax scale 1/8
    ThreadPool one(1), two(2);
    const auto expected = c.Run(ref::PagedDecodeAttention, &one);
    EXPECT_LE(c.MaxError(expected, c.Naive()), kRefBudget);
    for (int64_t target : SupportedTargets()) {
      SCOPED_TRACE(TargetName(target));
      ForceTarget(target);
      const bool bf16 = PagedAttentionArithmetic(c.View()) == AttentionArithmetic::kBf16Products;
      const auto budget = bf16 ? c.Bf16ProductsBudget() : std::vector<std::vector<double>>();
      for (ThreadPool* pool : {&one, &two}) {
        const auto out = c.Run(PagedDecodeAttention, pool);
        for (float x : out[0]) ASSERT_TRUE(std::isfinite(x));
        if (bf16) {
          EXPECT_LE(c.MaxError(out, expected, &budget), 1.0) << "in units of the derived budget";
        } else {
          EXPECT_LE(c.MaxError(out, expected), Budget(dtype));
        }
      }
    }
    ResetTarget();
  }
}

// Equal huge logits: every token's K is e_0 and q = 1e6 e_0, so every score is ~9e4 and the
// softmax is uniform (the output is the mean of the V rows). A kernel that exponentiates before
// subtracting the running max produces inf/NaN here.
TEST(PagedAttentionTest, EqualHugeLogitsAverageV) {
  for (KvDtype dtype : kAllDtypes) {
    CaseSpec spec;
    spec.dtype = dtype;
    spec.lengths = {40, 333};
    spec.seed = 22;
    SCOPED_TRACE(spec.Describe());
    PagedKvCase c(spec, Stale::kNan);
    for (int r = 0; r < 2; ++r) {
      for (int g = 0; g < spec.num_kv_heads; ++g) {
        for (int t = 0; t < spec.lengths[r]; ++t) {
          for (int d = 0; d < spec.head_dim; ++d) c.SetK(r, g, t, d, d == 0 ? 1.0 : 0.0);
        }
      }
      for (int h = 0; h < spec.num_heads(); ++h) {
        for (int d = 0; d < spec.head_dim; ++d) c.SetQ(r, h, d, d == 0 ? 1e6f : 0.0f);
      }
    }
    const auto naive = c.Naive();
    ThreadPool one(1), two(2);
    const auto expected = c.Run(ref::PagedDecodeAttention, &one);
    EXPECT_LE(c.MaxError(expected, naive), kRefBudget);
    const std::vector<int64_t> targets = SupportedTargets();
    for (int64_t target : targets) {
      SCOPED_TRACE(TargetName(target));
      ForceTarget(target);
      for (ThreadPool* pool : {&one, &two}) {
        const auto out = c.Run(PagedDecodeAttention, pool);
        for (const auto& row : out) {
          for (float x : row) ASSERT_TRUE(std::isfinite(x));
        }
        EXPECT_LE(c.MaxError(out, naive), Budget(dtype));
      }
    }
    ResetTarget();
  }
}

// One dominant token: K is zero except K[t*][0] = 1, q = 3000 e_0, so token t* scores about
// 3000 / sqrt(head_dim) and every other token 0: its weight is exactly 1 and the others'
// exactly 0 in FP32, and the output must be V[t*] to FP32 precision in every arithmetic (BF16
// products included: 1 and 0 are exact; there FP8 V's subnormal codes read as zero, so their
// bound, 2^-6 v_scale, is added). t* moves over the first, last and partial pages and
// differs per request and kv head, so a wrong token, dim, pair or page mapping shows at full
// precision. Positive twin: the FP64 definition (Naive) gives the same V[t*].
TEST(PagedAttentionTest, DominantTokenSelectsItsV) {
  for (KvDtype dtype : kAllDtypes) {
    for (int dim : {64, 128}) {
      for (int page : {1, 8, 16, 32}) {
        CaseSpec spec;
        spec.dtype = dtype;
        spec.head_dim = dim;
        spec.page_size = page;
        spec.group = 4;
        spec.lengths = {3 * page + 5, 2 * page, 1};
        spec.seed = static_cast<uint64_t>(dim + page);
        SCOPED_TRACE(spec.Describe());
        PagedKvCase c(spec, Stale::kNan);
        for (int r = 0; r < 3; ++r) {
          for (int g = 0; g < spec.num_kv_heads; ++g) {
            for (int t = 0; t < spec.lengths[r]; ++t) {
              for (int d = 0; d < dim; ++d) c.SetK(r, g, t, d, 0.0);
            }
          }
          for (int h = 0; h < spec.num_heads(); ++h) {
            for (int d = 0; d < dim; ++d) c.SetQ(r, h, d, d == 0 ? 3000.0f : 0.0f);
          }
        }
        ThreadPool one(1), two(2);
        std::vector<std::vector<int>> chosen(3, std::vector<int>(spec.num_kv_heads, 0));
        for (int trial = 0; trial < 6; ++trial) {
          for (int r = 0; r < 3; ++r) {
            const int len = spec.lengths[r];
            for (int g = 0; g < spec.num_kv_heads; ++g) {
              c.SetK(r, g, chosen[r][g], 0, 0.0);
              const int candidates[] = {0, len - 1, page - 1, page, len / 2, len - 2};
              chosen[r][g] = std::clamp(candidates[(trial + g) % 6], 0, len - 1);
              c.SetK(r, g, chosen[r][g], 0, 1.0);
            }
          }
          const auto naive = c.Naive();
          for (int64_t target : SupportedTargets()) {
            SCOPED_TRACE(TargetName(target) + " trial " + std::to_string(trial));
            ForceTarget(target);
            const bool bf16 =
                PagedAttentionArithmetic(c.View()) == AttentionArithmetic::kBf16Products;
            double budget = 1e-6;
            for (int r = 0; r < 3 && bf16; ++r) {
              for (int g = 0; g < spec.num_kv_heads; ++g) {
                budget = std::max(budget, 1e-6 + c.SubnormalVBound(r, g));
              }
            }
            for (ThreadPool* pool : {&one, &two}) {
              EXPECT_LE(c.MaxError(c.Run(PagedDecodeAttention, pool), naive), budget);
            }
          }
          ResetTarget();
        }
      }
    }
  }
}

// Bytes beyond a request's length in its last page (and between heads, and in unused pages)
// are never read: filling them with NaN codes instead of zeros changes no output bit, and the
// guarded partial page ends its allocation (ASan catches any overread).
// Positive twin: changing the last valid token's K or V does change the output, so the test
// would see a kernel that drops the tail.
TEST(PagedAttentionTest, StaleBytesBeyondLengthAreNeverRead) {
  for (KvDtype dtype : kAllDtypes) {
    for (int page : {1, 8, 16, 32}) {
      CaseSpec spec;
      spec.dtype = dtype;
      spec.page_size = page;
      spec.head_pad = 3;
      spec.lengths = {page + std::max(page / 2, 1), 3 * page - 1, 1};
      if (page == 1) spec.lengths = {5, 9, 1};
      spec.seed = static_cast<uint64_t>(31 + page);
      SCOPED_TRACE(spec.Describe());
      const PagedKvCase zeros(spec, Stale::kZero);
      PagedKvCase nans(spec, Stale::kNan);
      ThreadPool one(1), two(2);
      const std::vector<int64_t> targets = SupportedTargets();
      for (int64_t target : targets) {
        SCOPED_TRACE(TargetName(target));
        ForceTarget(target);
        for (ThreadPool* pool : {&one, &two}) {
          const auto a = zeros.Run(PagedDecodeAttention, pool);
          const auto b = nans.Run(PagedDecodeAttention, pool);
          for (size_t r = 0; r < a.size(); ++r) {
            for (size_t i = 0; i < a[r].size(); ++i) {
              ASSERT_TRUE(std::isfinite(b[r][i])) << "request " << r << " element " << i;
              ASSERT_EQ(a[r][i], b[r][i]) << "request " << r << " element " << i;
            }
          }
        }
      }
      ResetTarget();
      const auto ref_a = zeros.Run(ref::PagedDecodeAttention, &one);
      const auto ref_b = nans.Run(ref::PagedDecodeAttention, &one);
      EXPECT_EQ(ref_a, ref_b);

      // Positive twin: the last valid token (in the partial last page) is read, K and V.
      const auto base = nans.Run(PagedDecodeAttention, &one);
      const int r = 0;
      const int last = spec.lengths[r] - 1;
      const size_t esize = KvDtypeBytes(dtype);
      for (bool is_k : {true, false}) {
        uint8_t* e = is_k ? nans.KElement(r, 1, last, 0) : nans.VElement(r, 1, last, 0);
        uint8_t saved[4];
        std::memcpy(saved, e, esize);
        // A large finite value of the same dtype (FP8: the largest code, BF16/FP32: 64.0).
        if (dtype == KvDtype::kFp8E4m3) {
          *e = kFp8E4m3MaxCode;
        } else if (dtype == KvDtype::kBf16) {
          const uint16_t b = Bf16FromFloat(64.0f);
          std::memcpy(e, &b, 2);
        } else {
          const float f = 64.0f;
          std::memcpy(e, &f, 4);
        }
        const auto changed = nans.Run(PagedDecodeAttention, &one);
        std::memcpy(e, saved, esize);
        // Heads of kv head 1 change, heads of kv head 0 do not.
        const int dim = spec.head_dim;
        double moved = 0.0, untouched = 0.0;
        for (int h = 0; h < spec.num_heads(); ++h) {
          for (int d = 0; d < dim; ++d) {
            const double diff = std::fabs(changed[r][h * dim + d] - base[r][h * dim + d]);
            (h / spec.group == 1 ? moved : untouched) += diff;
          }
        }
        EXPECT_GT(moved, 1e-3) << (is_k ? "K" : "V") << " of the last valid token was not read";
        EXPECT_EQ(untouched, 0.0) << (is_k ? "K" : "V");
      }
    }
  }
}

// The in-kernel tag check: with every expected tag right, results are exactly those of the
// unchecked call; one flipped byte of any one page's expected tag, or a page id beyond the
// pool, fails that request alone (zeroed output, the failing index reported) and leaves the
// others bit-identical. Both implementations, 1 and 2 threads.
TEST(PagedAttentionTest, TagCheckFailsOnlyTheRequestWithAWrongTag) {
  CaseSpec spec;
  spec.dtype = KvDtype::kFp8E4m3;
  spec.lengths = {40, 17, 64};
  spec.seed = 77;
  const PagedKvCase c(spec, Stale::kNan);
  std::vector<PageTag> tags(static_cast<size_t>(c.num_pages()));
  for (size_t p = 0; p < tags.size(); ++p) tags[p] = PageTag{0x9E3779B97F4A7C15ull * (p + 1), ~p};
  std::vector<std::vector<PageTag>> expected(spec.lengths.size());
  for (size_t r = 0; r < expected.size(); ++r) {
    for (int32_t p : c.page_table(static_cast<int>(r))) expected[r].push_back(tags[size_t(p)]);
  }
  ThreadPool one(1), two(2);
  for (AttentionFn fn : {&PagedDecodeAttention, &ref::PagedDecodeAttention}) {
    for (ThreadPool* pool : {&one, &two}) {
      const auto base = c.Run(fn, pool);
      std::vector<int32_t> faults;
      EXPECT_EQ(c.RunTagged(fn, pool, tags, expected, &faults), base);  // positive twin
      EXPECT_EQ(faults, std::vector<int32_t>(spec.lengths.size(), -1));
      int flip = 0;
      for (size_t r = 0; r < expected.size(); ++r) {
        for (size_t i = 0; i < expected[r].size(); ++i, ++flip) {
          auto bad = expected;
          reinterpret_cast<uint8_t*>(&bad[r][i])[flip % 16] ^= 0x42;
          const auto out = c.RunTagged(fn, pool, tags, bad, &faults);
          for (size_t o = 0; o < expected.size(); ++o) {
            if (o == r) {
              EXPECT_EQ(faults[o], static_cast<int32_t>(i)) << "request " << r << " page " << i;
              EXPECT_EQ(out[o], std::vector<float>(out[o].size(), 0.0f));
            } else {
              EXPECT_EQ(faults[o], -1);
              EXPECT_EQ(out[o], base[o]) << "request " << o << " changed by request " << r;
            }
          }
        }
      }
      // A page id beyond the pool is a fault, not a read: the view claims fewer pages than the
      // largest id request 2 uses.
      int32_t largest = 0;
      for (int32_t p : c.page_table(2)) largest = std::max(largest, p);
      const std::vector<PageTag> fewer(tags.begin(), tags.begin() + largest);
      c.RunTagged(fn, pool, fewer, expected, &faults);
      EXPECT_GE(faults[2], 0);
    }
  }
}

// Broken preconditions are CHECK failures in both implementations; the positive twin is the
// same call with valid parameters.
// A page nobody owns carries the all-zero tag, so a page table entry that expects zero (a
// forged or never-granted entry) must fail the check, not match a free page. Found while
// writing the page_ops fuzz target's shadow model: an `off` tenant's page table is not
// verified, so the kernel check is its only line, and a zero entry used to pass it.
TEST(PagedAttentionTest, ZeroExpectedTagNeverMatchesAFreePage) {
  const std::vector<PageTag> tags = {PageTag{}, PageTag{7, 9}};
  PagedKvView kv;
  kv.page_size = 4;
  kv.page_tags = tags.data();
  kv.num_pages = 2;
  const int32_t free_page = 0, owned_page = 1;
  const PageTag zero{}, owned{7, 9};
  DecodeQuery q;
  q.length = 3;
  q.page_table = &free_page;
  q.expected_tags = &zero;
  EXPECT_EQ(FirstTagFault(kv, q), 0);
  // Positive twin: the owned page with its own tag passes.
  q.page_table = &owned_page;
  q.expected_tags = &owned;
  EXPECT_EQ(FirstTagFault(kv, q), -1);
  // The same rule in the write checks (core/model/model.cc uses PageTagMatches before every write).
  EXPECT_FALSE(PageTagMatches(tags.data(), 2, free_page, zero));
  EXPECT_TRUE(PageTagMatches(tags.data(), 2, owned_page, owned));
  EXPECT_FALSE(PageTagMatches(tags.data(), 2, 2, owned));  // outside the pool
  EXPECT_FALSE(TagMatches(PageTag{}, PageTag{}));
}

TEST(PagedAttentionDeathTest, RejectsBadShapes) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  CaseSpec spec;
  spec.lengths = {5};
  const PagedKvCase c(spec, Stale::kZero);
  ThreadPool one(1);
  for (AttentionFn fn : {ref::PagedDecodeAttention, PagedDecodeAttention}) {
    const auto ok = c.Run(fn, &one);
    EXPECT_TRUE(std::isfinite(ok[0][0]));
    PagedKvView bad_dim = c.View();
    bad_dim.head_dim = 24;  // even, but not whole vectors
    EXPECT_DEATH(c.Run(fn, &one, &bad_dim), "head_dim must be a multiple of 16");
    bad_dim.head_dim = 272;  // beyond the largest supported
    EXPECT_DEATH(c.Run(fn, &one, &bad_dim), "head_dim must be a multiple of 16");
    EXPECT_DEATH(c.Run(fn, &one, nullptr, spec.num_heads() + 1),
                 "num_heads must be a multiple of num_kv_heads");
  }
}

}  // namespace
}  // namespace kvguard::kernels
