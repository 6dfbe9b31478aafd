// `kvguard audit`: the auditor's tools for the tamper-evident audit log (audit/FORMAT.md):
// verify a log directory with only the public key, query and count its records, follow it,
// export it, and prove or check that one record is in it.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "audit/checkpoint_note.h"
#include "audit/query.h"
#include "audit/signing_key.h"
#include "audit/verdict.h"
#include "audit/verifier.h"
#include "tools/commands.h"
#include "tools/flags.h"

namespace kvguard::tools {
namespace {

constexpr char kUsage[] =
    "usage: kvguard audit <command> ...\n"
    "  verify DIR --pubkey FILE [--witness FILE] [--save-witness FILE] [--allow-unsigned-tail]\n"
    "         [--max-age DURATION [--now TIME]] [--json]\n"
    "      check the whole log: chain, signatures, sequence, order, rotation set, torn files;\n"
    "      prints one summary line (--json: one JSON object) with its verdict. Exit codes:\n"
    "      0 valid (every record covered by a signed checkpoint), 1 invalid (names the first\n"
    "      bad record), 3 unsigned tail (records after the last checkpoint, or none signed),\n"
    "      4 stale (--max-age), 5 unreadable (log, key or witness cannot be read).\n"
    "      --witness: a checkpoint line kept from an earlier look, which the log must extend;\n"
    "      --save-witness: keep this log's last checkpoint line there when the verdict is\n"
    "      valid (an existing file is read as the witness: it never moves backwards);\n"
    "      --allow-unsigned-tail: records after the last checkpoint do not fail the verdict;\n"
    "      --max-age: fail (stale) when the last checkpoint is older than DURATION (e.g. 90s,\n"
    "      5m) at --now (ns since the epoch or RFC 3339; default: the clock), or two\n"
    "      checkpoints of one run of the writer are further apart\n"
    "  query DIR [FILTERS] [--json]    matching records as a table (--json: their lines)\n"
    "  stats DIR [FILTERS]             violations and refused releases per hour (UTC),\n"
    "                                  tenant, type and reason\n"
    "  tail DIR [-n N] [-f]            the last N records (default 10); -f: then follow\n"
    "  export DIR --format csv|jsonl [FILTERS]\n"
    "                                  every matching record (jsonl: the lines as written)\n"
    "  prove DIR --seq N [--out FILE]  inclusion proof of record N against the latest\n"
    "                                  checkpoint (JSON)\n"
    "  check-proof --pubkey FILE --proof FILE [--record FILE]\n"
    "                                  verify a proof with only the public key (--record:\n"
    "                                  and that it proves exactly this record line)\n"
    "  prove-consistency DIR --from FILE [--out FILE]\n"
    "                                  RFC 9162 consistency proof that the log's latest\n"
    "                                  checkpoint extends the checkpoint line in FILE (e.g. a\n"
    "                                  witness) (JSON)\n"
    "  check-consistency --pubkey FILE --proof FILE [--witness FILE]\n"
    "                                  verify it with only the public key (--witness: and that\n"
    "                                  it starts from that checkpoint); exit 1 if it fails\n"
    "  check-note --pubkey FILE --note FILE\n"
    "                                  check a C2SP signed-note checkpoint (the log keeps its\n"
    "                                  latest in DIR/checkpoint.note) with only the public key\n"
    "  pubkey --signing-key FILE [--out FILE]\n"
    "                                  print (or write) the public key PEM of an existing\n"
    "                                  signing key (never creates one: the service does)\n"
    "FILTERS: --tenant T --session N --request N --type TYPE --reason R\n"
    "         --since NS --until NS (UTC ns since the epoch; since <= time < until)\n"
    "query, stats, tail, export and prove trust the files: run verify first.\n";

// Usage prints the usage (no error) or the error and where the usage is; returns the exit code.
int Usage(const std::string& error) {
  if (error.empty()) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  std::fprintf(stderr, "kvguard audit: %s (kvguard audit --help: usage)\n", error.c_str());
  return 2;
}

int Fail(const std::string& command, std::string_view message) {
  std::fprintf(stderr, "kvguard audit %s: %.*s\n", command.c_str(),
               static_cast<int>(message.size()), message.data());
  return 1;
}

int Fail(const std::string& command, const absl::Status& s) {
  return Fail(command, std::string(s.message()));
}

absl::StatusOr<std::string> ReadFile(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", what, " ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read ", what, " ", path));
  return ss.str();
}

// Flags is every flag any audit command takes; each command refuses those it does not use.
struct Flags {
  std::string dir;
  std::string pubkey, witness, save_witness, proof, signing_key, out, format, record, from, note;
  std::optional<uint64_t> seq;
  audit::RecordFilter filter;
  std::optional<absl::Duration> max_age;
  std::optional<absl::Time> now;
  bool json = false, follow = false, allow_unsigned_tail = false;
  int lines = 10;
  std::vector<std::string> given;  // the flags given, for "does not take" errors
};

// ParseFlags parses `argv` into `f`; returns a usage error message, or "".
std::string ParseFlags(const std::vector<std::string>& argv, Flags* f) {
  Args a(argv);
  auto u64 = [&](const char* name, std::optional<uint64_t>* out) -> std::string {
    std::string v;
    if (absl::Status s = a.Value(&v); !s.ok()) return std::string(s.message());
    uint64_t n = 0;
    if (!absl::SimpleAtoi(v, &n)) return absl::StrCat(name, " '", v, "' is not a number");
    *out = n;
    return "";
  };
  auto i64 = [&](const char* name, std::optional<int64_t>* out) -> std::string {
    std::string v;
    if (absl::Status s = a.Value(&v); !s.ok()) return std::string(s.message());
    int64_t n = 0;
    if (!absl::SimpleAtoi(v, &n)) {
      return absl::StrCat(name, " '", v, "' is not a time in ns since the epoch");
    }
    *out = n;
    return "";
  };
  auto str = [&](std::string* out) -> std::string {
    absl::Status s = a.Value(out);
    if (!s.ok()) return std::string(s.message());
    return "";
  };
  auto opt_str = [&](std::optional<std::string>* out) -> std::string {
    std::string v;
    if (absl::Status s = a.Value(&v); !s.ok()) return std::string(s.message());
    *out = v;
    return "";
  };
  while (!a.done()) {
    const std::string arg = a.peek();
    std::string error;
    const std::string name = arg.substr(0, arg.find('='));
    if (!arg.starts_with("-")) {
      if (!f->dir.empty()) return absl::StrCat("unexpected argument '", arg, "'");
      f->dir = arg;
      a.Skip();
      continue;
    }
    f->given.push_back(name);
    if (a.Flag("--pubkey")) {
      error = str(&f->pubkey);
    } else if (a.Flag("--witness")) {
      error = str(&f->witness);
    } else if (a.Flag("--save-witness")) {
      error = str(&f->save_witness);
    } else if (a.Flag("--note")) {
      error = str(&f->note);
    } else if (a.Flag("--from")) {
      error = str(&f->from);
    } else if (a.Flag("--proof")) {
      error = str(&f->proof);
    } else if (a.Flag("--record")) {
      error = str(&f->record);
    } else if (a.Flag("--signing-key")) {
      error = str(&f->signing_key);
    } else if (a.Flag("--out")) {
      error = str(&f->out);
    } else if (a.Flag("--format")) {
      error = str(&f->format);
    } else if (a.Flag("--seq")) {
      error = u64("--seq", &f->seq);
    } else if (a.Flag("--tenant")) {
      error = opt_str(&f->filter.tenant);
    } else if (a.Flag("--session")) {
      error = u64("--session", &f->filter.session);
    } else if (a.Flag("--request")) {
      error = u64("--request", &f->filter.request);
    } else if (a.Flag("--type")) {
      error = opt_str(&f->filter.type);
      if (error.empty() && !audit::IsEventType(*f->filter.type)) {
        error = absl::StrCat("unknown event type '", *f->filter.type, "'");
      }
    } else if (a.Flag("--reason")) {
      error = opt_str(&f->filter.reason);
    } else if (a.Flag("--since")) {
      error = i64("--since", &f->filter.since_ns);
    } else if (a.Flag("--until")) {
      error = i64("--until", &f->filter.until_ns);
    } else if (a.Flag("--json")) {
      f->json = true;
    } else if (a.Flag("--allow-unsigned-tail")) {
      f->allow_unsigned_tail = true;
    } else if (a.Flag("--max-age")) {
      std::string v;
      absl::Duration d;
      error = str(&v);
      if (error.empty() && (!absl::ParseDuration(v, &d) || d <= absl::ZeroDuration())) {
        error = absl::StrCat("--max-age '", v, "' is not a positive duration (e.g. 90s, 5m, 1h)");
      }
      if (error.empty()) f->max_age = d;
    } else if (a.Flag("--now")) {
      std::string v, parse_error;
      int64_t ns = 0;
      absl::Time t;
      error = str(&v);
      if (error.empty() && absl::SimpleAtoi(v, &ns)) {
        f->now = absl::FromUnixNanos(ns);
      } else if (error.empty() && absl::ParseTime(absl::RFC3339_full, v, &t, &parse_error)) {
        f->now = t;
      } else if (error.empty()) {
        error = absl::StrCat("--now '", v, "' is neither ns since the epoch nor RFC 3339 (",
                             parse_error, ")");
      }
    } else if (a.Flag("-f") || a.Flag("--follow")) {
      f->follow = true;
    } else if (a.Flag("-n")) {
      if (absl::Status s = a.Int(&f->lines, 0, 1 << 24); !s.ok()) error = std::string(s.message());
    } else {
      return absl::StrCat("unknown argument '", arg, "'");
    }
    if (!error.empty()) return error;
  }
  return "";
}

constexpr std::string_view kFilterFlags[] = {"--tenant", "--session", "--request", "--type",
                                             "--reason", "--since",   "--until"};

// WithFilters returns `flags` and the filter flags.
std::vector<std::string_view> WithFilters(std::initializer_list<std::string_view> flags) {
  std::vector<std::string_view> out(std::begin(kFilterFlags), std::end(kFilterFlags));
  out.insert(out.end(), flags.begin(), flags.end());
  return out;
}

// Printable escapes control characters so that one record stays on one table row.
std::string Printable(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '\n') {
      out += "\\n";
    } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      out += absl::StrFormat("\\x%02x", static_cast<int>(c));
    } else {
      out.push_back(c);
    }
  }
  return out;
}

// Row returns the table cells of a record: time, seq, type, tenant, request, reason, detail.
std::vector<std::string> Row(const audit::Line& r) {
  const audit::Event& e = r.event;
  return {audit::FormatTime(e.time_ns),
          absl::StrCat(r.seq),
          e.type,
          e.tenant ? Printable(*e.tenant) : "-",
          e.request ? absl::StrCat(*e.request) : "-",
          e.reason ? Printable(*e.reason) : "-",
          Printable(audit::Describe(e))};
}

// PrintTable prints `rows` under `header`, each column as wide as its widest cell (the last
// column unpadded); columns listed in `right` are right-aligned.
void PrintTable(const std::vector<std::string>& header,
                const std::vector<std::vector<std::string>>& rows,
                std::initializer_list<size_t> right = {}) {
  std::vector<size_t> width(header.size());
  for (size_t c = 0; c < header.size(); ++c) width[c] = header[c].size();
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  auto print = [&](const std::vector<std::string>& row) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      const bool last = c + 1 == row.size();
      const size_t pad = width[c] - std::min(width[c], row[c].size());
      const bool r = std::find(right.begin(), right.end(), c) != right.end();
      if (r) line.append(pad, ' ');
      line += row[c];
      if (!r && !last) line.append(pad, ' ');
      if (!last) line += "  ";
    }
    std::printf("%s\n", line.c_str());
  };
  print(header);
  for (const auto& row : rows) print(row);
}

const std::vector<std::string> kRecordHeader = {"time",    "seq",    "type",  "tenant",
                                                "request", "reason", "detail"};

// PrintVerdict prints `judgement` on `report` (null: unreadable) as a line or JSON; returns the
// exit code.
int PrintVerdict(const Flags& f, const audit::VerifyReport* report,
                 const audit::Judgement& judgement) {
  if (f.json) {
    std::fputs(audit::ReportJson(report, judgement).c_str(), stdout);
  } else if (report == nullptr) {
    std::fprintf(stderr, "kvguard audit verify: unreadable: %s\n", judgement.why.c_str());
  } else {
    std::printf("%s\n", audit::Summary(*report, judgement).c_str());
  }
  return audit::ExitCode(judgement.verdict);
}

int Unreadable(const Flags& f, const absl::Status& why) {
  return PrintVerdict(f, nullptr, {audit::Verdict::kUnreadable, std::string(why.message())});
}

// ReadWitness returns the checkpoint in the witness file `path`, or an error naming it.
absl::StatusOr<audit::Checkpoint> ReadWitness(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path, "witness");
  if (!text.ok()) return text.status();
  absl::StatusOr<audit::Checkpoint> w = audit::ParseWitness(*text);
  if (!w.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("witness ", path, ": ", w.status().message()));
  }
  return w;
}

// SaveWitness replaces `path` with `line` (through a temporary file and a rename, so a reader
// never sees half a witness).
absl::Status SaveWitness(const std::string& path, const std::string& line) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << line << "\n";
    if (!out.flush()) return absl::UnavailableError(absl::StrCat("cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

int Verify(const Flags& f) {
  if (f.pubkey.empty()) return Usage("verify needs --pubkey FILE (the log's public key)");
  if (f.now && !f.max_age) return Usage("verify: --now is only read with --max-age");
  // An existing --save-witness file is the witness: what was saved there is never replaced by
  // an older checkpoint, nor by one of another history.
  std::string witness_path = f.witness;
  if (!f.save_witness.empty() && access(f.save_witness.c_str(), F_OK) == 0) {
    if (!f.witness.empty() && f.witness != f.save_witness) {
      return Usage(absl::StrCat("verify: --save-witness ", f.save_witness,
                                " exists and is not the --witness; give it as --witness (or "
                                "alone: it is then read as the witness)"));
    }
    witness_path = f.save_witness;
  }
  absl::StatusOr<audit::VerifyingKey> key = audit::VerifyingKey::LoadFile(f.pubkey);
  if (!key.ok()) return Unreadable(f, key.status());
  audit::VerifyOptions options;
  if (!witness_path.empty()) {
    absl::StatusOr<audit::Checkpoint> w = ReadWitness(witness_path);
    if (!w.ok()) return Unreadable(f, w.status());
    options.witness = *w;
  }
  absl::StatusOr<audit::VerifyReport> report = audit::VerifyLog(f.dir, *key, options);
  if (!report.ok()) return Unreadable(f, report.status());
  audit::JudgeOptions judge;
  judge.allow_unsigned_tail = f.allow_unsigned_tail;
  if (f.max_age) {
    judge.max_age_ns = absl::ToInt64Nanoseconds(*f.max_age);
    judge.now_ns = absl::ToUnixNanos(f.now.value_or(absl::Now()));
  }
  const audit::Judgement judgement = audit::Judge(*report, judge);
  if (judgement.verdict == audit::Verdict::kValid && !f.save_witness.empty()) {
    // VerifyLog failed a log whose checkpoints stop below the witness, so this cannot move
    // the witness backwards; the check stays here too, where the file is written.
    if (options.witness && report->last_checkpoint->size < options.witness->size) {
      return Fail("verify", "--save-witness: refusing to move the witness backwards");
    }
    if (absl::Status s = SaveWitness(f.save_witness, report->last_checkpoint_line); !s.ok()) {
      return Fail("verify", s);
    }
  }
  return PrintVerdict(f, &*report, judgement);
}

int QueryCommand(const Flags& f) {
  std::vector<std::vector<std::string>> rows;
  absl::Status s =
      audit::ScanRecords(f.dir, f.filter, [&](const audit::Line& record, std::string_view line) {
        if (f.json) {
          std::fwrite(line.data(), 1, line.size(), stdout);
          std::fputc('\n', stdout);
        } else {
          rows.push_back(Row(record));
        }
        return absl::OkStatus();
      });
  if (!s.ok()) return Fail("query", s);
  if (!f.json) PrintTable(kRecordHeader, rows, {1, 4});
  return 0;
}

int Stats(const Flags& f) {
  absl::StatusOr<std::vector<audit::ViolationCount>> counts =
      audit::ViolationStats(f.dir, f.filter);
  if (!counts.ok()) return Fail("stats", counts.status());
  std::vector<std::vector<std::string>> rows;
  for (const audit::ViolationCount& c : *counts) {
    rows.push_back({audit::FormatTime(c.hour_ns).substr(0, 13) + ":00Z",
                    c.tenant.empty() ? "-" : Printable(c.tenant), c.type,
                    c.reason.empty() ? "-" : Printable(c.reason), absl::StrCat(c.count)});
  }
  PrintTable({"hour", "tenant", "type", "reason", "count"}, rows, {4});
  return 0;
}

int Tail(const Flags& f) {
  audit::LogFollower follower(f.dir);
  std::deque<std::vector<std::string>> last;
  absl::StatusOr<uint64_t> n = follower.Poll([&](const audit::Line& record, std::string_view) {
    if (f.lines == 0) return;
    last.push_back(Row(record));
    if (last.size() > static_cast<size_t>(f.lines)) last.pop_front();
  });
  if (!n.ok()) return Fail("tail", n.status());
  PrintTable(kRecordHeader, {last.begin(), last.end()}, {1, 4});
  std::fflush(stdout);
  while (f.follow) {
    usleep(250 * 1000);
    n = follower.Poll([&](const audit::Line& record, std::string_view) {
      std::vector<std::string> row = Row(record);
      std::string line;
      for (const std::string& cell : row) absl::StrAppend(&line, line.empty() ? "" : "  ", cell);
      std::printf("%s\n", line.c_str());
    });
    if (!n.ok()) return Fail("tail", n.status());
    if (*n > 0) std::fflush(stdout);
  }
  return 0;
}

int Export(const Flags& f) {
  audit::ExportFormat format;
  if (f.format == "csv") {
    format = audit::ExportFormat::kCsv;
  } else if (f.format == "jsonl") {
    format = audit::ExportFormat::kJsonl;
  } else if (f.format.empty()) {
    return Usage("export needs --format csv|jsonl");
  } else {
    return Usage(absl::StrCat("unknown export format '", f.format, "' (csv or jsonl)"));
  }
  absl::Status s = audit::ExportRecords(f.dir, f.filter, format, [](std::string_view chunk) {
    std::fwrite(chunk.data(), 1, chunk.size(), stdout);
  });
  if (!s.ok()) return Fail("export", s);
  return 0;
}

// WriteOut writes `text` to f.out, or to stdout without --out; returns the exit code.
int WriteOut(const Flags& f, const std::string& command, const std::string& text) {
  if (f.out.empty()) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
  }
  std::ofstream out(f.out, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out.flush()) return Fail(command, absl::StrCat("cannot write ", f.out));
  return 0;
}

int Prove(const Flags& f) {
  if (!f.seq) return Usage("prove needs --seq N");
  absl::StatusOr<std::string> proof = audit::ProveRecord(f.dir, *f.seq);
  if (!proof.ok()) return Fail("prove", proof.status());
  return WriteOut(f, "prove", *proof);
}

int CheckProofCommand(const Flags& f) {
  if (f.pubkey.empty()) return Usage("check-proof needs --pubkey FILE");
  if (f.proof.empty()) return Usage("check-proof needs --proof FILE");
  absl::StatusOr<audit::VerifyingKey> key = audit::VerifyingKey::LoadFile(f.pubkey);
  if (!key.ok()) return Fail("check-proof", key.status());
  absl::StatusOr<std::string> proof = ReadFile(f.proof, "proof");
  if (!proof.ok()) return Fail("check-proof", proof.status());
  std::optional<std::string> record;
  if (!f.record.empty()) {
    absl::StatusOr<std::string> text = ReadFile(f.record, "record");
    if (!text.ok()) return Fail("check-proof", text.status());
    record = std::string(absl::StripTrailingAsciiWhitespace(*text));
  }
  absl::StatusOr<audit::ProvenRecord> proven = audit::CheckProof(
      *proof, record ? std::optional<std::string_view>(*record) : std::nullopt, *key);
  if (!proven.ok()) {
    std::printf("invalid: %s\n", std::string(proven.status().message()).c_str());
    return 1;
  }
  const audit::Line& r = proven->record;
  std::printf(
      "valid: record seq %llu (%s%s) is in the first %llu records of log %s, as signed by key "
      "%s\n",
      static_cast<unsigned long long>(r.seq), r.event.type.c_str(),
      r.event.tenant ? (", tenant " + Printable(*r.event.tenant)).c_str() : "",
      static_cast<unsigned long long>(proven->checkpoint.size), proven->checkpoint.log_id.c_str(),
      proven->checkpoint.key_fp.c_str());
  return 0;
}

int ProveConsistencyCommand(const Flags& f) {
  if (f.from.empty()) return Usage("prove-consistency needs --from FILE (a checkpoint line)");
  absl::StatusOr<audit::Checkpoint> first = ReadWitness(f.from);
  if (!first.ok()) return Fail("prove-consistency", first.status());
  absl::StatusOr<std::string> proof = audit::ProveConsistency(f.dir, *first);
  if (!proof.ok()) return Fail("prove-consistency", proof.status());
  return WriteOut(f, "prove-consistency", *proof);
}

int CheckConsistencyCommand(const Flags& f) {
  if (f.pubkey.empty()) return Usage("check-consistency needs --pubkey FILE");
  if (f.proof.empty()) return Usage("check-consistency needs --proof FILE");
  absl::StatusOr<audit::VerifyingKey> key = audit::VerifyingKey::LoadFile(f.pubkey);
  if (!key.ok()) return Fail("check-consistency", key.status());
  absl::StatusOr<std::string> proof = ReadFile(f.proof, "proof");
  if (!proof.ok()) return Fail("check-consistency", proof.status());
  std::optional<audit::Checkpoint> witness;
  if (!f.witness.empty()) {
    absl::StatusOr<audit::Checkpoint> w = ReadWitness(f.witness);
    if (!w.ok()) return Fail("check-consistency", w.status());
    witness = *w;
  }
  absl::StatusOr<audit::ProvenConsistency> proven = audit::CheckConsistency(*proof, *key, witness);
  if (!proven.ok()) {
    std::printf("inconsistent: %s\n", std::string(proven.status().message()).c_str());
    return 1;
  }
  std::printf(
      "consistent: the first %llu records of log %s (checkpoint of %s) are the first of its %llu "
      "(checkpoint of %s), as signed by key %s\n",
      static_cast<unsigned long long>(proven->first.size), proven->first.log_id.c_str(),
      audit::FormatTime(proven->first.time_ns).c_str(),
      static_cast<unsigned long long>(proven->second.size),
      audit::FormatTime(proven->second.time_ns).c_str(), proven->second.key_fp.c_str());
  return 0;
}

int CheckNoteCommand(const Flags& f) {
  if (f.pubkey.empty()) return Usage("check-note needs --pubkey FILE");
  if (f.note.empty()) return Usage("check-note needs --note FILE");
  absl::StatusOr<audit::VerifyingKey> key = audit::VerifyingKey::LoadFile(f.pubkey);
  if (!key.ok()) return Fail("check-note", key.status());
  absl::StatusOr<std::string> note = ReadFile(f.note, "note");
  if (!note.ok()) return Fail("check-note", note.status());
  absl::StatusOr<audit::NoteCheckpoint> c = audit::CheckCheckpointNote(*note, "", *key);
  if (!c.ok()) {
    std::printf("invalid: %s\n", std::string(c.status().message()).c_str());
    return 1;
  }
  std::printf("valid: %s, %llu records, root %s; verifier key %s\n", c->origin.c_str(),
              static_cast<unsigned long long>(c->size), audit::ToHex(c->root).c_str(),
              audit::NoteVerifierKey(c->origin, key->PublicKeyRaw()).c_str());
  return 0;
}

int Pubkey(const Flags& f) {
  if (f.signing_key.empty()) return Usage("pubkey needs --signing-key FILE");
  // Never create one here: a mistyped path would print the public key of a brand-new key.
  if (access(f.signing_key.c_str(), F_OK) != 0) {
    return Fail("pubkey", absl::NotFoundError(absl::StrCat(
                              "no signing key at ", f.signing_key,
                              " (the service creates it at first start with --audit-log)")));
  }
  absl::StatusOr<std::unique_ptr<audit::SigningKey>> key =
      audit::SigningKey::LoadOrCreate(f.signing_key);
  if (!key.ok()) return Fail("pubkey", key.status());
  const std::string pem = (*key)->PublicKeyPem();
  if (f.out.empty()) {
    std::fputs(pem.c_str(), stdout);
    return 0;
  }
  std::ofstream out(f.out, std::ios::binary | std::ios::trunc);
  out << pem;
  if (!out.flush()) return Fail("pubkey", absl::StrCat("cannot write ", f.out));
  std::printf("wrote the public key (fingerprint %s) to %s\n", (*key)->Fingerprint().c_str(),
              f.out.c_str());
  return 0;
}

}  // namespace

int RunAudit(const std::vector<std::string>& argv) {
  if (argv.empty()) return Usage("which audit command?");
  const std::string& command = argv[0];
  if (command == "--help" || command == "-h" || command == "help") return Usage("");
  Flags f;
  const std::vector<std::string> rest(argv.begin() + 1, argv.end());
  if (std::find(rest.begin(), rest.end(), "--help") != rest.end()) return Usage("");
  if (std::string error = ParseFlags(rest, &f); !error.empty()) {
    return Usage(absl::StrCat(command, ": ", error));
  }
  std::string error;
  auto check = [&](std::vector<std::string_view> allowed, bool takes_dir) {
    for (const std::string& g : f.given) {
      if (std::find(allowed.begin(), allowed.end(), g) == allowed.end()) {
        error = absl::StrCat(command, " does not take ", g);
        return false;
      }
    }
    if (takes_dir && f.dir.empty()) error = absl::StrCat(command, " needs a log directory");
    if (!takes_dir && !f.dir.empty()) error = absl::StrCat("unexpected argument '", f.dir, "'");
    return error.empty();
  };
  int (*run)(const Flags&) = nullptr;
  if (command == "verify") {
    if (check({"--pubkey", "--witness", "--save-witness", "--allow-unsigned-tail", "--max-age",
               "--now", "--json"},
              true)) {
      run = Verify;
    }
  } else if (command == "query") {
    if (check(WithFilters({"--json"}), true)) run = QueryCommand;
  } else if (command == "stats") {
    if (check(WithFilters({}), true)) run = Stats;
  } else if (command == "tail") {
    if (check({"-n", "-f", "--follow"}, true)) run = Tail;
  } else if (command == "export") {
    if (check(WithFilters({"--format"}), true)) run = Export;
  } else if (command == "prove") {
    if (check({"--seq", "--out"}, true)) run = Prove;
  } else if (command == "check-proof") {
    if (check({"--pubkey", "--proof", "--record"}, false)) run = CheckProofCommand;
  } else if (command == "prove-consistency") {
    if (check({"--from", "--out"}, true)) run = ProveConsistencyCommand;
  } else if (command == "check-consistency") {
    if (check({"--pubkey", "--proof", "--witness"}, false)) run = CheckConsistencyCommand;
  } else if (command == "check-note") {
    if (check({"--pubkey", "--note"}, false)) run = CheckNoteCommand;
  } else if (command == "pubkey") {
    if (check({"--signing-key", "--out"}, false)) run = Pubkey;
  } else {
    return Usage(absl::StrCat("unknown audit command '", command, "'"));
  }
  if (run == nullptr) return Usage(error);
  return run(f);
}

}  // namespace kvguard::tools
