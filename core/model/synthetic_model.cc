#include "core/model/synthetic_model.h"

#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

namespace kvguard::core {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t HashName(const std::string& name) {
  uint64_t h = 0xCBF29CE484222325ull;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 0x100000001B3ull;
  return h;
}

// A standard normal approximation from one 64-bit draw: four 16-bit uniforms summed have mean
// 2 * 65535 and variance 4 * (65536^2 - 1) / 12.
float IrwinHall(uint64_t r) {
  const double sum =
      static_cast<double>((r & 0xFFFF) + ((r >> 16) & 0xFFFF) + ((r >> 32) & 0xFFFF) + (r >> 48));
  constexpr double kMean = 2.0 * 65535.0;
  const double kStd = std::sqrt(4.0 * (65536.0 * 65536.0 - 1.0) / 12.0);
  return static_cast<float>((sum - kMean) / kStd);
}

bool EndsWith(const std::string& s, const char* suffix) {
  const std::string t(suffix);
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

}  // namespace

SyntheticWeightSource::SyntheticWeightSource(ModelConfig config, uint64_t seed)
    : config_(std::move(config)), seed_(seed) {}

std::string SyntheticWeightSource::Description() const {
  return absl::StrCat("built-in ", config_.name, " (synthetic, seed ", seed_, ")");
}

absl::Status SyntheticWeightSource::ReadTensor(const std::string& name,
                                               std::vector<float>* out) const {
  int rows = 0, cols = 0;
  if (absl::Status s = TensorShape(config_, name, &rows, &cols); !s.ok()) return s;
  const ModelConfig& c = config_;
  float mean = 0.0f, std = 1.0f;
  if (EndsWith(name, "norm.weight")) {
    mean = 1.0f, std = 0.1f;
  } else if (EndsWith(name, "attn_q.weight") || EndsWith(name, "attn_k.weight")) {
    std = std::sqrt(2.0f / c.dim);
  } else if (EndsWith(name, "attn_v.weight") || EndsWith(name, "ffn_gate.weight") ||
             EndsWith(name, "ffn_up.weight")) {
    std = std::sqrt(1.0f / c.dim);
  } else if (EndsWith(name, "attn_output.weight")) {
    std = std::sqrt(1.0f / (static_cast<float>(c.q_dim()) * 2.0f * c.n_layers));
  } else if (EndsWith(name, "ffn_down.weight")) {
    std = std::sqrt(1.0f / (static_cast<float>(c.ffn_dim) * 2.0f * c.n_layers));
  } else if (name == "output.weight") {
    std = std::sqrt(16.0f / c.dim);
  }  // token_embd: N(0, 1)

  const size_t n = static_cast<size_t>(rows) * static_cast<size_t>(cols);
  out->resize(n);
  const uint64_t key = SplitMix64(seed_ ^ HashName(name));
  float* data = out->data();
  auto fill = [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) data[i] = mean + std * IrwinHall(SplitMix64(key + i));
  };
  // Large tensors are filled on all cores: the medium model has ~1.1e9 weights.
  const size_t threads =
      n < (size_t{1} << 20) ? 1 : std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> workers;
  for (size_t t = 1; t < threads; ++t) {
    workers.emplace_back(fill, n * t / threads, n * (t + 1) / threads);
  }
  fill(0, n / threads);
  for (auto& w : workers) w.join();
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<WeightSource>> MakeBuiltinSource(const std::string& name,
                                                                uint64_t seed) {
  absl::StatusOr<ModelConfig> config = BuiltinConfig(name);
  if (!config.ok()) return config.status();
  return std::unique_ptr<WeightSource>(new SyntheticWeightSource(*std::move(config), seed));
}

}  // namespace kvguard::core
