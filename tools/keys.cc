// `kvguard keys`: inspect and manage a page-tag key file offline. Prints key ids and
// fingerprints, never key material. A running service rotates its own ring (and rewrites the
// file) through its admin API; rotating here while a service runs on the same file would be
// overwritten by the service's next rewrite.
#include <cstdio>
#include <string>
#include <vector>

#include "isolation/tag_key.h"
#include "tools/commands.h"
#include "tools/flags.h"

namespace kvguard::tools {
namespace {

int Usage(const std::string& error) {
  if (!error.empty()) std::fprintf(stderr, "kvguard keys: %s\n\n", error.c_str());
  std::fprintf(error.empty() ? stdout : stderr,
               "usage: kvguard keys --tag-key-file PATH [--rotate] [--retire ID]\n"
               "  lists the key ids and fingerprints of PATH (creating it, mode 0600, if absent);\n"
               "  --rotate adds a new active key; --retire ID forgets an old one\n");
  return error.empty() ? 0 : 2;
}

}  // namespace

int RunKeys(const std::vector<std::string>& argv) {
  std::string path;
  bool rotate = false;
  int retire = 0;
  Args a(argv);
  while (!a.done()) {
    absl::Status s;
    if (a.Flag("--help") || a.Flag("-h")) {
      return Usage("");
    } else if (a.Flag("--tag-key-file")) {
      s = a.Value(&path);
    } else if (a.Flag("--rotate")) {
      rotate = true;
    } else if (a.Flag("--retire")) {
      s = a.Int(&retire, 1, 0x7fffffff);
    } else {
      return Usage("unknown argument '" + a.peek() + "'");
    }
    if (!s.ok()) return Usage(std::string(s.message()));
  }
  if (path.empty()) return Usage("--tag-key-file is required");
  absl::StatusOr<std::unique_ptr<isolation::TagKeyRing>> ring =
      isolation::TagKeyRing::LoadOrCreate(path);
  if (!ring.ok()) {
    std::fprintf(stderr, "kvguard keys: %s\n", std::string(ring.status().message()).c_str());
    return 1;
  }
  if (retire != 0) {
    if (absl::Status s = (*ring)->Retire(static_cast<isolation::KeyId>(retire)); !s.ok()) {
      std::fprintf(stderr, "kvguard keys: %s\n", std::string(s.message()).c_str());
      return 1;
    }
  }
  if (rotate) {
    if (absl::StatusOr<isolation::KeyId> id = (*ring)->Rotate(); !id.ok()) {
      std::fprintf(stderr, "kvguard keys: %s\n", std::string(id.status().message()).c_str());
      return 1;
    }
  }
  for (isolation::KeyId id : (*ring)->key_ids()) {
    absl::StatusOr<std::string> fp = (*ring)->Fingerprint(id);
    std::printf("%u %s%s\n", id, fp.ok() ? fp->c_str() : "?",
                id == (*ring)->active_id() ? " active" : "");
  }
  return 0;
}

}  // namespace kvguard::tools
