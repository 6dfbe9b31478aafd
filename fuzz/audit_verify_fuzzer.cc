// fuzz/audit_verify_fuzzer.cc: the auditor's whole-log check (audit/verifier.h) on a log
// directory the input describes: the bytes up to the first '\n' are the log-id file, the rest
// is audit-000001.jsonl, and a 0x1f byte in it starts audit-000002.jsonl. The seed corpus is
// a real log signed by the key below, so mutations start from a log that verifies. Every
// input must get a report (pass or a named failure) or a file system error; nothing else.
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>

#include "audit/signing_key.h"
#include "audit/verifier.h"
#include "fuzz/audit_seed_key.h"

namespace {

const std::string& Dir() {
  static const std::string dir = [] {
    // Memory-backed when possible: every input rewrites the files, and on a disk file system
    // the truncates alone cost milliseconds.
    const char* tmp = std::getenv("TMPDIR");
    std::string base = tmp != nullptr ? tmp : access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    std::string templ = base + "/kvguard-fuzz-audit-XXXXXX";
    if (mkdtemp(templ.data()) == nullptr) std::abort();
    return templ;
  }();
  return dir;
}

void Write(const std::string& name, std::string_view bytes) {
  std::ofstream f(Dir() + "/" + name, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const size_t nl = text.find('\n');
  const std::string_view log_id =
      text.substr(0, nl == std::string_view::npos ? text.size() : nl + 1);
  std::string_view rest = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
  const size_t sep = rest.find('\x1f');
  Write("log-id", log_id);
  Write("audit-000001.jsonl", rest.substr(0, sep));
  const std::string second = Dir() + "/audit-000002.jsonl";
  if (sep == std::string_view::npos) {
    unlink(second.c_str());
  } else {
    Write("audit-000002.jsonl", rest.substr(sep + 1));
  }
  // A report (pass or named failure) or a file system error; never a crash or UB.
  (void)kvguard::audit::VerifyLog(Dir(), kvguard::fuzz::AuditSeedKey());
  return 0;
}
