// The isolation layer's events in the durable audit log: the mapping of each event to its
// record, and an engine whose strict tenant's violation is on disk by the time the aborted
// request's result is returned.
#include "core/service/audit_log_sink.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "audit/record.h"
#include "audit/signing_key.h"
#include "core/engine/engine.h"
#include "tests/core/model/tiny_model.h"
#include "tests/core/service/unbatched_log.h"

namespace kvguard::core {
namespace {

namespace fs = std::filesystem;
using isolation::AuditEvent;
using isolation::Mode;

isolation::Violation StaleRead() {
  isolation::Violation v;
  v.kind = isolation::ViolationKind::kStaleGeneration;
  v.requester = {1, 11};
  v.page = 5;
  v.page_index = 0;
  v.expected_generation = 3;
  v.actual_generation = 5;
  v.actual_owner = {2, 22};
  return v;
}

TEST(AuditLogSinkTest, EachEventMapsToItsRecord) {
  AuditEvent e;
  e.type = AuditEvent::Type::kViolation;
  e.tenant = "acme";
  e.mode = "enforce";
  e.actual_tenant = "beta";
  e.request = 11;
  e.violation = StaleRead();
  audit::Event r = ToAuditRecord(e);
  EXPECT_EQ(r.type, "violation");
  EXPECT_EQ(r.reason, "stale_generation");
  EXPECT_EQ(r.tenant, "acme");
  EXPECT_EQ(r.session, 11u);
  EXPECT_EQ(r.page, 5);
  EXPECT_EQ(r.expected_generation, 3u);
  EXPECT_EQ(r.actual_generation, 5u);
  EXPECT_EQ(r.actual_tenant, "beta");
  EXPECT_EQ(r.actual_session, 22u);
  EXPECT_FALSE(r.durable) << "enforce events are batched";
  e.mode = "strict";
  EXPECT_TRUE(ToAuditRecord(e).durable) << "strict events are fsync'd before the error";
  e.violation->kind = isolation::ViolationKind::kStaleRelease;
  EXPECT_EQ(ToAuditRecord(e).type, "release_rejected");
  AuditEvent m;
  m.type = AuditEvent::Type::kModeChange;
  m.tenant = "acme";
  m.mode_from = "enforce";
  m.mode_to = "strict";
  m.actor = "root";
  r = ToAuditRecord(m);
  EXPECT_EQ(r.type, "mode_change");
  EXPECT_EQ(r.mode_to, "strict");
  EXPECT_TRUE(r.durable) << "a change into strict is recorded as durably as strict events";
  EXPECT_TRUE(audit::IsEventType(r.type));
}

std::vector<audit::Line> RecordsIn(const std::string& dir) {
  std::vector<audit::Line> out;
  for (int i = 1; fs::exists(dir + "/" + audit::FileName(i)); ++i) {
    std::ifstream in(dir + "/" + audit::FileName(i));
    for (std::string line; std::getline(in, line);) {
      absl::StatusOr<audit::Line> p = audit::ParseLine(line);
      EXPECT_TRUE(p.ok()) << p.status();
      if (p.ok() && p->kind == audit::Line::Kind::kRecord) out.push_back(*p);
    }
  }
  return out;
}

TEST(AuditLogSinkTest, StrictViolationIsOnDiskWhenTheAbortedRequestReturns) {
  for (const bool fault : {false, true}) {
    SCOPED_TRACE(fault ? "with a fault" : "twin without it");
    std::string tmpl = ::testing::TempDir() + "/audit_sink_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    const std::string dir = tmpl + "/log";
    std::shared_ptr<audit::AuditLog> log = testing::OpenUnbatchedLog(dir);

    const TinyModel& m = Fp32Tiny();
    KvPoolOptions po;
    po.dtype = kernels::KvDtype::kFp32;
    po.budget_bytes = m.model->config().KvBytesPerToken(4) * 16 * 64;
    EngineOptions eo;
    eo.check_accounting = false;
    eo.isolation.sink = std::make_shared<AuditLogSink>(log);
    eo.isolation.policy.tenants = {{"s", Mode::kStrict, 3}};
    auto engine = *Engine::Create(m.model, m.tokenizer, *KvPool::Create(m.model->config(), po), eo);
    EngineFaults f;
    if (fault) f.release_during_step = 1;
    engine->set_faults(f);
    GenerationRequest r;
    r.tenant = "s";
    r.prompt = m.tokenizer->Encode("audit me", true);
    r.max_tokens = 8;
    r.stop_at_eos = false;
    const GenerationResult res = *engine->Wait(*engine->Submit(std::move(r)));
    // Read the files now, before the engine or the log shuts down (which would flush).
    int violations = 0;
    for (const audit::Line& l : RecordsIn(dir)) {
      if (l.event.type == "violation") {
        ++violations;
        EXPECT_EQ(l.event.tenant, "s");
        EXPECT_EQ(l.event.reason, "kernel_tag_mismatch");
        EXPECT_EQ(l.event.mode, "strict");
        EXPECT_EQ(l.event.request, 1u);
      }
    }
    EXPECT_EQ(res.reason, fault ? FinishReason::kAborted : FinishReason::kLength);
    EXPECT_EQ(violations, fault ? 1 : 0);
    engine.reset();
    fs::remove_all(tmpl);
  }
}

}  // namespace
}  // namespace kvguard::core
