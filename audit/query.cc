#include "audit/query.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <ctime>
#include <map>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "audit/log.h"
#include "audit/merkle.h"
#include "audit/verifier.h"
#include "nlohmann/json.hpp"

namespace kvguard::audit {
namespace {

absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

constexpr int64_t kNsPerHour = int64_t{3600} * 1000 * 1000 * 1000;

absl::Status LineError(const std::string& file, uint64_t line, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat(file, " line ", line, ": ", why, " (run kvguard audit verify)"));
}

// CsvField appends `v` as one RFC 4180 field: quoted (with quotes doubled) when it holds a
// comma, a quote, CR or LF.
void CsvField(std::string* out, std::string_view v) {
  if (v.find_first_of(",\"\r\n") == std::string_view::npos) {
    out->append(v);
    return;
  }
  out->push_back('"');
  for (char c : v) {
    if (c == '"') out->push_back('"');
    out->push_back(c);
  }
  out->push_back('"');
}

template <class T>
std::string OrEmpty(const std::optional<T>& v) {
  if (!v) return "";
  return absl::StrCat(*v);
}

template <class T>
std::string OrUnknown(const std::optional<T>& v) {
  if (!v) return "?";
  return absl::StrCat(*v);
}

constexpr const char* kCsvColumns[] = {"seq",
                                       "time_ns",
                                       "time",
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
                                       "mode_from",
                                       "mode_to",
                                       "actor",
                                       "key_fingerprint",
                                       "detail",
                                       "prev",
                                       "hash"};

absl::Status ScanFile(const std::string& dir, int index, bool newest, const RecordFilter& filter,
                      absl::FunctionRef<absl::Status(const Line&, std::string_view)> fn) {
  const std::string name = FileName(index);
  std::string unterminated;
  uint64_t lines = 0;
  absl::Status s = ForEachLine(
      dir + "/" + name,
      [&](std::string_view text, uint64_t number) -> absl::Status {
        lines = number;
        absl::StatusOr<Line> line = ParseLine(text);
        if (!line.ok()) return LineError(name, number, line.status().message());
        if (line->kind != Line::Kind::kRecord || !Matches(filter, *line)) {
          return absl::OkStatus();
        }
        return fn(*line, text);
      },
      &unterminated);
  if (!s.ok()) return s;
  if (!unterminated.empty() && !newest) {
    return LineError(name, lines + 1, "the last line is cut short");
  }
  return absl::OkStatus();
}

}  // namespace

bool Matches(const RecordFilter& f, const Line& record) {
  const Event& e = record.event;
  if (f.tenant && e.tenant != f.tenant) return false;
  if (f.session && e.session != f.session) return false;
  if (f.request && e.request != f.request) return false;
  if (f.type && e.type != *f.type) return false;
  if (f.reason && e.reason != f.reason) return false;
  if (f.since_ns && e.time_ns < *f.since_ns) return false;
  if (f.until_ns && e.time_ns >= *f.until_ns) return false;
  return true;
}

absl::Status ScanRecords(const std::string& dir, const RecordFilter& filter,
                         absl::FunctionRef<absl::Status(const Line&, std::string_view)> fn) {
  absl::StatusOr<LogDirectory> listing = ListLogDirectory(dir);
  if (!listing.ok()) return listing.status();
  for (int index : listing->indexes) {
    absl::Status s = ScanFile(dir, index, index == listing->indexes.back(), filter, fn);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<QueriedRecord>> Query(const std::string& dir,
                                                 const RecordFilter& filter) {
  std::vector<QueriedRecord> out;
  absl::Status s = ScanRecords(dir, filter, [&](const Line& record, std::string_view line) {
    out.push_back(QueriedRecord{record, std::string(line)});
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return out;
}

absl::StatusOr<std::vector<ViolationCount>> ViolationStats(const std::string& dir,
                                                           const RecordFilter& filter) {
  const auto counted = [](std::string_view type) {
    return type == "violation" || type == "release_rejected";
  };
  if (filter.type && !counted(*filter.type)) return std::vector<ViolationCount>{};
  std::map<std::tuple<int64_t, std::string, std::string, std::string>, uint64_t> counts;
  absl::Status s = ScanRecords(dir, filter, [&](const Line& record, std::string_view) {
    const Event& e = record.event;
    if (!counted(e.type)) return absl::OkStatus();
    // Floor division: an hour starts at a multiple of kNsPerHour, before 1970 too.
    int64_t hour = e.time_ns / kNsPerHour;
    if (e.time_ns % kNsPerHour < 0) --hour;
    ++counts[{hour * kNsPerHour, e.tenant.value_or(""), e.type, e.reason.value_or("")}];
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  std::vector<ViolationCount> out;
  out.reserve(counts.size());
  for (const auto& [key, n] : counts) {
    const auto& [hour, tenant, type, reason] = key;
    out.push_back(ViolationCount{hour, tenant, type, reason, n});
  }
  return out;
}

std::string FormatTime(int64_t time_ns) {
  int64_t secs = time_ns / 1000000000;
  int64_t frac = time_ns % 1000000000;
  if (frac < 0) {
    frac += 1000000000;
    --secs;
  }
  const time_t t = static_cast<time_t>(secs);
  struct tm tm;
  if (gmtime_r(&t, &tm) == nullptr) return absl::StrCat(time_ns, "ns");
  return absl::StrFormat("%04d-%02d-%02dT%02d:%02d:%02d.%09dZ", tm.tm_year + 1900, tm.tm_mon + 1,
                         tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(frac));
}

std::string Describe(const Event& e) {
  std::vector<std::string> parts;
  if (e.session) parts.push_back(absl::StrCat("session ", *e.session));
  if (e.page) parts.push_back(absl::StrCat("page ", *e.page));
  if (e.actual_generation || e.expected_generation) {
    parts.push_back(absl::StrCat("generation ", OrUnknown(e.actual_generation), " (expected ",
                                 OrUnknown(e.expected_generation), ")"));
  }
  if (e.actual_tenant || e.actual_session) {
    parts.push_back(
        absl::StrCat("owner ", e.actual_tenant.value_or("?"), "/", OrUnknown(e.actual_session)));
  }
  if (e.mode) parts.push_back(absl::StrCat("mode ", *e.mode));
  if (e.mode_from || e.mode_to) {
    parts.push_back(
        absl::StrCat("mode ", e.mode_from.value_or("?"), " -> ", e.mode_to.value_or("?")));
  }
  if (e.actor) parts.push_back(absl::StrCat("by ", *e.actor));
  if (e.key_fingerprint) parts.push_back(absl::StrCat("key ", *e.key_fingerprint));
  if (e.detail) parts.push_back(*e.detail);
  return absl::StrJoin(parts, ", ");
}

std::string CsvHeader() { return absl::StrCat(absl::StrJoin(kCsvColumns, ","), "\r\n"); }

std::string CsvRow(const Line& r) {
  const Event& e = r.event;
  const std::string fields[] = {absl::StrCat(r.seq),
                                absl::StrCat(e.time_ns),
                                FormatTime(e.time_ns),
                                e.type,
                                r.instance,
                                e.tenant.value_or(""),
                                OrEmpty(e.session),
                                OrEmpty(e.request),
                                OrEmpty(e.page),
                                OrEmpty(e.expected_generation),
                                OrEmpty(e.actual_generation),
                                e.actual_tenant.value_or(""),
                                OrEmpty(e.actual_session),
                                e.reason.value_or(""),
                                e.mode.value_or(""),
                                e.mode_from.value_or(""),
                                e.mode_to.value_or(""),
                                e.actor.value_or(""),
                                e.key_fingerprint.value_or(""),
                                e.detail.value_or(""),
                                ToHex(r.prev),
                                ToHex(r.hash)};
  static_assert(std::size(fields) == std::size(kCsvColumns));
  std::string row;
  for (size_t i = 0; i < std::size(fields); ++i) {
    if (i > 0) row.push_back(',');
    CsvField(&row, fields[i]);
  }
  row.append("\r\n");
  return row;
}

absl::Status ExportRecords(const std::string& dir, const RecordFilter& filter, ExportFormat format,
                           absl::FunctionRef<void(std::string_view)> out) {
  if (format == ExportFormat::kCsv) out(CsvHeader());
  std::string buf;
  return ScanRecords(dir, filter, [&](const Line& record, std::string_view line) {
    if (format == ExportFormat::kCsv) {
      out(CsvRow(record));
    } else {
      buf.assign(line.data(), line.size());
      buf.push_back('\n');
      out(buf);
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<uint64_t> LogFollower::Poll(
    absl::FunctionRef<void(const Line&, std::string_view)> fn) {
  if (index_ == 0) {
    absl::StatusOr<LogDirectory> listing = ListLogDirectory(dir_);
    if (!listing.ok()) return listing.status();
    if (listing->indexes.empty()) return 0;
    index_ = listing->indexes.front();
  }
  uint64_t count = 0;
  std::string data;
  for (;;) {
    const std::string name = FileName(index_);
    // Look for the next file before reading this one to its end: the writer finishes a file
    // before it creates the next, so once the next exists this read sees all of this one.
    struct stat st;
    const bool next_exists = stat((dir_ + "/" + FileName(index_ + 1)).c_str(), &st) == 0;
    const std::string path = dir_ + "/" + name;
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) return count;
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
    }
    data.clear();
    char buf[1 << 16];
    uint64_t at = offset_;
    for (;;) {
      const ssize_t n = pread(fd, buf, sizeof(buf), static_cast<off_t>(at));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const int err = errno;
        close(fd);
        return absl::ErrnoToStatus(err, absl::StrCat("cannot read ", path));
      }
      if (n == 0) break;
      data.append(buf, static_cast<size_t>(n));
      at += static_cast<uint64_t>(n);
    }
    close(fd);
    size_t start = 0;
    for (size_t nl = data.find('\n'); nl != std::string::npos; nl = data.find('\n', start)) {
      const std::string_view text(data.data() + start, nl - start);
      absl::StatusOr<Line> line = ParseLine(text);
      if (!line.ok()) return LineError(name, line_ + 1, line.status().message());
      ++line_;
      offset_ += nl + 1 - start;
      start = nl + 1;
      if (line->kind == Line::Kind::kRecord) {
        fn(*line, text);
        ++count;
      }
    }
    if (!next_exists) return count;
    if (start != data.size()) return LineError(name, line_ + 1, "the last line is cut short");
    ++index_;
    offset_ = 0;
    line_ = 0;
  }
}

namespace {

// LogTree is what a proof needs of a log: every record's leaf hash, one record's line, and the
// latest checkpoint.
struct LogTree {
  std::vector<Hash> leaves;
  std::string leaf_line;  // of record `seq` given to ReadLogTree, if there is one
  std::optional<Checkpoint> checkpoint;
  std::string checkpoint_line;
};

// ReadLogTree reads the log in `dir` into a LogTree, keeping the line of record `seq`. Errors:
// InvalidArgument for a line that does not parse, DataLoss for records out of order, the file
// system's.
absl::StatusOr<LogTree> ReadLogTree(const std::string& dir, std::optional<uint64_t> seq) {
  absl::StatusOr<LogDirectory> listing = ListLogDirectory(dir);
  if (!listing.ok()) return listing.status();
  LogTree tree;
  for (int index : listing->indexes) {
    const std::string name = FileName(index);
    std::string unterminated;
    absl::Status s = ForEachLine(
        dir + "/" + name,
        [&](std::string_view text, uint64_t number) -> absl::Status {
          absl::StatusOr<Line> line = ParseLine(text);
          if (!line.ok()) return LineError(name, number, line.status().message());
          if (line->kind == Line::Kind::kCheckpoint) {
            tree.checkpoint = line->checkpoint;
            tree.checkpoint_line = std::string(text);
            return absl::OkStatus();
          }
          if (line->seq != tree.leaves.size()) {
            return absl::DataLossError(absl::StrCat(name, " line ", number, ": seq ", line->seq,
                                                    " where seq ", tree.leaves.size(),
                                                    " belongs (run kvguard audit verify)"));
          }
          if (line->seq == seq) tree.leaf_line = std::string(text);
          tree.leaves.push_back(LeafHash(text));
          return absl::OkStatus();
        },
        &unterminated);
    if (!s.ok()) return s;
  }
  return tree;
}

// ParsePath returns the hashes of a proof's "path" array, or InvalidArgument naming the bad one.
absl::StatusOr<std::vector<Hash>> ParsePath(const nlohmann::ordered_json& path) {
  std::vector<Hash> hashes;
  for (const nlohmann::ordered_json& h : path) {
    absl::StatusOr<Hash> parsed =
        h.is_string() ? HashFromHex(h.get<std::string>())
                      : absl::StatusOr<Hash>(absl::InvalidArgumentError("not a string"));
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("path element ", hashes.size(), " is not 64 lowercase hex digits"));
    }
    hashes.push_back(*parsed);
  }
  return hashes;
}

// ParseProofObject returns the proof in `json`: a JSON object of format version kFormatVersion
// with no field but `keys`; or InvalidArgument saying what is wrong.
absl::StatusOr<nlohmann::ordered_json> ParseProofObject(std::string_view json,
                                                        std::span<const std::string_view> keys) {
  nlohmann::ordered_json p =
      nlohmann::ordered_json::parse(json.begin(), json.end(), nullptr, false);
  if (p.is_discarded() || !p.is_object()) return absl::InvalidArgumentError("not a JSON object");
  for (const auto& [k, v] : p.items()) {
    if (std::find(keys.begin(), keys.end(), k) == keys.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown field '", k, "'"));
    }
  }
  auto v = p.find("v");
  if (v == p.end() || !v->is_number_integer() || v->get<int64_t>() != kFormatVersion) {
    return absl::InvalidArgumentError(absl::StrCat("not format version ", kFormatVersion));
  }
  return p;
}

// CheckSigned returns OK if `c` is signed by `key`, else InvalidArgument saying why.
absl::Status CheckSigned(const Checkpoint& c, const VerifyingKey& key) {
  if (c.key_fp != key.Fingerprint()) {
    return absl::InvalidArgumentError(absl::StrCat("the checkpoint is signed by key ", c.key_fp,
                                                   ", not by the public key given (",
                                                   key.Fingerprint(), ")"));
  }
  if (!key.Verify(CheckpointMessage(c.log_id, c.size, c.head, c.root, c.time_ns), c.sig)) {
    return absl::InvalidArgumentError(
        "the checkpoint's signature does not verify with the public key");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ProveRecord(const std::string& dir, uint64_t seq) {
  absl::StatusOr<LogTree> tree = ReadLogTree(dir, seq);
  if (!tree.ok()) return tree.status();
  const std::vector<Hash>& leaves = tree->leaves;
  const std::string& leaf_line = tree->leaf_line;
  const std::string& checkpoint_line = tree->checkpoint_line;
  const bool have_checkpoint = tree->checkpoint.has_value();
  const Checkpoint checkpoint = tree->checkpoint.value_or(Checkpoint{});
  if (seq >= leaves.size()) {
    return absl::NotFoundError(
        absl::StrCat("the log has ", leaves.size(), " records; there is no seq ", seq));
  }
  if (!have_checkpoint || checkpoint.size <= seq) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no checkpoint covers seq ", seq, " yet (the latest covers ",
        have_checkpoint ? checkpoint.size : 0, " records); try again after the next checkpoint"));
  }
  if (checkpoint.size > leaves.size() ||
      RootOf(std::span<const Hash>(leaves.data(), checkpoint.size)) != checkpoint.root) {
    return absl::DataLossError(absl::StrCat("the records do not match the checkpoint of size ",
                                            checkpoint.size, " (run kvguard audit verify)"));
  }
  absl::StatusOr<std::vector<Hash>> path = InclusionProof(leaves, seq, checkpoint.size);
  if (!path.ok()) return path.status();
  nlohmann::ordered_json proof;
  proof["v"] = kFormatVersion;
  proof["log_id"] = checkpoint.log_id;
  proof["index"] = seq;
  proof["size"] = checkpoint.size;
  proof["leaf"] = leaf_line;
  proof["path"] = nlohmann::ordered_json::array();
  for (const Hash& h : *path) proof["path"].push_back(ToHex(h));
  proof["checkpoint"] = nlohmann::ordered_json::parse(checkpoint_line);
  return proof.dump(2) + "\n";
}

absl::StatusOr<ProvenRecord> CheckProof(std::string_view proof_json,
                                        std::optional<std::string_view> record_line,
                                        const VerifyingKey& key) {
  auto bad = [](std::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("proof: ", Sv(why)));
  };
  static constexpr std::string_view kKeys[] = {"v",    "log_id", "index",     "size",
                                               "leaf", "path",   "checkpoint"};
  const absl::StatusOr<nlohmann::ordered_json> parsed = ParseProofObject(proof_json, kKeys);
  if (!parsed.ok()) return bad(std::string(parsed.status().message()));
  const nlohmann::ordered_json& p = *parsed;
  auto log_id = p.find("log_id");
  auto index = p.find("index");
  auto size = p.find("size");
  auto leaf = p.find("leaf");
  auto path = p.find("path");
  auto cp = p.find("checkpoint");
  if (log_id == p.end() || !log_id->is_string()) return bad("'log_id' missing or not a string");
  if (index == p.end() || !index->is_number_unsigned()) {
    return bad("'index' missing or not a non-negative integer");
  }
  if (size == p.end() || !size->is_number_unsigned()) {
    return bad("'size' missing or not a non-negative integer");
  }
  if (leaf == p.end() || !leaf->is_string()) return bad("'leaf' missing or not a string");
  if (path == p.end() || !path->is_array()) return bad("'path' missing or not an array");
  if (cp == p.end() || !cp->is_object()) return bad("'checkpoint' missing or not an object");

  ProvenRecord out;
  out.line = leaf->get<std::string>();
  if (record_line && *record_line != out.line) {
    return bad("the leaf is not the record line given");
  }
  absl::StatusOr<Line> record = ParseLine(out.line);
  if (!record.ok()) return bad(absl::StrCat("leaf: ", record.status().message()));
  if (record->kind != Line::Kind::kRecord) return bad("the leaf is not a record");
  if (!record->hash_ok) return bad("the leaf's hash does not match its bytes");
  const uint64_t i = index->get<uint64_t>();
  const uint64_t n = size->get<uint64_t>();
  if (record->seq != i) {
    return bad(absl::StrCat("the leaf is seq ", record->seq, ", not index ", i));
  }
  out.record = *std::move(record);

  absl::StatusOr<std::vector<Hash>> hashes = ParsePath(*path);
  if (!hashes.ok()) return bad(std::string(hashes.status().message()));

  // The checkpoint in the writer's key order: ParseLine then checks it as it checks the log's.
  static constexpr const char* kCheckpointKeys[] = {"v",    "type",    "log_id", "size", "head",
                                                    "root", "time_ns", "key_fp", "sig"};
  if (cp->size() != std::size(kCheckpointKeys)) {
    return bad("the checkpoint does not have exactly a checkpoint's fields");
  }
  nlohmann::ordered_json canonical;
  for (const char* k : kCheckpointKeys) {
    auto it = cp->find(k);
    if (it == cp->end()) return bad(absl::StrCat("the checkpoint has no '", k, "'"));
    canonical[k] = *it;
  }
  absl::StatusOr<Line> c = ParseLine(canonical.dump());
  if (!c.ok()) return bad(absl::StrCat("checkpoint: ", c.status().message()));
  if (c->kind != Line::Kind::kCheckpoint) return bad("the checkpoint is not a checkpoint");
  out.checkpoint = c->checkpoint;
  const Checkpoint& ck = out.checkpoint;
  if (ck.log_id != log_id->get<std::string>()) return bad("log_id differs from the checkpoint's");
  if (ck.size != n) {
    return bad(absl::StrCat("size ", n, " is not the checkpoint's size (", ck.size, ")"));
  }
  if (absl::Status signed_ok = CheckSigned(ck, key); !signed_ok.ok()) {
    return bad(std::string(signed_ok.message()));
  }
  if (i >= n) return bad(absl::StrCat("index ", i, " is not below size ", n));
  if (i + 1 == n && out.record.hash != ck.head) {
    return bad("the leaf is the checkpoint's last record but not its head");
  }
  if (!VerifyInclusion(LeafHash(out.line), i, n, *hashes, ck.root)) {
    return bad(absl::StrCat("the audit path does not lead from leaf ", i, " to the root of the ", n,
                            "-record tree the checkpoint signs"));
  }
  return out;
}

absl::StatusOr<std::string> ProveConsistency(const std::string& dir, const Checkpoint& first) {
  if (first.size == 0) {
    return absl::InvalidArgumentError("consistency proof: the first checkpoint has size 0");
  }
  absl::StatusOr<LogTree> tree = ReadLogTree(dir, std::nullopt);
  if (!tree.ok()) return tree.status();
  if (!tree->checkpoint) {
    return absl::FailedPreconditionError("the log has no checkpoint yet: nothing to prove to");
  }
  const Checkpoint& second = *tree->checkpoint;
  if (first.log_id != second.log_id) {
    return absl::InvalidArgumentError(absl::StrCat("the first checkpoint is for log ", first.log_id,
                                                   ", not this log (", second.log_id, ")"));
  }
  if (first.size > second.size) {
    return absl::FailedPreconditionError(
        absl::StrCat("the log's latest checkpoint has size ", second.size,
                     ", below the first checkpoint's ", first.size, " (checkpoints deleted?)"));
  }
  const std::span<const Hash> leaves(tree->leaves);
  if (second.size > leaves.size() || RootOf(leaves.first(second.size)) != second.root) {
    return absl::DataLossError(absl::StrCat("the records do not match the checkpoint of size ",
                                            second.size, " (run kvguard audit verify)"));
  }
  if (RootOf(leaves.first(first.size)) != first.root) {
    return absl::DataLossError(absl::StrCat("the log does not extend the first checkpoint: its ",
                                            first.size, " first records have another root"));
  }
  absl::StatusOr<std::vector<Hash>> path = ConsistencyProof(leaves, first.size, second.size);
  if (!path.ok()) return path.status();
  nlohmann::ordered_json proof;
  proof["v"] = kFormatVersion;
  proof["log_id"] = second.log_id;
  proof["first"] = FormatCheckpoint(first);
  proof["second"] = tree->checkpoint_line;
  proof["path"] = nlohmann::ordered_json::array();
  for (const Hash& h : *path) proof["path"].push_back(ToHex(h));
  return proof.dump(2) + "\n";
}

absl::StatusOr<ProvenConsistency> CheckConsistency(std::string_view proof_json,
                                                   const VerifyingKey& key,
                                                   const std::optional<Checkpoint>& witness) {
  auto bad = [](std::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("consistency proof: ", Sv(why)));
  };
  static constexpr std::string_view kKeys[] = {"v", "log_id", "first", "second", "path"};
  const absl::StatusOr<nlohmann::ordered_json> parsed = ParseProofObject(proof_json, kKeys);
  if (!parsed.ok()) return bad(std::string(parsed.status().message()));
  const nlohmann::ordered_json& p = *parsed;
  auto log_id = p.find("log_id");
  auto path = p.find("path");
  if (log_id == p.end() || !log_id->is_string()) return bad("'log_id' missing or not a string");
  if (path == p.end() || !path->is_array()) return bad("'path' missing or not an array");
  ProvenConsistency out;
  for (const char* name : {"first", "second"}) {
    auto it = p.find(name);
    if (it == p.end() || !it->is_string()) {
      return bad(absl::StrCat("'", name, "' missing or not a checkpoint line"));
    }
    absl::StatusOr<Checkpoint> c = ParseWitness(it->get<std::string>());
    if (!c.ok()) return bad(absl::StrCat(name, ": ", c.status().message()));
    if (c->log_id != log_id->get<std::string>()) {
      return bad(absl::StrCat(name, ": for log ", c->log_id, ", not the proof's"));
    }
    if (absl::Status s = CheckSigned(*c, key); !s.ok()) {
      return bad(absl::StrCat(name, ": ", s.message()));
    }
    (std::string_view(name) == "first" ? out.first : out.second) = *c;
  }
  if (witness && (witness->log_id != out.first.log_id || witness->size != out.first.size ||
                  witness->head != out.first.head || witness->root != out.first.root)) {
    return bad(absl::StrCat("it starts from another checkpoint (size ", out.first.size,
                            ") than the witness (size ", witness->size, ")"));
  }
  absl::StatusOr<std::vector<Hash>> hashes = ParsePath(*path);
  if (!hashes.ok()) return bad(std::string(hashes.status().message()));
  if (out.first.size > out.second.size) {
    return bad(absl::StrCat("the first checkpoint (size ", out.first.size,
                            ") is larger than the second (size ", out.second.size, ")"));
  }
  if (out.first.size == out.second.size && out.first.head != out.second.head) {
    return bad("two checkpoints of one size with different heads: the log forked");
  }
  if (!VerifyConsistency(out.first.size, out.second.size, out.first.root, out.second.root,
                         *hashes)) {
    return bad(absl::StrCat("the path does not prove that the tree of ", out.second.size,
                            " records extends the tree of ", out.first.size,
                            " (a rewritten history, or a damaged proof)"));
  }
  return out;
}

}  // namespace kvguard::audit
