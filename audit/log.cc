#include "audit/log.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "audit/checkpoint_note.h"
#include "audit/private_file.h"
#include "audit/verifier.h"
#include "openssl/rand.h"

namespace kvguard::audit {
namespace {

absl::Status Errno(std::string_view what, const std::string& path) {
  return absl::ErrnoToStatus(errno, absl::StrCat(std::string(what), " ", path));
}

absl::StatusOr<std::string> RandomHex(size_t bytes) {
  std::string raw(bytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(raw.data()), static_cast<int>(bytes)) != 1) {
    return absl::InternalError("audit log: RAND_bytes failed");
  }
  return absl::BytesToHexString(raw);
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Errno("open", path);
  std::string data;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const absl::Status s = Errno("read", path);
      close(fd);
      return s;
    }
    if (n == 0) break;
    data.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return data;
}

// LogFiles returns the indexes of the audit-NNNNNN.jsonl files in `dir`, ascending.
absl::StatusOr<std::vector<int>> LogFiles(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return Errno("open directory", dir);
  std::vector<int> out;
  while (dirent* e = readdir(d)) {
    const std::string_view name = e->d_name;
    int index = 0;
    if (name.starts_with("audit-") && name.ends_with(".jsonl") && name.size() > 12 &&
        std::sscanf(e->d_name, "audit-%d.jsonl", &index) == 1 && index > 0 &&
        FileName(index) == name) {
      out.push_back(index);
    }
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

constexpr std::string_view kCheckpointPrefix = "{\"v\":1,\"type\":\"checkpoint\"";

}  // namespace

std::string FileName(int index) { return absl::StrFormat("audit-%06d.jsonl", index); }

int64_t AuditLog::NowNs() const {
  if (options_.now_ns) return options_.now_ns();
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int64_t AuditLog::MonotonicMs() const {
  if (options_.monotonic_ms) return options_.monotonic_ms();
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

absl::StatusOr<std::unique_ptr<AuditLog>> AuditLog::Open(LogOptions options) {
  if (options.dir.empty()) return absl::InvalidArgumentError("audit log: no directory");
  if (options.key == nullptr) return absl::InvalidArgumentError("audit log: no signing key");
  if (options.checkpoint_every < 1 || options.batch_records < 1 || options.rotate_bytes < 4096 ||
      options.checkpoint_interval_ms < 1 || options.heartbeat_interval_ms < 1 ||
      options.batch_interval_ms < 1) {
    return absl::InvalidArgumentError(
        "audit log: checkpoint_every, batch_records and intervals must be >= 1, rotate_bytes "
        ">= 4096");
  }
  if (options.instance.empty()) {
    absl::StatusOr<std::string> id = RandomHex(8);
    if (!id.ok()) return id.status();
    options.instance = *id;
  }
  if (mkdir(options.dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return Errno("audit log: create directory", options.dir);
  }
  std::unique_ptr<AuditLog> log(new AuditLog(std::move(options)));
  const std::string lock_path = log->options_.dir + "/lock";
  log->lock_fd_ = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (log->lock_fd_ < 0) return Errno("audit log: open", lock_path);
  if (flock(log->lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "audit log ", log->options_.dir, " is held by another writer (", lock_path, ")"));
  }
  if (absl::Status s = log->Recover(); !s.ok()) {
    // A refused log is left exactly as it was: no service_stop, no checkpoint over what was
    // refused (the destructor's Close writes nothing once the file is closed here).
    std::lock_guard<std::mutex> lock(log->mu_);
    if (log->fd_ >= 0) close(log->fd_);
    log->fd_ = -1;
    return s;
  }
  {
    std::lock_guard<std::mutex> lock(log->mu_);
    Event start;
    start.type = "service_start";
    start.detail = absl::StrCat("instance ", log->options_.instance);
    if (absl::Status s = log->AppendLocked(std::move(start)); !s.ok()) return s;
    if (absl::Status s = log->FlushLocked(); !s.ok()) return s;
  }
  log->flusher_ = std::thread([l = log.get()] { l->FlusherLoop(); });
  return log;
}

absl::Status AuditLog::Recover() {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string id_path = options_.dir + "/log-id";
  if (absl::StatusOr<std::string> id = ReadFile(id_path); id.ok()) {
    log_id_ = std::string(absl::StripTrailingAsciiWhitespace(*id));
    if (log_id_.size() != 32) {
      return absl::DataLossError(absl::StrCat("audit log: ", id_path, " is not a 32-hex log id"));
    }
  } else {
    absl::StatusOr<std::vector<int>> existing = LogFiles(options_.dir);
    if (existing.ok() && !existing->empty()) {
      return absl::DataLossError(absl::StrCat("audit log: ", id_path,
                                              " is missing but the log has files; refusing to "
                                              "start a second log id (run kvguard audit verify)"));
    }
    absl::StatusOr<std::string> fresh = RandomHex(16);
    if (!fresh.ok()) return fresh.status();
    log_id_ = *fresh;
    if (absl::Status s = WriteNewPrivateFile(id_path, log_id_ + "\n"); !s.ok()) return s;
  }
  absl::StatusOr<std::vector<int>> files = LogFiles(options_.dir);
  if (!files.ok()) return files.status();
  if (files->empty()) {
    if (!options_.witness_file.empty() && access(options_.witness_file.c_str(), F_OK) == 0) {
      return absl::DataLossError(absl::StrCat(
          "audit log: ", options_.dir, " is empty, but this writer signed a log there before (",
          options_.witness_file, "); refusing to start a new history in its place"));
    }
    return OpenFileLocked(1);
  }
  for (size_t i = 0; i < files->size(); ++i) {
    if ((*files)[i] != static_cast<int>(i) + 1) {
      return absl::DataLossError(absl::StrCat("audit log: ", FileName(static_cast<int>(i) + 1),
                                              " is missing from ", options_.dir,
                                              " (run kvguard audit verify)"));
    }
  }
  std::optional<Event> recovery;
  bool ends_with_rotation = false;
  for (int index : *files) {
    const std::string path = options_.dir + "/" + FileName(index);
    absl::StatusOr<std::string> data = ReadFile(path);
    if (!data.ok()) return data.status();
    const bool newest = index == files->back();
    size_t pos = 0;
    while (pos < data->size()) {
      const size_t nl = data->find('\n', pos);
      const std::string_view line = std::string_view(*data).substr(
          pos, nl == std::string::npos ? std::string::npos : nl - pos);
      bool ok = nl != std::string::npos;
      const bool checkpoint = line.starts_with(kCheckpointPrefix);
      // The tree and chain need every record; full parsing (canonical form, hash) only where
      // it decides anything: the newest file's last line, which may be torn.
      const bool last = ok && newest && nl + 1 == data->size();
      if (ok && checkpoint) since_checkpoint_ = 0;
      if (ok && checkpoint && last) {
        ok = ParseLine(line).ok();  // a damaged final checkpoint is a torn tail too
      } else if (ok && !checkpoint) {
        if (last) {
          absl::StatusOr<Line> parsed = ParseLine(line);
          ok = parsed.ok() && parsed->hash_ok && parsed->seq == seq_ && parsed->prev == head_;
          if (ok) {
            head_ = parsed->hash;
            // A crash between a rotation record and the next file's creation: go on there.
            ends_with_rotation = parsed->event.type == "log_rotation";
          }
        } else {
          const size_t cut = line.rfind(",\"hash\":\"");
          absl::StatusOr<Hash> h = cut == std::string_view::npos
                                       ? absl::InvalidArgumentError("no hash")
                                       : HashFromHex(line.substr(cut + 9, 64));
          ok = h.ok();
          if (ok) head_ = *h;
        }
        if (ok) {
          tree_.Append(LeafHash(line));
          ++seq_;
          ++since_checkpoint_;  // records no checkpoint covers yet: the next one comes sooner
        }
      }
      if (!ok) {
        if (!newest || (nl != std::string::npos && nl + 1 != data->size())) {
          return absl::DataLossError(absl::StrCat(
              "audit log: ", path, " is damaged at byte ", pos,
              " before its tail; not writing on top of it (run kvguard audit verify)"));
        }
        // A torn tail: set it aside, cut the file back, and say so in the chain.
        const std::string aside = absl::StrCat(options_.dir, "/torn-", NowNs(), ".bin");
        if (absl::Status s = WriteNewPrivateFile(aside, std::string_view(*data).substr(pos));
            !s.ok()) {
          return s;
        }
        if (truncate(path.c_str(), static_cast<off_t>(pos)) != 0) return Errno("truncate", path);
        stats_.recovered_bytes = data->size() - pos;
        Event e;
        e.type = "recovery";
        const std::string_view torn = std::string_view(*data).substr(pos);
        e.detail = absl::StrCat("set aside ", torn.size(), " bytes (sha256 ", ToHex(Sha256({torn})),
                                ") of a torn record from ", FileName(index), " at byte ", pos,
                                " into ", aside.substr(options_.dir.size() + 1));
        recovery = std::move(e);
        break;
      }
      pos = nl + 1;
    }
  }
  stats_.records = seq_;
  // The whole log, cut back to its last good record, must verify and extend what this writer
  // last signed: refuse rather than sign a history someone rewrote meanwhile.
  const int open_index = ends_with_rotation ? files->back() + 1 : files->back();
  if (absl::Status s = OpenFileLocked(open_index); !s.ok()) return s;
  // (After a crash mid-rotation, the file the rotation record names now exists, empty.)
  absl::StatusOr<VerifyReport> verified = VerifyOnOpen();
  if (!verified.ok()) return verified.status();
  bool adopted = false;
  if (verified->uncovered > 0) {
    // Records no checkpoint covers. After a clean stop there are none (service_stop's checkpoint
    // is the last line a writer writes), so any there were added while the service was down:
    // refuse to sign them. Otherwise they may be a crash's last records, or an appended
    // forgery: this writer cannot tell, so it takes them over with a record naming them, which
    // `audit verify` reports, rather than signing them as its own in silence.
    const uint64_t first = verified->records - verified->uncovered, last = verified->records - 1;
    if (verified->last_covered_type == "service_stop") {
      return absl::DataLossError(absl::StrCat(
          "audit log ", options_.dir, ": records ", first, "..", last,
          " follow the final checkpoint of a clean stop, where a writer writes nothing; they were "
          "added while the service was down. Not signing them (run kvguard audit verify)"));
    }
    Event e;
    e.type = "tail_adopted";
    e.detail = TailAdoptedDetail(first, last);
    if (absl::Status s = AppendLocked(std::move(e)); !s.ok()) return s;
    adopted = true;
  }
  if (recovery) {
    // Signed at once: from here on, deleting or editing the torn file fails verification.
    if (absl::Status s = AppendLocked(std::move(*recovery)); !s.ok()) return s;
  }
  if (adopted || recovery) {
    if (absl::Status s = CheckpointLocked(); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status AuditLog::OpenFileLocked(int index) {
  const std::string path = options_.dir + "/" + FileName(index);
  const int fd = open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return Errno("open", path);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const absl::Status s = Errno("fstat", path);
    close(fd);
    return s;
  }
  if (absl::Status s = FsyncDirectory(options_.dir); !s.ok()) {  // before the file counts as made
    close(fd);
    return s;
  }
  if (fd_ >= 0) close(fd_);
  fd_ = fd;
  file_index_ = index;
  file_bytes_ = static_cast<uint64_t>(st.st_size);
  stats_.files = index;
  return absl::OkStatus();
}

absl::Status AuditLog::Append(Event event) {
  if (event.type == "service_start" || event.type == "service_stop" ||
      event.type == "log_rotation" || event.type == "recovery" || event.type == "tail_adopted") {
    return absl::InvalidArgumentError(
        absl::StrCat("audit event type '", event.type, "' is written by the log itself"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return absl::FailedPreconditionError("audit log is closed");
  return AppendLocked(std::move(event));
}

absl::Status AuditLog::AppendLocked(Event event) {
  if (!IsEventType(event.type)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown audit event type '", event.type, "'"));
  }
  if (event.time_ns == 0) event.time_ns = NowNs();
  const bool durable = event.durable;
  Hash hash;
  const std::string line = FormatRecord(event, seq_, options_.instance, head_, &hash);
  tree_.Append(LeafHash(line));
  head_ = hash;
  ++seq_;
  ++stats_.records;
  ++since_checkpoint_;
  if (rotation_pending_) {
    next_pending_.append(line).push_back('\n');
    ++next_pending_records_;
  } else {
    pending_.append(line).push_back('\n');
    ++pending_records_;
  }
  // The rotation record is the last line of its file: whatever follows (a checkpoint it
  // triggers included) waits for the next file, even if the flush below fails.
  if (event.type == "log_rotation") rotation_pending_ = true;
  absl::Status s;
  if (since_checkpoint_ >= options_.checkpoint_every) {
    s = CheckpointLocked();
  } else if (durable || pending_records_ + next_pending_records_ >= options_.batch_records) {
    s = FlushLocked();
  }
  // One rotation at a time: while one is pending (a failing disk), no second record is added.
  // Nor after service_stop: its final checkpoint follows it directly (Close).
  if (s.ok() && !rotation_pending_ && event.type != "log_rotation" &&
      event.type != "service_stop" && file_bytes_ + pending_.size() >= options_.rotate_bytes) {
    s = RotateLocked();
  }
  return s;
}

absl::Status AuditLog::FlushLocked() {
  if (pending_.empty() && !rotation_pending_) return health_;
  const std::string path = options_.dir + "/" + FileName(file_index_);
  absl::Status s = WriteAll(fd_, pending_);
  if (!s.ok()) s = Prefix(s, path);
  if (s.ok() && fsync(fd_) != 0) s = Errno("fsync", path);
  if (!s.ok()) {
    // Cut back whatever part of the batch reached the file, so that the retry does not leave
    // a torn line in the middle of the log; the batch stays pending.
    if (ftruncate(fd_, static_cast<off_t>(file_bytes_)) != 0) { /* the next Open recovers */
    }
    ++stats_.write_errors;
    if (stats_.write_errors % 1000 == 1) {
      std::fprintf(stderr, "kvguard: AUDIT LOG CANNOT BE WRITTEN (%s); %llu records pending\n",
                   std::string(s.message()).c_str(),
                   static_cast<unsigned long long>(pending_records_));
    }
    health_ = absl::UnavailableError(absl::StrCat("audit log: ", s.message()));
    return health_;
  }
  ++stats_.fsyncs;
  file_bytes_ += pending_.size();
  pending_.clear();
  pending_records_ = 0;
  health_ = absl::OkStatus();
  if (rotation_pending_) {
    // The log_rotation record is on disk: start the next file and write what waited for it.
    if (absl::Status open = OpenFileLocked(file_index_ + 1); !open.ok()) {
      ++stats_.write_errors;
      health_ = absl::UnavailableError(absl::StrCat("audit log: ", open.message()));
      return health_;
    }
    rotation_pending_ = false;
    pending_ = std::move(next_pending_);
    pending_records_ = next_pending_records_;
    next_pending_.clear();
    next_pending_records_ = 0;
    if (!pending_.empty()) return FlushLocked();
  }
  return health_;
}

absl::Status AuditLog::CheckpointLocked() {
  audit::Checkpoint c;
  c.log_id = log_id_;
  c.size = seq_;
  c.head = head_;
  c.root = tree_.Root();
  c.time_ns = NowNs();
  c.key_fp = options_.key->Fingerprint();
  absl::StatusOr<std::string> sig =
      options_.key->Sign(CheckpointMessage(c.log_id, c.size, c.head, c.root, c.time_ns));
  if (!sig.ok()) return sig.status();
  c.sig = *std::move(sig);
  (rotation_pending_ ? next_pending_ : pending_).append(FormatCheckpoint(c)).push_back('\n');
  since_checkpoint_ = 0;
  last_checkpoint_ms_ = MonotonicMs();
  ++stats_.checkpoints;
  const std::string line = FormatCheckpoint(c);
  absl::Status s = FlushLocked();
  if (s.ok() && !rotation_pending_) s = SaveWitness(line);
  if (s.ok() && !rotation_pending_) s = SaveNote(c);
  return s;
}

absl::Status AuditLog::SaveNote(const audit::Checkpoint& c) {
  // A copy of the checkpoint in the C2SP format, for tools that speak it: replaced whole (a
  // rename), not fsynced (the checkpoint line it is made from is, and verification does not
  // read it).
  absl::StatusOr<std::string> note = FormatCheckpointNote(c, *options_.key);
  if (!note.ok()) return note.status();
  const std::string path = options_.dir + "/checkpoint.note";
  const std::string tmp = path + ".tmp";
  unlink(tmp.c_str());
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return Errno("open", tmp);
  FdCloser closer(fd);
  if (absl::Status s = WriteAll(fd, *note); !s.ok()) return Prefix(s, tmp);
  if (absl::Status s = closer.Close(); !s.ok()) return Prefix(s, tmp);
  if (rename(tmp.c_str(), path.c_str()) != 0) return Errno("rename", path);
  return absl::OkStatus();
}

absl::Status AuditLog::SaveWitness(const std::string& checkpoint_line) {
  if (options_.witness_file.empty()) return absl::OkStatus();
  const std::string tmp = options_.witness_file + ".tmp";
  unlink(tmp.c_str());
  if (absl::Status s = WriteNewPrivateFile(tmp, checkpoint_line + "\n"); !s.ok()) return s;
  if (rename(tmp.c_str(), options_.witness_file.c_str()) != 0) {
    return Errno("rename", options_.witness_file);
  }
  return FsyncParentDir(options_.witness_file);
}

absl::StatusOr<VerifyReport> AuditLog::VerifyOnOpen() {
  absl::StatusOr<VerifyingKey> key = VerifyingKey::FromRaw(options_.key->PublicKeyRaw());
  if (!key.ok()) return key.status();
  VerifyOptions vo;
  if (!options_.witness_file.empty()) {
    absl::StatusOr<std::string> text = ReadFile(options_.witness_file);
    if (text.ok()) {
      absl::StatusOr<Line> w = ParseLine(std::string(absl::StripTrailingAsciiWhitespace(*text)));
      if (!w.ok() || w->kind != Line::Kind::kCheckpoint) {
        return absl::DataLossError(absl::StrCat("audit log: witness ", options_.witness_file,
                                                " is not a checkpoint line"));
      }
      vo.witness = w->checkpoint;
    } else if (seq_ > 0) {
      return absl::DataLossError(absl::StrCat(
          "audit log: ", options_.dir, " has records but this writer's witness ",
          options_.witness_file, " is missing; refusing to sign a history it cannot vouch for"));
    }
  }
  absl::StatusOr<VerifyReport> report = VerifyLog(options_.dir, *key, vo);
  if (!report.ok()) return report.status();
  if (report->failure) {
    return absl::DataLossError(
        absl::StrCat("audit log ", options_.dir,
                     " does not verify; not writing on top of it: ", report->failure->ToString()));
  }
  return report;
}

absl::Status AuditLog::RotateLocked() {
  Event e;
  e.type = "log_rotation";
  e.detail = FileName(file_index_ + 1);
  if (absl::Status s = AppendLocked(std::move(e)); !s.ok()) return s;  // sets rotation_pending_
  return FlushLocked();  // writes the rotation record, then opens the next file
}

absl::Status AuditLog::Flush() {
  std::lock_guard<std::mutex> lock(mu_);
  return FlushLocked();
}

absl::Status AuditLog::Checkpoint() {
  std::lock_guard<std::mutex> lock(mu_);
  return CheckpointLocked();
}

absl::Status AuditLog::Healthy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return health_;
}

LogStats AuditLog::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

absl::Status AuditLog::Tick(int64_t now_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return absl::OkStatus();
  return TickLocked(now_ms);
}

absl::Status AuditLog::TickLocked(int64_t now_ms) {
  const int64_t since = now_ms - last_checkpoint_ms_;
  if (since_checkpoint_ > 0 ? since >= options_.checkpoint_interval_ms
                            : since >= options_.heartbeat_interval_ms) {
    return CheckpointLocked();
  }
  if (!pending_.empty() || rotation_pending_) return FlushLocked();  // rotation: retry the open
  return absl::OkStatus();
}

void AuditLog::FlusherLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!closed_) {
    cv_.wait_for(lock, std::chrono::milliseconds(options_.batch_interval_ms));
    if (closed_) break;
    TickLocked(MonotonicMs()).IgnoreError();  // health_ records a failure
  }
}

absl::Status AuditLog::Close() {
  absl::Status s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return absl::OkStatus();
    if (fd_ < 0) {  // Open failed before the log was writable: nothing to stop
      closed_ = true;
      return absl::OkStatus();
    }
    Event stop;
    stop.type = "service_stop";
    stop.detail = absl::StrCat("instance ", options_.instance);
    s = AppendLocked(std::move(stop));
    // (AppendLocked has signed it already if it was the checkpoint_every-th record.)
    if (s.ok() && since_checkpoint_ > 0) s = CheckpointLocked();
    closed_ = true;
    cv_.notify_all();
  }
  if (flusher_.joinable()) flusher_.join();
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  return s;
}

AuditLog::~AuditLog() {
  Close().IgnoreError();
  if (lock_fd_ >= 0) close(lock_fd_);
}

}  // namespace kvguard::audit
