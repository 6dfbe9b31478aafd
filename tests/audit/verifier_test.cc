// Tests of audit/verifier.h: the corruption matrix of issue 5. Every log here is written by the
// real writer (audit::AuditLog) with small checkpoint and rotation intervals, then corrupted on
// a copy: one byte in each field and at each position of a record, records dropped, repeated
// and swapped, files removed and swapped, truncations, forged, replayed and altered
// checkpoints, witnesses. Each corruption must fail naming the right record; each test also
// verifies the untouched log (its positive twin), so a verifier that always says yes, or
// always says no, fails here.
#include "audit/verifier.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "audit/log.h"
#include "audit/merkle.h"
#include "audit/query.h"
#include "audit/record.h"
#include "audit/signing_key.h"
#include "audit/verdict.h"
#include "tests/audit/test_files.h"

namespace kvguard::audit {
namespace {

namespace fs = std::filesystem;
using testing::AppendFile;
using testing::NewTempDir;
using testing::ReadFile;
using testing::WriteFile;

constexpr int64_t kBaseNs = int64_t{1704067200} * 1000000000;  // 2024-01-01T00:00:00Z

// MakeEvent returns the i-th of a varied set of events: every event type a service writes,
// every field set somewhere, strings that need JSON escaping.
Event MakeEvent(int i) {
  Event e;
  e.time_ns = kBaseNs + int64_t{i} * 20 * 1000000000;
  const char* tenants[] = {"acme", "beta", "we,ird \"t\"\nenant \\ \xc3\xa9"};
  switch (i % 6) {
    case 0:
    case 1:
      e.type = "violation";
      e.tenant = tenants[i % 3];
      e.session = static_cast<uint64_t>(i);
      e.request = static_cast<uint64_t>(1000 + i);
      e.page = i % 50;
      e.expected_generation = 3;
      e.actual_generation = 4;
      e.actual_tenant = "beta";
      e.actual_session = 7;
      e.reason = i % 4 == 0 ? "stale_generation" : "wrong_owner";
      e.mode = "strict";
      e.detail = "tag mismatch";
      break;
    case 2:
      e.type = "release_rejected";
      e.tenant = tenants[i % 2];
      e.session = static_cast<uint64_t>(i);
      e.page = i % 50;
      e.reason = "double_release";
      break;
    case 3:
      e.type = i % 2 ? "session_quarantined" : "tenant_quarantined";
      e.tenant = "acme";
      e.session = static_cast<uint64_t>(i);
      e.reason = "quarantine_after";
      break;
    case 4:
      e.type = "mode_change";
      e.tenant = "beta";
      e.mode_from = "enforce";
      e.mode_to = "strict";
      e.actor = "admin";
      break;
    default:
      e.type = "key_rotated";
      e.key_fingerprint = "0123456789abcdef";
      e.actor = "ops";
      break;
  }
  return e;
}

LogOptions Options(const std::string& dir, std::shared_ptr<const SigningKey> key) {
  LogOptions o;
  o.dir = dir;
  o.key = std::move(key);
  o.instance = "0011223344556677";
  o.checkpoint_every = 10;
  o.checkpoint_interval_ms = 3600 * 1000;  // checkpoints only by count: deterministic
  o.rotate_bytes = 8192;
  o.batch_records = 16;
  o.batch_interval_ms = 3600 * 1000;
  return o;
}

// LogLines is a log directory's rotation set as lines, to corrupt and write back.
struct LogFile {
  std::string name;
  std::vector<std::string> lines;  // without '\n'
};

std::vector<LogFile> ReadLog(const std::string& dir) {
  std::vector<LogFile> files;
  for (int i = 1; fs::exists(dir + "/" + FileName(i)); ++i) {
    LogFile f{FileName(i), {}};
    std::stringstream in(ReadFile(dir + "/" + f.name));
    for (std::string line; std::getline(in, line);) f.lines.push_back(line);
    files.push_back(std::move(f));
  }
  return files;
}

void WriteLog(const std::string& dir, const std::vector<LogFile>& files) {
  for (const LogFile& f : files) {
    std::string data;
    for (const std::string& l : f.lines) data += l + "\n";
    WriteFile(dir + "/" + f.name, data);
  }
}

bool IsCheckpoint(const std::string& line) {
  return line.find("\"type\":\"checkpoint\"") != std::string::npos;
}

// Where is the position of one line.
struct Where {
  size_t file;
  size_t line;  // 0-based
};

// FindSeq returns where record `seq` is.
Where FindSeq(const std::vector<LogFile>& files, uint64_t seq) {
  const std::string key = absl::StrCat("{\"v\":1,\"seq\":", seq, ",");
  for (size_t f = 0; f < files.size(); ++f) {
    for (size_t l = 0; l < files[f].lines.size(); ++l) {
      if (files[f].lines[l].starts_with(key)) return {f, l};
    }
  }
  ADD_FAILURE() << "no record " << seq;
  return {0, 0};
}

// The shared log: written once, copied by each test.
class VerifierTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    key_ = std::shared_ptr<const SigningKey>(*SigningKey::CreateEphemeral());
    other_key_ = std::shared_ptr<const SigningKey>(*SigningKey::CreateEphemeral());
    golden_ = new std::string(NewTempDir() + "/log");
    absl::StatusOr<std::unique_ptr<AuditLog>> log = AuditLog::Open(Options(*golden_, key_));
    ASSERT_TRUE(log.ok()) << log.status();
    for (int i = 0; i < kEvents; ++i) ASSERT_TRUE((*log)->Append(MakeEvent(i)).ok());
    // Enough lines in the newest file to truncate it in several places.
    for (int i = kEvents;; ++i) {
      ASSERT_TRUE((*log)->Flush().ok());
      if (fs::file_size(*golden_ + "/" + FileName((*log)->stats().files)) > 4000) break;
      ASSERT_TRUE((*log)->Append(MakeEvent(i)).ok());
    }
    ASSERT_TRUE((*log)->Close().ok());
  }
  static void TearDownTestSuite() {
    fs::remove_all(fs::path(*golden_).parent_path());
    delete golden_;
  }

  void SetUp() override {
    dir_ = NewTempDir() + "/log";
    fs::copy(*golden_, dir_, fs::copy_options::recursive);
    files_ = ReadLog(dir_);
    // The target: a violation with every field set, in a middle file, followed by a record.
    for (uint64_t seq = 100; target_ == 0 && seq < 300; ++seq) {
      const Where w = FindSeq(files_, seq);
      const std::vector<std::string>& lines = files_[w.file].lines;
      if (w.file > 0 && w.file + 1 < files_.size() && w.line + 1 < lines.size() &&
          lines[w.line].find("\"actual_session\"") != std::string::npos &&
          !IsCheckpoint(lines[w.line + 1]) &&
          lines[w.line + 1].find("log_rotation") == std::string::npos) {
        target_ = seq;
      }
    }
    ASSERT_NE(target_, 0u);
  }
  void TearDown() override { fs::remove_all(fs::path(dir_).parent_path()); }

  static VerifyingKey Pub(const SigningKey& k) { return *VerifyingKey::FromRaw(k.PublicKeyRaw()); }

  VerifyReport Verify(const std::string& dir, const VerifyOptions& options = {}) {
    absl::StatusOr<VerifyReport> r = VerifyLog(dir, Pub(*key_), options);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : VerifyReport{};
  }

  // ExpectGolden checks the positive twin: the untouched log verifies.
  void ExpectGolden() {
    VerifyReport r = Verify(*golden_);
    EXPECT_TRUE(r.ok()) << Summary(r);
  }

  // ExpectFailsAt writes `files` over the copy and expects verification to fail at record
  // `seq`, in file `file` line `line` (1-based), with `why` in the reason.
  void ExpectFailsAt(uint64_t seq, const std::string& why, const std::string& file = "",
                     uint64_t line = 0) {
    WriteLog(dir_, files_);
    VerifyReport r = Verify(dir_);
    ASSERT_FALSE(r.ok()) << "passed: " << Summary(r);
    EXPECT_EQ(r.failure->seq, std::optional<uint64_t>(seq)) << r.failure->ToString();
    EXPECT_NE(r.failure->why.find(why), std::string::npos) << r.failure->ToString();
    if (!file.empty()) {
      EXPECT_EQ(r.failure->file, file) << r.failure->ToString();
    }
    if (line != 0) {
      EXPECT_EQ(r.failure->line, line) << r.failure->ToString();
    }
    ExpectGolden();
  }

  // Checkpoints returns the checkpoint lines, in order, with where they are.
  std::vector<std::pair<Where, std::string>> Checkpoints() const {
    std::vector<std::pair<Where, std::string>> out;
    for (size_t f = 0; f < files_.size(); ++f) {
      for (size_t l = 0; l < files_[f].lines.size(); ++l) {
        if (IsCheckpoint(files_[f].lines[l])) out.push_back({{f, l}, files_[f].lines[l]});
      }
    }
    return out;
  }

  // Signed returns checkpoint `c` signed by `key` (with its fingerprint unless keep_fp).
  static std::string Signed(Checkpoint c, const SigningKey& key, bool keep_fp = false) {
    if (!keep_fp) c.key_fp = key.Fingerprint();
    c.sig = *key.Sign(CheckpointMessage(c.log_id, c.size, c.head, c.root, c.time_ns));
    return FormatCheckpoint(c);
  }

  static Checkpoint Parsed(const std::string& line) {
    absl::StatusOr<Line> l = ParseLine(line);
    EXPECT_TRUE(l.ok() && l->kind == Line::Kind::kCheckpoint) << line;
    return l.ok() ? l->checkpoint : Checkpoint{};
  }

  static constexpr int kEvents = 300;
  static std::shared_ptr<const SigningKey> key_, other_key_;
  static std::string* golden_;
  std::string dir_;
  std::vector<LogFile> files_;
  uint64_t target_ = 0;  // see SetUp
};

std::shared_ptr<const SigningKey> VerifierTest::key_;
std::shared_ptr<const SigningKey> VerifierTest::other_key_;
std::string* VerifierTest::golden_;

TEST_F(VerifierTest, UntouchedLogVerifies) {
  VerifyReport r = Verify(dir_);
  ASSERT_TRUE(r.ok()) << Summary(r);
  // service_start + the events + log_rotation records + service_stop.
  EXPECT_GE(r.records, uint64_t{kEvents + 2});
  EXPECT_GE(r.files, 5);
  EXPECT_EQ(r.files, static_cast<int>(files_.size()));
  EXPECT_EQ(r.checkpoints, r.records / 10 + 1);  // every 10 and one at Close
  EXPECT_EQ(r.uncovered, 0u);
  EXPECT_TRUE(r.recoveries.empty());
  EXPECT_TRUE(r.torn_files.empty());
  EXPECT_EQ(r.last_checkpoint->size, r.records);
  EXPECT_EQ(Judge(r, {}).verdict, Verdict::kValid);
  EXPECT_EQ(Summary(r),
            absl::StrCat(r.files, " files, ", r.records, " records, ", r.checkpoints,
                         " checkpoints: all valid, every record signed; signed through ",
                         FormatTime(r.last_checkpoint->time_ns)));
  // The target record is a full violation, in neither the first nor the last file.
  const Where w = FindSeq(files_, target_);
  EXPECT_GT(w.file, 0u);
  EXPECT_LT(w.file + 1, files_.size());
  EXPECT_NE(files_[w.file].lines[w.line].find("\"actual_session\""), std::string::npos);
}

TEST_F(VerifierTest, WrongKeyFailsAtFirstCheckpoint) {
  absl::StatusOr<VerifyReport> r = VerifyLog(dir_, Pub(*other_key_));
  ASSERT_TRUE(r.ok());
  ASSERT_FALSE(r->ok());
  EXPECT_TRUE(r->failure->checkpoint);
  EXPECT_EQ(r->failure->seq, std::optional<uint64_t>(9));
  EXPECT_NE(r->failure->why.find("not by the public key given"), std::string::npos);
  ExpectGolden();
}

// One byte changed in each field of a record: the verifier names that record.
TEST_F(VerifierTest, OneByteInEachFieldFailsAtThatRecord) {
  const char* fields[] = {"v",
                          "seq",
                          "time_ns",
                          "type",
                          "instance",
                          "tenant",
                          "session",
                          "request",
                          "page",
                          "expected_generation",
                          "actual_generation",
                          "actual_tenant",
                          "actual_session",
                          "reason",
                          "mode",
                          "detail",
                          "prev",
                          "hash"};
  const std::vector<LogFile> original = files_;
  for (const char* field : fields) {
    SCOPED_TRACE(field);
    files_ = original;
    const Where w = FindSeq(files_, target_);
    std::string& line = files_[w.file].lines[w.line];
    const size_t key = line.find(absl::StrCat("\"", field, "\":"));
    ASSERT_NE(key, std::string::npos);
    size_t at = key + std::string_view(field).size() + 3;
    if (line[at] == '"') ++at;  // inside the string
    char& c = line[at];
    c = c == '1' ? '2' : c == 'a' ? 'b' : (c >= '0' && c <= '9') ? '1' : 'a';
    ExpectFailsAt(target_, "", files_[w.file].name, w.line + 1);
  }
  // And the fields of the other event types.
  for (const char* field : {"mode_from", "mode_to", "actor", "key_fingerprint"}) {
    SCOPED_TRACE(field);
    files_ = original;
    uint64_t seq = target_;
    Where w = FindSeq(files_, seq);
    while (files_[w.file].lines[w.line].find(absl::StrCat("\"", field, "\":")) ==
           std::string::npos) {
      w = FindSeq(files_, ++seq);
    }
    std::string& line = files_[w.file].lines[w.line];
    line[line.find(absl::StrCat("\"", field, "\":")) + std::string_view(field).size() + 4] ^= 1;
    ExpectFailsAt(seq, "", files_[w.file].name, w.line + 1);
  }
}

// Every byte of a record, flipped in turn: each flip fails at that record.
TEST_F(VerifierTest, EveryByteOfARecordFailsAtThatRecord) {
  const Where w = FindSeq(files_, target_);
  const std::string original = files_[w.file].lines[w.line];
  for (size_t i = 0; i < original.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("byte ", i, " of ", original));
    files_[w.file].lines[w.line] = original;
    files_[w.file].lines[w.line][i] ^= 0x42;
    WriteLog(dir_, files_);
    VerifyReport r = Verify(dir_);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.failure->seq, std::optional<uint64_t>(target_)) << r.failure->ToString();
    EXPECT_EQ(r.failure->line, w.line + 1);
  }
  files_[w.file].lines[w.line] = original;
  WriteLog(dir_, files_);
  EXPECT_TRUE(Verify(dir_).ok());
}

// Every byte of a checkpoint, flipped in turn, fails at that checkpoint (digit-for-digit
// changes of time_ns too: CheckpointTimeIsSigned).
TEST_F(VerifierTest, EveryByteOfACheckpointFailsAtIt) {
  const auto checkpoints = Checkpoints();
  const auto& [w, original] = checkpoints[checkpoints.size() / 2];
  for (size_t i = 0; i < original.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("byte ", i, " of ", original));
    files_[w.file].lines[w.line] = original;
    files_[w.file].lines[w.line][i] ^= 0x42;
    WriteLog(dir_, files_);
    VerifyReport r = Verify(dir_);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.failure->file, files_[w.file].name);
    EXPECT_EQ(r.failure->line, w.line + 1) << r.failure->ToString();
  }
  ExpectGolden();
}

TEST_F(VerifierTest, DroppedRecordFails) {
  const Where w = FindSeq(files_, target_);
  files_[w.file].lines.erase(files_[w.file].lines.begin() + static_cast<long>(w.line));
  ExpectFailsAt(target_,
                absl::StrCat("found seq ", target_ + 1, " where seq ", target_, " belongs"),
                files_[w.file].name, w.line + 1);
}

TEST_F(VerifierTest, DuplicatedRecordFails) {
  const Where w = FindSeq(files_, target_);
  auto& lines = files_[w.file].lines;
  lines.insert(lines.begin() + static_cast<long>(w.line) + 1, lines[w.line]);
  ExpectFailsAt(target_ + 1, absl::StrCat("found seq ", target_, " again"), files_[w.file].name,
                w.line + 2);
}

TEST_F(VerifierTest, SwappedNeighboursFail) {
  const Where w = FindSeq(files_, target_);
  auto& lines = files_[w.file].lines;
  ASSERT_FALSE(IsCheckpoint(lines[w.line + 1]));
  std::swap(lines[w.line], lines[w.line + 1]);
  ExpectFailsAt(target_,
                absl::StrCat("found seq ", target_ + 1, " where seq ", target_, " belongs"),
                files_[w.file].name, w.line + 1);
}

TEST_F(VerifierTest, RecordMovedToAnotherFileFails) {
  // The first record of file 3 moved to the end of file 2, after its log_rotation record.
  const std::string moved = files_[2].lines.front();
  absl::StatusOr<Line> l = ParseLine(moved);
  ASSERT_TRUE(l.ok());
  files_[2].lines.erase(files_[2].lines.begin());
  files_[1].lines.push_back(moved);
  ExpectFailsAt(l->seq, "after the log_rotation record", files_[1].name, files_[1].lines.size());
}

TEST_F(VerifierTest, TruncatedMidRecordFails) {
  // Cut the newest file in the middle of one of its records.
  LogFile& last = files_.back();
  size_t l = last.lines.size() / 2;
  while (IsCheckpoint(last.lines[l])) ++l;
  const uint64_t seq = ParseLine(last.lines[l])->seq;
  std::string data;
  for (size_t i = 0; i < l; ++i) data += last.lines[i] + "\n";
  data += last.lines[l].substr(0, last.lines[l].size() / 2);
  WriteFile(dir_ + "/" + last.name, data);
  VerifyReport r = Verify(dir_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.failure->seq, std::optional<uint64_t>(seq));
  EXPECT_EQ(r.failure->file, last.name);
  EXPECT_EQ(r.failure->line, l + 1);
  EXPECT_NE(r.failure->why.find("cut short"), std::string::npos);
  ExpectGolden();
}

TEST_F(VerifierTest, TruncatedMidRecordInOlderFileFails) {
  LogFile& f = files_[1];
  size_t l = 2;
  while (IsCheckpoint(f.lines[l])) ++l;
  const uint64_t seq = ParseLine(f.lines[l])->seq;
  f.lines.resize(l + 1);
  WriteLog(dir_, files_);
  std::string data = ReadFile(dir_ + "/" + f.name);
  data.resize(data.size() - 20);
  WriteFile(dir_ + "/" + f.name, data);
  VerifyReport r = Verify(dir_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.failure->seq, std::optional<uint64_t>(seq));
  EXPECT_EQ(r.failure->file, f.name);
  ExpectGolden();
}

TEST_F(VerifierTest, TruncatedAtBoundaryInOlderFileFails) {
  // Cut file 2 after a record before its log_rotation record: the rotation rule fires.
  LogFile& f = files_[1];
  size_t l = 3;
  while (IsCheckpoint(f.lines[l])) ++l;
  const uint64_t seq = ParseLine(f.lines[l])->seq;
  f.lines.resize(l + 1);
  ExpectFailsAt(seq, "ends without a log_rotation record", f.name, l + 1);
}

// Truncating the newest file at a record boundary below the last checkpoint: the log cannot
// tell (verifier.h, "What a pass does not prove"); a witness checkpoint kept from the longer
// log can.
TEST_F(VerifierTest, TruncatedBelowLastCheckpointNeedsAWitness) {
  const Checkpoint witness = Parsed(Checkpoints().back().second);
  VerifyOptions with_witness;
  with_witness.witness = witness;
  {
    VerifyReport whole = Verify(dir_, with_witness);  // the positive twin
    ASSERT_TRUE(whole.ok()) << Summary(whole);
    EXPECT_TRUE(whole.witness_checked);
  }
  LogFile& last = files_.back();
  size_t l = last.lines.size() - 4;  // before the last checkpoint, and before service_stop
  while (IsCheckpoint(last.lines[l])) --l;
  const uint64_t kept = ParseLine(last.lines[l])->seq + 1;
  last.lines.resize(l + 1);
  WriteLog(dir_, files_);
  VerifyReport alone = Verify(dir_);
  EXPECT_TRUE(alone.ok()) << Summary(alone);
  EXPECT_EQ(alone.records, kept);
  VerifyReport r = Verify(dir_, with_witness);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.failure->ToString(),
            absl::StrCat("log does not extend the witness checkpoint of size ", witness.size,
                         ": it has only ", kept, " records (truncated?)"));
}

// Truncated across files: the newest file removed and the one before cut back at a record
// boundary before its log_rotation record. Passes alone, fails against the witness.
TEST_F(VerifierTest, TruncatedAcrossFilesNeedsAWitness) {
  VerifyOptions with_witness;
  with_witness.witness = Parsed(Checkpoints().back().second);
  fs::remove(dir_ + "/" + files_.back().name);
  files_.pop_back();
  LogFile& f = files_.back();
  f.lines.resize(f.lines.size() - 3);
  while (IsCheckpoint(f.lines.back())) f.lines.pop_back();
  WriteLog(dir_, files_);
  EXPECT_TRUE(Verify(dir_).ok());
  VerifyReport r = Verify(dir_, with_witness);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.failure->why.find("log does not extend the witness checkpoint"), std::string::npos);
  EXPECT_TRUE(Verify(*golden_, with_witness).ok());
}

// A live log (records flushed after the last checkpoint): it verifies and says how many
// records no checkpoint covers yet; truncated at a boundary above its last checkpoint it still
// verifies, with fewer of them, and extends a witness taken at that checkpoint.
TEST_F(VerifierTest, RecordsAfterLastCheckpointAreReportedNotFailed) {
  const std::string dir = NewTempDir() + "/live";
  LogOptions o = Options(dir, key_);
  o.rotate_bytes = 1 << 20;
  absl::StatusOr<std::unique_ptr<AuditLog>> log = AuditLog::Open(o);
  ASSERT_TRUE(log.ok());
  for (int i = 0; i < 25; ++i) ASSERT_TRUE((*log)->Append(MakeEvent(i)).ok());  // 26 records
  ASSERT_TRUE((*log)->Flush().ok());
  const std::string copy = fs::path(dir).parent_path().string() + "/copy";
  fs::copy(dir, copy, fs::copy_options::recursive);
  ASSERT_TRUE((*log)->Close().ok());

  VerifyReport r = Verify(copy);
  ASSERT_TRUE(r.ok()) << Summary(r);
  EXPECT_EQ(r.records, 26u);
  EXPECT_EQ(r.checkpoints, 2u);
  EXPECT_EQ(r.uncovered, 6u);
  // Not a valid verdict: the tail is signed by nobody (issue 27), unless the auditor allows it.
  EXPECT_EQ(Judge(r, {}).verdict, Verdict::kUnsignedTail);
  EXPECT_EQ(Summary(r).substr(0, 107),
            "1 file, 26 records, 2 checkpoints: UNSIGNED TAIL: the last 6 records (seq 20..25) no "
            "checkpoint covers: who");
  JudgeOptions allow;
  allow.allow_unsigned_tail = true;
  EXPECT_EQ(Judge(r, allow).verdict, Verdict::kValid);

  // Cut two uncovered records off.
  std::vector<LogFile> files = ReadLog(copy);
  files.back().lines.resize(files.back().lines.size() - 2);
  WriteLog(copy, files);
  VerifyOptions with_witness;
  with_witness.witness = r.last_checkpoint;
  r = Verify(copy, with_witness);
  ASSERT_TRUE(r.ok()) << Summary(r);
  EXPECT_EQ(r.records, 24u);
  EXPECT_EQ(r.uncovered, 4u);
  EXPECT_TRUE(r.witness_checked);
  // The closed log extends that witness as well.
  EXPECT_TRUE(Verify(dir, with_witness).ok());
  fs::remove_all(fs::path(dir).parent_path());
}

TEST_F(VerifierTest, WitnessFromAnotherHistoryFails) {
  // A witness signed by the right key for a different root (a fork the writer signed).
  Checkpoint w = Parsed(Checkpoints()[5].second);
  VerifyOptions good;
  good.witness = w;
  EXPECT_TRUE(Verify(dir_, good).ok());
  w.root[0] ^= 1;
  VerifyOptions forked;
  forked.witness = Parsed(Signed(w, *key_));
  VerifyReport r = Verify(dir_, forked);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.failure->seq, std::optional<uint64_t>(w.size - 1));
  EXPECT_NE(r.failure->why.find(absl::StrCat("log does not extend the witness checkpoint of size ",
                                             w.size, ": records 0..", w.size - 1,
                                             " have another Merkle root")),
            std::string::npos)
      << r.failure->ToString();
  // Signed by another key, or for another log.
  w.root[0] ^= 1;
  VerifyOptions other;
  other.witness = Parsed(Signed(w, *other_key_));
  r = Verify(dir_, other);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.failure->why.find("witness checkpoint's signature does not verify"),
            std::string::npos);
  w.log_id[0] = w.log_id[0] == 'a' ? 'b' : 'a';
  other.witness = Parsed(Signed(w, *key_));
  r = Verify(dir_, other);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.failure->why.find("witness checkpoint is for log"), std::string::npos);
}

TEST_F(VerifierTest, ParseWitness) {
  const std::string line = Checkpoints()[3].second;
  absl::StatusOr<Checkpoint> w = ParseWitness("\n" + line + "\n");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(FormatCheckpoint(*w), line);
  EXPECT_FALSE(ParseWitness("").ok());
  EXPECT_FALSE(ParseWitness(line + "\n" + line).ok());
  EXPECT_FALSE(ParseWitness(files_[0].lines[0]).ok());  // a record
  EXPECT_FALSE(ParseWitness("not json").ok());
}

TEST_F(VerifierTest, RemovedMiddleFileFails) {
  fs::remove(dir_ + "/" + FileName(3));
  VerifyReport r = Verify(dir_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.failure->file, FileName(3));
  EXPECT_NE(r.failure->why.find("is missing"), std::string::npos);
  ExpectGolden();
}

TEST_F(VerifierTest, RemovedFirstFileFails) {
  fs::remove(dir_ + "/" + FileName(1));
  VerifyReport r = Verify(dir_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.failure->file, FileName(1));
  ExpectGolden();
}

TEST_F(VerifierTest, RemovedNewestFileFails) {
  const size_t n = files_.size();
  fs::remove(dir_ + "/" + FileName(static_cast<int>(n)));
  const LogFile& prev = files_[n - 2];
  size_t l = prev.lines.size() - 1;
  while (IsCheckpoint(prev.lines[l])) --l;
  VerifyReport r = Verify(dir_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.failure->file, prev.name);
  EXPECT_EQ(r.failure->line, l + 1);
  EXPECT_EQ(r.failure->seq, std::optional<uint64_t>(ParseLine(prev.lines[l])->seq));
  EXPECT_NE(r.failure->why.find("which is missing"), std::string::npos) << r.failure->ToString();
  ExpectGolden();
}

TEST_F(VerifierTest, SwappedFilesFail) {
  const uint64_t first_of_2 = ParseLine(files_[1].lines[0])->seq;
  std::swap(files_[1].lines, files_[2].lines);
  ExpectFailsAt(first_of_2, "where seq", FileName(2), 1);
}

TEST_F(VerifierTest, RenamedFileFails) {
  fs::rename(dir_ + "/" + FileName(2), dir_ + "/audit-2.jsonl");
  VerifyReport r = Verify(dir_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.failure->file, "audit-2.jsonl");
  ExpectGolden();
}

TEST_F(VerifierTest, EmptyOrMissingDirectory) {
  const std::string empty = NewTempDir();
  VerifyReport r = Verify(empty);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.failure->why.find("no audit-*.jsonl files"), std::string::npos);
  EXPECT_EQ(VerifyLog(empty + "/nope", Pub(*key_)).status().code(), absl::StatusCode::kNotFound);
  fs::remove_all(empty);
  ExpectGolden();
}

TEST_F(VerifierTest, LogIdMissingOrChangedFails) {
  const std::string id = ReadFile(dir_ + "/log-id");
  std::string other = id;
  other[0] = other[0] == 'a' ? 'b' : 'a';
  WriteFile(dir_ + "/log-id", other);
  VerifyReport r = Verify(dir_);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.failure->checkpoint);
  EXPECT_EQ(r.failure->seq, std::optional<uint64_t>(9));
  EXPECT_NE(r.failure->why.find("not this log"), std::string::npos);
  WriteFile(dir_ + "/log-id", "xyz\n");
  r = Verify(dir_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.failure->file, "log-id");
  fs::remove(dir_ + "/log-id");
  r = Verify(dir_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.failure->file, "log-id");
  WriteFile(dir_ + "/log-id", id);
  EXPECT_TRUE(Verify(dir_).ok());
}

TEST_F(VerifierTest, CheckpointForgedWithAnotherKeyFails) {
  const auto checkpoints = Checkpoints();
  const auto& [w, line] = checkpoints[7];
  const Checkpoint c = Parsed(line);
  files_[w.file].lines[w.line] = Signed(c, *other_key_);
  ExpectFailsAt(c.size - 1, "not by the public key given", files_[w.file].name, w.line + 1);
  files_[w.file].lines[w.line] = Signed(c, *other_key_, /*keep_fp=*/true);
  ExpectFailsAt(c.size - 1, "signature does not verify", files_[w.file].name, w.line + 1);
}

TEST_F(VerifierTest, CheckpointReplayedFromEarlierPointFails) {
  const auto checkpoints = Checkpoints();
  const std::string early = checkpoints[2].second;
  // After a later record, where no checkpoint is.
  const Where w = FindSeq(files_, target_);
  auto& lines = files_[w.file].lines;
  lines.insert(lines.begin() + static_cast<long>(w.line) + 1, early);
  ExpectFailsAt(target_, absl::StrCat("follows ", target_ + 1, " records"), files_[w.file].name,
                w.line + 2);
  // In place of a later checkpoint.
  files_ = ReadLog(dir_);
  const auto& [w2, late] = checkpoints[9];
  files_[w2.file].lines[w2.line] = early;
  ExpectFailsAt(Parsed(late).size - 1, "replayed", files_[w2.file].name, w2.line + 1);
}

TEST_F(VerifierTest, CheckpointAlteredFails) {
  const auto checkpoints = Checkpoints();
  const auto& [w, line] = checkpoints[8];
  const Checkpoint c = Parsed(line);
  const std::string file = files_[w.file].name;
  // Altered fields, the signature left as it was.
  for (const char* field : {"\"root\":\"", "\"head\":\"", "\"size\":"}) {
    SCOPED_TRACE(field);
    files_ = ReadLog(*golden_);
    std::string& l = files_[w.file].lines[w.line];
    char& ch = l[l.find(field) + std::string_view(field).size() + 1];
    ch = ch == '1' ? '2' : '1';
    ExpectFailsAt(c.size - 1, "checkpoint", file, w.line + 1);
  }
  // Altered fields, re-signed with the real key: the checks themselves catch them.
  Checkpoint bad = c;
  bad.root[31] ^= 1;
  files_ = ReadLog(*golden_);
  files_[w.file].lines[w.line] = Signed(bad, *key_);
  ExpectFailsAt(c.size - 1, "checkpoint root is not the Merkle root", file, w.line + 1);
  bad = c;
  bad.head[0] ^= 1;
  files_[w.file].lines[w.line] = Signed(bad, *key_);
  ExpectFailsAt(c.size - 1, "checkpoint head is not the hash of seq", file, w.line + 1);
  bad = c;
  bad.size -= 1;
  files_[w.file].lines[w.line] = Signed(bad, *key_);
  ExpectFailsAt(c.size - 1, "checkpoint of size", file, w.line + 1);
}

TEST_F(VerifierTest, CheckpointTimeIsSigned) {
  // The checkpoint's time_ns is in its signed message: changed (digit for digit, so the line
  // still parses), the checkpoint fails; the twin is the untouched log.
  ExpectGolden();
  const auto checkpoints = Checkpoints();
  const auto& [w, line] = checkpoints[4];
  Checkpoint c = Parsed(line);
  c.time_ns += 1000;
  files_[w.file].lines[w.line] = FormatCheckpoint(c);
  WriteLog(dir_, files_);
  VerifyReport r = Verify(dir_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.failure->line, w.line + 1) << r.failure->ToString();
}

// Recovery after a crash in the middle of a write: the torn bytes fail verification until the
// writer reopens the log; then they are in torn-*.bin, a recovery record follows, and the whole
// log verifies.
TEST_F(VerifierTest, RecoveryAfterTornWriteVerifies) {
  const std::string newest = dir_ + "/" + files_.back().name;
  const std::string torn = "{\"v\":1,\"seq\":99999,\"time_ns\":17";
  WriteFile(newest, ReadFile(newest) + torn);
  VerifyReport r = Verify(dir_);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.failure->why.find("cut short"), std::string::npos);

  absl::StatusOr<std::unique_ptr<AuditLog>> log = AuditLog::Open(Options(dir_, key_));
  ASSERT_TRUE(log.ok()) << log.status();
  ASSERT_TRUE((*log)->Append(MakeEvent(1)).ok());
  ASSERT_TRUE((*log)->Close().ok());
  r = Verify(dir_);
  ASSERT_TRUE(r.ok()) << Summary(r);
  ASSERT_EQ(r.torn_files.size(), 1u);
  EXPECT_EQ(ReadFile(dir_ + "/" + r.torn_files[0]), torn);
  ASSERT_EQ(r.recoveries.size(), 1u);
  EXPECT_NE(r.recoveries[0].detail.find(r.torn_files[0]), std::string::npos);
  EXPECT_NE(Summary(r).find("1 recovery after a crash"), std::string::npos);
}

TEST_F(VerifierTest, RecoveryAfterRecordCutInHalfVerifies) {
  // A live log whose last line is a record, cut in half as a crash mid-write leaves it.
  const std::string dir = NewTempDir() + "/live";
  {
    LogOptions o = Options(dir, key_);
    o.rotate_bytes = 1 << 20;
    absl::StatusOr<std::unique_ptr<AuditLog>> log = AuditLog::Open(o);
    ASSERT_TRUE(log.ok());
    for (int i = 0; i < 14; ++i) ASSERT_TRUE((*log)->Append(MakeEvent(i)).ok());
    ASSERT_TRUE((*log)->Flush().ok());
    const std::string copy = fs::path(dir).parent_path().string() + "/crashed";
    fs::copy(dir, copy, fs::copy_options::recursive);
    std::string data = ReadFile(copy + "/" + FileName(1));
    ASSERT_FALSE(IsCheckpoint(data.substr(data.rfind('\n', data.size() - 2) + 1)));
    const size_t cut = data.size() - 150;
    const size_t line_start = data.rfind('\n', cut) + 1;
    const std::string torn = data.substr(line_start, cut - line_start);
    data.resize(cut);
    WriteFile(copy + "/" + FileName(1), data);
    EXPECT_FALSE(Verify(copy).ok());

    o.dir = copy;
    absl::StatusOr<std::unique_ptr<AuditLog>> reopened = AuditLog::Open(o);
    ASSERT_TRUE(reopened.ok()) << reopened.status();
    ASSERT_TRUE((*reopened)->Close().ok());
    VerifyReport r = Verify(copy);
    ASSERT_TRUE(r.ok()) << Summary(r);
    ASSERT_EQ(r.torn_files.size(), 1u);
    EXPECT_EQ(ReadFile(copy + "/" + r.torn_files[0]), torn);
    ASSERT_EQ(r.recoveries.size(), 1u);
    // The crash left records after the last checkpoint: the writer first takes them over
    // (tail_adopted, seq 14, naming them), then notes the torn bytes (recovery, seq 15).
    ASSERT_EQ(r.adoptions.size(), 1u);
    EXPECT_EQ(r.adoptions[0].seq, 14u);
    EXPECT_EQ(r.adoptions[0].last, 13u);
    EXPECT_EQ(r.recoveries[0].seq, 15u);
    ASSERT_TRUE((*log)->Close().ok());
  }
  fs::remove_all(fs::path(dir).parent_path());
}

// Regression (audit/log.cc, Recover): a crash after the log_rotation record was written but
// before the next file was created leaves a newest file that ends with that record; Open must
// continue in the file it names, not append after it.
TEST_F(VerifierTest, ReopenAfterCrashDuringRotationVerifies) {
  // The crash: the newest file never got created.
  fs::remove(dir_ + "/" + files_.back().name);
  files_.pop_back();
  // The writer never wrote the final checkpoint or anything after the rotation either.
  LogFile& f = files_.back();
  while (IsCheckpoint(f.lines.back())) f.lines.pop_back();
  WriteLog(dir_, files_);
  absl::StatusOr<std::unique_ptr<AuditLog>> log = AuditLog::Open(Options(dir_, key_));
  ASSERT_TRUE(log.ok()) << log.status();
  ASSERT_TRUE((*log)->Close().ok());
  VerifyReport r = Verify(dir_);
  EXPECT_TRUE(r.ok()) << Summary(r);
}

// Regression (audit/log.cc, AppendLocked/RotateLocked): while writes fail, a rotation that is
// pending must not be appended again, and records that arrive meanwhile belong to the next
// file; once the disk is back the log verifies.
TEST_F(VerifierTest, RotationWhileDiskFailsVerifiesLater) {
  const std::string dir = NewTempDir() + "/full";
  LogOptions o = Options(dir, key_);
  o.batch_records = 1000;
  o.checkpoint_every = 1000;
  o.rotate_bytes = 4096;
  absl::StatusOr<std::unique_ptr<AuditLog>> log = AuditLog::Open(o);
  ASSERT_TRUE(log.ok());
  ASSERT_TRUE((*log)->Flush().ok());
  // The disk is "full": writes past the current size fail with EFBIG.
  signal(SIGXFSZ, SIG_IGN);
  struct rlimit old;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  struct rlimit full = old;
  full.rlim_cur = fs::file_size(dir + "/" + FileName(1));
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &full), 0);
  int failed = 0;
  for (int i = 0; i < 30; ++i) failed += (*log)->Append(MakeEvent(i)).ok() ? 0 : 1;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &old), 0);
  EXPECT_GE(failed, 1);  // the rotation's write failed at least
  ASSERT_TRUE((*log)->Close().ok());
  VerifyReport r = Verify(dir);
  EXPECT_TRUE(r.ok()) << Summary(r);
  fs::remove_all(fs::path(dir).parent_path());
}

// ---- Issue 27: forged records whose own hash is recomputed, every position, every truncation
// point, appends, checkpoint swaps, witness rollback, torn-tail deletion. ----

namespace forged {

// Rehashed returns `line` with its event changed by `edit` and its hash recomputed (its seq and
// prev kept unless `edit_chain` changes them), as a forger without the signing key can.
std::string Rehashed(const std::string& line, const std::function<void(Event&)>& edit,
                     const std::function<void(uint64_t&, Hash&)>& edit_chain = nullptr) {
  absl::StatusOr<Line> l = ParseLine(line);
  EXPECT_TRUE(l.ok() && l->kind == Line::Kind::kRecord) << line;
  Event e = l->event;
  edit(e);
  uint64_t seq = l->seq;
  Hash prev = l->prev;
  if (edit_chain) edit_chain(seq, prev);
  Hash hash;
  return FormatRecord(e, seq, l->instance, prev, &hash);
}

void LaterTime(Event& e) { e.time_ns += 1; }

}  // namespace forged

// Every record, in turn, replaced by a forged one (one field changed, its own hash recomputed,
// so it passes the hash check): the record after it fails on `prev`, or the checkpoint right
// after it fails on its head. Deleting the verifier's prev check makes this test fail.
TEST_F(VerifierTest, ForgedRehashedRecordAtEveryPositionFailsAtTheNextLine) {
  const std::vector<LogFile> original = files_;
  const uint64_t records = Verify(dir_).records;
  for (uint64_t seq = 0; seq < records; ++seq) {
    SCOPED_TRACE(absl::StrCat("seq ", seq));
    files_ = original;
    const Where w = FindSeq(files_, seq);
    std::string& line = files_[w.file].lines[w.line];
    line = forged::Rehashed(line, forged::LaterTime);
    ASSERT_TRUE(ParseLine(line)->hash_ok);
    WriteLog(dir_, files_);
    VerifyReport r = Verify(dir_);
    ASSERT_FALSE(r.ok()) << "passed: " << Summary(r);
    EXPECT_EQ(Judge(r, {}).verdict, Verdict::kInvalid);
    // The next line: a record in this file or the next, or a checkpoint.
    const bool last_of_file = w.line + 1 == files_[w.file].lines.size();
    const std::string& next =
        last_of_file ? files_[w.file + 1].lines[0] : files_[w.file].lines[w.line + 1];
    if (IsCheckpoint(next)) {
      EXPECT_TRUE(r.failure->checkpoint) << r.failure->ToString();
      EXPECT_EQ(r.failure->seq, std::optional<uint64_t>(seq)) << r.failure->ToString();
      EXPECT_NE(r.failure->why.find("checkpoint head is not the hash of seq"), std::string::npos)
          << r.failure->ToString();
    } else {
      EXPECT_FALSE(r.failure->checkpoint) << r.failure->ToString();
      EXPECT_EQ(r.failure->seq, std::optional<uint64_t>(seq + 1)) << r.failure->ToString();
      EXPECT_EQ(r.failure->why, absl::StrCat("prev does not match the hash of seq ", seq));
      EXPECT_EQ(r.failure->file, last_of_file ? files_[w.file + 1].name : files_[w.file].name);
      EXPECT_EQ(r.failure->line, last_of_file ? 1 : w.line + 2);
    }
  }
  files_ = original;
  WriteLog(dir_, files_);
  EXPECT_EQ(Judge(Verify(dir_), {}).verdict, Verdict::kValid);  // the positive twin
}

// A forged record whose prev was changed too (and its hash recomputed) fails at itself.
TEST_F(VerifierTest, ForgedRehashedPrevFailsAtThatRecord) {
  const Where w = FindSeq(files_, target_);
  std::string& line = files_[w.file].lines[w.line];
  line = forged::Rehashed(line, forged::LaterTime, [](uint64_t&, Hash& prev) { prev[5] ^= 1; });
  ExpectFailsAt(target_, absl::StrCat("prev does not match the hash of seq ", target_ - 1),
                files_[w.file].name, w.line + 1);
  // And the first record, whose prev must be 64 zeros.
  files_ = ReadLog(*golden_);
  files_[0].lines[0] = forged::Rehashed(files_[0].lines[0], forged::LaterTime,
                                        [](uint64_t&, Hash& prev) { prev[0] = 1; });
  ExpectFailsAt(0, "prev of the first record is not 64 zeros", FileName(1), 1);
}

// A forger who re-chains every record from the forged one up to the next checkpoint gets past
// every record check; the checkpoint's signed head (and root) stops him there.
TEST_F(VerifierTest, ForgedAndRechainedUpToACheckpointFailsAtIt) {
  Where w = FindSeq(files_, target_);
  Hash prev = ParseLine(files_[w.file].lines[w.line])->prev;
  uint64_t last = target_;
  for (uint64_t seq = target_;; ++seq) {
    std::string& line = files_[w.file].lines[w.line];
    if (IsCheckpoint(line)) break;
    line = forged::Rehashed(
        line, [&](Event& e) { e.time_ns += seq == target_ ? 1 : 0; },
        [&](uint64_t&, Hash& p) { p = prev; });
    prev = ParseLine(line)->hash;
    last = seq;
    if (++w.line == files_[w.file].lines.size()) {
      ++w.file;
      w.line = 0;
    }
  }
  ExpectFailsAt(last, "checkpoint head is not the hash of seq", files_[w.file].name, w.line + 1);
}

// A record appended after the last checkpoint, chained and hashed like the writer's (the
// forgery of issue 27): not a valid verdict; with the writer's later checkpoint it would be.
TEST_F(VerifierTest, ForgedRecordAppendedIsAnUnsignedTail) {
  const VerifyReport before = Verify(dir_);
  ASSERT_EQ(Judge(before, {}).verdict, Verdict::kValid);  // the positive twin
  LogFile& f = files_.back();
  const std::string& last_record = f.lines[f.lines.size() - 2];
  ASSERT_TRUE(IsCheckpoint(f.lines.back()));
  const Line l = *ParseLine(last_record);
  Event e = MakeEvent(7);
  Hash hash;
  f.lines.push_back(FormatRecord(e, l.seq + 1, l.instance, l.hash, &hash));
  WriteLog(dir_, files_);
  const VerifyReport r = Verify(dir_);
  EXPECT_TRUE(r.ok());  // no record check fails: nothing but a signature could tell
  EXPECT_EQ(r.uncovered, 1u);
  const Judgement j = Judge(r, {});
  EXPECT_EQ(j.verdict, Verdict::kUnsignedTail);
  EXPECT_EQ(ExitCode(j.verdict), 3);
  EXPECT_NE(j.why.find(absl::StrCat("the last 1 record (seq ", l.seq + 1, ") no checkpoint")),
            std::string::npos)
      << j.why;
}

// Every truncation point of a log file, byte by byte: never a valid verdict except the whole
// file, and against a witness of the whole log always invalid; a cut inside a line names that
// line. (A small one-file log of its own, so that each of the thousands of cuts is cheap; the
// older files of the shared log are cut at every line boundary below.)
TEST_F(VerifierTest, EveryTruncationPointIsCaught) {
  const std::string dir = NewTempDir() + "/small";
  LogOptions o = Options(dir, key_);
  o.checkpoint_every = 3;
  {
    absl::StatusOr<std::unique_ptr<AuditLog>> log = AuditLog::Open(o);
    ASSERT_TRUE(log.ok());
    for (int i = 0; i < 6; ++i) ASSERT_TRUE((*log)->Append(MakeEvent(i)).ok());
    ASSERT_TRUE((*log)->Close().ok());
  }
  const std::vector<LogFile> files = ReadLog(dir);
  ASSERT_EQ(files.size(), 1u);
  VerifyOptions with_witness;
  with_witness.witness = Parsed(files[0].lines.back());
  const std::string path = dir + "/" + FileName(1);
  const std::string whole = ReadFile(path);
  std::vector<size_t> line_starts = {0};
  for (size_t i = 0; i < whole.size(); ++i) {
    if (whole[i] == '\n') line_starts.push_back(i + 1);
  }
  for (size_t cut = 0; cut < whole.size(); ++cut) {
    SCOPED_TRACE(absl::StrCat("cut at byte ", cut, " of ", whole.size()));
    WriteFile(path, whole.substr(0, cut));
    const size_t line = static_cast<size_t>(
        std::upper_bound(line_starts.begin(), line_starts.end(), cut) - line_starts.begin());
    const bool boundary = line_starts[line - 1] == cut;
    const VerifyReport r = Verify(dir, with_witness);
    ASSERT_EQ(Judge(r, {}).verdict, Verdict::kInvalid) << Summary(r);
    if (!boundary) {
      EXPECT_EQ(r.failure->file, FileName(1));
      EXPECT_EQ(r.failure->line, line);
      EXPECT_NE(r.failure->why.find("cut short"), std::string::npos);
    } else if (cut > 0 && !IsCheckpoint(files[0].lines[line - 2])) {
      // Without the witness: cut after a record, the records after the last checkpoint are an
      // unsigned tail. (Cut after a checkpoint, it is a valid shorter log: only a witness
      // tells, verifier.h.)
      const VerifyReport alone = Verify(dir);
      EXPECT_EQ(Judge(alone, {}).verdict, Verdict::kUnsignedTail) << Summary(alone);
    }
  }
  WriteFile(path, whole);
  EXPECT_EQ(Judge(Verify(dir, with_witness), {}).verdict, Verdict::kValid);
  fs::remove_all(fs::path(dir).parent_path());
}

// Every line boundary of every older file: the rotation rule fails it, at the right line.
TEST_F(VerifierTest, EveryLineBoundaryOfAnOlderFileFails) {
  const std::vector<LogFile> original = files_;
  for (size_t f = 0; f + 1 < original.size(); ++f) {
    for (size_t keep = 0; keep < original[f].lines.size(); ++keep) {
      SCOPED_TRACE(absl::StrCat(original[f].name, " cut to ", keep, " lines"));
      files_ = original;
      files_[f].lines.resize(keep);
      WriteLog(dir_, files_);
      const VerifyReport r = Verify(dir_);
      ASSERT_FALSE(r.ok()) << Summary(r);
      EXPECT_EQ(r.failure->file, original[f].name) << r.failure->ToString();
    }
  }
  files_ = original;
  WriteLog(dir_, files_);
  EXPECT_EQ(Judge(Verify(dir_), {}).verdict, Verdict::kValid);
}

// One byte flipped in every record in turn: each fails at that record.
TEST_F(VerifierTest, OneByteFlippedInEveryRecordFailsAtThatRecord) {
  const std::vector<LogFile> original = files_;
  for (size_t f = 0; f < original.size(); ++f) {
    for (size_t l = 0; l < original[f].lines.size(); ++l) {
      if (IsCheckpoint(original[f].lines[l])) continue;
      files_ = original;
      std::string& line = files_[f].lines[l];
      const uint64_t seq = ParseLine(line)->seq;
      SCOPED_TRACE(absl::StrCat("seq ", seq));
      line[line.size() / 2] ^= 0x01;
      WriteLog(dir_, files_);
      const VerifyReport r = Verify(dir_);
      ASSERT_FALSE(r.ok());
      EXPECT_EQ(r.failure->seq, std::optional<uint64_t>(seq)) << r.failure->ToString();
      EXPECT_EQ(r.failure->line, l + 1);
    }
  }
  files_ = original;
  WriteLog(dir_, files_);
  EXPECT_TRUE(Verify(dir_).ok());
}

// Two checkpoints swapped: the first of the two places fails.
TEST_F(VerifierTest, CheckpointsSwappedFail) {
  const auto checkpoints = Checkpoints();
  const auto& [a, line_a] = checkpoints[3];
  const auto& [b, line_b] = checkpoints[6];
  files_[a.file].lines[a.line] = line_b;
  files_[b.file].lines[b.line] = line_a;
  ExpectFailsAt(Parsed(line_a).size - 1, "replayed or moved", files_[a.file].name, a.line + 1);
}

// Witness rollback (issue 27): the checkpoints from the witness's on deleted. The records they
// covered are now an unsigned tail, and the witness would be "extended": the verifier refuses,
// so no verdict is valid and `verify --save-witness` never saves the older checkpoint.
TEST_F(VerifierTest, CheckpointsDeletedAboveTheWitnessFail) {
  const auto checkpoints = Checkpoints();
  VerifyOptions with_witness;
  with_witness.witness = Parsed(checkpoints[checkpoints.size() - 3].second);
  EXPECT_EQ(Judge(Verify(dir_, with_witness), {}).verdict, Verdict::kValid);  // the twin
  for (size_t i = checkpoints.size() - 3; i < checkpoints.size(); ++i) {
    const Where& w = checkpoints[i].first;
    files_[w.file].lines[w.line] = "";  // dropped below
  }
  for (LogFile& f : files_) std::erase(f.lines, "");
  WriteLog(dir_, files_);
  JudgeOptions allow;
  allow.allow_unsigned_tail = true;
  EXPECT_EQ(Judge(Verify(dir_), allow).verdict, Verdict::kValid);  // alone, it cannot tell
  const VerifyReport r = Verify(dir_, with_witness);
  ASSERT_FALSE(r.ok()) << Summary(r);
  EXPECT_NE(
      r.failure->why.find(absl::StrCat("the witness checkpoint of size ",
                                       with_witness.witness->size, " is no longer in the log")),
      std::string::npos)
      << r.failure->ToString();
  EXPECT_EQ(Judge(r, allow).verdict, Verdict::kInvalid);
}

// Torn-tail deletion (issue 27): the recovery record names the torn file and its digest, and a
// checkpoint signs it at once; deleting or editing the file fails at that record.
TEST_F(VerifierTest, TornFileDeletedOrEditedFailsAtItsRecoveryRecord) {
  const std::string newest = dir_ + "/" + files_.back().name;
  WriteFile(newest, ReadFile(newest) + "{\"v\":1,\"seq\":99999,\"ti");
  {
    absl::StatusOr<std::unique_ptr<AuditLog>> log = AuditLog::Open(Options(dir_, key_));
    ASSERT_TRUE(log.ok()) << log.status();
    ASSERT_TRUE((*log)->Close().ok());
  }
  VerifyReport r = Verify(dir_);
  ASSERT_EQ(Judge(r, {}).verdict, Verdict::kValid) << Summary(r);  // the positive twin
  ASSERT_EQ(r.recoveries.size(), 1u);
  const RecoveryNote note = r.recoveries[0];
  ASSERT_EQ(r.torn_files, std::vector<std::string>{note.torn_file});
  // The recovery record is covered by the checkpoint right after it.
  files_ = ReadLog(dir_);
  const Where w = FindSeq(files_, note.seq);
  ASSERT_TRUE(IsCheckpoint(files_[w.file].lines[w.line + 1]));
  EXPECT_EQ(Parsed(files_[w.file].lines[w.line + 1]).size, note.seq + 1);

  const std::string torn_path = dir_ + "/" + note.torn_file;
  const std::string torn = ReadFile(torn_path);
  WriteFile(torn_path, torn + "x");
  r = Verify(dir_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.failure->seq, std::optional<uint64_t>(note.seq));
  EXPECT_EQ(r.failure->line, note.line);
  EXPECT_NE(r.failure->why.find("sha256 differs"), std::string::npos) << r.failure->ToString();
  fs::remove(torn_path);
  r = Verify(dir_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.failure->seq, std::optional<uint64_t>(note.seq));
  EXPECT_NE(r.failure->why.find("missing from the directory"), std::string::npos);
  WriteFile(torn_path, torn);
  EXPECT_EQ(Judge(Verify(dir_), {}).verdict, Verdict::kValid);
}

}  // namespace
}  // namespace kvguard::audit
