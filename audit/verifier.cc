#include "audit/verifier.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <span>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "audit/hex.h"
#include "audit/log.h"
#include "audit/merkle.h"

namespace kvguard::audit {
namespace {

// absl's string_view is not std::string_view in this build; StrCat wants the former.
absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

absl::Status ErrnoError(int err, std::string_view what, std::string_view path) {
  return absl::ErrnoToStatus(err, absl::StrCat(Sv(what), " ", Sv(path)));
}

constexpr Hash kZeroHash{};

// ForEachBlock reads the file at `path` in large blocks and calls `fn(lines, first_number)` with
// the complete lines of each (without their '\n'; line numbers from 1). Stops at the first
// non-OK status of `fn`. `*unterminated` receives the bytes after the last '\n'.
absl::Status ForEachBlock(
    const std::string& path,
    absl::FunctionRef<absl::Status(std::span<const std::string_view>, uint64_t)> fn,
    std::string* unterminated) {
  unterminated->clear();
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "cannot open", path);
  // 4 MiB blocks, or less for a smaller file (a fresh log is a few KiB: no point zeroing
  // megabytes); the buffer still doubles for a line longer than it.
  struct stat st;
  size_t block = size_t{4} << 20;
  if (fstat(fd, &st) == 0 && st.st_size >= 0) {
    block = std::clamp<size_t>(static_cast<size_t>(st.st_size) + 1, 4096, block);
  }
  std::string buf(block, '\0');
  std::vector<std::string_view> lines;
  size_t have = 0;  // bytes in buf: an incomplete line carried over, then new data
  uint64_t number = 1;
  absl::Status status;
  for (;;) {
    if (have == buf.size()) buf.resize(2 * buf.size());  // a line longer than the buffer
    const ssize_t n = read(fd, buf.data() + have, buf.size() - have);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      status = ErrnoError(errno, "cannot read", path);
      break;
    }
    if (n == 0) break;
    const size_t scanned = have;
    have += static_cast<size_t>(n);
    const char* base = buf.data();
    size_t start = 0;
    lines.clear();
    for (const void* nl = memchr(base + scanned, '\n', have - scanned); nl != nullptr;
         nl = memchr(base + start, '\n', have - start)) {
      const size_t end = static_cast<size_t>(static_cast<const char*>(nl) - base);
      lines.emplace_back(base + start, end - start);
      start = end + 1;
    }
    if (!lines.empty()) {
      status = fn(lines, number);
      if (!status.ok()) break;
      number += lines.size();
    }
    std::memmove(buf.data(), buf.data() + start, have - start);
    have -= start;
  }
  close(fd);
  if (status.ok()) unterminated->assign(buf.data(), have);
  return status;
}

// ParsedLine is the per-line work that does not depend on other lines, done in parallel.
struct ParsedLine {
  absl::StatusOr<Line> line;
  Hash leaf{};  // LeafHash of a record's line
};

// ParseAll parses `lines` into `out` on up to `threads` threads. ParseLine (JSON, canonical
// form, record hash) dominates verification; the chain checks after it are sequential and
// cheap.
void ParseAll(std::span<const std::string_view> lines, unsigned threads,
              std::vector<ParsedLine>* out) {
  out->resize(lines.size());
  auto work = [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      ParsedLine& p = (*out)[i];
      p.line = ParseLine(lines[i]);
      if (p.line.ok() && p.line->kind == Line::Kind::kRecord) p.leaf = LeafHash(lines[i]);
    }
  };
  const size_t n = lines.size();
  const unsigned t = n < 512 ? 1 : threads;
  std::vector<std::thread> helpers;
  for (unsigned k = 1; k < t; ++k) helpers.emplace_back(work, n * k / t, n * (k + 1) / t);
  work(0, n / t);
  for (std::thread& h : helpers) h.join();
}

// Verifier is one pass over one log. Each Check* returns false after recording the failure.
class Verifier {
 public:
  Verifier(std::string dir, const VerifyingKey& key, const VerifyOptions& options,
           VerifyReport* report)
      : dir_(std::move(dir)),
        key_(key),
        key_fp_(key.Fingerprint()),
        options_(options),
        report_(report) {}

  absl::Status Run();

 private:
  // Fail records the failure at the current line and returns false.
  bool Fail(std::string why, std::optional<uint64_t> seq, bool checkpoint) {
    report_->failure = VerifyFailure{file_, line_, seq, checkpoint, std::move(why)};
    return false;
  }
  bool FailRecord(std::string why) { return Fail(std::move(why), next_seq_, false); }
  bool FailCheckpoint(std::string why) {
    return Fail(std::move(why),
                next_seq_ == 0 ? std::nullopt : std::optional<uint64_t>(next_seq_ - 1), true);
  }

  bool CheckLogId();
  bool CheckWitnessSignature();
  bool CheckLine(std::string_view text, const ParsedLine& parsed);
  bool CheckRecord(const Line& line, const Hash& leaf);
  bool CheckCheckpoint(std::string_view text, const Checkpoint& c);
  bool CheckFileEnd(bool newest);
  bool CheckRecovery(const Line& line);

  const std::string dir_;
  const VerifyingKey& key_;
  const std::string key_fp_;
  const VerifyOptions& options_;
  VerifyReport* const report_;

  // Where we are.
  std::string file_;
  uint64_t line_ = 0;
  int file_index_ = 0;
  // The chain and the tree so far.
  uint64_t next_seq_ = 0;
  Hash head_ = kZeroHash;
  MerkleAccumulator tree_;
  uint64_t covered_ = 0;  // size of the last checkpoint
  // The current file's last record, for the rotation rule.
  bool file_has_record_ = false;
  uint64_t file_last_line_ = 0;
  std::optional<std::string> file_rotation_;  // detail of a log_rotation record, if last
  // A service_start since the last checkpoint: the time to the next one is not a gap.
  bool restarted_ = false;
  std::string last_record_type_;  // the event type of the last record so far
};

bool Verifier::CheckLogId() {
  file_ = "log-id";
  line_ = 0;
  const std::string path = dir_ + "/log-id";
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return Fail(absl::StrCat("cannot be read: ", strerror(errno)), std::nullopt, false);
  }
  char buf[128];
  ssize_t n;
  do {
    n = read(fd, buf, sizeof(buf));
  } while (n < 0 && errno == EINTR);
  const int err = errno;
  close(fd);
  if (n < 0) return Fail(absl::StrCat("cannot be read: ", strerror(err)), std::nullopt, false);
  std::string_view id(buf, static_cast<size_t>(n));
  if (id.ends_with('\n')) id.remove_suffix(1);
  if (id.size() != 32 || !IsLowerHex(id)) {
    return Fail("is not one line of 32 lowercase hex digits", std::nullopt, false);
  }
  report_->log_id = std::string(id);
  return true;
}

bool Verifier::CheckWitnessSignature() {
  const Checkpoint& w = *options_.witness;
  file_.clear();
  line_ = 0;
  if (w.log_id != report_->log_id) {
    return Fail(absl::StrCat("the witness checkpoint is for log ", w.log_id, ", not this log (",
                             report_->log_id, ")"),
                std::nullopt, false);
  }
  if (w.key_fp != key_fp_ ||
      !key_.Verify(CheckpointMessage(w.log_id, w.size, w.head, w.root, w.time_ns), w.sig)) {
    return Fail("the witness checkpoint's signature does not verify with the public key",
                std::nullopt, false);
  }
  if (w.size == 0 && (w.root != EmptyRoot() || w.head != kZeroHash)) {
    return Fail("log does not extend the witness checkpoint of size 0", std::nullopt, false);
  }
  return true;
}

bool Verifier::CheckLine(std::string_view text, const ParsedLine& parsed) {
  const absl::StatusOr<Line>& line = parsed.line;
  if (!line.ok()) {
    // Which kind it was meant to be decides how the failure is named.
    const bool checkpoint = text.find("\"type\":\"checkpoint\"") != std::string_view::npos;
    const std::string why = absl::StrCat("does not parse: ", line.status().message());
    return checkpoint ? FailCheckpoint(why) : FailRecord(why);
  }
  if (line->kind == Line::Kind::kCheckpoint) return CheckCheckpoint(text, line->checkpoint);
  return CheckRecord(*line, parsed.leaf);
}

bool Verifier::CheckRecord(const Line& line, const Hash& leaf) {
  if (!line.hash_ok) return FailRecord("hash does not match the record's bytes");
  if (line.seq != next_seq_) {
    if (line.seq < next_seq_) {
      return FailRecord(absl::StrCat("found seq ", line.seq, " again, where seq ", next_seq_,
                                     " belongs (a record repeated or moved)"));
    }
    return FailRecord(absl::StrCat("found seq ", line.seq, " where seq ", next_seq_,
                                   " belongs (records missing or moved)"));
  }
  if (line.prev != head_) {
    return FailRecord(next_seq_ == 0
                          ? std::string("prev of the first record is not 64 zeros")
                          : absl::StrCat("prev does not match the hash of seq ", next_seq_ - 1));
  }
  if (file_rotation_.has_value()) {
    return FailRecord(absl::StrCat("record after the log_rotation record to ", *file_rotation_,
                                   " (a log_rotation must be the last record of its file)"));
  }
  if (line.event.type == "log_rotation") {
    const std::string next = FileName(file_index_ + 1);
    if (line.event.detail != next) {
      return FailRecord(absl::StrCat("log_rotation names '", line.event.detail.value_or(""),
                                     "', not the next file ", next));
    }
    file_rotation_ = next;
  } else if (line.event.type == "recovery") {
    if (!CheckRecovery(line)) return false;
  } else if (line.event.type == "service_start") {
    restarted_ = true;
  } else if (line.event.type == "tail_adopted") {
    // The writer's note that it started on records no checkpoint covered: it must name exactly
    // those, seq covered_ .. this one - 1, so it can neither hide some nor claim signed ones.
    if (next_seq_ == covered_ || line.event.detail != TailAdoptedDetail(covered_, next_seq_ - 1)) {
      return FailRecord(absl::StrCat(
          "tail_adopted record does not name the records after the last checkpoint (seq ", covered_,
          "..", next_seq_ == 0 ? 0 : next_seq_ - 1, ")"));
    }
    report_->adoptions.push_back(AdoptionNote{line.seq, covered_, next_seq_ - 1, file_, line_});
  }
  last_record_type_ = line.event.type;
  if (report_->records == 0) report_->first_record_ns = line.event.time_ns;
  report_->last_record_ns = line.event.time_ns;
  head_ = line.hash;
  tree_.Append(leaf);
  ++next_seq_;
  ++report_->records;
  file_has_record_ = true;
  file_last_line_ = line_;
  if (options_.witness && next_seq_ == options_.witness->size) {
    if (head_ != options_.witness->head || tree_.Root() != options_.witness->root) {
      return Fail(
          absl::StrCat("log does not extend the witness checkpoint of size ",
                       options_.witness->size, ": records 0..", next_seq_ - 1, " have another ",
                       head_ != options_.witness->head ? "chain head" : "Merkle root"),
          next_seq_ - 1, false);
    }
    report_->witness_checked = true;
  }
  return true;
}

bool Verifier::CheckCheckpoint(std::string_view text, const Checkpoint& c) {
  if (c.log_id != report_->log_id) {
    return FailCheckpoint(
        absl::StrCat("checkpoint is for log ", c.log_id, ", not this log (", report_->log_id, ")"));
  }
  if (c.size != next_seq_) {
    return FailCheckpoint(absl::StrCat("checkpoint of size ", c.size, " follows ", next_seq_,
                                       " records (replayed or moved?)"));
  }
  if (c.head != head_) {
    return FailCheckpoint(
        next_seq_ == 0 ? std::string("checkpoint head is not 64 zeros")
                       : absl::StrCat("checkpoint head is not the hash of seq ", next_seq_ - 1));
  }
  if (c.root != tree_.Root()) {
    return FailCheckpoint(
        absl::StrCat("checkpoint root is not the Merkle root of the ", next_seq_, " records"));
  }
  if (c.key_fp != key_fp_) {
    return FailCheckpoint(absl::StrCat("checkpoint is signed by key ", c.key_fp,
                                       ", not by the public key given (", key_fp_, ")"));
  }
  if (!key_.Verify(CheckpointMessage(c.log_id, c.size, c.head, c.root, c.time_ns), c.sig)) {
    return FailCheckpoint("checkpoint signature does not verify with the public key");
  }
  if (report_->last_checkpoint && !restarted_) {
    const int64_t gap = c.time_ns - report_->last_checkpoint->time_ns;
    if (!report_->longest_gap || gap > report_->longest_gap->ns) {
      report_->longest_gap =
          CheckpointGap{gap, report_->last_checkpoint->time_ns, c.time_ns, file_, line_};
    }
  }
  restarted_ = false;
  covered_ = c.size;
  report_->last_covered_type = last_record_type_;
  report_->covered_through_ns = report_->last_record_ns;
  ++report_->checkpoints;
  report_->last_checkpoint = c;
  report_->last_checkpoint_line = std::string(text);
  return true;
}

// CheckRecovery checks that the torn-*.bin file a `recovery` record names is still there with
// the size and SHA-256 the record gives (log.cc writes "set aside N bytes (sha256 H) of a torn
// record from FILE at byte P into torn-T.bin"): the record is signed, so deleting or editing the
// set-aside bytes is detected.
bool Verifier::CheckRecovery(const Line& line) {
  const std::string detail = line.event.detail.value_or("");
  RecoveryNote note{line.seq, file_, line_, detail, ""};
  uint64_t size = 0;
  const size_t bytes = detail.find(" bytes (sha256 ");
  const size_t into = detail.rfind(" into ");
  absl::StatusOr<Hash> digest = absl::InvalidArgumentError("");
  if (detail.starts_with("set aside ") && bytes != std::string::npos &&
      absl::SimpleAtoi(absl::string_view(detail).substr(10, bytes - 10), &size)) {
    digest = HashFromHex(std::string_view(detail).substr(bytes + 15, 64));
  }
  if (into != std::string::npos) note.torn_file = detail.substr(into + 6);
  if (!digest.ok() || !note.torn_file.starts_with("torn-") || !note.torn_file.ends_with(".bin") ||
      note.torn_file.find('/') != std::string::npos) {
    return FailRecord(
        "recovery record does not name the torn-*.bin file it set aside and its sha256");
  }
  std::ifstream in(dir_ + "/" + note.torn_file, std::ios::binary);
  if (!in) {
    return FailRecord(absl::StrCat("recovery record names ", note.torn_file,
                                   ", which is missing from the directory (deleted?)"));
  }
  std::stringstream data;
  data << in.rdbuf();
  const std::string torn = data.str();
  if (torn.size() != size || Sha256({torn}) != *digest) {
    return FailRecord(absl::StrCat(note.torn_file, " is not the ", size,
                                   " bytes this recovery record set aside (sha256 differs)"));
  }
  report_->recoveries.push_back(std::move(note));
  return true;
}

bool Verifier::CheckFileEnd(bool newest) {
  if (newest) {
    if (file_rotation_.has_value()) {
      line_ = file_last_line_;
      return Fail(absl::StrCat("log_rotation to ", *file_rotation_,
                               ", which is missing from the directory"),
                  next_seq_ - 1, false);
    }
    return true;
  }
  if (!file_rotation_.has_value()) {
    line_ = file_has_record_ ? file_last_line_ : 0;
    return Fail(absl::StrCat("the file ends without a log_rotation record to ",
                             FileName(file_index_ + 1), " (truncated, or files swapped?)"),
                file_has_record_ ? std::optional<uint64_t>(next_seq_ - 1) : std::nullopt, false);
  }
  return true;
}

absl::Status Verifier::Run() {
  absl::StatusOr<LogDirectory> listing = ListLogDirectory(dir_);
  if (!listing.ok()) return listing.status();
  report_->torn_files = listing->torn_files;
  if (!listing->odd_names.empty()) {
    file_ = listing->odd_names.front();
    Fail("is not a name of the rotation set (audit-NNNNNN.jsonl, 6 or more digits)", std::nullopt,
         false);
    return absl::OkStatus();
  }
  if (listing->indexes.empty()) {
    Fail(absl::StrCat("no audit-*.jsonl files in ", dir_), std::nullopt, false);
    return absl::OkStatus();
  }
  for (size_t i = 0; i < listing->indexes.size(); ++i) {
    const int want = static_cast<int>(i) + 1;
    if (listing->indexes[i] != want) {
      file_ = FileName(want);
      Fail(absl::StrCat("is missing: the rotation set runs from ", FileName(1), " without gaps (",
                        FileName(listing->indexes.back()), " is there)"),
           std::nullopt, false);
      return absl::OkStatus();
    }
  }
  if (!CheckLogId()) return absl::OkStatus();
  if (options_.witness && !CheckWitnessSignature()) return absl::OkStatus();

  const unsigned threads = std::clamp(std::thread::hardware_concurrency(), 1u, 8u);
  std::vector<ParsedLine> parsed;
  for (int index : listing->indexes) {
    file_index_ = index;
    file_ = FileName(index);
    line_ = 0;
    file_has_record_ = false;
    file_last_line_ = 0;
    file_rotation_.reset();
    ++report_->files;
    bool good = true;
    std::string unterminated;
    absl::Status read = ForEachBlock(
        dir_ + "/" + file_,
        [&](std::span<const std::string_view> lines, uint64_t first) {
          ParseAll(lines, threads, &parsed);
          for (size_t i = 0; i < lines.size() && good; ++i) {
            line_ = first + i;
            good = CheckLine(lines[i], parsed[i]);
          }
          // Stop reading; the failure is in the report, not an I/O error.
          return good ? absl::OkStatus() : absl::CancelledError();
        },
        &unterminated);
    if (!good) return absl::OkStatus();
    if (!read.ok()) return read;
    if (!unterminated.empty()) {
      ++line_;
      const bool checkpoint = unterminated.find("\"type\":\"checkpoint\"") != std::string::npos;
      const std::string why =
          absl::StrCat("the last line is cut short (", unterminated.size(),
                       " bytes without a newline): a torn write; reopening the log sets it aside");
      if (checkpoint) {
        FailCheckpoint(why);
      } else {
        FailRecord(why);
      }
      return absl::OkStatus();
    }
    if (!CheckFileEnd(index == listing->indexes.back())) return absl::OkStatus();
  }
  if (options_.witness && next_seq_ < options_.witness->size) {
    file_.clear();
    line_ = 0;
    Fail(absl::StrCat("log does not extend the witness checkpoint of size ", options_.witness->size,
                      ": it has only ", next_seq_, " records (truncated?)"),
         std::nullopt, false);
    return absl::OkStatus();
  }
  if (options_.witness && options_.witness->size > 0 &&
      (!report_->last_checkpoint || report_->last_checkpoint->size < options_.witness->size)) {
    // The witness came from a checkpoint of this log, and the writer never removes one: the
    // checkpoints from it on were deleted, which would turn signed records into a tail.
    file_.clear();
    line_ = 0;
    Fail(absl::StrCat("the witness checkpoint of size ", options_.witness->size,
                      " is no longer in the log (its last checkpoint has size ",
                      report_->last_checkpoint ? report_->last_checkpoint->size : 0,
                      "): checkpoints deleted"),
         std::nullopt, false);
    return absl::OkStatus();
  }
  if (options_.witness) report_->witness_checked = true;
  report_->uncovered = next_seq_ - covered_;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LogDirectory> ListLogDirectory(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return ErrnoError(errno, "cannot open log directory", dir);
  LogDirectory out;
  errno = 0;
  while (const dirent* e = readdir(d)) {
    const std::string_view name = e->d_name;
    if (name.starts_with("audit-") && name.ends_with(".jsonl")) {
      const std::string_view digits = name.substr(6, name.size() - 12);
      int index = 0;
      const bool numeric =
          !digits.empty() && digits.size() <= 9 &&
          std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
      if (numeric) {
        for (char c : digits) index = index * 10 + (c - '0');
      }
      if (numeric && index > 0 && FileName(index) == name) {
        out.indexes.push_back(index);
      } else {
        out.odd_names.emplace_back(name);
      }
    } else if (name.starts_with("torn-") && name.ends_with(".bin")) {
      out.torn_files.emplace_back(name);
    }
  }
  const int err = errno;
  closedir(d);
  if (err != 0) return ErrnoError(err, "cannot list log directory", dir);
  std::sort(out.indexes.begin(), out.indexes.end());
  std::sort(out.torn_files.begin(), out.torn_files.end());
  std::sort(out.odd_names.begin(), out.odd_names.end());
  return out;
}

absl::Status ForEachLine(const std::string& path,
                         absl::FunctionRef<absl::Status(std::string_view, uint64_t)> fn,
                         std::string* unterminated) {
  return ForEachBlock(
      path,
      [&](std::span<const std::string_view> lines, uint64_t first) {
        for (size_t i = 0; i < lines.size(); ++i) {
          if (absl::Status s = fn(lines[i], first + i); !s.ok()) return s;
        }
        return absl::OkStatus();
      },
      unterminated);
}

std::string VerifyFailure::ToString() const {
  std::string where = file;
  if (line > 0) absl::StrAppend(&where, where.empty() ? "" : " ", "line ", line);
  std::string what;
  if (checkpoint) {
    what = seq ? absl::StrCat("checkpoint after seq ", *seq) : "checkpoint before any record";
  } else if (seq) {
    what = absl::StrCat("seq ", *seq);
  }
  if (!what.empty()) absl::StrAppend(&where, where.empty() ? "" : " ", "(", what, ")");
  return where.empty() ? why : absl::StrCat(where, ": ", why);
}

absl::StatusOr<VerifyReport> VerifyLog(const std::string& dir, const VerifyingKey& key,
                                       const VerifyOptions& options) {
  VerifyReport report;
  Verifier v(dir, key, options, &report);
  if (absl::Status s = v.Run(); !s.ok()) return s;
  return report;
}

absl::StatusOr<Checkpoint> ParseWitness(std::string_view text) {
  const absl::string_view trimmed = absl::StripAsciiWhitespace(Sv(text));
  if (trimmed.find('\n') != absl::string_view::npos) {
    return absl::InvalidArgumentError("a witness file holds one checkpoint line, not several");
  }
  absl::StatusOr<Line> line = ParseLine(std::string_view(trimmed.data(), trimmed.size()));
  if (!line.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a checkpoint line: ", line.status().message()));
  }
  if (line->kind != Line::Kind::kCheckpoint) {
    return absl::InvalidArgumentError("not a checkpoint line: it is a record");
  }
  return line->checkpoint;
}

std::string WithCommas(uint64_t n) {
  std::string digits = absl::StrCat(n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

}  // namespace kvguard::audit
