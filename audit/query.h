// audit/query.h: reading an audit log for people: filtered records, violation counts,
// exports, following a live log, and RFC 9162 inclusion proofs of single records.
//
// Everything here except CheckProof trusts the files as they are: it parses every line
// (ParseLine: canonical form) but checks neither the chain nor the signatures. Run VerifyLog
// (audit/verifier.h) first; a proof, though, is checked by CheckProof against the public key
// alone.
#ifndef KVGUARD_AUDIT_QUERY_H_
#define KVGUARD_AUDIT_QUERY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "audit/record.h"
#include "audit/signing_key.h"

namespace kvguard::audit {

// RecordFilter selects records; an unset field selects everything. A record without the field
// (e.g. no tenant) does not match a filter on it.
struct RecordFilter {
  std::optional<std::string> tenant;
  std::optional<uint64_t> session, request;
  std::optional<std::string> type;    // an event type (FORMAT.md)
  std::optional<std::string> reason;  // a violation kind
  std::optional<int64_t> since_ns;    // time_ns >= since_ns (UTC ns since the epoch)
  std::optional<int64_t> until_ns;    // time_ns < until_ns
};

// Matches returns whether the record `record` passes `filter`.
bool Matches(const RecordFilter& filter, const Line& record);

// ScanRecords calls `fn(record, line)` for each record of the log in `dir` that passes
// `filter`, in file and line order; `line` is the record's line as written, without '\n'.
// Checkpoints are skipped, and so is an unterminated last line of the newest file (a record
// being written). Stops at the first error `fn` returns and returns it. Errors: the file
// system's; InvalidArgument naming the file and line of a line that does not parse, or of an
// unterminated line in any other file.
absl::Status ScanRecords(const std::string& dir, const RecordFilter& filter,
                         absl::FunctionRef<absl::Status(const Line&, std::string_view)> fn);

// QueriedRecord is one record ScanRecords found, kept.
struct QueriedRecord {
  Line record;
  std::string line;  // as written, without '\n'
};

// Query returns the records ScanRecords finds (all in memory), or its error.
absl::StatusOr<std::vector<QueriedRecord>> Query(const std::string& dir,
                                                 const RecordFilter& filter);

// ViolationCount is the number of violation records of one type, tenant and reason in one hour.
struct ViolationCount {
  int64_t hour_ns = 0;  // start of the UTC hour
  std::string tenant;   // "" when the record has none
  std::string type;     // "violation" or "release_rejected"
  std::string reason;   // "" when the record has none
  uint64_t count = 0;
};

// ViolationStats returns the count of `violation` and `release_rejected` records (a refused
// release is a violation found at release) passing `filter` per (hour, tenant, type, reason),
// ordered by hour, then tenant, type and reason; or ScanRecords's error.
absl::StatusOr<std::vector<ViolationCount>> ViolationStats(const std::string& dir,
                                                           const RecordFilter& filter);

// FormatTime returns `time_ns` (UTC ns since the epoch) as ISO-8601 with nanoseconds:
// "2024-05-01T12:34:56.000000123Z".
std::string FormatTime(int64_t time_ns);

// Describe returns the fields of `event` that a table has no column for, readably
// ("session 3, page 17, generation 4 (expected 2), owner beta/9, mode strict").
std::string Describe(const Event& event);

enum class ExportFormat { kCsv, kJsonl };

// CsvHeader returns the CSV header row, CsvRow one record's row: every field of the format,
// in FORMAT.md's order, plus `time` (FormatTime), quoted per RFC 4180, ending in CRLF.
std::string CsvHeader();
std::string CsvRow(const Line& record);

// ExportRecords writes the records passing `filter` through `out`, in order: CSV (CsvHeader,
// then CsvRow each) or JSON Lines (each record's line as written, so that its hash can still be
// checked, then '\n'). Returns ScanRecords's error.
absl::Status ExportRecords(const std::string& dir, const RecordFilter& filter, ExportFormat format,
                           absl::FunctionRef<void(std::string_view)> out);

// LogFollower reads a log as it grows, across rotations (`kvguard audit tail -f`).
class LogFollower {
 public:
  explicit LogFollower(std::string dir) : dir_(std::move(dir)) {}

  // Poll calls `fn(record, line)` for each record completed since the last Poll (the first
  // Poll: every record) and returns how many; a line not yet terminated waits for a later Poll.
  // Checkpoints are skipped. A directory with no log file yet is not an error (0). Errors: the
  // file system's (NotFound for a missing directory); InvalidArgument naming the file and line
  // of a line that does not parse.
  absl::StatusOr<uint64_t> Poll(absl::FunctionRef<void(const Line&, std::string_view)> fn);

 private:
  std::string dir_;
  int index_ = 0;        // the file being read; 0 before the first file is found
  uint64_t offset_ = 0;  // bytes of it consumed (complete lines)
  uint64_t line_ = 0;    // lines of it consumed
};

// ProveRecord returns the inclusion proof (FORMAT.md, "Inclusion proof": JSON, ending in
// '\n') of record `seq` of the log in `dir` against the log's latest checkpoint. Errors:
// NotFound if the log has no record `seq`; FailedPrecondition if no checkpoint covers it yet
// (the latest has size <= seq); DataLoss if the records do not match that checkpoint's root
// (run VerifyLog); InvalidArgument for a line that does not parse; the file system's.
absl::StatusOr<std::string> ProveRecord(const std::string& dir, uint64_t seq);

// ProvenRecord is what a valid proof establishes: `record` (`line`) is leaf `index` of the
// tree of `checkpoint.size` records that `checkpoint` signs.
struct ProvenRecord {
  Line record;
  std::string line;
  Checkpoint checkpoint;
};

// CheckProof verifies the inclusion proof `proof_json` with the public key `key` alone: the
// checkpoint's signature (and key fingerprint), and the audit path from the leaf's hash to its
// root at the proof's index and size; the leaf must be a record whose hash matches its bytes
// and whose seq is the index. If `record_line` is given, the leaf must be exactly that line.
// Returns what it proves, or InvalidArgument saying what is wrong.
absl::StatusOr<ProvenRecord> CheckProof(std::string_view proof_json,
                                        std::optional<std::string_view> record_line,
                                        const VerifyingKey& key);

// ProveConsistency returns the consistency proof (FORMAT.md, "Consistency proof": JSON, ending
// in '\n') that the log in `dir`, as its latest checkpoint signs it, extends the checkpoint
// `first` (an auditor's witness, or any earlier checkpoint of the log). Errors: InvalidArgument
// if `first` is for another log or of size 0; FailedPrecondition if the log has no checkpoint,
// or none as large as `first`; DataLoss if the log's records do not have `first`'s root or the
// latest checkpoint's (run VerifyLog); ReadLogTree's errors. It checks no signature: the checker
// does.
absl::StatusOr<std::string> ProveConsistency(const std::string& dir, const Checkpoint& first);

// ProvenConsistency is what a valid consistency proof establishes: the tree `second` signs
// extends the tree `first` signs (its first first.size records are the same).
struct ProvenConsistency {
  Checkpoint first, second;
};

// CheckConsistency verifies the consistency proof `proof_json` with the public key `key` alone:
// both checkpoints are for the proof's log and signed by the key, and the path (RFC 9162
// 2.1.4.2) takes the first's root to the second's. If `witness` is given, the proof must start
// from it (same log, size, head and root). Returns what it proves, or InvalidArgument saying what
// is wrong.
absl::StatusOr<ProvenConsistency> CheckConsistency(std::string_view proof_json,
                                                   const VerifyingKey& key,
                                                   const std::optional<Checkpoint>& witness);

}  // namespace kvguard::audit

#endif  // KVGUARD_AUDIT_QUERY_H_
