// audit/log.h: the writer of the tamper-evident audit log (format: audit/FORMAT.md).
//
// One AuditLog owns one log directory. Appends are thread-safe. Every record joins the hash
// chain and the Merkle tree at once; bytes reach the disk in batches (batch_records, or
// batch_interval_ms by a background flusher), except durable events (strict tenants'), which
// are written and fsync'd before Append returns. A checkpoint (signed tree head) follows every
// checkpoint_every records or checkpoint_interval_ms, whichever comes first, and closes the
// log. While no record is pending, a heartbeat checkpoint (the same size, a new signed time)
// follows every heartbeat_interval_ms, so that an auditor can tell a log that stopped being
// signed (`verify --max-age`). Both timers run in Tick, which the background flusher calls and
// tests call directly with their own clock. Files rotate at rotate_bytes; one chain runs
// through all of them. service_stop is the last record a writer writes, and its checkpoint
// follows it directly (Close).
//
// Crash recovery (Open on an existing directory): the whole log is read back to rebuild the
// chain head and the tree, and verified in full (chain, canonical form, every checkpoint's
// signature, and the writer's witness, see LogOptions::witness_file) before anything is
// written: a log damaged or rewritten while the service was down is refused (DataLoss), never
// signed again. Records after the last checkpoint are never signed in silence: after a clean
// stop (service_stop, then its checkpoint) there can be none, so any there are refused
// (DataLoss); otherwise (a crash's last records, or an append no one can tell from them) a
// `tail_adopted` record naming them goes into the chain before the next checkpoint, and
// `audit verify` reports it. One writer per directory (an exclusive lock on DIR/lock). A torn
// tail (an unterminated last line, or a last line that does not parse or whose hash does not
// match its bytes) is moved to torn-<unix_ns>.bin, never dropped, the file is cut back to its
// last good record, and a `recovery` record saying so continues the chain. Damage anywhere but
// the tail is not repaired: Open refuses the log (run `kvguard audit verify` on it) rather than
// write on top of it.
//
// When the disk fails (full, permissions), Append returns the error and Healthy() reports it
// until a later write succeeds; the engine then refuses strict tenants and raises an alarm for
// the rest (isolation::Guard). The first failure, and every 1000th after, also goes to stderr.
#ifndef KVGUARD_AUDIT_LOG_H_
#define KVGUARD_AUDIT_LOG_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "audit/merkle.h"
#include "audit/record.h"
#include "audit/signing_key.h"
#include "audit/verifier.h"

namespace kvguard::audit {

struct LogOptions {
  std::string dir;                             // created (0700) if absent
  std::shared_ptr<const SigningKey> key;       // signs checkpoints; required
  std::string instance;                        // service instance id; "" = 16 random hex
  uint64_t checkpoint_every = 1000;            // records between checkpoints (>= 1)
  int64_t checkpoint_interval_ms = 10000;      // or this long since the last one
  int64_t heartbeat_interval_ms = 60000;       // with no record pending: a checkpoint this often
  uint64_t rotate_bytes = uint64_t{64} << 20;  // start a new file past this size
  uint64_t batch_records = 512;                // write + fsync after this many pending records
  int64_t batch_interval_ms = 100;             // or when the flusher next wakes (this period)
  // The writer's own witness: the newest checkpoint it signed, kept outside the log directory
  // (beside the signing key). At Open the log must verify in full and extend it, so records
  // rewritten (and their checkpoints deleted) while the service was down are refused rather
  // than signed again, and a directory replaced wholesale is refused too. "" = none (tests).
  std::string witness_file;
  // Clocks, for tests (null: the system's). monotonic_ms drives the checkpoint timers (Tick);
  // now_ns stamps records and checkpoints (UTC ns since the epoch).
  std::function<int64_t()> monotonic_ms;
  std::function<int64_t()> now_ns;
};

struct LogStats {
  uint64_t records = 0;      // in the log, including those read back at Open
  uint64_t checkpoints = 0;  // written by this process
  uint64_t fsyncs = 0;
  uint64_t write_errors = 0;
  uint64_t recovered_bytes = 0;  // set aside at Open
  int files = 0;
};

// FileName returns "audit-000042.jsonl" for index 42.
std::string FileName(int index);

class AuditLog {
 public:
  // Open creates or reopens the log in options.dir (recovering a torn tail, see above) and
  // appends a service_start record. Errors: InvalidArgument for bad options; the file
  // system's error; DataLoss for a log damaged before its tail.
  static absl::StatusOr<std::unique_ptr<AuditLog>> Open(LogOptions options);
  ~AuditLog();  // Close(), errors ignored
  AuditLog(const AuditLog&) = delete;
  AuditLog& operator=(const AuditLog&) = delete;

  // Append adds one record. Returns OK once it is in the chain (and, if event.durable, on
  // disk); Unavailable (with the cause) if it could not be written: then it stays pending
  // and is retried with the next write. InvalidArgument for an unknown event type or one only
  // the writer writes (service_start, service_stop, log_rotation, recovery). After Close,
  // FailedPrecondition.
  absl::Status Append(Event event);

  // Flush writes and fsyncs every pending record; Checkpoint also appends a checkpoint.
  absl::Status Flush();
  absl::Status Checkpoint();

  // Close appends service_stop and a final checkpoint, fsyncs and stops the flusher.
  absl::Status Close();

  // Tick runs the timers as of `now_ms` (LogOptions::monotonic_ms's clock): it signs a
  // checkpoint if records are uncovered and checkpoint_interval_ms has passed since the last
  // checkpoint, or if none are and heartbeat_interval_ms has (a heartbeat); otherwise it writes
  // pending records. Returns that write's status (OK if there was nothing to do). The flusher
  // calls it every batch_interval_ms; a test calls it with its own times, without sleeping.
  absl::Status Tick(int64_t now_ms);

  // Healthy returns OK if the last write succeeded, else its error.
  absl::Status Healthy() const;

  LogStats stats() const;
  const std::string& log_id() const { return log_id_; }
  const std::string& dir() const { return options_.dir; }

 private:
  explicit AuditLog(LogOptions options) : options_(std::move(options)) {}
  absl::Status Recover();
  absl::Status AppendLocked(Event event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status FlushLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckpointLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status OpenFileLocked(int index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status RotateLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // SaveWitness replaces options_.witness_file with `checkpoint_line` (atomically).
  absl::Status SaveWitness(const std::string& checkpoint_line) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // SaveNote replaces DIR/checkpoint.note with `c` as a C2SP signed note (checkpoint_note.h).
  absl::Status SaveNote(const audit::Checkpoint& c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // VerifyOnOpen runs the auditor's full check (VerifyLog) with the writer's witness and
  // returns its report (DataLoss if the log does not verify).
  absl::StatusOr<VerifyReport> VerifyOnOpen() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status TickLocked(int64_t now_ms) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FlusherLoop();
  int64_t MonotonicMs() const;
  int64_t NowNs() const;

  LogOptions options_;
  std::string log_id_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  int fd_ ABSL_GUARDED_BY(mu_) = -1;
  int file_index_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t file_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // durable bytes of the current file
  std::string pending_ ABSL_GUARDED_BY(mu_);      // lines not yet written
  uint64_t pending_records_ ABSL_GUARDED_BY(mu_) = 0;
  // A log_rotation record is in pending_ (or written, with the next file not yet open): lines
  // appended meanwhile belong to the next file and wait in next_pending_.
  bool rotation_pending_ ABSL_GUARDED_BY(mu_) = false;
  std::string next_pending_ ABSL_GUARDED_BY(mu_);
  uint64_t next_pending_records_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;  // the next record's
  Hash head_ ABSL_GUARDED_BY(mu_){};       // the last record's hash
  MerkleAccumulator tree_ ABSL_GUARDED_BY(mu_);
  uint64_t since_checkpoint_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_checkpoint_ms_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status health_ ABSL_GUARDED_BY(mu_);
  LogStats stats_ ABSL_GUARDED_BY(mu_);
  std::thread flusher_;
  int lock_fd_ = -1;  // flock(DIR/lock): one writer per directory
};

}  // namespace kvguard::audit

#endif  // KVGUARD_AUDIT_LOG_H_
