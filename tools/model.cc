// `kvguard model inspect PATH.gguf`: what a GGUF file holds and what the engine will make of
// it: architecture and shapes, every tensor's stored type, the tokenizer and its pre-tokenizer
// (`kvguard model tokenize`, model_tokenize.cc, runs it on a text), the bytes of the weight
// matrices in each engine format after conversion (with the INT4 fallbacks), and the KV cache
// bytes per token.
#include "core/model/model.h"

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/gguf/gguf.h"
#include "core/model/gguf_weight_source.h"
#include "core/text/chat_template.h"
#include "core/text/gguf_chat_template.h"
#include "core/text/gguf_tokenizer.h"
#include "kernels/formats.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "tools/render_chat.h"

namespace kvguard::tools {
namespace {

int ModelUsage(const std::string& error) {
  if (!error.empty()) std::fprintf(stderr, "kvguard model: %s\n\n", error.c_str());
  std::fprintf(
      stderr,
      "usage: kvguard model inspect PATH.gguf [--int4-group G]\n"
      "  prints the architecture, shapes, tensor types, tokenizer (and its\n"
      "  pre-tokenizer, tokenizer.ggml.pre), whether it carries a chat template,\n"
      "  the weight bytes in each engine format after conversion and the KV\n"
      "  cache bytes per token\n"
      "  --int4-group G   the INT4 group asked for: 32, 64, 128 (default)\n"
      "       kvguard model tokenize PATH.gguf (--text T | --file F) [--no-bos] [--pieces]\n"
      "  prints the token ids of the text as a JSON array (see --help after tokenize)\n"
      "       kvguard model render-chat ... (a chat prompt; render-chat --help)\n");
  return error.empty() ? 0 : 2;
}

std::string Shape(const std::vector<uint64_t>& ne) {
  std::string s;
  for (uint64_t d : ne) absl::StrAppend(&s, s.empty() ? "" : " x ", d);
  return s;
}

// TokenizerLine: the tokenizer's summary (kind, pre-tokenizer, vocabulary, special tokens), or
// why kvguard cannot use it.
std::string TokenizerLine(const core::gguf::File& f) {
  absl::StatusOr<std::unique_ptr<core::GgufTokenizer>> tok = core::GgufTokenizer::Create(f);
  return tok.ok() ? (*tok)->Summary() : absl::StrCat("unusable: ", tok.status().message());
}

// ChatTemplateLine: whether the file carries a chat template (what `kvguard serve` applies to
// chat requests unless --chat-template replaces it), and whether it parses.
std::string ChatTemplateLine(const core::gguf::File& f) {
  absl::StatusOr<core::GgufChatTemplate> t = core::ReadGgufChatTemplate(f);
  if (!t.ok()) return absl::StrCat("unusable: ", t.status().message());
  if (!t->source.has_value()) {
    return "none (tokenizer.chat_template absent: chats get \"role: content\" lines)";
  }
  absl::StatusOr<core::ChatTemplate> parsed = core::ChatTemplate::Parse(*t->source);
  return absl::StrCat(
      "found (tokenizer.chat_template, ", t->source->size(), " bytes",
      parsed.ok() ? "" : absl::StrCat("; does not parse: ", parsed.status().message()), "), BOS '",
      t->bos_token, "', EOS '", t->eos_token, "'");
}

int Inspect(const std::string& path, int int4_group) {
  absl::StatusOr<std::unique_ptr<core::GgufWeightSource>> source =
      core::GgufWeightSource::Open(path);
  if (!source.ok()) {
    // The engine cannot load it; its tokenizer may still be readable (a vocabulary-only file, an
    // architecture kvguard does not run), and saying which one it is helps.
    if (absl::StatusOr<std::unique_ptr<core::gguf::File>> f = core::gguf::File::Open(path);
        f.ok()) {
      std::printf("tokenizer     %s\n", TokenizerLine(**f).c_str());
      std::printf("chat template %s\n", ChatTemplateLine(**f).c_str());
      std::fflush(stdout);
    }
    std::fprintf(stderr, "kvguard model inspect: %s\n",
                 std::string(source.status().message()).c_str());
    return 1;
  }
  const core::gguf::File& f = (*source)->file();
  const core::ModelConfig& c = (*source)->config();
  std::printf(
      "file          %s: GGUF v%u, %zu bytes, %zu metadata keys, %zu tensors, "
      "alignment %llu\n",
      path.c_str(), f.version(), f.size(), f.keys().size(), f.tensors().size(),
      static_cast<unsigned long long>(f.alignment()));
  absl::StatusOr<std::string_view> name = f.GetString("general.name");
  std::printf("architecture  llama%s\n",
              name.ok() ? absl::StrCat(" (general.name '", std::string(*name), "')").c_str() : "");
  std::printf(
      "shape         dim %d, %d layers, %d heads, %d kv heads, head_dim %d, ffn %d, "
      "vocab %d, context %d\n"
      "              rope theta %g, rms eps %g, embeddings %s, %.3fM parameters\n",
      c.dim, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn_dim, c.vocab_size,
      c.max_context, c.rope_theta, c.norm_eps, c.tied_embeddings ? "tied" : "untied",
      c.ParameterCount() / 1e6);
  std::printf("tokenizer     %s\n", TokenizerLine(f).c_str());
  std::printf("chat template %s\n", ChatTemplateLine(f).c_str());

  std::printf("\ntensors (name, stored type, shape ne[0] x ne[1], bytes):\n");
  std::map<std::string, std::pair<int, uint64_t>> by_type;
  for (const core::gguf::TensorInfo& t : f.tensors()) {
    const std::string type = core::gguf::TensorTypeName(t.type);
    std::printf("  %-28s %-5s %-12s %llu\n", t.name.c_str(), type.c_str(), Shape(t.ne).c_str(),
                static_cast<unsigned long long>(t.bytes));
    by_type[type].first += 1;
    by_type[type].second += t.bytes;
  }
  std::printf("stored:");
  for (const auto& [type, n] : by_type) {
    std::printf(" %s %d tensors %llu bytes;", type.c_str(), n.first,
                static_cast<unsigned long long>(n.second));
  }
  std::printf("\n");

  // The matrices the engine quantises (the lm head is token_embd again when tied); the
  // embedding table and the norms stay FP32 in every configuration.
  std::vector<std::string> matrices;
  size_t fp32_bytes = size_t(c.vocab_size) * c.dim * 4 + size_t(c.dim) * 4;
  for (const std::string& n : core::RequiredTensorNames(c)) {
    int rows = 0, cols = 0;
    if (!core::TensorShape(c, n, &rows, &cols).ok()) continue;
    if (cols == 1) {
      if (n != "output_norm.weight") fp32_bytes += size_t(rows) * 4;
    } else if (n != "token_embd.weight") {
      matrices.push_back(n);
    }
  }
  if (c.tied_embeddings) matrices.insert(matrices.begin(), "token_embd.weight");
  std::printf(
      "\nweights after conversion (%zu matrices; embedding table and norms stay FP32: "
      "%zu bytes):\n",
      matrices.size(), fp32_bytes);
  for (kernels::WeightFormat format : {kernels::WeightFormat::kFp32, kernels::WeightFormat::kBf16,
                                       kernels::WeightFormat::kFp8, kernels::WeightFormat::kInt4}) {
    size_t bytes = 0;
    std::vector<std::string> fallbacks;
    int groups_min = 1 << 30, groups_max = 0;
    for (const std::string& n : matrices) {
      int rows = 0, cols = 0;
      (void)core::TensorShape(c, n, &rows, &cols);
      kernels::WeightView w;
      bool fallback = false;
      w.format = core::DecodeMatrixFormat(cols, format, int4_group, &w.group, &fallback);
      w.rows = rows, w.cols = cols;
      bytes += kernels::WeightBytes(w);
      if (fallback) fallbacks.push_back(absl::StrCat(n, " (K ", cols, ")"));
      if (w.format == kernels::WeightFormat::kInt4) {
        groups_min = std::min(groups_min, w.group);
        groups_max = std::max(groups_max, w.group);
      }
    }
    std::string note;
    if (format == kernels::WeightFormat::kInt4) {
      note = groups_max == 0            ? " no matrix takes INT4"
             : groups_min == groups_max ? absl::StrCat(" group ", groups_max)
                                        : absl::StrCat(" groups ", groups_min, "..", groups_max);
      if (!fallbacks.empty()) {
        absl::StrAppend(&note,
                        "; kept FP8 (no INT4 group of 32/64/128 divides K): ", fallbacks.size(),
                        " matrices, e.g. ", fallbacks.front());
      }
    }
    std::printf("  %-5s %12zu bytes%s%s\n", kernels::WeightFormatName(format), bytes,
                format == kernels::WeightFormat::kInt4 ? " (decode only)" : "", note.c_str());
  }
  std::printf("  (prefill weights: fp8 | bf16 | fp32; decode weights: int4 | fp8 | bf16 | fp32)\n");
  std::printf(
      "\nKV cache per token (K and V, all layers): fp32 %zu, bf16 %zu, fp8_e4m3 %zu bytes\n",
      c.KvBytesPerToken(4), c.KvBytesPerToken(2), c.KvBytesPerToken(1));
  return 0;
}

}  // namespace

int RunModel(const std::vector<std::string>& argv) {
  if (argv.empty()) return ModelUsage("missing subcommand (inspect, tokenize)");
  if (argv[0] == "--help" || argv[0] == "-h") return ModelUsage("");
  if (argv[0] == "tokenize") {
    return RunModelTokenize(std::vector<std::string>(argv.begin() + 1, argv.end()));
  }
  if (argv[0] == "render-chat") return RunRenderChat({argv.begin() + 1, argv.end()});
  if (argv[0] != "inspect") return ModelUsage("unknown subcommand '" + argv[0] + "'");
  std::string path;
  int int4_group = 128;
  Args a(std::vector<std::string>(argv.begin() + 1, argv.end()));
  while (!a.done()) {
    absl::Status s;
    if (a.Flag("--help") || a.Flag("-h")) {
      return ModelUsage("");
    } else if (a.Flag("--int4-group")) {
      s = a.Int(&int4_group, 32, 128);
      if (s.ok() && !kernels::IsValidInt4Group(int4_group)) {
        s = absl::InvalidArgumentError("--int4-group must be 32, 64 or 128");
      }
    } else if (path.empty() && a.peek().rfind("--", 0) != 0) {
      path = a.peek();
      a.Skip();
    } else {
      return ModelUsage("unknown argument '" + a.peek() + "'");
    }
    if (!s.ok()) return ModelUsage(std::string(s.message()));
  }
  if (path.empty()) return ModelUsage("missing PATH.gguf");
  return Inspect(path, int4_group);
}

}  // namespace kvguard::tools
