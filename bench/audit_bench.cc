// The audit log's two rates (issue 5 targets: append >= 200,000 records/s with batched fsync;
// verify >= 1,000,000 records in 10 s).
//
//   BM_AuditAppend/batch:B     AuditLog::Append of a typical violation record into a fresh log
//                              directory, fsync every B records (B = 1: every record durable,
//                              as for strict tenants); checkpoints every 1000 records.
//   BM_AuditVerify/records:N   VerifyLog over a log of N records written beforehand (not
//                              timed), checkpoints every 1000.
// items = records. The log lives under $TMPDIR (default /tmp): the disk there decides fsync.
#include <benchmark/benchmark.h>
#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>

#include "audit/log.h"
#include "audit/signing_key.h"
#include "audit/verifier.h"

namespace kvguard::bench {
namespace {

namespace fs = std::filesystem;

std::string TempDir() {
  std::string tmpl = (fs::temp_directory_path() / "audit_bench.XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) return "";
  return tmpl;
}

std::shared_ptr<const audit::SigningKey> Key() {
  static const std::shared_ptr<const audit::SigningKey> key =
      std::shared_ptr<const audit::SigningKey>(audit::SigningKey::CreateEphemeral().value());
  return key;
}

audit::Event Typical(uint64_t i) {
  audit::Event e;
  e.type = "violation";
  e.tenant = "tenant-42";
  e.session = i;
  e.request = i;
  e.page = static_cast<int64_t>(i % 4096);
  e.expected_generation = 2 * i + 1;
  e.actual_generation = 2 * i + 3;
  e.actual_tenant = "tenant-7";
  e.actual_session = i + 1;
  e.reason = "stale_generation";
  e.mode = "enforce";
  return e;
}

void BM_AuditAppend(benchmark::State& state) {
  const std::string dir = TempDir();
  audit::LogOptions o;
  o.dir = dir + "/log";
  o.key = Key();
  o.batch_records = static_cast<uint64_t>(state.range(0));
  auto log = audit::AuditLog::Open(o);
  if (!log.ok()) {
    state.SkipWithError(std::string(log.status().message()).c_str());
    return;
  }
  uint64_t i = 0;
  for (auto _ : state) {
    if (!(*log)->Append(Typical(i++)).ok()) {
      state.SkipWithError("append failed");
      break;
    }
  }
  (*log)->Close().IgnoreError();
  state.SetItemsProcessed(state.iterations());
  fs::remove_all(dir);
}
BENCHMARK(BM_AuditAppend)->ArgName("batch")->Arg(1)->Arg(512)->UseRealTime();

void BM_AuditVerify(benchmark::State& state) {
  const uint64_t n = static_cast<uint64_t>(state.range(0));
  const std::string dir = TempDir();
  {
    audit::LogOptions o;
    o.dir = dir + "/log";
    o.key = Key();
    o.batch_records = 4096;
    auto log = audit::AuditLog::Open(o);
    if (!log.ok()) {
      state.SkipWithError(std::string(log.status().message()).c_str());
      return;
    }
    for (uint64_t i = 0; i + 2 < n; ++i) (*log)->Append(Typical(i)).IgnoreError();
  }  // start, n - 2 events, stop: n records
  const audit::VerifyingKey vk = *audit::VerifyingKey::FromPem(Key()->PublicKeyPem());
  uint64_t records = 0;
  for (auto _ : state) {
    absl::StatusOr<audit::VerifyReport> r = audit::VerifyLog(dir + "/log", vk, {});
    if (!r.ok() || r->failure) {
      state.SkipWithError("verify failed");
      break;
    }
    records = r->records;
  }
  state.counters["records"] = static_cast<double>(records);
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(records));
  fs::remove_all(dir);
}
BENCHMARK(BM_AuditVerify)
    ->ArgName("records")
    ->Arg(1000000)
    ->Unit(benchmark::kSecond)
    ->Iterations(3)
    ->UseRealTime();

}  // namespace
}  // namespace kvguard::bench

BENCHMARK_MAIN();
