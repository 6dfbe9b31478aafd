// core/model/model.h: the Llama-family forward pass over the paged KV pool, with weights held per
// phase as in disaggregated serving: prefill weights (FP8 by default; compute-bound, so
// higher precision costs little) and decode weights (INT4 by default; memory-bound, so every
// byte not read is time saved). Where both phases use one format the matrices are shared.
#ifndef KVGUARD_CORE_MODEL_MODEL_H_
#define KVGUARD_CORE_MODEL_MODEL_H_

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model/kv_pool.h"
#include "core/model/model_config.h"
#include "core/model/weight_source.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/quantize.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/formats.h"

namespace kvguard::core {

struct ModelOptions {
  kernels::WeightFormat prefill_weights = kernels::WeightFormat::kFp8;  // fp8 | bf16 | fp32
  kernels::WeightFormat decode_weights = kernels::WeightFormat::kInt4;  // int4|fp8|bf16|fp32
  int int4_group = 128;
  // What the prefill matmuls do to their activations (kernels/cpu/matmul.h): kBf16 rounds them
  // to BF16 and runs FP8 and BF16 prefill weights on BF16 dot products where the CPU has them
  // (prefill is bound by multiply-adds; GPU deployments of FP8 prefill do the same with BF16 or
  // FP8 activations); kExact keeps FP32 activations. Decode matmuls always keep them exact.
  // Either way a request's outputs do not depend on what it is batched with.
  kernels::MatMulActivations prefill_activations = kernels::MatMulActivations::kBf16;
};

// ParseWeightFormat maps "fp32" | "bf16" | "fp8" | "int4" to a format; InvalidArgument else.
absl::StatusOr<kernels::WeightFormat> ParseWeightFormat(const std::string& name);

// DecodeMatrixFormat returns the format (and INT4 group) a decode matrix of `cols` input
// features gets when `requested` is asked for: INT4 takes the largest group <= int4_group
// (32, 64, 128) that divides cols; a matrix whose width no INT4 group divides (e.g. ffn_dim
// 172: ffn_down) is kept in FP8 instead (`*fallback` set). Padding K to the group would let it
// stay INT4, but every activation vector would then need padding too, in every matmul call;
// the fallback costs only that one matrix's bytes. Other formats are returned unchanged.
kernels::WeightFormat DecodeMatrixFormat(int cols, kernels::WeightFormat requested, int int4_group,
                                         int* group, bool* fallback);

// The largest decode batch one step handles (the matmul kernels' batch limit).
inline constexpr int kMaxDecodeBatch = 64;

class Model {
 public:
  // Load reads every tensor of `source` and quantises it into the formats `options` names.
  // InvalidArgument for an invalid combination (prefill INT4), or the source's error.
  static absl::StatusOr<std::unique_ptr<Model>> Load(const WeightSource& source,
                                                     const ModelOptions& options,
                                                     kernels::ThreadPool* pool);

  const ModelConfig& config() const { return config_; }
  const ModelOptions& options() const { return options_; }

  // WeightBytes returns the bytes of all quantised matrices held (both phases, shared once)
  // plus the FP32 embedding table and norms.
  size_t WeightBytes() const;

  // Int4Fallbacks returns how many decode matrices are FP8 although INT4 was asked for,
  // because no INT4 group (32, 64, 128) divides their input width.
  int Int4Fallbacks() const { return int4_fallbacks_; }

  // DecodeBytesPerStep returns the weight bytes one decode step reads (every decode matrix
  // once, the lm head included), excluding the KV cache.
  size_t DecodeWeightBytesPerStep() const;

  // Chunk is one sequence's share of a forward pass: its tokens at positions pos .. pos + n - 1,
  // whose pages (in token order) already hold positions 0 .. pos - 1 and have room up to
  // pos + n - 1. A decode step is a chunk of one token; a prompt is prefilled in one chunk or
  // in several, over several steps (chunked prefill): each attends over the earlier ones
  // through the same paged cache and page table as decode.
  struct Chunk {
    std::span<const int> tokens;
    int pos = 0;
    std::span<const PageGrant> pages;
    // prefill: the chunk's rows go through the prefill weights (FP8 by default, the
    // compute-bound phase), else through the decode weights (INT4 by default).
    bool prefill = false;
    bool logits = true;  // write the logits of the chunk's last token (its row of `logits`)
    // token_logits, if set: [tokens.size(), vocab], every token's logits, row t for token t
    // (prompt logprobs). They come out of the same pass as the rest; chunks that leave it
    // null cost nothing more.
    float* token_logits = nullptr;
    // check_tags: before every layer's writes, each page the chunk writes into must still
    // carry its grant's tag, and the attention kernel checks every page's tag against the
    // grants' before reading it (isolation's defence in depth, after the verifier).
    // *tag_fault receives -1 if all matched, else the index into `pages` of the first that did
    // not (nothing more of the chunk was written into or read from a foreign page; its logits
    // are meaningless).
    bool check_tags = false;
    int32_t* tag_fault = nullptr;
  };

  // Forward runs one step over `chunks` (any mix of decode tokens and prefill chunks of
  // different sequences; no two may be of one sequence): one layer body for every row, each
  // matrix multiplied once per phase's weights. Writes each token's K and V into its page
  // (quantised on write) before the layer's attention reads the cache, so a chunk's tokens
  // attend to each other causally; writes chunk i's logits, if asked for, to row i of
  // `logits` [chunks.size(), vocab], and every token's to its token_logits where set.
  // InvalidArgument, with nothing written, for an empty list or chunk, a position outside the
  // context or the pages' room, or a token outside the vocabulary.
  absl::Status Forward(std::span<const Chunk> chunks, KvPool& pool, float* logits,
                       kernels::ThreadPool* thread_pool);

  // Prefill is Forward over one prefill chunk at position 0 (a fresh sequence), its logits
  // to `logits` [vocab]. With `tag_fault` set, its tags are checked (Chunk::check_tags).
  absl::Status Prefill(std::span<const int> tokens, std::span<const PageGrant> pages, KvPool& pool,
                       float* logits, kernels::ThreadPool* thread_pool,
                       int32_t* tag_fault = nullptr);

  // DecodeItem is one sequence in a decode step: `token` at position `pos`, whose pages (in
  // token order) already hold positions 0 .. pos-1 and have room for pos. check_tags and
  // tag_fault as in Chunk.
  struct DecodeItem {
    int token = 0;
    int pos = 0;
    std::span<const PageGrant> pages;
    bool check_tags = false;
    int32_t* tag_fault = nullptr;
  };

  // Decode is Forward over one decode chunk per item (1 <= items.size() <= kMaxDecodeBatch);
  // logits [items.size(), vocab].
  absl::Status Decode(std::span<const DecodeItem> items, KvPool& pool, float* logits,
                      kernels::ThreadPool* thread_pool);

  // CalibrateKvScales runs prefill over `prompts` (token ids) with an FP32 KV cache and sets
  // per-(layer, kv head) FP8 scales for K and V: 1.5 x the largest |value| seen / 448
  // (headroom for decode-time values beyond the calibration set; beyond it, values
  // saturate). Kept in the model: fp8_k_scales() / fp8_v_scales(). Internal error if some
  // head never produced a non-zero value (no scale is ever a silent 1.0).
  absl::Status CalibrateKvScales(std::span<const std::vector<int>> prompts,
                                 kernels::ThreadPool* thread_pool);
  const std::vector<float>& fp8_k_scales() const { return k_scales_; }
  const std::vector<float>& fp8_v_scales() const { return v_scales_; }

#if KVGUARD_FAULT_INJECTION
  // set_layer_hook: `hook(layer)` runs at the start of every layer of Prefill and Decode (test
  // builds only), so a test can change the page table's pages mid-pass, as a broken allocator
  // on another thread would.
  void set_layer_hook(std::function<void(int)> hook) { layer_hook_ = std::move(hook); }
#endif

 private:
  struct Layer {
    std::vector<float> attn_norm, ffn_norm;  // [dim]
    // Per phase: index 0 prefill, 1 decode (may point at the same matrix).
    // Matrices that read the same input are stacked by rows into one, so each is one matmul
    // call (one pass over the thread pool) instead of three or two: the Q, K and V projections
    // (attn_q, attn_k, attn_v) and the gate and up projections. Every format quantises row by
    // row (FP8 row scales, INT4 group scales within a row), so the stacked matrix holds exactly
    // the codes of its parts and each output equals the separate matmul's bit for bit. On
    // `medium` a decode step makes 89 matmul calls instead of 155: each call ends with the
    // threads waiting for the slowest, and each chunk starts a new DRAM stream.
    const kernels::QuantizedMatrix* qkv[2];      // [q_dim + 2 kv_dim, dim]: Q, K, V rows
    const kernels::QuantizedMatrix* wo[2];       // [dim, q_dim]
    const kernels::QuantizedMatrix* gate_up[2];  // [2 ffn_dim, dim]: gate rows, then up rows
    const kernels::QuantizedMatrix* down[2];     // [dim, ffn_dim]
  };
  enum Phase { kPrefill = 0, kDecode = 1 };

  Model() = default;
  // MatMulPhases multiplies rows [0, decode_rows) of x by w[kDecode] with exact activations and
  // the rest by w[kPrefill] with options_.prefill_activations (one call over all rows when both
  // phases share the matrix and its arithmetic).
  void MatMulPhases(const kernels::QuantizedMatrix* const w[2], const float* x, int decode_rows,
                    int rows, float* y, kernels::ThreadPool* pool) const;

  ModelConfig config_;
  ModelOptions options_;
  std::vector<std::unique_ptr<kernels::QuantizedMatrix>> matrices_;  // owns all matrices
  std::vector<float> token_embd_;                                    // [vocab, dim] FP32
  std::vector<float> output_norm_;                                   // [dim]
  const kernels::QuantizedMatrix* output_[2] = {nullptr, nullptr};   // [vocab, dim]
  std::vector<Layer> layers_;
  std::vector<float> k_scales_, v_scales_;  // [n_layers * n_kv_heads], from calibration
  int int4_fallbacks_ = 0;  // decode matrices kept in FP8: no INT4 group divides their width
  // Observed |K| and |V| maxima while calibrating (null otherwise).
  std::vector<float>* calib_k_max_ = nullptr;
  std::vector<float>* calib_v_max_ = nullptr;
#if KVGUARD_FAULT_INJECTION
  std::function<void(int)> layer_hook_;
#endif
};

}  // namespace kvguard::core

#endif  // KVGUARD_CORE_MODEL_MODEL_H_
