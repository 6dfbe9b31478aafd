// kvguard: the one binary. `kvguard help` lists the subcommands.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tools/commands.h"

namespace kvguard::tools {
namespace {

struct Command {
  const char* name;
  const char* summary;
  int (*run)(const std::vector<std::string>& args);
};

constexpr Command kCommands[] = {
    {"version", "print the build: compiler, SIMD targets (compiled, selected), CUDA", RunVersion},
    {"generate", "generate text from a prompt (built-in model or --model PATH.gguf)", RunGenerate},
    {"eval", "KL divergence / top-1 agreement of quantised configs vs FP32", RunEval},
    {"model", "inspect a GGUF model file: shapes, types, tokenizer, bytes per format", RunModel},
    {"bench", "the serving benchmark (--help); `kvguard bench kernels`, `kvguard bench gpu`",
     RunBench},
    {"keys", "list, rotate or retire page-tag keys in a key file (ids, fingerprints)", RunKeys},
    {"audit", "verify, query, export and prove records of an audit log (--help)", RunAudit},
    {"serve", "the OpenAI-compatible multi-tenant HTTP service (--help)", RunServe},
    {"tenant", "list tenants / set a tenant's mode through the admin API", RunTenant},
};

int Usage(FILE* out) {
  std::fprintf(out, "usage: kvguard <command> [args]\n\ncommands:\n");
  for (const Command& c : kCommands) std::fprintf(out, "  %-10s %s\n", c.name, c.summary);
  std::fprintf(out, "  %-10s %s\n", "help", "print this message");
  return out == stdout ? 0 : 2;
}

}  // namespace
}  // namespace kvguard::tools

int main(int argc, char** argv) {
  using kvguard::tools::kCommands;
  if (argc < 2) return kvguard::tools::Usage(stderr);
  const std::string name = argv[1];
  if (name == "help" || name == "--help" || name == "-h") return kvguard::tools::Usage(stdout);
  for (const auto& c : kCommands) {
    if (name == c.name) return c.run(std::vector<std::string>(argv + 2, argv + argc));
  }
  std::fprintf(stderr, "kvguard: unknown command '%s'\n\n", name.c_str());
  return kvguard::tools::Usage(stderr);
}
