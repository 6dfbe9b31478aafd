// Operator changes (mode changes, key rotations, config changes) through isolation::Guard into
// the durable audit log: each is on disk (fsync'd) by the time the call returns, before the
// change applies, so a crash cannot lose the record of a weakening that took effect. The twin,
// an enforce tenant's violation, is batched: not on disk yet.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "audit/log.h"
#include "core/service/audit_log_sink.h"
#include "isolation/guard.h"
#include "isolation/ownership_table.h"
#include "isolation/tag_key.h"
#include "tests/core/service/unbatched_log.h"

namespace kvguard::core {
namespace {

namespace fs = std::filesystem;
using isolation::AuditEvent;
using isolation::Mode;

// OnDisk returns how many lines of the log's files in `dir` mention `type` as a record type.
int OnDisk(const std::string& dir, const std::string& type) {
  int n = 0;
  for (int i = 1; fs::exists(dir + "/" + audit::FileName(i)); ++i) {
    std::ifstream in(dir + "/" + audit::FileName(i));
    for (std::string line; std::getline(in, line);) {
      if (line.find("\"type\":\"" + type + "\"") != std::string::npos) ++n;
    }
  }
  return n;
}

TEST(OperatorChangeDurabilityTest, EveryOperatorChangeIsOnDiskWhenItReturns) {
  std::string tmpl = ::testing::TempDir() + "/operator_change.XXXXXX";
  ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
  const std::string dir = tmpl + "/log";
  std::shared_ptr<audit::AuditLog> log = testing::OpenUnbatchedLog(dir);
  auto sink = std::make_shared<AuditLogSink>(log);
  std::shared_ptr<isolation::TagKeyRing> keys(*isolation::TagKeyRing::CreateEphemeral());
  isolation::OwnershipTable table(4, keys.get(), nullptr);
  isolation::GuardOptions go;
  go.policy.tenants = {{"acme", Mode::kEnforce, 3}, {"beta", Mode::kEnforce, 3}};
  go.sink = sink;
  std::unique_ptr<isolation::Guard> guard = *isolation::Guard::Create(go, &table, keys);

  // Twin first: an enforce tenant's violation is batched, so not on disk yet. (Were it there,
  // the checks below could not tell a durable record from a batch that happened to flush.)
  AuditEvent v;
  v.type = AuditEvent::Type::kViolation;
  v.tenant = "acme";
  v.mode = "enforce";
  v.violation = isolation::Violation{};
  ASSERT_TRUE(sink->Append(v).ok());
  EXPECT_EQ(OnDisk(dir, "violation"), 0);

  // A downgrade between two non-strict modes.
  ASSERT_TRUE(guard->SetMode("beta", Mode::kOff, "ops").ok());
  EXPECT_EQ(OnDisk(dir, "mode_change"), 1);
  ASSERT_TRUE(guard->RotateKey("ops").ok());
  EXPECT_EQ(OnDisk(dir, "key_rotated"), 1);
  AuditEvent config;
  config.type = AuditEvent::Type::kConfigChange;
  config.tenant = "acme";
  config.mode = "enforce";
  config.actor = "admin:reload";
  config.detail = "api_keys [sha256:00000000] -> [sha256:00000000,sha256:11111111]";
  const isolation::Guard::ModeChange downgrade{"acme", Mode::kOff};
  ASSERT_TRUE(guard->ApplyChanges({&downgrade, 1}, {config}, "admin:reload", [] {}).ok());
  EXPECT_EQ(OnDisk(dir, "mode_change"), 2);
  EXPECT_EQ(OnDisk(dir, "config_change"), 1);
  guard.reset();
  log.reset();
  fs::remove_all(tmpl);
}

}  // namespace
}  // namespace kvguard::core
