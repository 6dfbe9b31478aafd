// fuzz/audit_seed_key.h: the public key of the test-only signing key that signed the audit
// seed corpus (fuzz/corpus/audit_verify/, fuzz/corpus/audit_parse/). Its private half was
// thrown away after signing; it protects nothing.
#ifndef KVGUARD_FUZZ_AUDIT_SEED_KEY_H_
#define KVGUARD_FUZZ_AUDIT_SEED_KEY_H_

#include <cstdlib>

#include "audit/signing_key.h"

namespace kvguard::fuzz {

inline const audit::VerifyingKey& AuditSeedKey() {
  static const audit::VerifyingKey key = [] {
    absl::StatusOr<audit::VerifyingKey> k = audit::VerifyingKey::FromPem(
        "-----BEGIN PUBLIC KEY-----\n"
        "MCowBQYDK2VwAyEAMeixEIuMcFXL7aZ0rWSWLOwXpK0uB9EtR2p/ui1xpiQ=\n"
        "-----END PUBLIC KEY-----\n");
    if (!k.ok()) std::abort();
    return *k;
  }();
  return key;
}

}  // namespace kvguard::fuzz

#endif  // KVGUARD_FUZZ_AUDIT_SEED_KEY_H_
