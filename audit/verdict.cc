#include "audit/verdict.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "audit/query.h"
#include "nlohmann/json.hpp"

namespace kvguard::audit {
namespace {

// Seconds returns `ns` as seconds, e.g. "12.500s".
std::string Seconds(int64_t ns) { return absl::StrFormat("%.3fs", static_cast<double>(ns) / 1e9); }

std::string SignedThrough(const VerifyReport& r) {
  return r.last_checkpoint ? FormatTime(r.last_checkpoint->time_ns) : "never";
}

// Tail describes the records after the last checkpoint.
std::string Tail(const VerifyReport& r) {
  const uint64_t covered = r.records - r.uncovered;
  return absl::StrCat(
      "the last ", WithCommas(r.uncovered), r.uncovered == 1 ? " record (seq " : " records (seq ",
      covered, r.uncovered == 1 ? "" : absl::StrCat("..", r.records - 1), ") no checkpoint covers");
}

}  // namespace

std::string_view VerdictName(Verdict v) {
  switch (v) {
    case Verdict::kValid:
      return "valid";
    case Verdict::kInvalid:
      return "invalid";
    case Verdict::kUnsignedTail:
      return "unsigned tail";
    case Verdict::kStale:
      return "stale";
    case Verdict::kUnreadable:
      return "unreadable";
  }
  return "unreadable";
}

int ExitCode(Verdict v) {
  switch (v) {
    case Verdict::kValid:
      return 0;
    case Verdict::kInvalid:
      return 1;
    case Verdict::kUnsignedTail:
      return 3;
    case Verdict::kStale:
      return 4;
    case Verdict::kUnreadable:
      return 5;
  }
  return 5;
}

Judgement Judge(const VerifyReport& r, const JudgeOptions& options) {
  if (r.failure) return {Verdict::kInvalid, r.failure->ToString()};
  if (r.checkpoints == 0) {
    return {Verdict::kUnsignedTail, "no checkpoint: nothing in this log is signed yet"};
  }
  if (r.uncovered > 0 && !options.allow_unsigned_tail) {
    return {Verdict::kUnsignedTail,
            absl::StrCat(Tail(r), ": whoever can write the directory can rewrite them")};
  }
  if (options.max_age_ns) {
    const int64_t age = options.now_ns - r.last_checkpoint->time_ns;
    if (age > *options.max_age_ns) {
      return {Verdict::kStale,
              absl::StrCat("the last checkpoint (", FormatTime(r.last_checkpoint->time_ns), ") is ",
                           Seconds(age), " old, more than the maximum age ",
                           Seconds(*options.max_age_ns))};
    }
    if (r.longest_gap && r.longest_gap->ns > *options.max_age_ns) {
      return {Verdict::kStale,
              absl::StrCat("no checkpoint for ", Seconds(r.longest_gap->ns), " (",
                           FormatTime(r.longest_gap->from_ns), " to ",
                           FormatTime(r.longest_gap->to_ns), ", ", r.longest_gap->file, " line ",
                           r.longest_gap->line, ") while the writer ran: more than the maximum ",
                           "age ", Seconds(*options.max_age_ns))};
    }
  }
  return {Verdict::kValid, ""};
}

std::string Summary(const VerifyReport& r, const Judgement& j) {
  std::string s = absl::StrCat(
      WithCommas(static_cast<uint64_t>(r.files)), r.files == 1 ? " file, " : " files, ",
      WithCommas(r.records), r.records == 1 ? " record, " : " records, ", WithCommas(r.checkpoints),
      r.checkpoints == 1 ? " checkpoint: " : " checkpoints: ");
  switch (j.verdict) {
    case Verdict::kInvalid:
      return absl::StrCat(s, "INVALID: ", j.why);
    case Verdict::kUnreadable:
      return absl::StrCat("UNREADABLE: ", j.why);
    case Verdict::kUnsignedTail:
      absl::StrAppend(&s, "UNSIGNED TAIL: ", j.why);
      if (r.checkpoints > 0) {
        absl::StrAppend(&s, "; records before it are valid, signed through ", SignedThrough(r));
      }
      break;
    case Verdict::kStale:
      absl::StrAppend(&s, "STALE: ", j.why);
      break;
    case Verdict::kValid:
      if (r.uncovered == 0) {
        absl::StrAppend(&s, "all valid, every record signed; signed through ", SignedThrough(r));
      } else {
        absl::StrAppend(&s, "valid, signed through ", SignedThrough(r), "; ", Tail(r),
                        " (unsigned tail allowed)");
      }
      break;
  }
  if (r.witness_checked) absl::StrAppend(&s, "; extends the witness checkpoint");
  if (!r.recoveries.empty()) {
    absl::StrAppend(&s, "; ", r.recoveries.size(),
                    r.recoveries.size() == 1 ? " recovery" : " recoveries", " after a crash (seq");
    for (const RecoveryNote& n : r.recoveries) absl::StrAppend(&s, " ", n.seq);
    absl::StrAppend(&s, ")");
  }
  for (const AdoptionNote& n : r.adoptions) {
    absl::StrAppend(&s, "; records ", n.first, "..", n.last,
                    " were taken over unsigned at a restart (tail_adopted, seq ", n.seq,
                    "): written before a crash or added while the service was down");
  }
  if (!r.torn_files.empty()) {
    absl::StrAppend(&s, "; torn bytes kept in");
    for (const std::string& t : r.torn_files) absl::StrAppend(&s, " ", t);
  }
  return s;
}

std::string Summary(const VerifyReport& report) { return Summary(report, Judge(report, {})); }

std::string ReportJson(const VerifyReport* r, const Judgement& j) {
  using Json = nlohmann::ordered_json;
  Json out;
  out["verdict"] = std::string(VerdictName(j.verdict));
  out["exit_code"] = ExitCode(j.verdict);
  out["why"] = j.why;
  if (r == nullptr) return out.dump() + "\n";
  out["log_id"] = r->log_id;
  out["files"] = r->files;
  out["records"] = r->records;
  out["checkpoints"] = r->checkpoints;
  out["covered"] = r->records - r->uncovered;
  out["uncovered"] = r->uncovered;
  Json bad = nullptr;
  if (r->failure) {
    const VerifyFailure& f = *r->failure;
    bad = Json{{"file", f.file},
               {"line", f.line},
               {"seq", f.seq ? Json(*f.seq) : Json(nullptr)},
               {"checkpoint", f.checkpoint},
               {"why", f.why}};
  }
  out["first_bad"] = bad;
  auto time = [](bool set, int64_t ns) { return set ? Json(ns) : Json(nullptr); };
  const bool covered = r->last_checkpoint.has_value() && r->last_checkpoint->size > 0;
  out["time_range"] = Json{
      {"first_record_ns", time(r->records > 0, r->first_record_ns)},
      {"last_record_ns", time(r->records > 0, r->last_record_ns)},
      {"covered_through_ns", time(covered, r->covered_through_ns)},
      {"signed_through_ns",
       time(r->last_checkpoint.has_value(), r->last_checkpoint ? r->last_checkpoint->time_ns : 0)}};
  out["longest_checkpoint_gap_ns"] =
      time(r->longest_gap.has_value(), r->longest_gap ? r->longest_gap->ns : 0);
  out["witness_checked"] = r->witness_checked;
  out["last_checkpoint"] = r->last_checkpoint_line.empty()
                               ? Json(nullptr)
                               : Json::parse(r->last_checkpoint_line, nullptr, false);
  Json recoveries = Json::array();
  for (const RecoveryNote& n : r->recoveries) {
    recoveries.push_back(Json{{"seq", n.seq},
                              {"file", n.file},
                              {"line", n.line},
                              {"torn_file", n.torn_file},
                              {"detail", n.detail}});
  }
  out["recoveries"] = recoveries;
  Json adoptions = Json::array();
  for (const AdoptionNote& n : r->adoptions) {
    adoptions.push_back(Json{
        {"seq", n.seq}, {"first", n.first}, {"last", n.last}, {"file", n.file}, {"line", n.line}});
  }
  out["adopted_unsigned"] = adoptions;
  out["torn_files"] = r->torn_files;
  return out.dump() + "\n";
}

}  // namespace kvguard::audit
