// kernels/cuda/attention.cu: see attention.h.
//
// Grid: (split, kv head, request). A block of 128 threads takes one kv head of one request
// over up to kSplitTokens tokens, all `group` query heads of that kv head together (so each K
// and V element is loaded once per step), in chunks of 128 tokens:
//   1. the tag check of every page of its range (before any K/V load);
//   2. the chunk's K, [head_dim, 128 tokens], into shared memory: consecutive threads read
//      consecutive bytes of each page's contiguous [head_dim, P] block, and only tokens below
//      the request's length (stale bytes of a partial last page are never loaded);
//   3. one thread per token: its score for every head;
//   4. per head, the block's max and sum update the running (max, sum) of the online softmax;
//   5. one thread per dim: the accumulator of every head, rescaled, plus p * V over the chunk
//      (V rows read straight from memory: a row of head_dim elements is contiguous).
// The block writes its partial state (max, sum, accumulator per head); MergeKernel weighs the
// partial states of a request's blocks by exp(max_i - max) and normalises, or writes zeros for a
// request whose tag check failed.
#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/internal/launch.cuh"

namespace kvguard::kernels::cuda {
namespace {

using internal::BlockMax;
using internal::BlockSum;
using internal::LaunchStatus;
using internal::Stream;

constexpr int kThreads = 128;
constexpr int kChunk = kThreads;  // tokens per chunk: one per thread in the score pass

__device__ __forceinline__ float Decode(uint8_t code) { return Fp8E4m3ToFloat(code); }
__device__ __forceinline__ float Decode(uint16_t bits) { return Bf16ToFloat(bits); }

// PartialFloats: [group] running max, [group] sum, [group, head_dim] accumulator.
__host__ __device__ inline size_t PartialFloats(int group, int head_dim) {
  return static_cast<size_t>(group) * static_cast<size_t>(head_dim + 2);
}

__host__ __device__ inline int Splits(int length) {
  return (length + kSplitTokens - 1) / kSplitTokens;
}

// ReadTag reads a tag the host may be rewriting (a release racing the step is what the check
// is for): volatile, so a torn or stale read is a mismatch, never a cached value.
__device__ __forceinline__ PageTag ReadTag(const PageTag* tags, int32_t page) {
  const volatile uint64_t* p = reinterpret_cast<const volatile uint64_t*>(tags + page);
  PageTag t;
  t.lo = p[0];
  t.hi = p[1];
  return t;
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads)
    AttendKernel(PagedKvView kv, int group, int num_heads, float softmax_scale,
                 DeviceDecodeBatch batch, int splits_max, float* partials) {
  const int split = blockIdx.x, kv_head = blockIdx.y, r = blockIdx.z;
  const int tid = threadIdx.x;
  const int length = min(batch.lengths[r], splits_max * kSplitTokens);  // merge fails the rest
  const int t0 = split * kSplitTokens;
  if (t0 >= length) return;  // this request has fewer splits; the merge never reads this slot
  const int t1 = min(length, t0 + kSplitTokens);
  const int P = kv.page_size;
  const int32_t* table = batch.page_ids + batch.table_offsets[r];
  float* part =
      partials + ((static_cast<size_t>(r) * kv.num_kv_heads + kv_head) * splits_max + split) *
                     PartialFloats(group, D);

  __shared__ int bad;
  __shared__ float q_s[kMaxGroup][D];
  __shared__ T k_s[D][kChunk];
  __shared__ float p_s[kMaxGroup][kChunk];
  __shared__ float m_s[kMaxGroup], s_s[kMaxGroup], alpha_s[kMaxGroup];
  __shared__ float scratch[32];

  // 1. The tag check of this block's pages, before any of their K or V is loaded.
  if (tid == 0) bad = 0;
  __syncthreads();
  const int first_page = t0 / P, end_page = (t1 + P - 1) / P;
  if (batch.expected_tags != nullptr && kv.page_tags != nullptr) {
    const PageTag* expected = batch.expected_tags + batch.table_offsets[r];
    for (int i = first_page + tid; i < end_page; i += kThreads) {
      const int32_t page = table[i];
      bool ok = page >= 0 && page < kv.num_pages;
      if (ok) {
        const PageTag cur = ReadTag(kv.page_tags, page);
        const PageTag want = expected[i];
        // formats.h TagMatches: equal, and a zero expected tag (a free page's) never matches.
        ok = ((cur.lo ^ want.lo) | (cur.hi ^ want.hi)) == 0 && (want.lo | want.hi) != 0;
      }
      if (!ok) {
        // Unsigned: the -1 the launcher stored is the largest value, so any index replaces it
        // (a signed min would keep -1 for ever) and the smallest failing index wins.
        atomicMin(reinterpret_cast<unsigned int*>(&batch.tag_faults[r]),
                  static_cast<unsigned int>(i));
        bad = 1;
      }
    }
  }
  __syncthreads();
  if (bad) {
    // A neutral partial state (weight 0 in any merge), so that no stale workspace contents can
    // ever reach an output, whatever the merge decides.
    if (tid < group) {
      part[tid] = -INFINITY;
      part[group + tid] = 0.0f;
    }
    for (int i = tid; i < group * D; i += kThreads) part[2 * group + i] = 0.0f;
    return;
  }

  // 2. q of the group's heads, times softmax_scale (and the FP8 K scale: K is decoded to its
  // code values).
  const float k_factor = sizeof(T) == 1 ? kv.k_scale[kv_head] : 1.0f;
  const float* q = batch.q + (static_cast<size_t>(r) * num_heads + kv_head * group) * D;
  for (int i = tid; i < group * D; i += kThreads) {
    q_s[i / D][i % D] = q[i] * softmax_scale * k_factor;
  }
  if (tid < group) {
    m_s[tid] = -INFINITY;
    s_s[tid] = 0.0f;
  }
  float acc[kMaxGroup];
#pragma unroll
  for (int h = 0; h < kMaxGroup; ++h) acc[h] = 0.0f;
  __syncthreads();

  const T* k_base = static_cast<const T*>(kv.k) + kv_head * kv.head_stride;
  const T* v_base = static_cast<const T*>(kv.v) + kv_head * kv.head_stride;
  for (int c0 = t0; c0 < t1; c0 += kChunk) {
    const int n = min(kChunk, t1 - c0);
    // 3. The chunk's K: element e of the chunk's (kChunk / P) page blocks of [D, P], page by
    // page, so that consecutive threads read consecutive bytes.
    for (int e = tid; e < D * kChunk; e += kThreads) {
      const int in_chunk_page = e / (D * P), within = e % (D * P);
      const int d = within / P, slot = within % P;
      const int j = in_chunk_page * P + slot;
      T value = 0;
      if (j < n) {
        const int t = c0 + j;
        value = k_base[static_cast<int64_t>(table[t / P]) * kv.page_stride + d * P + slot];
      }
      k_s[d][j] = value;
    }
    __syncthreads();
    // 4. Scores, one token per thread, every head.
    {
      float sc[kMaxGroup];
#pragma unroll
      for (int h = 0; h < kMaxGroup; ++h) sc[h] = 0.0f;
      for (int d = 0; d < D; ++d) {
        const float kval = Decode(k_s[d][tid]);
#pragma unroll
        for (int h = 0; h < kMaxGroup; ++h) {
          if (h < group) sc[h] = fmaf(q_s[h][d], kval, sc[h]);
        }
      }
#pragma unroll
      for (int h = 0; h < kMaxGroup; ++h) {
        if (h < group) p_s[h][tid] = tid < n ? sc[h] : -INFINITY;
      }
    }
    __syncthreads();
    // 5. The online softmax, head by head.
    for (int h = 0; h < group; ++h) {
      const float x = p_s[h][tid];
      const float chunk_max = BlockMax(x, scratch);
      const float old_max = m_s[h];
      const float new_max = fmaxf(old_max, chunk_max);
      const float p = tid < n ? expf(x - new_max) : 0.0f;
      const float chunk_sum = BlockSum(p, scratch);
      __syncthreads();  // every thread has read m_s[h] before thread 0 moves it
      p_s[h][tid] = p;
      if (tid == 0) {
        const float alpha = expf(old_max - new_max);  // 0 for the first chunk
        alpha_s[h] = alpha;
        m_s[h] = new_max;
        s_s[h] = s_s[h] * alpha + chunk_sum;
      }
    }
    __syncthreads();
    // 6. V, one dim per thread.
    if (tid < D) {
#pragma unroll
      for (int h = 0; h < kMaxGroup; ++h) {
        if (h < group) acc[h] *= alpha_s[h];
      }
      for (int j = 0; j < n; ++j) {
        const int t = c0 + j;
        const float vval =
            Decode(v_base[static_cast<int64_t>(table[t / P]) * kv.page_stride + (t % P) * D + tid]);
#pragma unroll
        for (int h = 0; h < kMaxGroup; ++h) {
          if (h < group) acc[h] = fmaf(p_s[h][j], vval, acc[h]);
        }
      }
    }
    __syncthreads();  // before the next chunk overwrites k_s and p_s
  }

  if (tid < group) {
    part[tid] = m_s[tid];
    part[group + tid] = s_s[tid];
  }
  if (tid < D) {
#pragma unroll
    for (int h = 0; h < kMaxGroup; ++h) {
      if (h < group) part[2 * group + h * D + tid] = acc[h];
    }
  }
}

// One block per (request, query head), one thread per dim.
__global__ void MergeKernel(PagedKvView kv, int group, int num_heads, DeviceDecodeBatch batch,
                            int splits_max, const float* partials) {
  const int r = blockIdx.x, head = blockIdx.y, d = threadIdx.x;
  const int dim = kv.head_dim;
  float* out = batch.out + (static_cast<size_t>(r) * num_heads + head) * dim + d;
  if (batch.expected_tags != nullptr && batch.tag_faults[r] >= 0) {
    *out = 0.0f;  // the request is aborted: no output
    return;
  }
  const int g = head / group, h = head % group;
  const size_t stride = PartialFloats(group, dim);
  const float* base =
      partials + (static_cast<size_t>(r) * kv.num_kv_heads + g) * splits_max * stride;
  const int length = batch.lengths[r];
  if (length < 1 || length > splits_max * kSplitTokens) {
    // Metadata the launch was not sized for: fail the request rather than read slots of others.
    *out = 0.0f;
    if (batch.tag_faults != nullptr && d == 0 && h == 0) batch.tag_faults[r] = 0x7FFFFFFF;
    return;
  }
  const int splits = Splits(length);
  float max = -INFINITY;
  for (int i = 0; i < splits; ++i) max = fmaxf(max, base[i * stride + h]);
  float sum = 0.0f, acc = 0.0f;
  for (int i = 0; i < splits; ++i) {
    const float* state = base + i * stride;
    const float w = expf(state[h] - max);
    sum = fmaf(w, state[group + h], sum);
    acc = fmaf(w, state[2 * group + h * dim + d], acc);
  }
  const float v_factor = kv.dtype == KvDtype::kFp8E4m3 ? kv.v_scale[g] : 1.0f;
  *out = __fdiv_rn(acc * v_factor, sum);
}

template <typename T, int D>
void Launch(const PagedKvView& kv, int group, int num_heads, float softmax_scale,
            const DeviceDecodeBatch& batch, int splits_max, float* partials, cudaStream_t stream) {
  const dim3 grid(splits_max, kv.num_kv_heads, batch.num_queries);
  AttendKernel<T, D><<<grid, kThreads, 0, stream>>>(kv, group, num_heads, softmax_scale, batch,
                                                    splits_max, partials);
}

}  // namespace

size_t AttentionWorkspaceBytes(const PagedKvView& kv, int num_heads, int num_queries,
                               int max_length) {
  if (kv.num_kv_heads <= 0 || num_heads % kv.num_kv_heads != 0) return 0;
  return static_cast<size_t>(num_queries) * kv.num_kv_heads * Splits(max_length) *
         PartialFloats(num_heads / kv.num_kv_heads, kv.head_dim) * sizeof(float);
}

absl::Status PagedDecodeAttention(const PagedKvView& kv, int num_heads, float softmax_scale,
                                  const DeviceDecodeBatch& batch, void* workspace,
                                  size_t workspace_bytes, void* stream) {
  if (batch.num_queries == 0) return absl::OkStatus();
  if (kv.dtype == KvDtype::kFp32) {
    return absl::InvalidArgumentError("CUDA attention: FP8 or BF16 pages only");
  }
  if (kv.head_dim != 64 && kv.head_dim != 128) {
    return absl::InvalidArgumentError("CUDA attention: head_dim must be 64 or 128");
  }
  if (batch.num_queries < 0 || batch.num_queries > 65535) {
    return absl::InvalidArgumentError("CUDA attention: 0..65535 queries per launch");
  }
  if (kv.num_kv_heads <= 0 || num_heads <= 0 || num_heads % kv.num_kv_heads != 0 ||
      num_heads / kv.num_kv_heads > kMaxGroup) {
    return absl::InvalidArgumentError(
        "CUDA attention: num_heads must be a multiple of num_kv_heads, at most 8 times it");
  }
  if (kv.page_size < 1 || kChunk % kv.page_size != 0) {
    return absl::InvalidArgumentError("CUDA attention: page size must divide 128");
  }
  if (kv.dtype == KvDtype::kFp8E4m3 && (kv.k_scale == nullptr || kv.v_scale == nullptr)) {
    return absl::InvalidArgumentError("CUDA attention: FP8 KV needs k_scale and v_scale");
  }
  if (batch.expected_tags != nullptr && batch.tag_faults == nullptr) {
    return absl::InvalidArgumentError("CUDA attention: expected tags need tag_faults");
  }
  if (batch.max_length < 1 ||
      workspace_bytes <
          AttentionWorkspaceBytes(kv, num_heads, batch.num_queries, batch.max_length)) {
    return absl::InvalidArgumentError("CUDA attention: workspace too small for max_length");
  }
  const int group = num_heads / kv.num_kv_heads;
  const int splits_max = Splits(batch.max_length);
  float* partials = static_cast<float*>(workspace);
  cudaStream_t s = Stream(stream);
  if (batch.expected_tags != nullptr) {
    const cudaError_t err =
        cudaMemsetAsync(batch.tag_faults, 0xFF, sizeof(int32_t) * batch.num_queries, s);  // -1
    if (err != cudaSuccess) {
      return absl::InternalError(std::string("CUDA attention: ") + cudaGetErrorString(err));
    }
  }
  const bool fp8 = kv.dtype == KvDtype::kFp8E4m3;
  if (kv.head_dim == 64) {
    fp8 ? Launch<uint8_t, 64>(kv, group, num_heads, softmax_scale, batch, splits_max, partials, s)
        : Launch<uint16_t, 64>(kv, group, num_heads, softmax_scale, batch, splits_max, partials, s);
  } else {
    fp8 ? Launch<uint8_t, 128>(kv, group, num_heads, softmax_scale, batch, splits_max, partials, s)
        : Launch<uint16_t, 128>(kv, group, num_heads, softmax_scale, batch, splits_max, partials,
                                s);
  }
  if (absl::Status st = LaunchStatus("PagedDecodeAttention"); !st.ok()) return st;
  MergeKernel<<<dim3(batch.num_queries, num_heads), kv.head_dim, 0, s>>>(
      kv, group, num_heads, batch, splits_max, partials);
  return LaunchStatus("PagedDecodeAttention merge");
}

}  // namespace kvguard::kernels::cuda
