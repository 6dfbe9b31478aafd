#include "audit/record.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <span>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "audit/hex.h"
#include "nlohmann/json.hpp"

namespace kvguard::audit {
namespace {

constexpr std::string_view kRecordDomain = "kvguard/audit/record/v1\n";
constexpr std::string_view kCheckpointDomain = "kvguard/audit/checkpoint/v1\n";
constexpr std::string_view kHashKey = ",\"hash\":\"";

constexpr std::array<std::string_view, 12> kEventTypes = {
    "service_start",       "service_stop",       "violation",     "release_rejected",
    "session_quarantined", "tenant_quarantined", "mode_change",   "key_rotated",
    "log_rotation",        "recovery",           "config_change", "tail_adopted"};

// Quote returns `v` as a JSON string. Invalid UTF-8 (an operator's name, a detail) becomes
// U+FFFD rather than an exception: a record is always written, and stays canonical (parsing
// and quoting it again gives the same bytes).
std::string Quote(const std::string& v) {
  return nlohmann::json(v).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void AddString(std::string* out, std::string_view key, const std::optional<std::string>& v) {
  if (!v) return;
  absl::StrAppend(out, ",\"", std::string(key), "\":", Quote(*v));
}

template <class T>
void AddInt(std::string* out, std::string_view key, const std::optional<T>& v) {
  if (!v) return;
  absl::StrAppend(out, ",\"", std::string(key), "\":", *v);
}

// Body returns the record's bytes up to (not including) ,"hash":".
std::string Body(const Event& e, uint64_t seq, std::string_view instance, const Hash& prev) {
  std::string s =
      absl::StrCat("{\"v\":", kFormatVersion, ",\"seq\":", seq, ",\"time_ns\":", e.time_ns,
                   ",\"type\":", Quote(e.type), ",\"instance\":", Quote(std::string(instance)));
  AddString(&s, "tenant", e.tenant);
  AddInt(&s, "session", e.session);
  AddInt(&s, "request", e.request);
  AddInt(&s, "page", e.page);
  AddInt(&s, "expected_generation", e.expected_generation);
  AddInt(&s, "actual_generation", e.actual_generation);
  AddString(&s, "actual_tenant", e.actual_tenant);
  AddInt(&s, "actual_session", e.actual_session);
  AddString(&s, "reason", e.reason);
  AddString(&s, "mode", e.mode);
  AddString(&s, "mode_from", e.mode_from);
  AddString(&s, "mode_to", e.mode_to);
  AddString(&s, "actor", e.actor);
  AddString(&s, "key_fingerprint", e.key_fingerprint);
  AddString(&s, "detail", e.detail);
  absl::StrAppend(&s, ",\"prev\":\"", ToHex(prev), "\"");
  return s;
}

void PutBe64(std::string* out, uint64_t v) {
  for (int i = 7; i >= 0; --i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// Typed getters over a parsed object: each returns false (and sets *error) on a mistyped or
// missing required field.
bool GetUint(const nlohmann::json& j, const char* key, bool required, std::optional<uint64_t>* out,
             std::string* error) {
  auto it = j.find(key);
  if (it == j.end()) {
    if (required) *error = absl::StrCat("missing field '", key, "'");
    return !required;
  }
  if (!it->is_number_unsigned() && !(it->is_number_integer() && it->get<int64_t>() >= 0)) {
    *error = absl::StrCat("field '", key, "' is not a non-negative integer");
    return false;
  }
  *out = it->get<uint64_t>();
  return true;
}

bool GetInt(const nlohmann::json& j, const char* key, std::optional<int64_t>* out,
            std::string* error) {
  auto it = j.find(key);
  if (it == j.end()) return true;
  if (!it->is_number_integer()) {
    *error = absl::StrCat("field '", key, "' is not an integer");
    return false;
  }
  *out = it->get<int64_t>();
  return true;
}

bool GetString(const nlohmann::json& j, const char* key, bool required,
               std::optional<std::string>* out, std::string* error) {
  auto it = j.find(key);
  if (it == j.end()) {
    if (required) *error = absl::StrCat("missing field '", key, "'");
    return !required;
  }
  if (!it->is_string()) {
    *error = absl::StrCat("field '", key, "' is not a string");
    return false;
  }
  *out = it->get<std::string>();
  return true;
}

bool GetHash(const nlohmann::json& j, const char* key, Hash* out, std::string* error) {
  std::optional<std::string> hex;
  if (!GetString(j, key, true, &hex, error)) return false;
  absl::StatusOr<Hash> h = HashFromHex(*hex);
  if (!h.ok()) {
    *error = absl::StrCat("field '", key, "' is not 64 lowercase hex digits");
    return false;
  }
  *out = *h;
  return true;
}

absl::StatusOr<Line> ParseCheckpointLine(const nlohmann::json& j, std::string_view line) {
  std::string error;
  std::optional<std::string> log_id, key_fp, sig_hex;
  std::optional<uint64_t> size;
  std::optional<int64_t> time_ns;
  Line out;
  out.kind = Line::Kind::kCheckpoint;
  Checkpoint& c = out.checkpoint;
  if (!GetString(j, "log_id", true, &log_id, &error) || !GetUint(j, "size", true, &size, &error) ||
      !GetHash(j, "head", &c.head, &error) || !GetHash(j, "root", &c.root, &error) ||
      !GetInt(j, "time_ns", &time_ns, &error) || !GetString(j, "key_fp", true, &key_fp, &error) ||
      !GetString(j, "sig", true, &sig_hex, &error)) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint: ", error));
  }
  std::string sig(64, '\0');  // Ed25519
  if (!ParseLowerHex(*sig_hex, std::span(reinterpret_cast<uint8_t*>(sig.data()), sig.size()))) {
    return absl::InvalidArgumentError("checkpoint: 'sig' is not 128 lowercase hex digits");
  }
  c.log_id = *log_id;
  c.size = *size;
  c.time_ns = time_ns.value_or(0);
  c.key_fp = *key_fp;
  c.sig = std::move(sig);
  if (FormatCheckpoint(c) != line) {
    return absl::InvalidArgumentError("checkpoint: not in the writer's canonical form");
  }
  return out;
}

}  // namespace

bool IsEventType(std::string_view type) {
  for (std::string_view t : kEventTypes) {
    if (t == type) return true;
  }
  return false;
}

std::string TailAdoptedDetail(uint64_t first, uint64_t last) {
  return absl::StrCat("seq ", first, "..", last, " (", last - first + 1,
                      " records): no checkpoint covered them when this writer started; written "
                      "before a crash, or added while the service was down: the writer cannot "
                      "tell which");
}

Hash RecordHash(std::string_view body) { return Sha256({kRecordDomain, body}); }

std::string FormatRecord(const Event& event, uint64_t seq, std::string_view instance,
                         const Hash& prev, Hash* hash) {
  std::string line = Body(event, seq, instance, prev);
  *hash = RecordHash(line);
  absl::StrAppend(&line, std::string(kHashKey), ToHex(*hash), "\"}");
  return line;
}

std::string CheckpointMessage(std::string_view log_id, uint64_t size, const Hash& head,
                              const Hash& root, int64_t time_ns) {
  std::string m = absl::StrCat(std::string(kCheckpointDomain), std::string(log_id), "\n");
  PutBe64(&m, size);
  m.append(reinterpret_cast<const char*>(head.data()), head.size());
  m.append(reinterpret_cast<const char*>(root.data()), root.size());
  PutBe64(&m, static_cast<uint64_t>(time_ns));
  return m;
}

std::string FormatCheckpoint(const Checkpoint& c) {
  return absl::StrCat("{\"v\":", kFormatVersion,
                      ",\"type\":\"checkpoint\",\"log_id\":", Quote(c.log_id), ",\"size\":", c.size,
                      ",\"head\":\"", ToHex(c.head), "\",\"root\":\"", ToHex(c.root),
                      "\",\"time_ns\":", c.time_ns, ",\"key_fp\":", Quote(c.key_fp), ",\"sig\":\"",
                      absl::BytesToHexString(c.sig), "\"}");
}

absl::StatusOr<Line> ParseLine(std::string_view line) {
  const nlohmann::json j = nlohmann::json::parse(line.begin(), line.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("not a JSON object");
  }
  auto v = j.find("v");
  if (v == j.end() || !v->is_number_integer() || v->get<int64_t>() != kFormatVersion) {
    return absl::InvalidArgumentError(absl::StrCat("not format version ", kFormatVersion));
  }
  auto type = j.find("type");
  if (type == j.end() || !type->is_string()) {
    return absl::InvalidArgumentError("missing field 'type'");
  }
  if (type->get_ref<const std::string&>() == "checkpoint") return ParseCheckpointLine(j, line);
  if (!IsEventType(type->get_ref<const std::string&>())) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown event type '", type->get_ref<const std::string&>(), "'"));
  }
  const size_t cut = line.rfind(kHashKey);
  if (cut == std::string_view::npos) return absl::InvalidArgumentError("missing field 'hash'");
  Line out;
  out.body = std::string(line.substr(0, cut));
  std::string error;
  std::optional<uint64_t> seq;
  std::optional<int64_t> time_ns;
  std::optional<std::string> instance;
  Event& e = out.event;
  e.type = type->get<std::string>();
  if (!GetUint(j, "seq", true, &seq, &error) || !GetInt(j, "time_ns", &time_ns, &error) ||
      !GetString(j, "instance", true, &instance, &error) ||
      !GetHash(j, "prev", &out.prev, &error) || !GetHash(j, "hash", &out.hash, &error) ||
      !GetString(j, "tenant", false, &e.tenant, &error) ||
      !GetUint(j, "session", false, &e.session, &error) ||
      !GetUint(j, "request", false, &e.request, &error) || !GetInt(j, "page", &e.page, &error) ||
      !GetUint(j, "expected_generation", false, &e.expected_generation, &error) ||
      !GetUint(j, "actual_generation", false, &e.actual_generation, &error) ||
      !GetString(j, "actual_tenant", false, &e.actual_tenant, &error) ||
      !GetUint(j, "actual_session", false, &e.actual_session, &error) ||
      !GetString(j, "reason", false, &e.reason, &error) ||
      !GetString(j, "mode", false, &e.mode, &error) ||
      !GetString(j, "mode_from", false, &e.mode_from, &error) ||
      !GetString(j, "mode_to", false, &e.mode_to, &error) ||
      !GetString(j, "actor", false, &e.actor, &error) ||
      !GetString(j, "key_fingerprint", false, &e.key_fingerprint, &error) ||
      !GetString(j, "detail", false, &e.detail, &error)) {
    return absl::InvalidArgumentError(error);
  }
  out.seq = *seq;
  e.time_ns = time_ns.value_or(0);
  out.instance = *instance;
  // Canonical form: the body must be exactly what the writer produces for these values (no
  // extra keys, no reordering, no other spelling of the same JSON).
  if (Body(e, out.seq, out.instance, out.prev) != out.body ||
      line.substr(cut) != absl::StrCat(std::string(kHashKey), ToHex(out.hash), "\"}")) {
    return absl::InvalidArgumentError("record is not in the writer's canonical form");
  }
  out.hash_ok = RecordHash(out.body) == out.hash;
  return out;
}

}  // namespace kvguard::audit
