// audit/record.h: the audit log's lines, as audit/FORMAT.md defines them: records (events in
// a hash chain) and checkpoints (signed tree heads). One place formats and parses both, so the
// writer and the verifier cannot disagree on a byte.
#ifndef KVGUARD_AUDIT_RECORD_H_
#define KVGUARD_AUDIT_RECORD_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "audit/merkle.h"

namespace kvguard::audit {

inline constexpr int kFormatVersion = 1;

// Event is what one record says. `type` is one of FORMAT.md's event types; every other field
// is optional and written only when set.
struct Event {
  std::string type;
  int64_t time_ns = 0;  // UTC, ns since the epoch; 0: the writer stamps it
  std::optional<std::string> tenant;
  std::optional<uint64_t> session, request;
  std::optional<int64_t> page;
  std::optional<uint64_t> expected_generation, actual_generation;
  std::optional<std::string> actual_tenant;  // the owner the table found, if another
  std::optional<uint64_t> actual_session;
  std::optional<std::string> reason;  // violation kind
  std::optional<std::string> mode;    // the tenant's mode when it happened
  std::optional<std::string> mode_from, mode_to, actor, key_fingerprint, detail;
  // durable: the writer fsyncs before Append returns (strict tenants' events).
  bool durable = false;
};

// IsEventType returns whether `type` is one of FORMAT.md's event types.
bool IsEventType(std::string_view type);

// TailAdoptedDetail returns the exact `detail` of a `tail_adopted` record for seq first..last
// (FORMAT.md): the writer's note, at start, of records no checkpoint covered.
std::string TailAdoptedDetail(uint64_t first, uint64_t last);

// RecordHash returns SHA-256("kvguard/audit/record/v1\n" || body).
Hash RecordHash(std::string_view body);

// FormatRecord returns the line (without '\n') of record `seq` carrying `event`, written by
// `instance`, chained to `prev`; *hash receives its hash.
std::string FormatRecord(const Event& event, uint64_t seq, std::string_view instance,
                         const Hash& prev, Hash* hash);

// Checkpoint is one signed tree head.
struct Checkpoint {
  std::string log_id;  // 32 hex
  uint64_t size = 0;   // records covered: seq 0 .. size-1
  Hash head{};         // hash of record size-1
  Hash root{};         // RFC 9162 tree head over records 0 .. size-1
  int64_t time_ns = 0;
  std::string key_fp;  // 16 hex
  std::string sig;     // 64 raw bytes
};

// CheckpointMessage returns the bytes a checkpoint's signature covers (FORMAT.md).
std::string CheckpointMessage(std::string_view log_id, uint64_t size, const Hash& head,
                              const Hash& root, int64_t time_ns);

// FormatCheckpoint returns the checkpoint's line (without '\n').
std::string FormatCheckpoint(const Checkpoint& c);

// Line is one parsed line of a log file.
struct Line {
  enum class Kind { kRecord, kCheckpoint };
  Kind kind = Kind::kRecord;
  // Records:
  uint64_t seq = 0;
  std::string instance;
  Hash prev{}, hash{};
  std::string body;  // the bytes the hash covers
  Event event;
  bool hash_ok = false;  // hash == RecordHash(body)
  // Checkpoints:
  Checkpoint checkpoint;
};

// ParseLine parses one line (without '\n'). InvalidArgument naming the problem for anything
// that is not a well-formed v1 record or checkpoint (bad JSON, wrong version, missing or
// mistyped field, unknown event type, keys out of the writer's order); a record whose hash
// does not match its body parses, with hash_ok false (the verifier names that).
absl::StatusOr<Line> ParseLine(std::string_view line);

}  // namespace kvguard::audit

#endif  // KVGUARD_AUDIT_RECORD_H_
