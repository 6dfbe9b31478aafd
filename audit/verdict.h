// audit/verdict.h: what `kvguard audit verify` concludes from a VerifyReport (audit/verifier.h),
// how it says it (one line, or JSON for scripts), and its exit code. The verdicts, their exit
// codes and the JSON fields are documented for auditors in audit/README.md.
//
//   valid          0  no failure, and every record is covered by a signed checkpoint (and,
//                     with a maximum age, the log is fresh)
//   invalid        1  something is wrong: VerifyReport::failure names the first bad record
//   unsigned tail  3  no failure, but records after the last checkpoint are signed by nobody
//                     (or nothing is signed at all); --allow-unsigned-tail accepts a tail
//                     after at least one checkpoint
//   stale          4  no failure, but the last checkpoint is older than the maximum age, or
//                     two checkpoints of one run of the writer are further apart than it
//   unreadable     5  the log (or the key or witness given) could not be read at all
// (2 is the command line's usage error.)
#ifndef KVGUARD_AUDIT_VERDICT_H_
#define KVGUARD_AUDIT_VERDICT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "audit/verifier.h"

namespace kvguard::audit {

enum class Verdict { kValid, kInvalid, kUnsignedTail, kStale, kUnreadable };

// VerdictName returns "valid", "invalid", "unsigned tail", "stale" or "unreadable".
std::string_view VerdictName(Verdict v);

// ExitCode returns the exit code of `kvguard audit verify` for `v` (table above).
int ExitCode(Verdict v);

struct JudgeOptions {
  bool allow_unsigned_tail = false;
  // max_age_ns: the newest checkpoint may be at most this old at now_ns, and two checkpoints
  // of one run of the writer at most this far apart (the writer's heartbeat, plus slack).
  std::optional<int64_t> max_age_ns;
  int64_t now_ns = 0;  // UTC ns since the epoch; only read with max_age_ns
};

// Judgement is a verdict and, unless valid, why (one phrase).
struct Judgement {
  Verdict verdict = Verdict::kValid;
  std::string why;
};

// Judge returns the verdict on `report` (see the table above).
Judgement Judge(const VerifyReport& report, const JudgeOptions& options);

// Summary returns the one-line verdict, e.g. "12 files, 1,204,331 records, 2,409 checkpoints:
// valid, signed through 2026-05-01T12:00:00.000000000Z" with notes on the tail, the witness
// and recoveries, "UNSIGNED TAIL: ...", "STALE: ..." or "INVALID: " and the first failure.
std::string Summary(const VerifyReport& report, const Judgement& judgement);
// Summary(report) is Summary(report, Judge(report, {})).
std::string Summary(const VerifyReport& report);

// ReportJson returns the verdict as one JSON object (ending in '\n'), the fields audit/README.md
// lists. `report` is null for an unreadable log.
std::string ReportJson(const VerifyReport* report, const Judgement& judgement);

}  // namespace kvguard::audit

#endif  // KVGUARD_AUDIT_VERDICT_H_
