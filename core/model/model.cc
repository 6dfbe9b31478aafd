#include "core/model/model.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <initializer_list>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"

namespace kvguard::core {

using kernels::QuantizedMatrix;
using kernels::WeightFormat;

absl::StatusOr<WeightFormat> ParseWeightFormat(const std::string& name) {
  if (name == "fp32") return WeightFormat::kFp32;
  if (name == "bf16") return WeightFormat::kBf16;
  if (name == "fp8") return WeightFormat::kFp8;
  if (name == "int4") return WeightFormat::kInt4;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown weight format '", name, "' (fp32, bf16, fp8, int4)"));
}

WeightFormat DecodeMatrixFormat(int cols, WeightFormat requested, int int4_group, int* group,
                                bool* fallback) {
  *group = int4_group;
  *fallback = false;
  if (requested != WeightFormat::kInt4) return requested;
  while (*group >= 32 && cols % *group != 0) *group /= 2;
  if (*group >= 32) return requested;
  *group = int4_group;
  *fallback = true;
  return WeightFormat::kFp8;
}

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const WeightSource& source,
                                                   const ModelOptions& options,
                                                   kernels::ThreadPool* /*pool*/) {
  if (options.prefill_weights == WeightFormat::kInt4) {
    return absl::InvalidArgumentError(
        "prefill weights cannot be int4: prefill is compute-bound (use fp8, bf16 or fp32)");
  }
  if (options.decode_weights == WeightFormat::kInt4 &&
      !kernels::IsValidInt4Group(options.int4_group)) {
    return absl::InvalidArgumentError(
        absl::StrCat("int4 group ", options.int4_group, " must be 32, 64 or 128"));
  }
  const ModelConfig& c = source.config();
  if (absl::Status s = c.Validate(); !s.ok()) return s;
  std::unique_ptr<Model> m(new Model());
  m->config_ = c;
  m->options_ = options;

  auto read = [&](const std::string& name, std::vector<float>* out) -> absl::Status {
    absl::Status s = source.ReadTensor(name, out);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("loading ", name, ": ", s.message()));
    for (float v : *out) {
      if (!std::isfinite(v)) return absl::DataLossError(absl::StrCat(name, ": non-finite weight"));
    }
    return absl::OkStatus();
  };
  if (auto s = read("token_embd.weight", &m->token_embd_); !s.ok()) return s;
  if (auto s = read("output_norm.weight", &m->output_norm_); !s.ok()) return s;

  // Every matrix is a job: read its tensors as FP32 (several, stacked by rows, for a fused
  // matrix: see Layer), quantise it into both phases' formats (sharing one matrix when they
  // agree), drop the FP32 copy. Jobs run on all cores: quantising the medium model's 1.1e9
  // weights twice is the bulk of its load time.
  struct Job {
    std::vector<std::string> names;  // tensors of one width, stacked in this order
    const QuantizedMatrix** out;     // [2]: prefill, decode
  };
  std::vector<Job> jobs;
  jobs.push_back({{c.tied_embeddings ? "token_embd.weight" : "output.weight"}, m->output_});
  m->layers_.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    Layer& L = m->layers_[l];
    if (auto s = read(LayerTensorName(l, "attn_norm.weight"), &L.attn_norm); !s.ok()) return s;
    if (auto s = read(LayerTensorName(l, "ffn_norm.weight"), &L.ffn_norm); !s.ok()) return s;
    auto names = [l](std::initializer_list<const char*> suffixes) {
      std::vector<std::string> out;
      for (const char* suffix : suffixes) out.push_back(LayerTensorName(l, suffix));
      return out;
    };
    jobs.push_back({names({"attn_q.weight", "attn_k.weight", "attn_v.weight"}), L.qkv});
    jobs.push_back({names({"attn_output.weight"}), L.wo});
    jobs.push_back({names({"ffn_gate.weight", "ffn_up.weight"}), L.gate_up});
    jobs.push_back({names({"ffn_down.weight"}), L.down});
  }
  const int int4_group = options.int4_group;
  std::mutex mu;
  absl::Status first_error;
  std::atomic<size_t> next{0};
  // run_jobs takes jobs until none is left: reads a job's tensors (stacked), quantises them per
  // phase (decode format per DecodeMatrixFormat; INT4 fallbacks are counted in int4_fallbacks_).
  // The FP32 buffers live for one job only, so no thread holds on to the largest one it saw.
  auto run_jobs = [&] {
    for (size_t j; (j = next.fetch_add(1)) < jobs.size();) {
      const std::vector<std::string>& names = jobs[j].names;
      // Shapes first, so that a stacked matrix is allocated once, at its full size.
      int rows = 0, cols = 0;
      absl::Status s;
      for (size_t i = 0; i < names.size() && s.ok(); ++i) {
        int part_rows = 0, part_cols = 0;
        s = TensorShape(c, names[i], &part_rows, &part_cols);
        if (s.ok() && i > 0 && part_cols != cols) {
          s = absl::InternalError(absl::StrCat(names[i], ": width ", part_cols, " differs from ",
                                               names[0], "'s ", cols));
        }
        rows += part_rows;
        cols = part_cols;
      }
      std::vector<float> w;
      if (s.ok() && names.size() == 1) {
        s = read(names[0], &w);
      } else if (s.ok()) {
        w.resize(static_cast<size_t>(rows) * cols);
        size_t at = 0;
        std::vector<float> part;
        for (const std::string& name : names) {
          s = read(name, &part);
          if (s.ok() && part.size() > w.size() - at) {
            s = absl::InternalError(absl::StrCat(name, ": more values than its shape"));
          }
          if (!s.ok()) break;
          std::copy(part.begin(), part.end(), w.begin() + static_cast<std::ptrdiff_t>(at));
          at += part.size();
        }
        w.resize(at);  // a short tensor is caught below
      }
      if (s.ok() && w.size() != static_cast<size_t>(rows) * cols) {
        s = absl::InternalError(
            absl::StrCat(names[0], ": ", w.size(), " values read for ", rows, " x ", cols));
      }
      if (!s.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (first_error.ok()) first_error = s;
        return;
      }
      int group = int4_group;
      bool fallback = false;
      const WeightFormat f[2] = {
          options.prefill_weights,
          DecodeMatrixFormat(cols, options.decode_weights, int4_group, &group, &fallback)};
      std::unique_ptr<QuantizedMatrix> q[2];
      for (int phase = 0; phase < 2; ++phase) {
        if (phase == 1 && f[1] == f[0]) break;
        q[phase] = std::make_unique<QuantizedMatrix>(
            kernels::QuantizeMatrix(w.data(), rows, cols, f[phase], group));
      }
      std::lock_guard<std::mutex> lock(mu);
      jobs[j].out[0] = q[0].get();
      jobs[j].out[1] = q[1] ? q[1].get() : q[0].get();
      m->matrices_.push_back(std::move(q[0]));
      if (q[1]) m->matrices_.push_back(std::move(q[1]));
      m->int4_fallbacks_ += fallback;
    }
  };
  const unsigned threads = std::max(1u, std::min(4u, std::thread::hardware_concurrency()));
  std::vector<std::thread> workers;
  for (unsigned t = 1; t < threads; ++t) workers.emplace_back(run_jobs);
  run_jobs();
  for (auto& t : workers) t.join();
  if (!first_error.ok()) return first_error;
  return m;
}

size_t Model::WeightBytes() const {
  size_t bytes = (token_embd_.size() + output_norm_.size()) * sizeof(float);
  for (const auto& q : matrices_) bytes += kernels::WeightBytes(q->view());
  for (const Layer& L : layers_) bytes += (L.attn_norm.size() + L.ffn_norm.size()) * 4;
  return bytes;
}

size_t Model::DecodeWeightBytesPerStep() const {
  size_t bytes = kernels::WeightBytes(output_[kDecode]->view());
  for (const Layer& L : layers_) {
    for (const QuantizedMatrix* q :
         {L.qkv[kDecode], L.wo[kDecode], L.gate_up[kDecode], L.down[kDecode]}) {
      bytes += kernels::WeightBytes(q->view());
    }
  }
  return bytes;
}

namespace {

// Scratch holds one step's activations, row-major with one row per token.
struct Scratch {
  Scratch() = default;
  Scratch(const ModelConfig& c, int rows) { Resize(c, rows); }
  // Resize sizes every buffer for `rows` tokens of `c` (contents unspecified; capacity is kept,
  // so a scratch reused across decode steps allocates, and the kernel zeroes pages for it, only
  // when the batch grows: measured 8% of a batch-32 step on `small` when allocated per step).
  void Resize(const ModelConfig& c, int rows) {
    x.resize(size_t(rows) * c.dim);
    xb.resize(size_t(rows) * c.dim);
    qkv.resize(size_t(rows) * QkvDim(c));
    att.resize(size_t(rows) * c.q_dim());
    proj.resize(size_t(rows) * c.dim);
    gate_up.resize(size_t(rows) * 2 * c.ffn_dim);
  }
  static int QkvDim(const ModelConfig& c) { return c.q_dim() + 2 * c.kv_dim(); }
  // Row r's Q [n_heads, head_dim], K and V [n_kv_heads, head_dim], inside qkv.
  float* q(const ModelConfig& c, int r) { return &qkv[size_t(r) * QkvDim(c)]; }
  float* k(const ModelConfig& c, int r) { return q(c, r) + c.q_dim(); }
  float* v(const ModelConfig& c, int r) { return k(c, r) + c.kv_dim(); }
  // SiluGate computes silu(gate) * up for each row of gate_up and packs the results at the
  // front of gate_up as [rows, ffn_dim], the down projection's input; returns it. In place, in
  // row order: row r's result [r f, (r + 1) f) (f = ffn_dim) overwrites only row r's own gate
  // half (r = 0) or halves of row r / 2 and before, already consumed (2 r f >= (r + 1) f for
  // r >= 1), so prefill needs no third [rows, ffn_dim] buffer.
  const float* SiluGate(const ModelConfig& c, int rows) {
    const size_t f = static_cast<size_t>(c.ffn_dim);
    for (int r = 0; r < rows; ++r) {
      const float* g = &gate_up[size_t(r) * 2 * f];
      kernels::SiluMul(g, g + f, f, &gate_up[size_t(r) * f]);
    }
    return gate_up.data();
  }
  std::vector<float> x;        // [rows, dim] residual stream
  std::vector<float> xb;       // [rows, dim] normalised block input
  std::vector<float> qkv;      // [rows, q_dim + 2 kv_dim]: the fused projection's output
  std::vector<float> att;      // [rows, n_heads, head_dim] attention output
  std::vector<float> proj;     // [rows, dim] block output before the residual add
  std::vector<float> gate_up;  // [rows, 2 ffn_dim]: gate, then up (see SiluGate)
  std::vector<float> head;     // [rows with logits, vocab]: the output matmul's, packed
};

void Embed(const std::vector<float>& table, int dim, const int* tokens, int rows, float* x) {
  for (int r = 0; r < rows; ++r) {
    std::copy_n(&table[size_t(tokens[r]) * dim], dim, x + size_t(r) * dim);
  }
}

}  // namespace

absl::Status Model::Prefill(std::span<const int> tokens, std::span<const PageGrant> pages,
                            KvPool& pool, float* logits, kernels::ThreadPool* tp,
                            int32_t* tag_fault) {
  if (tokens.empty()) return absl::InvalidArgumentError("prefill of an empty sequence");
  if (static_cast<int>(tokens.size()) > config_.max_context) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sequence of ", tokens.size(), " tokens exceeds the context of ", config_.max_context));
  }
  const Chunk chunk{.tokens = tokens,
                    .pos = 0,
                    .pages = pages,
                    .prefill = true,
                    .logits = true,
                    .check_tags = tag_fault != nullptr,
                    .tag_fault = tag_fault};
  return Forward(std::span(&chunk, 1), pool, logits, tp);
}

absl::Status Model::Decode(std::span<const DecodeItem> items, KvPool& pool, float* logits,
                           kernels::ThreadPool* tp) {
  const int B = static_cast<int>(items.size());
  if (B < 1 || B > kMaxDecodeBatch) {
    return absl::InvalidArgumentError(
        absl::StrCat("decode batch of ", B, " (must be 1..", kMaxDecodeBatch, ")"));
  }
  std::vector<Chunk> chunks(items.size());
  for (size_t b = 0; b < items.size(); ++b) {
    const DecodeItem& it = items[b];
    chunks[b] = Chunk{.tokens = std::span(&it.token, 1),
                      .pos = it.pos,
                      .pages = it.pages,
                      .prefill = false,
                      .logits = true,
                      .check_tags = it.check_tags,
                      .tag_fault = it.tag_fault};
  }
  return Forward(chunks, pool, logits, tp);
}

namespace {

// StepRows lays a step's chunks out as rows, one per token: decode chunks first, then
// prefill chunks, so that each matrix runs as (at most) two matmul calls, one per phase's
// weights. Row i is token `offset[i]` of chunk `chunk[i]`, at position `pos[i]`.
struct StepRows {
  std::vector<int> chunk, pos, token;
  int decode_rows = 0;  // rows [0, decode_rows) use the decode weights, the rest prefill's
  int size() const { return static_cast<int>(chunk.size()); }
};

}  // namespace

void Model::MatMulPhases(const QuantizedMatrix* const w[2], const float* x, int decode_rows,
                         int rows, float* y, kernels::ThreadPool* tp) const {
  constexpr auto kExact = kernels::MatMulActivations::kExact;
  const kernels::MatMulActivations prefill = options_.prefill_activations;
  if (w[kPrefill] == w[kDecode] && kernels::MatMulArithmeticFor(w[kDecode]->format, prefill) ==
                                       kernels::MatMulArithmeticFor(w[kDecode]->format, kExact)) {
    kernels::MatMul(w[kDecode]->view(), x, rows, y, tp, kExact);  // one matrix, one arithmetic
    return;
  }
  if (decode_rows > 0) kernels::MatMul(w[kDecode]->view(), x, decode_rows, y, tp, kExact);
  if (rows > decode_rows) {
    kernels::MatMul(w[kPrefill]->view(), x + size_t(decode_rows) * w[kPrefill]->cols,
                    rows - decode_rows, y + size_t(decode_rows) * w[kPrefill]->rows, tp, prefill);
  }
}

absl::Status Model::Forward(std::span<const Chunk> chunks, KvPool& pool, float* logits,
                            kernels::ThreadPool* tp) {
  const ModelConfig& c = config_;
  const int P = pool.page_size();
  const int n_chunks = static_cast<int>(chunks.size());
  if (n_chunks == 0) return absl::InvalidArgumentError("a forward pass over no chunks");
  // Validate everything before anything is written: a bad chunk fails the whole step.
  StepRows rows;
  for (int pass = 0; pass < 2; ++pass) {  // decode chunks, then prefill chunks
    for (int i = 0; i < n_chunks; ++i) {
      const Chunk& ch = chunks[size_t(i)];
      if (ch.prefill != (pass == 1)) continue;
      const int n = static_cast<int>(ch.tokens.size());
      if (n == 0) return absl::InvalidArgumentError(absl::StrCat("chunk ", i, " has no tokens"));
      if (ch.pos < 0 || ch.pos + n > c.max_context) {
        return absl::InvalidArgumentError(absl::StrCat("chunk ", i, " at positions ", ch.pos, "..",
                                                       ch.pos + n - 1, " outside the context of ",
                                                       c.max_context));
      }
      if (static_cast<int64_t>(ch.pages.size()) * P < ch.pos + n) {
        return absl::InvalidArgumentError(absl::StrCat("chunk ", i, " up to position ",
                                                       ch.pos + n - 1, " given ", ch.pages.size(),
                                                       " pages of ", P, " tokens"));
      }
      for (int t = 0; t < n; ++t) {
        const int token = ch.tokens[size_t(t)];
        if (token < 0 || token >= c.vocab_size) {
          return absl::InvalidArgumentError(
              absl::StrCat("token id ", token, " outside the vocabulary of ", c.vocab_size));
        }
        rows.chunk.push_back(i);
        rows.pos.push_back(ch.pos + t);
        rows.token.push_back(token);
      }
    }
    if (pass == 0) rows.decode_rows = rows.size();
  }
  const int R = rows.size();
  const int hd = c.head_dim, q_dim = c.q_dim();

  // Per chunk: its physical page ids and expected tags (token order), and the first tag fault
  // any check found (-1: none).
  std::vector<std::vector<int32_t>> page_ids(static_cast<size_t>(n_chunks));
  std::vector<std::vector<kernels::PageTag>> expected(static_cast<size_t>(n_chunks));
  std::vector<int32_t> fault(static_cast<size_t>(n_chunks), -1);
  for (int i = 0; i < n_chunks; ++i) {
    const Chunk& ch = chunks[size_t(i)];
    for (const PageGrant& g : ch.pages) page_ids[size_t(i)].push_back(g.page);
    if (ch.check_tags) {
      for (const PageGrant& g : ch.pages) expected[size_t(i)].push_back(g.tag);
    }
  }
  // WritePagesChanged: before a layer writes a chunk's K and V, every page it writes into must
  // still carry its grant's tag; a page that changed hands during the step (only a broken
  // allocator can do that) is never written into. Checked in every layer, not once.
  auto write_pages_changed = [&](int i) {
    const Chunk& ch = chunks[size_t(i)];
    const int first = ch.pos / P, last = (ch.pos + static_cast<int>(ch.tokens.size()) - 1) / P;
    for (int p = first; p <= last; ++p) {
      const PageGrant& g = ch.pages[size_t(p)];
      if (!kernels::PageTagMatches(pool.table().tags(), pool.num_pages(), g.page, g.tag)) {
        fault[size_t(i)] = p;
        return true;
      }
    }
    return false;
  };

  // Reused across steps by the calling thread (the engine's), resized per call.
  thread_local Scratch s;
  s.Resize(c, R);
  Embed(token_embd_, c.dim, rows.token.data(), R, s.x.data());
  std::vector<kernels::DecodeQuery> queries(static_cast<size_t>(R));
  std::vector<int32_t> row_fault(static_cast<size_t>(R),
                                 -1);  // the attention kernel's, per row and layer
  for (int r = 0; r < R; ++r) {
    const int i = rows.chunk[size_t(r)];
    kernels::DecodeQuery& q = queries[size_t(r)];
    q.q = s.q(c, r);
    q.page_table = page_ids[size_t(i)].data();
    q.length = rows.pos[size_t(r)] + 1;  // causal: earlier chunks and this chunk's earlier rows
    q.out = &s.att[size_t(r) * q_dim];
    if (chunks[size_t(i)].check_tags) {
      q.expected_tags = expected[size_t(i)].data();
      q.tag_fault = &row_fault[size_t(r)];
    }
  }
  const float softmax_scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int D = rows.decode_rows;

  // The layer body: every row, prefill or decode, goes through the same code.
  for (int l = 0; l < c.n_layers; ++l) {
#if KVGUARD_FAULT_INJECTION
    if (layer_hook_) layer_hook_(l);
#endif
    const Layer& L = layers_[l];
    for (int i = 0; i < n_chunks; ++i) {
      if (chunks[size_t(i)].check_tags && fault[size_t(i)] < 0) write_pages_changed(i);
    }
    // Attention block: x += Wo attention(rope(Wqkv rmsnorm(x))).
    for (int r = 0; r < R; ++r) {
      kernels::RmsNorm(&s.x[size_t(r) * c.dim], L.attn_norm.data(), c.dim, c.norm_eps,
                       &s.xb[size_t(r) * c.dim]);
    }
    MatMulPhases(L.qkv, s.xb.data(), D, R, s.qkv.data(), tp);
    for (int r = 0; r < R; ++r) {
      const int i = rows.chunk[size_t(r)], pos = rows.pos[size_t(r)];
      float* kt = s.k(c, r);
      const float* vt = s.v(c, r);
      // Q's heads and then K's are contiguous in qkv: one call rotates both, so the position's
      // angles are computed once.
      kernels::Rope(s.q(c, r), c.n_heads + c.n_kv_heads, hd, pos, c.rope_theta);
      if (calib_k_max_ != nullptr) {
        for (int h = 0; h < c.n_kv_heads; ++h) {
          float& km = (*calib_k_max_)[size_t(l) * c.n_kv_heads + h];
          float& vm = (*calib_v_max_)[size_t(l) * c.n_kv_heads + h];
          for (int d = 0; d < hd; ++d) {
            km = std::max(km, std::fabs(kt[h * hd + d]));
            vm = std::max(vm, std::fabs(vt[h * hd + d]));
          }
        }
      }
      if (fault[size_t(i)] >= 0) continue;  // never write into a page that is not the chunk's
      pool.WriteToken(l, chunks[size_t(i)].pages[size_t(pos / P)], pos % P, kt, vt);
    }
    kernels::PagedDecodeAttention(pool.LayerView(l), c.n_heads, softmax_scale, queries.data(), R,
                                  tp);
    for (int r = 0; r < R; ++r) {
      int32_t& f = fault[size_t(rows.chunk[size_t(r)])];
      if (f < 0 && row_fault[size_t(r)] >= 0) f = row_fault[size_t(r)];
    }
    MatMulPhases(L.wo, s.att.data(), D, R, s.proj.data(), tp);
    for (size_t k = 0; k < size_t(R) * c.dim; ++k) s.x[k] += s.proj[k];
    // Feed-forward block: x += Wdown (silu(Wgate xb) * Wup xb), xb = rmsnorm(x).
    for (int r = 0; r < R; ++r) {
      kernels::RmsNorm(&s.x[size_t(r) * c.dim], L.ffn_norm.data(), c.dim, c.norm_eps,
                       &s.xb[size_t(r) * c.dim]);
    }
    MatMulPhases(L.gate_up, s.xb.data(), D, R, s.gate_up.data(), tp);
    MatMulPhases(L.down, s.SiluGate(c, R), D, R, s.proj.data(), tp);
    for (size_t k = 0; k < size_t(R) * c.dim; ++k) s.x[k] += s.proj[k];
  }

  // Logits of each chunk's last token that wants them, and of every token of chunks with
  // token_logits, decode chunks then prefill chunks (packed into xb's first rows; xb has a row
  // per token), then scattered: to the chunk's own row of `logits`, and to its token_logits.
  std::vector<int> out_chunk;  // packed row -> chunk
  std::vector<int> out_row;    // packed row -> step row
  int out_decode = 0;
  bool any_token_logits = false;
  for (int r = 0; r < R; ++r) {
    const int i = rows.chunk[size_t(r)];
    const bool last = r + 1 == R || rows.chunk[size_t(r) + 1] != i;
    const bool every = chunks[size_t(i)].token_logits != nullptr;
    if (!every && (!last || !chunks[size_t(i)].logits)) continue;
    any_token_logits = any_token_logits || every;
    kernels::RmsNorm(&s.x[size_t(r) * c.dim], output_norm_.data(), c.dim, c.norm_eps,
                     &s.xb[out_chunk.size() * c.dim]);
    out_chunk.push_back(i);
    out_row.push_back(r);
    if (r < D) out_decode = static_cast<int>(out_chunk.size());
  }
  const int n_out = static_cast<int>(out_chunk.size());
  const size_t V = static_cast<size_t>(c.vocab_size);
  // When packed row k is chunk k's (a decode step, where every chunk wants logits), the
  // matmul writes `logits` itself: a copy of [chunks, vocab] floats saved per step.
  bool in_place = !any_token_logits;
  for (int k = 0; k < n_out; ++k) in_place = in_place && out_chunk[size_t(k)] == k;
  if (n_out > 0 && in_place) {
    MatMulPhases(output_, s.xb.data(), out_decode, n_out, logits, tp);
  } else if (n_out > 0) {
    std::vector<float>& packed = s.head;
    packed.resize(size_t(n_out) * V);
    MatMulPhases(output_, s.xb.data(), out_decode, n_out, packed.data(), tp);
    for (int k = 0; k < n_out; ++k) {
      const int i = out_chunk[size_t(k)], r = out_row[size_t(k)];
      const Chunk& ch = chunks[size_t(i)];
      const bool last = r + 1 == R || rows.chunk[size_t(r) + 1] != i;
      const float* row = &packed[size_t(k) * V];
      if (ch.token_logits != nullptr) {
        std::copy_n(row, V, ch.token_logits + size_t(rows.pos[size_t(r)] - ch.pos) * V);
      }
      if (last && ch.logits) std::copy_n(row, V, logits + size_t(i) * V);
    }
  }
  for (int i = 0; i < n_chunks; ++i) {
    if (chunks[size_t(i)].tag_fault != nullptr) *chunks[size_t(i)].tag_fault = fault[size_t(i)];
  }
  return absl::OkStatus();
}

absl::Status Model::CalibrateKvScales(std::span<const std::vector<int>> prompts,
                                      kernels::ThreadPool* tp) {
  const ModelConfig& c = config_;
  int longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, static_cast<int>(p.size()));
  if (longest == 0) return absl::InvalidArgumentError("FP8 KV calibration needs prompts");
  longest = std::min(longest, c.max_context);
  KvPoolOptions opt;
  opt.dtype = kernels::KvDtype::kFp32;
  opt.page_size = 16;
  opt.budget_bytes = c.KvBytesPerToken(4) * size_t((longest + 15) / 16 * 16);
  absl::StatusOr<std::unique_ptr<KvPool>> pool = KvPool::Create(c, opt);
  if (!pool.ok()) return pool.status();
  std::vector<float> k_max(size_t(c.n_layers) * c.n_kv_heads, 0.0f), v_max(k_max.size(), 0.0f);
  calib_k_max_ = &k_max;
  calib_v_max_ = &v_max;
  std::vector<float> logits(c.vocab_size);
  absl::Status status;
  for (const auto& p : prompts) {
    if (p.empty()) continue;
    const std::span<const int> tokens(p.data(), std::min<size_t>(p.size(), size_t(longest)));
    std::vector<PageGrant> pages;
    const Owner calibration{0, 1};
    status = (*pool)->table().GrantMany(calibration, ((int)tokens.size() + 15) / 16, &pages);
    if (status.ok()) status = Prefill(tokens, pages, **pool, logits.data(), tp);
    for (const PageGrant& g : pages) (*pool)->table().Release(calibration, g, false);
    if (!status.ok()) break;
  }
  calib_k_max_ = calib_v_max_ = nullptr;
  if (!status.ok()) return status;
  constexpr float kHeadroom = 1.5f;
  std::vector<float> ks(k_max.size()), vs(v_max.size());
  for (size_t i = 0; i < k_max.size(); ++i) {
    if (!(k_max[i] > 0.0f) || !(v_max[i] > 0.0f) || !std::isfinite(k_max[i]) ||
        !std::isfinite(v_max[i])) {
      return absl::InternalError(absl::StrCat("FP8 KV calibration: layer ", i / c.n_kv_heads,
                                              " kv head ", i % c.n_kv_heads,
                                              " produced no usable range"));
    }
    ks[i] = kHeadroom * k_max[i] / kernels::kFp8E4m3Max;
    vs[i] = kHeadroom * v_max[i] / kernels::kFp8E4m3Max;
  }
  k_scales_ = std::move(ks);
  v_scales_ = std::move(vs);
  return absl::OkStatus();
}

}  // namespace kvguard::core
