// kernels/cpu/attention_ref.cc: scalar paged decode attention, the oracle for attention.cc.
//
// Written straight from the definition: every score in FP64, then a two-pass softmax (max, then
// sum of exponentials) and the weighted sum of V rows, also in FP64. Elements are decoded with
// the scalar codecs of kernels/formats.h. Only tokens below a request's length are touched.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/base/internal/raw_logging.h"
#include "kernels/cpu/attention.h"
#include "kernels/formats.h"

namespace kvguard::kernels {
namespace attention_internal {

// Shared by the SIMD kernel and the reference, so both keep the same fail-closed contract.
const DecodeQuery* CheckTags(const PagedKvView& kv, int num_heads, const DecodeQuery* queries,
                             int num_queries, std::vector<DecodeQuery>* live, int* count) {
  *count = num_queries;
  // Bad shapes are left to the callers' CHECKs, which follow (and name the problem).
  if (kv.page_tags == nullptr || kv.page_size < 1) return queries;
  std::vector<bool> failed;
  for (int r = 0; r < num_queries; ++r) {
    const DecodeQuery& q = queries[r];
    if (q.expected_tags == nullptr) continue;
    const int32_t fault = FirstTagFault(kv, q);
    if (q.tag_fault != nullptr) *q.tag_fault = fault;
    if (fault < 0) continue;
    std::fill_n(q.out, static_cast<size_t>(num_heads) * static_cast<size_t>(kv.head_dim), 0.0f);
    failed.resize(static_cast<size_t>(num_queries), false);
    failed[static_cast<size_t>(r)] = true;
  }
  if (failed.empty()) return queries;
  live->clear();
  for (int r = 0; r < num_queries; ++r) {
    if (!failed[static_cast<size_t>(r)]) live->push_back(queries[r]);
  }
  *count = static_cast<int>(live->size());
  return live->data();
}

}  // namespace attention_internal

namespace ref {
namespace {

// Element returns the decoded value of element `index` (in elements of kv.dtype) of `base`,
// times `scale` for FP8.
double Element(const PagedKvView& kv, const void* base, int64_t index, float scale) {
  switch (kv.dtype) {
    case KvDtype::kFp32:
      return static_cast<const float*>(base)[index];
    case KvDtype::kBf16:
      return Bf16ToFloat(static_cast<const uint16_t*>(base)[index]);
    case KvDtype::kFp8E4m3:
      return static_cast<double>(Fp8E4m3ToFloat(static_cast<const uint8_t*>(base)[index])) *
             static_cast<double>(scale);
  }
  return 0.0;
}

}  // namespace

// The pool is unused: the reference is single-threaded on purpose, so that it shares no
// scheduling or merging code with the kernel it checks.
void PagedDecodeAttention(const PagedKvView& kv, int num_heads, float softmax_scale,
                          const DecodeQuery* all_queries, int num_all, ThreadPool* /*pool*/) {
  std::vector<DecodeQuery> live;
  int num_queries = 0;
  const DecodeQuery* queries =
      attention_internal::CheckTags(kv, num_heads, all_queries, num_all, &live, &num_queries);
  ABSL_RAW_CHECK(kv.num_kv_heads > 0 && num_heads > 0, "attention: no heads");
  ABSL_RAW_CHECK(num_heads % kv.num_kv_heads == 0,
                 "attention: num_heads must be a multiple of num_kv_heads");
  ABSL_RAW_CHECK(IsSupportedHeadDim(kv.head_dim),
                 "attention: head_dim must be a multiple of 16 in [16, 256]");
  ABSL_RAW_CHECK(kv.page_size >= 1, "attention: page_size must be >= 1");
  ABSL_RAW_CHECK(kv.dtype != KvDtype::kFp8E4m3 || (kv.k_scale != nullptr && kv.v_scale != nullptr),
                 "attention: FP8 KV needs k_scale and v_scale");
  const int group = num_heads / kv.num_kv_heads;
  const int dim = kv.head_dim;
  const int page = kv.page_size;
  const bool fp8 = kv.dtype == KvDtype::kFp8E4m3;

  for (int r = 0; r < num_queries; ++r) {
    const DecodeQuery& query = queries[r];
    ABSL_RAW_CHECK(query.length >= 1, "attention: length must be >= 1");
    for (int i = 0; i <= (query.length - 1) / page; ++i) {
      ABSL_RAW_CHECK(query.page_table[i] >= 0, "attention: negative page id");
    }
    std::vector<double> weights(static_cast<size_t>(query.length));
    for (int h = 0; h < num_heads; ++h) {
      const int g = h / group;
      const float k_scale = fp8 ? kv.k_scale[g] : 1.0f;
      const float v_scale = fp8 ? kv.v_scale[g] : 1.0f;
      const float* q = query.q + static_cast<int64_t>(h) * dim;

      // Pass 1: scores and their maximum.
      double max_score = -INFINITY;
      for (int t = 0; t < query.length; ++t) {
        const int64_t base = static_cast<int64_t>(query.page_table[t / page]) * kv.page_stride +
                             static_cast<int64_t>(g) * kv.head_stride;
        double dot = 0.0;
        for (int d = 0; d < dim; ++d) {
          dot += static_cast<double>(q[d]) *
                 Element(kv, kv.k, base + static_cast<int64_t>(d) * page + t % page, k_scale);
        }
        weights[t] = dot * static_cast<double>(softmax_scale);
        max_score = std::max(max_score, weights[t]);
      }
      // Pass 2: exponentials, their sum, and the weighted sum of V rows.
      double sum = 0.0;
      for (int t = 0; t < query.length; ++t) {
        weights[t] = std::exp(weights[t] - max_score);
        sum += weights[t];
      }
      float* out = query.out + static_cast<int64_t>(h) * dim;
      for (int d = 0; d < dim; ++d) {
        double acc = 0.0;
        for (int t = 0; t < query.length; ++t) {
          const int64_t row = static_cast<int64_t>(query.page_table[t / page]) * kv.page_stride +
                              static_cast<int64_t>(g) * kv.head_stride +
                              static_cast<int64_t>(t % page) * dim;
          acc += weights[t] * Element(kv, kv.v, row + d, v_scale);
        }
        out[d] = static_cast<float>(acc / sum);
      }
    }
  }
}

double Bf16ProductsErrorBound(const PagedKvView& kv, int num_heads, float softmax_scale,
                              const DecodeQuery& query, int head) {
  const int group = num_heads / kv.num_kv_heads;
  const int g = head / group;
  const int dim = kv.head_dim;
  const int page = kv.page_size;
  const bool fp8 = kv.dtype == KvDtype::kFp8E4m3;
  const float k_scale = fp8 ? kv.k_scale[g] : 1.0f;
  const float v_scale = fp8 ? kv.v_scale[g] : 1.0f;
  const float* q = query.q + static_cast<int64_t>(head) * dim;
  double sum_q = 0.0;
  for (int d = 0; d < dim; ++d) sum_q += std::fabs(static_cast<double>(q[d]));
  double delta = 0.0, max_v = 0.0;
  for (int t = 0; t < query.length; ++t) {
    const int64_t base = static_cast<int64_t>(query.page_table[t / page]) * kv.page_stride +
                         static_cast<int64_t>(g) * kv.head_stride;
    double sum = 0.0;
    for (int d = 0; d < dim; ++d) {
      sum +=
          std::fabs(static_cast<double>(q[d]) *
                    Element(kv, kv.k, base + static_cast<int64_t>(d) * page + t % page, k_scale));
      max_v = std::max(
          max_v,
          std::fabs(Element(kv, kv.v, base + static_cast<int64_t>(t % page) * dim + d, v_scale)));
    }
    // 2^-8: q's rounding to BF16 (8 significant bits, to nearest); 2^-20: FP32 rounding of q *
    // scale and of the sums (generous).
    double score_error = sum * (0x1p-8 + 0x1p-20);
    if (fp8) score_error += sum_q * 0x1p-6 * k_scale;  // subnormal K codes read as zero
    delta = std::max(delta, score_error * static_cast<double>(softmax_scale));
  }
  // Each weight moves by a factor within e^(+-2 delta) from the scores, and by 2^-8 (1 + 2^-8)
  // relative from rounding the probabilities and normalising by their own sum; the weights
  // sum to 1. FP8 V's subnormal codes, read as zero, are below 2^-6 v_scale.
  return max_v * (std::expm1(2.0 * delta) + 0x1p-8 * (1.0 + 0x1p-8)) +
         (fp8 ? 0x1p-6 * static_cast<double>(v_scale) : 0.0);
}

}  // namespace ref
}  // namespace kvguard::kernels
