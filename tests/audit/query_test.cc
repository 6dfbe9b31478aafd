// Tests of audit/query.h: filters against a brute-force count over the events written, violation
// statistics, CSV (RFC 4180, parsed back) and JSON Lines exports, following a growing log
// across rotations, and inclusion proofs: every valid proof checks, and each corrupted variant
// (wrong index or size, a flipped bit in each path element, an element dropped or added,
// another record, a checkpoint re-signed by another key or altered) fails, next to its valid
// twin.
#include "audit/query.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "audit/log.h"
#include "audit/merkle.h"
#include "audit/record.h"
#include "audit/signing_key.h"
#include "audit/verifier.h"
#include "nlohmann/json.hpp"
#include "tests/audit/test_files.h"

namespace kvguard::audit {
namespace {

namespace fs = std::filesystem;
using testing::AppendFile;
using testing::NewTempDir;
using testing::ReadFile;
using testing::WriteFile;
using Json = nlohmann::ordered_json;

constexpr int64_t kBaseNs = int64_t{1704067200} * 1000000000;  // 2024-01-01T00:00:00Z
constexpr int64_t kMinuteNs = int64_t{60} * 1000000000;
constexpr int64_t kHourNs = 60 * kMinuteNs;

// MakeEvent returns the i-th event: one every 7 minutes, several types, tenants and reasons,
// one tenant whose name needs quoting in CSV and escaping in JSON.
Event MakeEvent(int i) {
  Event e;
  e.time_ns = kBaseNs + i * 7 * kMinuteNs;
  const char* tenants[] = {"acme", "beta", "we,ird \"t\"\nenant"};
  const char* reasons[] = {"stale_generation", "wrong_owner", "bad_tag"};
  e.tenant = tenants[i % 3];
  if (i % 4 == 3) {
    e.type = "mode_change";
    e.mode_from = "enforce";
    e.mode_to = "strict";
    e.actor = "admin";
    return e;
  }
  e.type = i % 4 == 2 ? "release_rejected" : "violation";
  e.session = static_cast<uint64_t>(i % 5);
  e.request = static_cast<uint64_t>(1000 + i);
  e.page = i;
  e.reason = reasons[i % 7 % 3];
  e.mode = "enforce";
  return e;
}

LogOptions Options(const std::string& dir, std::shared_ptr<const SigningKey> key) {
  LogOptions o;
  o.dir = dir;
  o.key = std::move(key);
  o.instance = "feedfacefeedface";
  o.checkpoint_every = 10;
  o.checkpoint_interval_ms = 3600 * 1000;
  o.rotate_bytes = 8192;
  o.batch_records = 8;
  o.batch_interval_ms = 3600 * 1000;
  return o;
}

class QueryTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    key_ = std::shared_ptr<const SigningKey>(*SigningKey::CreateEphemeral());
    other_key_ = std::shared_ptr<const SigningKey>(*SigningKey::CreateEphemeral());
    dir_ = new std::string(NewTempDir() + "/log");
    absl::StatusOr<std::unique_ptr<AuditLog>> log = AuditLog::Open(Options(*dir_, key_));
    ASSERT_TRUE(log.ok()) << log.status();
    for (int i = 0; i < kEvents; ++i) ASSERT_TRUE((*log)->Append(MakeEvent(i)).ok());
    ASSERT_TRUE((*log)->Close().ok());
  }
  static void TearDownTestSuite() {
    fs::remove_all(fs::path(*dir_).parent_path());
    delete dir_;
  }

  static VerifyingKey Pub(const SigningKey& k) { return *VerifyingKey::FromRaw(k.PublicKeyRaw()); }

  // Expected returns the events (of those written by the test) that pass `keep`.
  template <class F>
  static std::vector<int> Expected(F keep) {
    std::vector<int> out;
    for (int i = 0; i < kEvents; ++i) {
      if (keep(MakeEvent(i))) out.push_back(i);
    }
    return out;
  }

  // Found returns the page (= event index) of each record `filter` selects, in order, leaving
  // out the writer's own records (which have no page).
  static std::vector<int> Found(const RecordFilter& filter, size_t* writer_records = nullptr) {
    absl::StatusOr<std::vector<QueriedRecord>> got = Query(*dir_, filter);
    EXPECT_TRUE(got.ok()) << got.status();
    std::vector<int> out;
    size_t own = 0;
    for (const QueriedRecord& r : got.ok() ? *got : std::vector<QueriedRecord>{}) {
      EXPECT_TRUE(Matches(filter, r.record));
      if (r.record.event.page) {
        out.push_back(static_cast<int>(*r.record.event.page));
      } else if (r.record.event.mode_to) {
        // mode_change events carry no page; find their index by time.
        out.push_back(static_cast<int>((r.record.event.time_ns - kBaseNs) / (7 * kMinuteNs)));
      } else {
        ++own;
      }
    }
    if (writer_records) *writer_records = own;
    return out;
  }

  static constexpr int kEvents = 120;
  static std::shared_ptr<const SigningKey> key_, other_key_;
  static std::string* dir_;
};

std::shared_ptr<const SigningKey> QueryTest::key_;
std::shared_ptr<const SigningKey> QueryTest::other_key_;
std::string* QueryTest::dir_;

TEST_F(QueryTest, NoFilterReturnsEveryRecordInOrder) {
  absl::StatusOr<std::vector<QueriedRecord>> all = Query(*dir_, {});
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_GT(all->size(), static_cast<size_t>(kEvents) + 1);
  for (size_t i = 0; i < all->size(); ++i) {
    EXPECT_EQ((*all)[i].record.seq, i);
    absl::StatusOr<Line> reparsed = ParseLine((*all)[i].line);
    ASSERT_TRUE(reparsed.ok());
    EXPECT_EQ(reparsed->hash, (*all)[i].record.hash);
  }
  size_t own = 0;
  EXPECT_EQ(Found({}, &own), Expected([](const Event&) { return true; }));
  EXPECT_GE(own, 2u);  // service_start, service_stop, log_rotation records
}

TEST_F(QueryTest, EachFilterSelectsExactlyItsRecords) {
  RecordFilter f;
  f.tenant = "acme";
  EXPECT_EQ(Found(f), Expected([](const Event& e) { return e.tenant == "acme"; }));
  f = {};
  f.tenant = "we,ird \"t\"\nenant";
  EXPECT_EQ(Found(f), Expected([&](const Event& e) { return e.tenant == f.tenant; }));
  f = {};
  f.tenant = "nobody";
  EXPECT_TRUE(Found(f).empty());
  f = {};
  f.session = 3;
  EXPECT_EQ(Found(f), Expected([](const Event& e) { return e.session == uint64_t{3}; }));
  f = {};
  f.request = 1010;
  EXPECT_EQ(Found(f), std::vector<int>{10});
  f = {};
  f.type = "mode_change";
  EXPECT_EQ(Found(f), Expected([](const Event& e) { return e.type == "mode_change"; }));
  f = {};
  f.type = "violation";
  EXPECT_EQ(Found(f), Expected([](const Event& e) { return e.type == "violation"; }));
  f = {};
  f.reason = "bad_tag";
  EXPECT_EQ(Found(f), Expected([](const Event& e) { return e.reason == "bad_tag"; }));
  // Time: [since, until), both ends exact.
  f = {};
  f.since_ns = MakeEvent(10).time_ns;
  f.until_ns = MakeEvent(20).time_ns;
  std::vector<int> ten_to_nineteen;
  for (int i = 10; i < 20; ++i) ten_to_nineteen.push_back(i);
  EXPECT_EQ(Found(f), ten_to_nineteen);
  f.until_ns = *f.since_ns;
  EXPECT_TRUE(Found(f).empty());
  // Combined.
  f = {};
  f.tenant = "beta";
  f.type = "violation";
  f.reason = "wrong_owner";
  f.until_ns = MakeEvent(60).time_ns;
  EXPECT_EQ(Found(f), Expected([](const Event& e) {
              return e.tenant == "beta" && e.type == "violation" && e.reason == "wrong_owner" &&
                     e.time_ns < MakeEvent(60).time_ns;
            }));
  EXPECT_FALSE(Found(f).empty());
}

TEST_F(QueryTest, ViolationStatsCountPerHourTenantReason) {
  // Refused releases count too, apart from violations (regression: stats left them out).
  std::map<std::tuple<int64_t, std::string, std::string, std::string>, uint64_t> want;
  uint64_t rejected = 0;
  for (int i = 0; i < kEvents; ++i) {
    const Event e = MakeEvent(i);
    if (e.type != "violation" && e.type != "release_rejected") continue;
    rejected += e.type == "release_rejected";
    ++want[{kBaseNs + (e.time_ns - kBaseNs) / kHourNs * kHourNs, *e.tenant, e.type, *e.reason}];
  }
  ASSERT_GT(rejected, 0u);
  absl::StatusOr<std::vector<ViolationCount>> got = ViolationStats(*dir_, {});
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), want.size());
  auto it = want.begin();
  for (const ViolationCount& c : *got) {
    EXPECT_EQ(std::make_tuple(c.hour_ns, c.tenant, c.type, c.reason), it->first);
    EXPECT_EQ(c.count, it->second);
    ++it;
  }
  for (const char* type : {"release_rejected", "violation"}) {
    RecordFilter only;
    only.type = type;
    got = ViolationStats(*dir_, only);
    ASSERT_TRUE(got.ok());
    EXPECT_FALSE(got->empty()) << type;
    for (const ViolationCount& c : *got) EXPECT_EQ(c.type, type);
  }
  RecordFilter only_acme;
  only_acme.tenant = "acme";
  got = ViolationStats(*dir_, only_acme);
  ASSERT_TRUE(got.ok());
  for (const ViolationCount& c : *got) EXPECT_EQ(c.tenant, "acme");
  RecordFilter other_type;
  other_type.type = "mode_change";
  got = ViolationStats(*dir_, other_type);
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(got->empty());
}

TEST(FormatTime, Utc) {
  EXPECT_EQ(FormatTime(0), "1970-01-01T00:00:00.000000000Z");
  EXPECT_EQ(FormatTime(kBaseNs + 123456789), "2024-01-01T00:00:00.123456789Z");
  EXPECT_EQ(FormatTime(kBaseNs + 59 * kMinuteNs + 59 * 1000000000LL),
            "2024-01-01T00:59:59.000000000Z");
  EXPECT_EQ(FormatTime(-1), "1969-12-31T23:59:59.999999999Z");
}

// ParseCsv is an RFC 4180 reader: quoted fields, doubled quotes, CRLF records.
std::vector<std::vector<std::string>> ParseCsv(std::string_view text) {
  std::vector<std::vector<std::string>> rows(1, std::vector<std::string>(1));
  bool quoted = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    std::string& field = rows.back().back();
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"') {
        field.push_back('"');
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        field.push_back(c);
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      rows.back().emplace_back();
    } else if (c == '\r' && i + 1 < text.size() && text[i + 1] == '\n') {
      ++i;
      rows.emplace_back(1);
    } else {
      field.push_back(c);
    }
  }
  if (rows.back().size() == 1 && rows.back()[0].empty()) rows.pop_back();
  return rows;
}

TEST_F(QueryTest, CsvExportRoundTrips) {
  std::string csv;
  ASSERT_TRUE(ExportRecords(*dir_, {}, ExportFormat::kCsv, [&](std::string_view s) {
                csv.append(s);
              }).ok());
  EXPECT_TRUE(csv.starts_with(CsvHeader()));
  EXPECT_TRUE(csv.starts_with("seq,time_ns,time,type,instance,tenant,"));
  // The awkward tenant is quoted, its quotes doubled, its newline kept inside the field.
  EXPECT_NE(csv.find(",\"we,ird \"\"t\"\"\nenant\","), std::string::npos);
  const std::vector<std::vector<std::string>> rows = ParseCsv(csv);
  absl::StatusOr<std::vector<QueriedRecord>> all = Query(*dir_, {});
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(rows.size(), all->size() + 1);
  const std::vector<std::string>& header = rows[0];
  auto column = [&](std::string_view name) {
    return static_cast<size_t>(std::find(header.begin(), header.end(), name) - header.begin());
  };
  for (size_t i = 0; i < all->size(); ++i) {
    const std::vector<std::string>& row = rows[i + 1];
    const Line& r = (*all)[i].record;
    ASSERT_EQ(row.size(), header.size());
    EXPECT_EQ(row[column("seq")], absl::StrCat(r.seq));
    EXPECT_EQ(row[column("time")], FormatTime(r.event.time_ns));
    EXPECT_EQ(row[column("type")], r.event.type);
    EXPECT_EQ(row[column("tenant")], r.event.tenant.value_or(""));
    EXPECT_EQ(row[column("request")], r.event.request ? absl::StrCat(*r.event.request) : "");
    EXPECT_EQ(row[column("reason")], r.event.reason.value_or(""));
    EXPECT_EQ(row[column("detail")], r.event.detail.value_or(""));
    EXPECT_EQ(row[column("hash")], ToHex(r.hash));
  }
  // A filter applies to exports too.
  RecordFilter f;
  f.type = "mode_change";
  csv.clear();
  ASSERT_TRUE(
      ExportRecords(*dir_, f, ExportFormat::kCsv, [&](std::string_view s) { csv.append(s); }).ok());
  EXPECT_EQ(ParseCsv(csv).size(), Found(f).size() + 1);
}

TEST_F(QueryTest, JsonlExportIsTheOriginalLines) {
  std::string jsonl;
  ASSERT_TRUE(ExportRecords(*dir_, {}, ExportFormat::kJsonl, [&](std::string_view s) {
                jsonl.append(s);
              }).ok());
  std::string want;
  for (int i = 1; fs::exists(*dir_ + "/" + FileName(i)); ++i) {
    std::stringstream in(ReadFile(*dir_ + "/" + FileName(i)));
    for (std::string line; std::getline(in, line);) {
      if (line.find("\"type\":\"checkpoint\"") == std::string::npos) want += line + "\n";
    }
  }
  EXPECT_EQ(jsonl, want);
}

TEST_F(QueryTest, BadLinesAreNamed) {
  const std::string dir = NewTempDir();
  fs::copy(*dir_, dir + "/log", fs::copy_options::recursive);
  std::string data = ReadFile(dir + "/log/" + FileName(2));
  data.insert(data.find('\n') + 1, "{\"v\":1,\"seq\":\n");  // a bad line 2
  std::ofstream(dir + "/log/" + FileName(2), std::ios::binary | std::ios::trunc) << data;
  absl::Status s =
      ScanRecords(dir + "/log", {}, [](const Line&, std::string_view) { return absl::OkStatus(); });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(absl::StrCat(FileName(2), " line 2: ")), std::string::npos) << s;
  EXPECT_EQ(Query(dir + "/nope", {}).status().code(), absl::StatusCode::kNotFound);
  fs::remove_all(dir);
}

TEST(LogFollowerTest, FollowsAGrowingLogAcrossRotations) {
  std::shared_ptr<const SigningKey> key(*SigningKey::CreateEphemeral());
  const std::string dir = NewTempDir() + "/log";
  LogFollower follower(dir);
  std::vector<uint64_t> seen;
  auto collect = [&](const Line& r, std::string_view line) {
    EXPECT_EQ(ParseLine(line)->seq, r.seq);
    seen.push_back(r.seq);
  };
  absl::StatusOr<uint64_t> n = follower.Poll(collect);  // no directory yet
  EXPECT_FALSE(n.ok());
  absl::StatusOr<std::unique_ptr<AuditLog>> log = AuditLog::Open(Options(dir, key));
  ASSERT_TRUE(log.ok());
  n = follower.Poll(collect);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 1u);  // service_start
  for (int round = 0; round < 5; ++round) {
    for (int i = 0; i < 20; ++i) ASSERT_TRUE((*log)->Append(MakeEvent(i)).ok());
    ASSERT_TRUE((*log)->Flush().ok());
    n = follower.Poll(collect);
    ASSERT_TRUE(n.ok()) << n.status();
    EXPECT_GE(*n, 20u);
  }
  EXPECT_GT((*log)->stats().files, 2);
  ASSERT_TRUE((*log)->Close().ok());
  ASSERT_TRUE(follower.Poll(collect).ok());
  EXPECT_EQ(seen.size(), (*log)->stats().records);
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], i);
  // A line being written waits until it is complete.
  const std::string newest = dir + "/" + FileName((*log)->stats().files);
  const Hash prev = Query(dir, {})->back().record.hash;
  Hash hash;
  const std::string line = FormatRecord(MakeEvent(1), seen.size(), "feedfacefeedface", prev, &hash);
  AppendFile(newest, line.substr(0, 40));
  n = follower.Poll(collect);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 0u);
  AppendFile(newest, line.substr(40) + "\n");
  n = follower.Poll(collect);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 1u);
  EXPECT_EQ(seen.back(), seen.size() - 1);
  fs::remove_all(fs::path(dir).parent_path());
}

// Proofs: the log above has checkpoints every 10 records and a final one; a proof is against
// the latest.
class ProofTest : public QueryTest {
 protected:
  Json Prove(uint64_t seq) {
    absl::StatusOr<std::string> p = ProveRecord(*dir_, seq);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? Json::parse(*p) : Json();
  }
  static bool Checks(const Json& proof, const SigningKey& key = *key_) {
    return CheckProof(proof.dump(), std::nullopt, Pub(key)).ok();
  }
  static std::string Why(const Json& proof) {
    return std::string(CheckProof(proof.dump(), std::nullopt, Pub(*key_)).status().message());
  }
  static uint64_t Records() { return Query(*dir_, {})->size(); }
};

TEST_F(ProofTest, EveryRecordHasAValidProof) {
  const uint64_t n = Records();
  for (uint64_t seq = 0; seq < n; ++seq) {
    SCOPED_TRACE(seq);
    absl::StatusOr<std::string> text = ProveRecord(*dir_, seq);
    ASSERT_TRUE(text.ok()) << text.status();
    absl::StatusOr<ProvenRecord> proven = CheckProof(*text, std::nullopt, Pub(*key_));
    ASSERT_TRUE(proven.ok()) << proven.status();
    EXPECT_EQ(proven->record.seq, seq);
    EXPECT_EQ(proven->checkpoint.size, n);  // the final checkpoint covers every record
    const Json j = Json::parse(*text);
    EXPECT_EQ(j["index"], seq);
    EXPECT_EQ(j["leaf"], proven->line);
    // The record line, given separately, must be the leaf.
    EXPECT_TRUE(CheckProof(*text, proven->line, Pub(*key_)).ok());
    EXPECT_FALSE(CheckProof(*text, Query(*dir_, {})->at((seq + 1) % n).line, Pub(*key_)).ok());
    // Compact JSON works as well as the indented form.
    EXPECT_TRUE(CheckProof(j.dump(), std::nullopt, Pub(*key_)).ok());
  }
  EXPECT_EQ(ProveRecord(*dir_, n).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ProofTest, WrongIndexOrSizeFails) {
  const Json good = Prove(37);
  ASSERT_TRUE(Checks(good));
  for (int64_t delta : {-1, 1}) {
    Json p = good;
    p["index"] = static_cast<uint64_t>(37 + delta);
    EXPECT_FALSE(Checks(p)) << delta;
    p = good;
    p["size"] = good["size"].get<uint64_t>() + delta;
    EXPECT_FALSE(Checks(p)) << delta;
    // The checkpoint's size changed with it: its signature no longer holds.
    p["checkpoint"]["size"] = p["size"];
    EXPECT_FALSE(Checks(p)) << delta;
    EXPECT_NE(Why(p).find("signature"), std::string::npos) << Why(p);
  }
  // An index at or past the size.
  Json p = good;
  p["index"] = good["size"];
  EXPECT_FALSE(Checks(p));
}

TEST_F(ProofTest, FlippedBitInEachPathElementFails) {
  for (uint64_t seq : {0, 5, 64, 100}) {
    SCOPED_TRACE(seq);
    const Json good = Prove(seq);
    ASSERT_TRUE(Checks(good));
    ASSERT_GT(good["path"].size(), 3u);
    for (size_t e = 0; e < good["path"].size(); ++e) {
      for (int byte = 0; byte < 32; ++byte) {
        Hash h = *HashFromHex(good["path"][e].get<std::string>());
        h[byte] ^= static_cast<uint8_t>(1u << (byte % 8));
        Json p = good;
        p["path"][e] = ToHex(h);
        EXPECT_FALSE(Checks(p)) << "element " << e << " byte " << byte;
      }
    }
  }
}

TEST_F(ProofTest, PathElementDroppedOrAddedFails) {
  const Json good = Prove(77);
  ASSERT_TRUE(Checks(good));
  const size_t len = good["path"].size();
  for (size_t drop = 0; drop < len; ++drop) {
    Json p = good;
    p["path"].erase(drop);
    EXPECT_FALSE(Checks(p)) << "dropped " << drop;
  }
  for (size_t at = 0; at <= len; ++at) {
    Json p = good;
    Json path = Json::array();
    for (size_t i = 0; i < len; ++i) {
      if (i == at) path.push_back(good["path"][0]);
      path.push_back(good["path"][i]);
    }
    if (at == len) path.push_back(ToHex(EmptyRoot()));
    p["path"] = path;
    EXPECT_FALSE(Checks(p)) << "added at " << at;
  }
  Json p = good;
  p["path"] = Json::array();
  EXPECT_FALSE(Checks(p));
}

TEST_F(ProofTest, AnotherRecordFails) {
  const Json good = Prove(40);
  ASSERT_TRUE(Checks(good));
  absl::StatusOr<std::vector<QueriedRecord>> all = Query(*dir_, {});
  // Another record's line with this record's path.
  Json p = good;
  p["leaf"] = (*all)[41].line;
  EXPECT_FALSE(Checks(p));
  p["index"] = 41;
  EXPECT_FALSE(Checks(p));
  // This record with one field changed (its hash no longer matches).
  std::string edited = good["leaf"].get<std::string>();
  char& c = edited[edited.find("\"prev\":\"") + 8];
  c = c == '0' ? '1' : '0';
  p = good;
  p["leaf"] = edited;
  EXPECT_FALSE(Checks(p));
  // A record that is not in the log at all, though well formed.
  Hash hash;
  p = good;
  p["leaf"] = FormatRecord(MakeEvent(3), 40, "feedfacefeedface", (*all)[39].record.hash, &hash);
  EXPECT_FALSE(Checks(p));
}

TEST_F(ProofTest, CheckpointSignedByAnotherKeyOrAlteredFails) {
  const Json good = Prove(12);
  ASSERT_TRUE(Checks(good));
  absl::StatusOr<Line> c = ParseLine(good["checkpoint"].dump());
  ASSERT_TRUE(c.ok()) << c.status();
  Checkpoint ck = c->checkpoint;
  auto with = [&](const Checkpoint& k) {
    Json p = good;
    p["checkpoint"] = Json::parse(FormatCheckpoint(k));
    return p;
  };
  auto sign = [](Checkpoint k, const SigningKey& key) {
    k.key_fp = key.Fingerprint();
    k.sig = *key.Sign(CheckpointMessage(k.log_id, k.size, k.head, k.root, k.time_ns));
    return k;
  };
  // Re-signed by another key: checks under that key, not under the log's.
  const Json other = with(sign(ck, *other_key_));
  EXPECT_TRUE(Checks(other, *other_key_));
  EXPECT_FALSE(Checks(other));
  Checkpoint forged = sign(ck, *other_key_);
  forged.key_fp = ck.key_fp;  // claiming the log's key
  EXPECT_FALSE(Checks(with(forged)));
  // Altered without re-signing: root, head, log id, signature.
  Checkpoint k = ck;
  k.root[3] ^= 0x10;
  EXPECT_FALSE(Checks(with(k)));
  k = ck;
  k.head[0] ^= 1;
  EXPECT_FALSE(Checks(with(k)));
  k = ck;
  k.sig[10] ^= 1;
  EXPECT_FALSE(Checks(with(k)));
  // Altered root re-signed with the log's own key: the path no longer leads to it.
  k = ck;
  k.root[0] ^= 1;
  EXPECT_FALSE(Checks(with(sign(k, *key_))));
  EXPECT_NE(Why(with(sign(k, *key_))).find("audit path"), std::string::npos);
  // The proof's log id must be the checkpoint's.
  Json p = good;
  p["log_id"] = std::string(32, 'a');
  EXPECT_FALSE(Checks(p));
}

TEST_F(ProofTest, MalformedProofsFailWithoutCrashing) {
  const Json good = Prove(3);
  ASSERT_TRUE(Checks(good));
  for (const char* text : {"", "null", "[]", "{", "{\"v\":1}", "\"proof\"", "{\"v\":2}"}) {
    EXPECT_FALSE(CheckProof(text, std::nullopt, Pub(*key_)).ok()) << text;
  }
  for (const char* field : {"v", "log_id", "index", "size", "leaf", "path", "checkpoint"}) {
    Json p = good;
    p.erase(field);
    EXPECT_FALSE(Checks(p)) << "without " << field;
    p = good;
    p[field] = Json::array({1, "x"});
    EXPECT_FALSE(Checks(p)) << "mistyped " << field;
    p = good;
    p[field] = -1;
    EXPECT_FALSE(Checks(p)) << "negative " << field;
  }
  Json p = good;
  p["extra"] = 1;
  EXPECT_FALSE(Checks(p));
  p = good;
  p["checkpoint"]["extra"] = 1;
  EXPECT_FALSE(Checks(p));
  p = good;
  p["checkpoint"].erase("sig");
  EXPECT_FALSE(Checks(p));
  p = good;
  p["path"][0] = "XYZ";
  EXPECT_FALSE(Checks(p));
  p = good;
  p["path"][0] = 7;
  EXPECT_FALSE(Checks(p));
  p = good;
  p["leaf"] = good["checkpoint"].dump();  // a checkpoint as the leaf
  EXPECT_FALSE(Checks(p));
}

TEST(ProveRecordTest, RecordsNoCheckpointCoversYetArePreconditionFailures) {
  std::shared_ptr<const SigningKey> key(*SigningKey::CreateEphemeral());
  const std::string dir = NewTempDir() + "/log";
  absl::StatusOr<std::unique_ptr<AuditLog>> log = AuditLog::Open(Options(dir, key));
  ASSERT_TRUE(log.ok());
  for (int i = 0; i < 14; ++i) ASSERT_TRUE((*log)->Append(MakeEvent(i)).ok());  // 15 records
  ASSERT_TRUE((*log)->Flush().ok());
  // The checkpoint of size 10 covers seq 0..9; 10..14 wait for the next.
  absl::StatusOr<std::string> p = ProveRecord(dir, 9);
  ASSERT_TRUE(p.ok()) << p.status();
  absl::StatusOr<ProvenRecord> proven =
      CheckProof(*p, std::nullopt, *VerifyingKey::FromRaw(key->PublicKeyRaw()));
  ASSERT_TRUE(proven.ok()) << proven.status();
  EXPECT_EQ(proven->checkpoint.size, 10u);
  EXPECT_EQ(ProveRecord(dir, 10).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ProveRecord(dir, 14).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ProveRecord(dir, 15).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE((*log)->Close().ok());
  EXPECT_TRUE(ProveRecord(dir, 14).ok());
  fs::remove_all(fs::path(dir).parent_path());
}

// Consistency proofs between two checkpoints of the log above (checkpoints every 10 records).
class ConsistencyTest : public ProofTest {
 protected:
  // CheckpointLines returns the log's checkpoint lines, in order.
  static std::vector<std::string> CheckpointLines() {
    std::vector<std::string> out;
    for (int i = 1; fs::exists(*dir_ + "/" + FileName(i)); ++i) {
      std::stringstream in(ReadFile(*dir_ + "/" + FileName(i)));
      for (std::string line; std::getline(in, line);) {
        if (line.find("\"type\":\"checkpoint\"") != std::string::npos) out.push_back(line);
      }
    }
    return out;
  }
  static Checkpoint Parsed(const std::string& line) { return *ParseWitness(line); }
  static std::string Signed(Checkpoint c, const SigningKey& key) {
    c.key_fp = key.Fingerprint();
    c.sig = *key.Sign(CheckpointMessage(c.log_id, c.size, c.head, c.root, c.time_ns));
    return FormatCheckpoint(c);
  }
  // Has returns whether `s` failed with `text` in its message.
  static bool Has(const absl::Status& s, std::string_view text) {
    return !s.ok() && std::string(s.message()).find(text) != std::string::npos;
  }
  static absl::Status Check(const Json& proof, std::optional<Checkpoint> witness = std::nullopt,
                            const SigningKey& key = *key_) {
    return CheckConsistency(proof.dump(), Pub(key), witness).status();
  }
};

// From every checkpoint to the latest: a valid proof, which names both checkpoints.
TEST_F(ConsistencyTest, FromEveryCheckpointToTheLatestVerifies) {
  const std::vector<std::string> lines = CheckpointLines();
  ASSERT_GE(lines.size(), 10u);
  for (const std::string& line : lines) {
    const Checkpoint first = Parsed(line);
    absl::StatusOr<std::string> text = ProveConsistency(*dir_, first);
    ASSERT_TRUE(text.ok()) << text.status();
    absl::StatusOr<ProvenConsistency> proven = CheckConsistency(*text, Pub(*key_), first);
    ASSERT_TRUE(proven.ok()) << proven.status();
    EXPECT_EQ(proven->first.size, first.size);
    EXPECT_EQ(FormatCheckpoint(proven->second), lines.back());
  }
}

TEST_F(ConsistencyTest, CorruptedProofsFail) {
  const std::vector<std::string> lines = CheckpointLines();
  const Checkpoint first = Parsed(lines[3]);
  const Json good = Json::parse(*ProveConsistency(*dir_, first));
  ASSERT_TRUE(Check(good, first).ok());  // the twin of each below
  ASSERT_FALSE(good["path"].empty());
  for (size_t e = 0; e < good["path"].size(); ++e) {
    Json bad = good;
    std::string h = bad["path"][e];
    h[10] = h[10] == '0' ? '1' : '0';
    bad["path"][e] = h;
    EXPECT_TRUE(Has(Check(bad), "does not prove")) << e;
    Json dropped = good;
    dropped["path"].erase(e);
    EXPECT_FALSE(Check(dropped).ok()) << e;
  }
  // Another key; a witness other than the first checkpoint; checkpoints swapped.
  EXPECT_TRUE(Has(Check(good, std::nullopt, *other_key_), "not by the public key given"));
  EXPECT_TRUE(Has(Check(good, Parsed(lines[4])), "starts from another checkpoint"));
  Json swapped = good;
  std::swap(swapped["first"], swapped["second"]);
  EXPECT_TRUE(Has(Check(swapped), "is larger than the second"));
  // A first checkpoint re-signed (by the real key: a fork the key holder signed) for another root.
  Checkpoint forked = first;
  forked.root[0] ^= 1;
  Json fork = good;
  fork["first"] = Signed(forked, *key_);
  EXPECT_TRUE(Has(Check(fork), "does not prove"));
  EXPECT_EQ(ProveConsistency(*dir_, forked).status().code(), absl::StatusCode::kDataLoss);
  // Malformed.
  EXPECT_FALSE(CheckConsistency("[]", Pub(*key_), std::nullopt).ok());
  Json extra = good;
  extra["x"] = 1;
  EXPECT_TRUE(Has(Check(extra), "unknown field 'x'"));
  Json not_line = good;
  not_line["first"] = "{}";
  EXPECT_FALSE(Check(not_line).ok());
}

TEST_F(ConsistencyTest, ProveRefusesBadFirstCheckpoints) {
  const std::vector<std::string> lines = CheckpointLines();
  Checkpoint other_log = Parsed(lines[2]);
  other_log.log_id[0] = other_log.log_id[0] == 'a' ? 'b' : 'a';
  EXPECT_EQ(ProveConsistency(*dir_, other_log).status().code(), absl::StatusCode::kInvalidArgument);
  Checkpoint larger = Parsed(lines.back());
  larger.size += 1;
  EXPECT_EQ(ProveConsistency(*dir_, larger).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(ProveConsistency(*dir_, Parsed(lines[2])).ok());  // the twin
}
}  // namespace
}  // namespace kvguard::audit
