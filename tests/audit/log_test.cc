// The audit log writer: records and checkpoints as FORMAT.md says, the chain across reopen and
// rotation, durable appends, crash recovery of a torn tail, and a disk that refuses writes.
// (The verifier's corruption matrix is verifier_test.cc.)
#include "audit/log.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "audit/record.h"
#include "audit/signing_key.h"
#include "audit/verdict.h"
#include "audit/verifier.h"
#include "tests/temp_dir.h"

namespace kvguard::audit {
namespace {

namespace fs = std::filesystem;

class AuditLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = tests::NewTempDir("audit_log_test");
    dir_ = root_ + "/log";
    key_ = std::shared_ptr<const SigningKey>(*SigningKey::CreateEphemeral());
  }
  void TearDown() override { fs::remove_all(root_); }

  LogOptions Options() const {
    LogOptions o;
    o.dir = dir_;
    o.key = key_;
    o.instance = "test-instance";
    o.checkpoint_every = 5;
    return o;
  }
  static Event Violation(uint64_t request, bool durable = false) {
    Event e;
    e.type = "violation";
    e.tenant = "acme";
    e.session = request;
    e.request = request;
    e.page = 7;
    e.expected_generation = 3;
    e.actual_generation = 5;
    e.reason = "stale_generation";
    e.mode = durable ? "strict" : "enforce";
    e.durable = durable;
    return e;
  }
  // Lines returns every line of every log file, in order.
  std::vector<std::string> Lines() const {
    std::vector<std::string> out;
    for (int i = 1; fs::exists(dir_ + "/" + FileName(i)); ++i) {
      std::ifstream in(dir_ + "/" + FileName(i));
      for (std::string line; std::getline(in, line);) out.push_back(line);
    }
    return out;
  }
  // Records parses every line and checks the chain; returns the records' events.
  std::vector<Line> Records() const {
    std::vector<Line> out;
    Hash prev{};
    for (const std::string& l : Lines()) {
      absl::StatusOr<Line> p = ParseLine(l);
      EXPECT_TRUE(p.ok()) << p.status() << "\n" << l;
      if (!p.ok() || p->kind != Line::Kind::kRecord) continue;
      EXPECT_TRUE(p->hash_ok) << l;
      EXPECT_EQ(p->seq, out.size()) << l;
      EXPECT_EQ(p->prev, prev) << l;
      prev = p->hash;
      out.push_back(*p);
    }
    return out;
  }

  std::string root_, dir_;
  std::shared_ptr<const SigningKey> key_;
};

TEST_F(AuditLogTest, RecordsChainAndCheckpointsAreSigned) {
  {
    auto log = *AuditLog::Open(Options());
    for (uint64_t i = 1; i <= 12; ++i) ASSERT_TRUE(log->Append(Violation(i)).ok());
    ASSERT_TRUE(log->Close().ok());
  }
  const std::vector<Line> records = Records();
  ASSERT_EQ(records.size(), 14u);  // start, 12 violations, stop
  EXPECT_EQ(records.front().event.type, "service_start");
  EXPECT_EQ(records.back().event.type, "service_stop");
  EXPECT_EQ(records[1].event.tenant, "acme");
  EXPECT_EQ(records[1].event.reason, "stale_generation");
  EXPECT_EQ(records[1].instance, "test-instance");
  // Checkpoints: after every 5 records and at close, each signed over the right tree head.
  const VerifyingKey vk = *VerifyingKey::FromPem(key_->PublicKeyPem());
  MerkleAccumulator tree;
  Hash head{};
  int checkpoints = 0;
  for (const std::string& l : Lines()) {
    const Line p = *ParseLine(l);
    if (p.kind == Line::Kind::kRecord) {
      tree.Append(LeafHash(l));
      head = p.hash;
      continue;
    }
    ++checkpoints;
    const Checkpoint& c = p.checkpoint;
    EXPECT_EQ(c.size, tree.size());
    EXPECT_EQ(c.root, tree.Root());
    EXPECT_EQ(c.head, head);
    EXPECT_EQ(c.key_fp, key_->Fingerprint());
    EXPECT_TRUE(vk.Verify(CheckpointMessage(c.log_id, c.size, c.head, c.root, c.time_ns), c.sig));
    std::string forged = c.sig;
    forged[0] ^= 1;
    EXPECT_FALSE(vk.Verify(CheckpointMessage(c.log_id, c.size, c.head, c.root, c.time_ns), forged));
  }
  EXPECT_EQ(checkpoints, 3);  // sizes 5 and 10, then 14 at close
}

TEST_F(AuditLogTest, ReopenContinuesTheChainAndRotationKeepsOneChain) {
  LogOptions o = Options();
  o.rotate_bytes = 4096;
  for (int run = 0; run < 3; ++run) {
    auto log = *AuditLog::Open(o);
    for (uint64_t i = 0; i < 20; ++i) ASSERT_TRUE(log->Append(Violation(i)).ok());
  }                                             // destructor closes
  const std::vector<Line> records = Records();  // one chain, seq 0.. across runs and files
  int rotations = 0;
  for (const Line& r : records) rotations += r.event.type == "log_rotation";
  EXPECT_GT(rotations, 0);
  EXPECT_EQ(records.size(), 3u * 22u + static_cast<size_t>(rotations));  // start, 20, stop
  // (service_stop never rotates, its checkpoint follows it: the next start may rotate instead.)
  const int files = AuditLog::Open(o).value()->stats().files;
  rotations = 0;
  for (const Line& r : Records()) rotations += r.event.type == "log_rotation";
  EXPECT_EQ(files, rotations + 1);
}

TEST_F(AuditLogTest, DurableAppendIsOnDiskBeforeItReturns) {
  LogOptions o = Options();
  o.batch_records = 1000;
  o.batch_interval_ms = 1000000;  // the flusher never fires during the test
  o.checkpoint_every = 1000;
  auto log = *AuditLog::Open(o);
  const size_t before = Lines().size();
  ASSERT_TRUE(log->Append(Violation(1)).ok());
  EXPECT_EQ(Lines().size(), before) << "a non-durable record waits for its batch";
  ASSERT_TRUE(log->Append(Violation(2, /*durable=*/true)).ok());
  EXPECT_EQ(Lines().size(), before + 2) << "a durable record flushes itself and what precedes";
}

TEST_F(AuditLogTest, TornTailIsSetAsideAndTheChainGoesOnWithARecoveryRecord) {
  {
    auto log = *AuditLog::Open(Options());
    for (uint64_t i = 0; i < 7; ++i) ASSERT_TRUE(log->Append(Violation(i)).ok());
  }
  // A crash in the middle of a write: half a record at the end of the newest file.
  const std::string torn = R"({"v":1,"seq":99,"time_ns":1,"type":"violation","inst)";
  std::ofstream(dir_ + "/" + FileName(1), std::ios::app) << torn;
  {
    auto log = AuditLog::Open(Options());
    ASSERT_TRUE(log.ok()) << log.status();
    EXPECT_EQ((*log)->stats().recovered_bytes, torn.size());
  }
  const std::vector<Line> records = Records();  // the chain is whole
  bool recovered = false;
  for (const Line& r : records) {
    if (r.event.type == "recovery") {
      recovered = true;
      EXPECT_NE(r.event.detail->find("torn-"), std::string::npos);
    }
  }
  EXPECT_TRUE(recovered);
  int aside = 0;
  for (const auto& e : fs::directory_iterator(dir_)) {
    if (e.path().filename().string().starts_with("torn-")) {
      ++aside;
      std::ifstream in(e.path());
      std::stringstream ss;
      ss << in.rdbuf();
      EXPECT_EQ(ss.str(), torn) << "the torn bytes are kept, not dropped";
    }
  }
  EXPECT_EQ(aside, 1);
}

TEST_F(AuditLogTest, DamageBeforeTheTailIsRefusedNotOverwritten) {
  {
    auto log = *AuditLog::Open(Options());
    for (uint64_t i = 0; i < 7; ++i) ASSERT_TRUE(log->Append(Violation(i)).ok());
  }
  std::vector<std::string> lines = Lines();
  lines[2] = "garbage";
  std::ofstream out(dir_ + "/" + FileName(1), std::ios::trunc);
  for (const std::string& l : lines) out << l << "\n";
  out.close();
  EXPECT_EQ(AuditLog::Open(Options()).status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(AuditLogTest, AFailingDiskIsReportedAndTheBatchIsWrittenOnceItRecovers) {
  LogOptions o = Options();
  o.checkpoint_every = 1000;
  o.batch_interval_ms = 1000000;
  auto log = *AuditLog::Open(o);
  ASSERT_TRUE(log->Healthy().ok());
  // A file size limit makes every further write fail with EFBIG: a real failing write.
  signal(SIGXFSZ, SIG_IGN);
  rlimit old;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  const auto size = fs::file_size(dir_ + "/" + FileName(1));
  rlimit tight = old;
  tight.rlim_cur = size;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &tight), 0);
  const absl::Status failed = log->Append(Violation(1, /*durable=*/true));
  setrlimit(RLIMIT_FSIZE, &old);
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable) << failed;
  EXPECT_FALSE(log->Healthy().ok());
  EXPECT_EQ(fs::file_size(dir_ + "/" + FileName(1)), size) << "no torn bytes left behind";
  // Twin: the disk is back; the pending record goes out with the next write.
  ASSERT_TRUE(log->Append(Violation(2, /*durable=*/true)).ok());
  EXPECT_TRUE(log->Healthy().ok());
  ASSERT_TRUE(log->Close().ok());
  const std::vector<Line> records = Records();
  ASSERT_EQ(records.size(), 4u);
  EXPECT_EQ(records[1].event.request, 1u);
  EXPECT_EQ(records[2].event.request, 2u);
}

TEST_F(AuditLogTest, UnknownEventTypeIsRefusedKnownOneAccepted) {
  auto log = *AuditLog::Open(Options());
  Event e;
  e.type = "coffee_break";
  EXPECT_EQ(log->Append(e).code(), absl::StatusCode::kInvalidArgument);
  e.type = "mode_change";
  e.mode_from = "enforce";
  e.mode_to = "strict";
  EXPECT_TRUE(log->Append(e).ok());
}

// The writer's own witness (kept outside the directory) stops it from signing a history that
// was rewritten while it was down (...so the writer must refuse to sign it); the twin reopens.
TEST_F(AuditLogTest, AHistoryRewrittenWhileDownIsRefusedNotSignedAgain) {
  for (const bool tamper : {false, true}) {
    SCOPED_TRACE(tamper ? "checkpoints deleted" : "untouched twin");
    fs::remove_all(dir_);
    LogOptions o = Options();
    o.witness_file = root_ + "/witness";
    fs::remove(o.witness_file);
    {
      auto log = *AuditLog::Open(o);
      for (uint64_t i = 0; i < 12; ++i) ASSERT_TRUE(log->Append(Violation(i)).ok());
    }
    if (tamper) {
      // What anyone who can write the directory can do without the key: edit record 3,
      // re-chain everything after it, and drop the checkpoints that would expose it.
      std::vector<std::string> lines = Lines();
      std::ofstream out(dir_ + "/" + FileName(1), std::ios::trunc);
      Hash prev{};
      for (const std::string& l : lines) {
        Line p = *ParseLine(l);
        if (p.kind != Line::Kind::kRecord) continue;
        if (p.seq == 3) p.event.detail = "forged";
        Hash hash;
        out << FormatRecord(p.event, p.seq, p.instance, prev, &hash) << "\n";
        prev = hash;
      }
      out.close();
      // An auditor without a witness sees a well-formed, merely unsigned tail...
      const VerifyingKey vk = *VerifyingKey::FromPem(key_->PublicKeyPem());
      const VerifyReport blind = *VerifyLog(dir_, vk, {});
      EXPECT_FALSE(blind.failure.has_value());
      EXPECT_EQ(blind.checkpoints, 0u);
    }
    const std::vector<std::string> before = Lines();
    absl::StatusOr<std::unique_ptr<AuditLog>> again = AuditLog::Open(o);
    if (tamper) {
      EXPECT_EQ(again.status().code(), absl::StatusCode::kDataLoss) << again.status();
      EXPECT_EQ(Lines(), before) << "a refused log gets nothing written to it";
    } else {
      EXPECT_TRUE(again.ok()) << again.status();
    }
  }
}

TEST_F(AuditLogTest, AnEmptiedDirectoryIsNotANewLogForAWriterThatSignedThere) {
  LogOptions o = Options();
  o.witness_file = root_ + "/witness";
  { auto log = *AuditLog::Open(o); }
  fs::remove_all(dir_);
  EXPECT_EQ(AuditLog::Open(o).status().code(), absl::StatusCode::kDataLoss);
  fs::remove(o.witness_file);  // twin: a writer that never signed there may start afresh
  EXPECT_TRUE(AuditLog::Open(o).ok());
}

TEST_F(AuditLogTest, OneWriterPerDirectory) {
  auto first = *AuditLog::Open(Options());
  EXPECT_EQ(AuditLog::Open(Options()).status().code(), absl::StatusCode::kFailedPrecondition);
  first.reset();
  EXPECT_TRUE(AuditLog::Open(Options()).ok());  // twin: once the first has closed
}

TEST_F(AuditLogTest, WriterOnlyEventTypesAreRefusedFromCallers) {
  auto log = *AuditLog::Open(Options());
  for (const char* type : {"service_start", "service_stop", "log_rotation", "recovery"}) {
    Event e;
    e.type = type;
    EXPECT_EQ(log->Append(e).code(), absl::StatusCode::kInvalidArgument) << type;
  }
  EXPECT_TRUE(log->Append(Violation(1)).ok());
}

// Bytes that are not UTF-8 in a field (an operator's name, a detail) never stop a record:
// they are written as U+FFFD and the log still parses in canonical form; the twin is plain text.
TEST_F(AuditLogTest, InvalidUtf8InAFieldIsWrittenNotThrown) {
  {
    auto log = *AuditLog::Open(Options());
    Event e = Violation(1);
    e.detail = std::string("bad \xff\xfe bytes");
    EXPECT_TRUE(log->Append(e).ok());
    e.detail = "plain";
    EXPECT_TRUE(log->Append(e).ok());
  }
  const std::vector<Line> records = Records();
  ASSERT_EQ(records.size(), 4u);
  EXPECT_EQ(records[1].event.detail, "bad \xef\xbf\xbd\xef\xbf\xbd bytes");
  EXPECT_EQ(records[2].event.detail, "plain");
}

// FakeClocks is a monotonic and a wall clock the test moves by hand (no sleeps).
struct FakeClocks {
  std::shared_ptr<std::atomic<int64_t>> ms = std::make_shared<std::atomic<int64_t>>(1000000);
  static constexpr int64_t kEpochNs = int64_t{1767225600} * 1000000000;  // 2026-01-01
  // Install makes `o` run on these clocks, with checkpoints by time only (T, T' in ms).
  void Install(LogOptions& o, int64_t checkpoint_ms, int64_t heartbeat_ms) const {
    o.checkpoint_every = 1000;
    o.checkpoint_interval_ms = checkpoint_ms;
    o.heartbeat_interval_ms = heartbeat_ms;
    o.batch_interval_ms = 1000 * 1000 * 1000;  // the flusher never ticks during a test
    o.monotonic_ms = [ms = ms] { return ms->load(); };
    o.now_ns = [ms = ms] { return kEpochNs + ms->load() * 1000000; };
  }
  int64_t now_ns() const { return kEpochNs + ms->load() * 1000000; }
};

// Checkpoints returns the checkpoints of the log, in order.
std::vector<Checkpoint> CheckpointsIn(const std::vector<std::string>& lines) {
  std::vector<Checkpoint> out;
  for (const std::string& l : lines) {
    absl::StatusOr<Line> p = ParseLine(l);
    if (p.ok() && p->kind == Line::Kind::kCheckpoint) out.push_back(p->checkpoint);
  }
  return out;
}

// The timers, driven by Tick with a fake clock: a checkpoint T after the last one while a record
// waits (not before), a heartbeat T' after it while none does (not before), of the same size.
TEST_F(AuditLogTest, TickSignsPendingRecordsAfterTAndAHeartbeatAfterTPrimeWhenIdle) {
  FakeClocks clock;
  LogOptions o = Options();
  clock.Install(o, 10000, 60000);
  auto log = *AuditLog::Open(o);
  auto tick = [&](int64_t t) {
    *clock.ms = t;
    return log->Tick(t);
  };
  const int64_t t0 = *clock.ms;
  ASSERT_TRUE(tick(t0).ok());  // service_start waits; none signed yet: sign it
  ASSERT_EQ(log->stats().checkpoints, 1u);
  ASSERT_TRUE(log->Append(Violation(1)).ok());
  ASSERT_TRUE(tick(t0 + 9999).ok());
  EXPECT_EQ(log->stats().checkpoints, 1u) << "a pending record is signed T after, not before";
  ASSERT_TRUE(tick(t0 + 10000).ok());
  EXPECT_EQ(log->stats().checkpoints, 2u);
  ASSERT_TRUE(tick(t0 + 10000 + 59999).ok());
  EXPECT_EQ(log->stats().checkpoints, 2u) << "idle: no heartbeat before T'";
  ASSERT_TRUE(tick(t0 + 70000).ok());
  EXPECT_EQ(log->stats().checkpoints, 3u) << "idle: a heartbeat T' after the last checkpoint";
  const std::vector<Checkpoint> c = CheckpointsIn(Lines());
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[2].size, c[1].size) << "a heartbeat covers the same records";
  EXPECT_EQ(c[2].root, c[1].root);
  EXPECT_EQ(c[2].time_ns, clock.now_ns()) << "with a new signed time";
  // The log with heartbeats verifies.
  ASSERT_TRUE(log->Close().ok());
  absl::StatusOr<VerifyReport> r = VerifyLog(dir_, *VerifyingKey::FromRaw(key_->PublicKeyRaw()));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->ok()) << r->failure->ToString();
  EXPECT_EQ(Judge(*r, {}).verdict, Verdict::kValid);
}

// verify --max-age: a writer that ticks every T' is fresh; one that stopped signing for longer
// (a gap between two checkpoints of one run) or long ago (now) is stale; a restart between two
// checkpoints is not a gap.
TEST_F(AuditLogTest, MaxAgeTellsAGapOrAnOldLastCheckpoint) {
  FakeClocks clock;
  LogOptions o = Options();
  clock.Install(o, 1000, 60000);
  const VerifyingKey pub = *VerifyingKey::FromRaw(key_->PublicKeyRaw());
  auto judge = [&](int64_t max_age_s, int64_t now_ns) {
    absl::StatusOr<VerifyReport> r = VerifyLog(dir_, pub);
    EXPECT_TRUE(r.ok() && r->ok());
    JudgeOptions j;
    j.max_age_ns = max_age_s * 1000000000;
    j.now_ns = now_ns;
    return Judge(*r, j);
  };
  {
    auto log = *AuditLog::Open(o);
    for (int i = 0; i < 10; ++i) {  // ten minutes, ticking every second
      for (int s = 0; s < 60; ++s) {
        *clock.ms += 1000;
        ASSERT_TRUE(log->Tick(*clock.ms).ok());
      }
    }
    ASSERT_TRUE(log->Close().ok());
  }
  EXPECT_EQ(judge(61, clock.now_ns()).verdict, Verdict::kValid);
  const Judgement old = judge(61, clock.now_ns() + 62 * int64_t{1000000000});
  EXPECT_EQ(old.verdict, Verdict::kStale);
  EXPECT_NE(old.why.find("the last checkpoint"), std::string::npos) << old.why;
  // A restart an hour later: not a gap.
  *clock.ms += 3600 * 1000;
  {
    auto log = *AuditLog::Open(o);
    ASSERT_TRUE(log->Tick(*clock.ms).ok());
    // Then the writer stops signing for five minutes (no tick), and signs again.
    ASSERT_TRUE(log->Append(Violation(1)).ok());
    *clock.ms += 300 * 1000;
    ASSERT_TRUE(log->Tick(*clock.ms).ok());
    ASSERT_TRUE(log->Close().ok());
  }
  const Judgement gap = judge(61, clock.now_ns());
  EXPECT_EQ(gap.verdict, Verdict::kStale);
  EXPECT_NE(gap.why.find("no checkpoint for 300.000s"), std::string::npos) << gap.why;
  EXPECT_EQ(judge(301, clock.now_ns()).verdict, Verdict::kValid);  // the twin
}

// service_stop is always the last record and a checkpoint covering it follows it directly,
// wherever the stop falls against rotation and the checkpoint count.
TEST_F(AuditLogTest, StopIsAlwaysFollowedByItsFinalCheckpoint) {
  for (int n = 0; n < 40; ++n) {
    SCOPED_TRACE(absl::StrCat(n, " records"));
    LogOptions o = Options();
    o.dir = absl::StrCat(root_, "/stop", n);
    o.rotate_bytes = 4096;
    o.checkpoint_every = 7;
    {
      auto log = *AuditLog::Open(o);
      for (int i = 0; i < n; ++i) ASSERT_TRUE(log->Append(Violation(i)).ok());
      ASSERT_TRUE(log->Close().ok());
    }
    int newest = 1;
    while (fs::exists(o.dir + "/" + FileName(newest + 1))) ++newest;
    std::ifstream in(o.dir + "/" + FileName(newest));
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    ASSERT_GE(lines.size(), 2u);
    // The newest file ends with service_stop and one checkpoint covering it.
    const Line stop = *ParseLine(lines[lines.size() - 2]);
    const Line last = *ParseLine(lines.back());
    ASSERT_EQ(stop.kind, Line::Kind::kRecord);
    EXPECT_EQ(stop.event.type, "service_stop");
    ASSERT_EQ(last.kind, Line::Kind::kCheckpoint);
    EXPECT_EQ(last.checkpoint.size, stop.seq + 1);
    EXPECT_EQ(last.checkpoint.head, stop.hash);
  }
}
// What anyone who can write the directory can do without the key: append a record, chained to
// the last one, after the log's last line. AppendForged returns the forged record's seq.
uint64_t AppendForged(const std::string& path, const std::vector<Line>& records) {
  Event e;
  e.type = "mode_change";
  e.tenant = "acme";
  e.mode_from = "enforce";
  e.mode_to = "off";
  e.actor = "admin";
  e.time_ns = records.back().event.time_ns + 1;
  Hash hash;
  const uint64_t seq = records.back().seq + 1;
  std::ofstream(path, std::ios::app)
      << FormatRecord(e, seq, records.back().instance, records.back().hash, &hash) << "\n";
  return seq;
}

// A clean stop ends with service_stop and its checkpoint; a writer writes nothing after them. A
// record there was added while the service was down: the next start refuses the log rather
// than sign it (before, the start's first checkpoint covered it and `verify` said all valid).
TEST_F(AuditLogTest, RecordsAfterACleanStopAreRefusedNotSigned) {
  for (const bool forge : {false, true}) {
    SCOPED_TRACE(forge ? "a record appended after the stop" : "untouched twin");
    fs::remove_all(dir_);
    {
      auto log = *AuditLog::Open(Options());
      for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(log->Append(Violation(i)).ok());
    }
    if (forge) {
      const uint64_t seq = AppendForged(dir_ + "/" + FileName(1), Records());
      const VerifyingKey vk = *VerifyingKey::FromPem(key_->PublicKeyPem());
      const VerifyReport report = *VerifyLog(dir_, vk, {});
      EXPECT_FALSE(report.failure.has_value());  // well formed: an unsigned tail of one
      EXPECT_EQ(report.uncovered, 1u);
      EXPECT_EQ(report.last_covered_type, "service_stop");
      absl::StatusOr<std::unique_ptr<AuditLog>> again = AuditLog::Open(Options());
      EXPECT_EQ(again.status().code(), absl::StatusCode::kDataLoss) << again.status();
      EXPECT_NE(again.status().message().find(absl::StrCat("records ", seq, "..", seq)),
                std::string::npos)
          << again.status();
      const VerifyReport after = *VerifyLog(dir_, vk, {});  // nothing was signed
      EXPECT_FALSE(after.failure.has_value()) << after.failure->ToString();
      EXPECT_EQ(after.uncovered, 1u);
    } else {
      EXPECT_TRUE(AuditLog::Open(Options()).ok());
    }
  }
}

// After a crash the last records may have no checkpoint yet, and a record appended to such a
// log cannot be told from them. The next start takes them over with a `tail_adopted` record
// naming exactly those seqs, which verify reports; a log without such a tail gets none (twin).
TEST_F(AuditLogTest, ACrashTailIsTakenOverByANamedRecordNotSignedInSilence) {
  for (const bool crash : {false, true}) {
    SCOPED_TRACE(crash ? "crash image with records after the last checkpoint" : "clean twin");
    fs::remove_all(dir_);
    {
      auto log = *AuditLog::Open(Options());  // a checkpoint every 5 records
      for (uint64_t i = 0; i < 7; ++i) ASSERT_TRUE(log->Append(Violation(i)).ok());
    }
    uint64_t first = 0, last = 0;
    if (crash) {
      // The image a crash before Close leaves: drop service_stop and its checkpoint, then let
      // someone append one more record.
      std::vector<std::string> lines = Lines();
      lines.resize(lines.size() - 2);
      {
        std::ofstream out(dir_ + "/" + FileName(1), std::ios::trunc);
        for (const std::string& l : lines) out << l << "\n";
      }
      const VerifyingKey vk = *VerifyingKey::FromPem(key_->PublicKeyPem());
      const VerifyReport before = *VerifyLog(dir_, vk, {});
      ASSERT_GT(before.uncovered, 0u);
      first = before.records - before.uncovered;
      last = AppendForged(dir_ + "/" + FileName(1), Records());
    }
    { ASSERT_TRUE(AuditLog::Open(Options()).ok()); }
    const VerifyingKey vk = *VerifyingKey::FromPem(key_->PublicKeyPem());
    const VerifyReport report = *VerifyLog(dir_, vk, {});
    ASSERT_FALSE(report.failure.has_value()) << report.failure->ToString();
    EXPECT_EQ(report.uncovered, 0u);
    if (crash) {
      ASSERT_EQ(report.adoptions.size(), 1u);
      EXPECT_EQ(report.adoptions[0].first, first);
      EXPECT_EQ(report.adoptions[0].last, last);
      EXPECT_EQ(report.adoptions[0].seq, last + 1);  // right after them, before anything else
      EXPECT_NE(Summary(report).find(
                    absl::StrCat("records ", first, "..", last, " were taken over unsigned")),
                std::string::npos)
          << Summary(report);
    } else {
      EXPECT_TRUE(report.adoptions.empty());
    }
  }
}

// A tail_adopted record must name exactly the records after the last checkpoint: one that
// understates them (hiding a forged record among signed ones) fails verification.
TEST_F(AuditLogTest, ATailAdoptedRecordMustNameTheWholeTail) {
  for (const bool honest : {true, false}) {
    SCOPED_TRACE(honest ? "names seq 0..1" : "names seq 1..1");
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::ofstream(dir_ + "/log-id") << "0123456789abcdef0123456789abcdef\n";
    std::ofstream out(dir_ + "/" + FileName(1));
    Hash prev{};
    for (uint64_t seq = 0; seq < 3; ++seq) {
      Event e = Violation(seq);
      if (seq == 2) {
        e = Event{};
        e.type = "tail_adopted";
        e.detail = honest ? TailAdoptedDetail(0, 1) : TailAdoptedDetail(1, 1);
      }
      e.time_ns = 1000 + static_cast<int64_t>(seq);
      Hash hash;
      out << FormatRecord(e, seq, "forger", prev, &hash) << "\n";
      prev = hash;
    }
    out.close();
    const VerifyingKey vk = *VerifyingKey::FromPem(key_->PublicKeyPem());
    const VerifyReport report = *VerifyLog(dir_, vk, {});
    if (honest) {
      EXPECT_FALSE(report.failure.has_value()) << report.failure->ToString();
      ASSERT_EQ(report.adoptions.size(), 1u);
    } else {
      ASSERT_TRUE(report.failure.has_value());
      EXPECT_NE(report.failure->why.find("tail_adopted"), std::string::npos);
    }
  }
}

}  // namespace
}  // namespace kvguard::audit
