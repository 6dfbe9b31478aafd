// audit/verifier.h: the auditor's check of a whole log directory (format: audit/FORMAT.md),
// trusting nothing but the log's public key.
//
// What a pass proves. Every line of every file of the rotation set parses as a canonical v1
// record or checkpoint; the records form one hash chain from seq 0 (each record's hash covers
// its bytes and the previous hash) with no gap, repeat or reordering, across files numbered
// from 1 without gaps, each file but the newest ending with a log_rotation record naming the
// next; and every checkpoint is signed by the key given, is for this log (log-id), and
// commits to exactly the records before it (size, chain head, RFC 9162 Merkle root). So any
// change to a record covered by a checkpoint - an edit, a removal, an insertion, a reordering,
// a file removed or swapped - fails, unless whoever made it also holds the signing key.
//
// What a pass does not prove.
//  * The tail. Records after the last checkpoint (VerifyReport::uncovered) are chained but
//    signed by nobody: whoever can write the directory can rewrite them. They are not a
//    failure here (a log being written always has such a tail), but audit/verdict.h never calls
//    such a log valid: its verdict is "unsigned tail" unless the auditor allows one.
//  * Truncation. A log cut back at a record boundary, together with its newest checkpoints,
//    is indistinguishable from a log that simply stopped there: it still passes, with fewer
//    records. Only something kept outside the log catches this: pass the newest checkpoint
//    the auditor saw before as VerifyOptions::witness (`verify --witness FILE`), and a log
//    that no longer extends it fails. A truncation of any file but the newest fails anyway
//    (its log_rotation record is gone).
//  * Honesty of the writer. A holder of the signing key can sign any history; the signature
//    proves who vouched for the log, not that the events happened.
//  * Freshness and completeness of the events: a service that never wrote a record leaves
//    no trace here. Timestamps are the writer's clock and are not checked for plausibility
//    (they are covered: record times by the chain, checkpoint times by the signature).
//  * torn-*.bin files are only checked against the `recovery` records that name them (each must
//    still be there with the digest its record gives, so deleting or editing one fails); the
//    torn bytes themselves are not judged.
//
// A pass is not yet a verdict: audit/verdict.h judges the report (unsigned tail, staleness).
#ifndef KVGUARD_AUDIT_VERIFIER_H_
#define KVGUARD_AUDIT_VERIFIER_H_

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

// LogDirectory is what a log directory holds, by name, without reading the files.
struct LogDirectory {
  std::vector<int> indexes;             // of the audit-NNNNNN.jsonl files, ascending
  std::vector<std::string> torn_files;  // torn-*.bin names, ascending
  std::vector<std::string> odd_names;   // audit-*.jsonl names FileName() would not write
};

// ListLogDirectory returns the contents of the log directory `dir`, or the file system's error
// (NotFound if there is no such directory).
absl::StatusOr<LogDirectory> ListLogDirectory(const std::string& dir);

// ForEachLine calls `fn(line, line_number)` for each '\n'-terminated line of the file at
// `path`, in order, the line without its '\n', numbered from 1; stops at the first non-OK
// status `fn` returns and returns it. `*unterminated` receives the bytes after the last '\n'
// (empty when the file ends with one). Reads in large blocks: one pass, no per-line allocation.
// Returns the file system's error if the file cannot be read.
absl::Status ForEachLine(const std::string& path,
                         absl::FunctionRef<absl::Status(std::string_view, uint64_t)> fn,
                         std::string* unterminated);

// VerifyOptions says what, besides the log, the auditor brings.
struct VerifyOptions {
  // witness: a checkpoint the auditor kept from an earlier look at this log. The log passes
  // only if it extends it: this log id, a signature by the key, and records whose first
  // witness->size have exactly its chain head and Merkle root.
  std::optional<Checkpoint> witness;
};

// VerifyFailure names the first thing wrong with a log.
struct VerifyFailure {
  std::string file;   // "audit-000002.jsonl", "log-id", or "" for the log as a whole
  uint64_t line = 0;  // 1-based line in `file`; 0 for the whole file
  // seq: for a record line, the seq the record at this position must have (the record that is
  // wrong, dropped, repeated or moved); for a checkpoint line, the last record before it
  // (nullopt if none).
  std::optional<uint64_t> seq;
  bool checkpoint = false;  // the line is (or should be) a checkpoint
  std::string why;

  // ToString returns e.g. "audit-000002.jsonl line 17 (seq 5016): hash does not match the
  // record's bytes".
  std::string ToString() const;
};

// RecoveryNote is one `recovery` record: the writer's note that it set torn bytes aside.
struct RecoveryNote {
  uint64_t seq = 0;
  std::string file;
  uint64_t line = 0;
  std::string detail;
  std::string torn_file;  // the torn-*.bin it names (checked: present, with its digest)
};

// AdoptionNote is one `tail_adopted` record: records seq first..last, which no checkpoint
// covered, taken over by a writer at its start (after a crash, or after someone appended them
// while the service was down: the log cannot tell which, so the auditor is told).
struct AdoptionNote {
  uint64_t seq = 0;  // of the tail_adopted record
  uint64_t first = 0, last = 0;
  std::string file;
  uint64_t line = 0;
};

// CheckpointGap is the longest time between two consecutive checkpoints of one run of the
// writer (no service_start record between them), by their signed times.
struct CheckpointGap {
  int64_t ns = 0;
  int64_t from_ns = 0, to_ns = 0;  // the two checkpoints' times
  std::string file;                // where the later one is
  uint64_t line = 0;
};

// VerifyReport is what VerifyLog found. On a failure the counts say how far it got.
struct VerifyReport {
  std::string log_id;
  int files = 0;             // files of the rotation set
  uint64_t records = 0;      // records that passed
  uint64_t checkpoints = 0;  // checkpoints that passed
  // uncovered: records after the last checkpoint (all of them if there is none).
  uint64_t uncovered = 0;
  std::optional<Checkpoint> last_checkpoint;
  std::string last_checkpoint_line;  // its line, what an auditor keeps as a witness
  // Times (the writer's clock, ns since the epoch): of the first and last record, and of the
  // last record the last checkpoint covers; 0 when there is none.
  int64_t first_record_ns = 0, last_record_ns = 0, covered_through_ns = 0;
  std::optional<CheckpointGap> longest_gap;  // nullopt with fewer than two checkpoints in a run
  bool witness_checked = false;              // the log extends VerifyOptions::witness
  std::vector<RecoveryNote> recoveries;
  std::vector<AdoptionNote> adoptions;
  // The event type of the last record the last checkpoint covers ("" with no checkpoint, or
  // one of size 0): "service_stop" means the log was closed cleanly there.
  std::string last_covered_type;
  std::vector<std::string> torn_files;  // torn-*.bin in the directory: reported, not errors
  std::optional<VerifyFailure> failure;

  bool ok() const { return !failure.has_value(); }
};

// VerifyLog checks the log in directory `dir` against the public key `key` (see the top of
// this file for what a pass proves), stopping at the first failure. Returns the report, with
// `failure` set if the log is not valid; an error status only if the directory or a file
// cannot be read at all (NotFound for a missing directory). Streams each file once; memory
// does not grow with the log.
absl::StatusOr<VerifyReport> VerifyLog(const std::string& dir, const VerifyingKey& key,
                                       const VerifyOptions& options = {});

// ParseWitness returns the checkpoint in `text`, the contents of a witness file: one
// checkpoint line as the log has it (surrounding whitespace allowed), or InvalidArgument
// saying why it is not one.
absl::StatusOr<Checkpoint> ParseWitness(std::string_view text);

// WithCommas returns `n` in decimal with thousands separators: 1204331 -> "1,204,331".
std::string WithCommas(uint64_t n);

}  // namespace kvguard::audit

#endif  // KVGUARD_AUDIT_VERIFIER_H_
