// `kvguard model tokenize PATH.gguf (--text T | --file F) [--no-bos] [--pieces]`: the ids the
// model's tokenizer gives a text, as a JSON array on one line (the prompt the engine would
// prefill); --pieces prints [{"id": N, "piece": "..."}, ...] instead, each piece the bytes the
// token decodes to (bytes that are not whole UTF-8 characters shown as U+FFFD). A vocabulary-only
// GGUF (no tensors) is enough.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/gguf/gguf.h"
#include "core/text/gguf_tokenizer.h"
#include "nlohmann/json.hpp"
#include "tools/commands.h"
#include "tools/flags.h"

namespace kvguard::tools {
namespace {

int TokenizeUsage(const std::string& error) {
  if (!error.empty()) std::fprintf(stderr, "kvguard model tokenize: %s\n\n", error.c_str());
  std::fprintf(stderr,
               "usage: kvguard model tokenize PATH.gguf (--text TEXT | --file FILE) [--no-bos]\n"
               "                              [--pieces]\n"
               "  prints the token ids of the text as a JSON array on one line\n"
               "  --text TEXT  the text (bytes as given)\n"
               "  --file FILE  the text is the file's bytes\n"
               "  --no-bos     no BOS/EOS even where the model adds them\n"
               "  --pieces     print [{\"id\": N, \"piece\": \"...\"}, ...]\n");
  return error.empty() ? 0 : 2;
}

}  // namespace

int RunModelTokenize(const std::vector<std::string>& argv) {
  std::string path, text, file;
  bool have_text = false, have_file = false, bos = true, pieces = false;
  Args a(argv);
  while (!a.done()) {
    absl::Status s;
    if (a.Flag("--help") || a.Flag("-h")) {
      return TokenizeUsage("");
    } else if (a.Flag("--text")) {
      s = a.Value(&text);
      have_text = true;
    } else if (a.Flag("--file")) {
      s = a.Value(&file);
      have_file = true;
    } else if (a.Flag("--no-bos")) {
      bos = false;
    } else if (a.Flag("--pieces")) {
      pieces = true;
    } else if (path.empty() && a.peek().rfind("--", 0) != 0) {
      path = a.peek();
      a.Skip();
    } else {
      return TokenizeUsage("unknown argument '" + a.peek() + "'");
    }
    if (!s.ok()) return TokenizeUsage(std::string(s.message()));
  }
  if (path.empty()) return TokenizeUsage("missing PATH.gguf");
  if (have_text == have_file) return TokenizeUsage("give exactly one of --text and --file");
  if (have_file) {
    std::ifstream in(file, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "kvguard model tokenize: cannot read %s\n", file.c_str());
      return 1;
    }
    std::ostringstream bytes;
    bytes << in.rdbuf();
    text = bytes.str();
  }
  absl::StatusOr<std::unique_ptr<core::gguf::File>> f = core::gguf::File::Open(path);
  if (!f.ok()) {
    std::fprintf(stderr, "kvguard model tokenize: %s\n", std::string(f.status().message()).c_str());
    return 1;
  }
  absl::StatusOr<std::unique_ptr<core::GgufTokenizer>> tok = core::GgufTokenizer::Create(**f);
  if (!tok.ok()) {
    std::fprintf(stderr, "kvguard model tokenize: %s: %s\n", path.c_str(),
                 std::string(tok.status().message()).c_str());
    return 1;
  }
  const std::vector<int> ids = (*tok)->Encode(text, bos);
  nlohmann::json out = nlohmann::json::array();
  for (const int id : ids) {
    if (pieces) {
      out.push_back({{"id", id}, {"piece", (*tok)->DecodeToken(id)}});
    } else {
      out.push_back(id);
    }
  }
  std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  return 0;
}

}  // namespace kvguard::tools
