#include "tests/core/model/reference_decoder.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace kvguard::testing {
namespace {

// out[r] = sum_c w[r, c] * x[c]; w is [rows, cols] row-major. FP64 accumulation.
void MatVec(const std::vector<float>& w, const float* x, int rows, int cols, float* out) {
  for (int r = 0; r < rows; ++r) {
    double acc = 0;
    for (int c = 0; c < cols; ++c) acc += double{w[size_t(r) * cols + c]} * x[c];
    out[r] = static_cast<float>(acc);
  }
}

void RmsNorm(const float* x, const std::vector<float>& weight, int n, float eps, float* out) {
  double ss = 0;
  for (int i = 0; i < n; ++i) ss += double{x[i]} * x[i];
  const double inv = 1.0 / std::sqrt(ss / n + eps);
  for (int i = 0; i < n; ++i) out[i] = static_cast<float>(x[i] * inv * weight[i]);
}

// Llama's rotate-half RoPE on one head: pairs (i, i + d/2) rotate by pos * theta^(-2i/d).
void RopeHead(float* v, int head_dim, int pos, float theta) {
  const int half = head_dim / 2;
  for (int i = 0; i < half; ++i) {
    const double freq = std::pow(double{theta}, -2.0 * i / head_dim);
    const double angle = pos * freq;
    const double c = std::cos(angle), s = std::sin(angle);
    const double a = v[i], b = v[i + half];
    v[i] = static_cast<float>(a * c - b * s);
    v[i + half] = static_cast<float>(a * s + b * c);
  }
}

}  // namespace

absl::StatusOr<ReferenceDecoder> ReferenceDecoder::Load(const core::WeightSource& source) {
  ReferenceDecoder d;
  d.c_ = source.config();
  auto read = [&](const std::string& name, std::vector<float>* out) {
    return source.ReadTensor(name, out);
  };
  if (auto s = read("token_embd.weight", &d.token_embd_); !s.ok()) return s;
  if (auto s = read("output_norm.weight", &d.output_norm_); !s.ok()) return s;
  if (d.c_.tied_embeddings) {
    d.output_ = d.token_embd_;
  } else if (auto s = read("output.weight", &d.output_); !s.ok()) {
    return s;
  }
  d.layers_.resize(d.c_.n_layers);
  for (int l = 0; l < d.c_.n_layers; ++l) {
    Layer& L = d.layers_[l];
    const std::pair<const char*, std::vector<float>*> tensors[] = {
        {"attn_norm.weight", &L.attn_norm}, {"attn_q.weight", &L.wq},
        {"attn_k.weight", &L.wk},           {"attn_v.weight", &L.wv},
        {"attn_output.weight", &L.wo},      {"ffn_norm.weight", &L.ffn_norm},
        {"ffn_gate.weight", &L.w_gate},     {"ffn_up.weight", &L.w_up},
        {"ffn_down.weight", &L.w_down}};
    for (const auto& [suffix, dst] : tensors) {
      if (auto s = read(core::LayerTensorName(l, suffix), dst); !s.ok()) return s;
    }
    L.k_cache.assign(size_t(d.c_.max_context) * d.c_.kv_dim(), 0.0f);
    L.v_cache.assign(size_t(d.c_.max_context) * d.c_.kv_dim(), 0.0f);
  }
  return d;
}

std::vector<float> ReferenceDecoder::Forward(int token, int pos) {
  const core::ModelConfig& c = c_;
  const int dim = c.dim, hd = c.head_dim, q_dim = c.q_dim(), kv_dim = c.kv_dim();
  const int group = c.n_heads / c.n_kv_heads;
  if (pos != cached_ || pos >= c.max_context || token < 0 || token >= c.vocab_size) return {};

  std::vector<float> x(token_embd_.begin() + size_t(token) * dim,
                       token_embd_.begin() + size_t(token + 1) * dim);  // [dim] residual
  std::vector<float> xb(dim);           // [dim] normalised input of a block
  std::vector<float> q(q_dim);          // [n_heads, head_dim]
  std::vector<float> att_out(q_dim);    // [n_heads, head_dim]
  std::vector<float> proj(dim);         // [dim] a block's output before the residual add
  std::vector<float> gate(c.ffn_dim);   // [ffn_dim]
  std::vector<float> up(c.ffn_dim);     // [ffn_dim]
  std::vector<double> scores(pos + 1);  // [pos + 1] one head's attention weights

  for (int l = 0; l < c.n_layers; ++l) {
    Layer& L = layers_[l];
    // Attention block.
    RmsNorm(x.data(), L.attn_norm, dim, c.norm_eps, xb.data());
    float* k = &L.k_cache[size_t(pos) * kv_dim];  // this token's K and V go straight into the
    float* v = &L.v_cache[size_t(pos) * kv_dim];  // cache: [n_kv_heads, head_dim] each
    MatVec(L.wq, xb.data(), q_dim, dim, q.data());
    MatVec(L.wk, xb.data(), kv_dim, dim, k);
    MatVec(L.wv, xb.data(), kv_dim, dim, v);
    for (int h = 0; h < c.n_heads; ++h) RopeHead(&q[size_t(h) * hd], hd, pos, c.rope_theta);
    for (int h = 0; h < c.n_kv_heads; ++h) RopeHead(k + size_t(h) * hd, hd, pos, c.rope_theta);

    for (int h = 0; h < c.n_heads; ++h) {
      const int kvh = h / group;  // grouped-query attention: query head h reads kv head h/group
      const float* qh = &q[size_t(h) * hd];
      double max_score = -INFINITY;
      for (int t = 0; t <= pos; ++t) {
        const float* kt = &L.k_cache[size_t(t) * kv_dim + size_t(kvh) * hd];
        double dot = 0;
        for (int i = 0; i < hd; ++i) dot += double{qh[i]} * kt[i];
        scores[t] = dot / std::sqrt(double(hd));
        max_score = std::max(max_score, scores[t]);
      }
      double sum = 0;
      for (int t = 0; t <= pos; ++t) sum += (scores[t] = std::exp(scores[t] - max_score));
      for (int i = 0; i < hd; ++i) {
        double acc = 0;
        for (int t = 0; t <= pos; ++t) {
          acc += scores[t] / sum * L.v_cache[size_t(t) * kv_dim + size_t(kvh) * hd + i];
        }
        att_out[size_t(h) * hd + i] = static_cast<float>(acc);
      }
    }
    MatVec(L.wo, att_out.data(), dim, q_dim, proj.data());
    for (int i = 0; i < dim; ++i) x[i] += proj[i];

    // SwiGLU MLP block: down(silu(gate x) * up x).
    RmsNorm(x.data(), L.ffn_norm, dim, c.norm_eps, xb.data());
    MatVec(L.w_gate, xb.data(), c.ffn_dim, dim, gate.data());
    MatVec(L.w_up, xb.data(), c.ffn_dim, dim, up.data());
    for (int i = 0; i < c.ffn_dim; ++i) {
      const double g = gate[i];
      gate[i] = static_cast<float>(g / (1.0 + std::exp(-g)) * up[i]);
    }
    MatVec(L.w_down, gate.data(), dim, c.ffn_dim, proj.data());
    for (int i = 0; i < dim; ++i) x[i] += proj[i];
  }

  RmsNorm(x.data(), output_norm_, dim, c.norm_eps, xb.data());
  std::vector<float> logits(c.vocab_size);  // [vocab]
  MatVec(output_, xb.data(), c.vocab_size, dim, logits.data());
  cached_ = pos + 1;
  return logits;
}

}  // namespace kvguard::testing
