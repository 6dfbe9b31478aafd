// tests/core/service/unbatched_log.h: an audit log whose batches never reach the disk on their
// own (no batch fills, the flusher never wakes, no checkpoint falls due), so that a record on
// disk is there because it was written durably.
#ifndef KVGUARD_TESTS_CORE_SERVICE_UNBATCHED_LOG_H_
#define KVGUARD_TESTS_CORE_SERVICE_UNBATCHED_LOG_H_

#include <memory>
#include <string>

#include "audit/log.h"
#include "audit/signing_key.h"

namespace kvguard::core::testing {

// OpenUnbatchedLog opens (creates) such a log in `dir`; it fails the test if it cannot.
inline std::shared_ptr<audit::AuditLog> OpenUnbatchedLog(const std::string& dir) {
  audit::LogOptions lo;
  lo.dir = dir;
  lo.key = std::shared_ptr<const audit::SigningKey>(*audit::SigningKey::CreateEphemeral());
  lo.batch_records = 100000;
  lo.batch_interval_ms = 10000000;
  lo.checkpoint_every = 100000;
  lo.checkpoint_interval_ms = 10000000;
  return std::shared_ptr<audit::AuditLog>(*audit::AuditLog::Open(lo));
}

}  // namespace kvguard::core::testing

#endif  // KVGUARD_TESTS_CORE_SERVICE_UNBATCHED_LOG_H_
