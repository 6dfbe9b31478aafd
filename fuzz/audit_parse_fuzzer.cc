// fuzz/audit_parse_fuzzer.cc: the audit log's line parser, witness parser and inclusion-proof
// checker (audit/record.h, audit/verifier.h, audit/query.h) on arbitrary bytes. Each must
// either accept or return an error, within bounds (ASan) and without undefined behaviour
// (UBSan); a record the parser calls hash-consistent must really hash to its hash field.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "audit/query.h"
#include "audit/record.h"
#include "audit/signing_key.h"
#include "audit/verifier.h"
#include "fuzz/audit_seed_key.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    absl::StatusOr<kvguard::audit::Line> line =
        kvguard::audit::ParseLine(text.substr(start, end - start));
    if (line.ok() && line->kind == kvguard::audit::Line::Kind::kRecord &&
        line->hash_ok != (kvguard::audit::RecordHash(line->body) == line->hash)) {
      std::fprintf(stderr, "==kvguard-fuzz== ORACLE audit-parse: hash_ok is wrong\n");
      std::abort();
    }
    start = end + 1;
  }
  (void)kvguard::audit::ParseWitness(text);
  const size_t split = text.find('\x1e');  // proof, then optionally the record line it proves
  if (split == std::string_view::npos) {
    (void)kvguard::audit::CheckProof(text, std::nullopt, kvguard::fuzz::AuditSeedKey());
  } else {
    (void)kvguard::audit::CheckProof(text.substr(0, split), text.substr(split + 1),
                                     kvguard::fuzz::AuditSeedKey());
  }
  return 0;
}
