// tests/isolation/verdict.h: Kind, the verdict the isolation tests compare: "ok" or the
// violation's stable name, so a failed expectation reads as a verdict.
#ifndef KVGUARD_TESTS_ISOLATION_VERDICT_H_
#define KVGUARD_TESTS_ISOLATION_VERDICT_H_

#include <optional>
#include <string>

#include "isolation/violation.h"

namespace kvguard::tests {

inline std::string Kind(const std::optional<isolation::Violation>& v) {
  return v ? isolation::ViolationKindName(v->kind) : "ok";
}

}  // namespace kvguard::tests

#endif  // KVGUARD_TESTS_ISOLATION_VERDICT_H_
