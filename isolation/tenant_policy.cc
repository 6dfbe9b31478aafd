#include "isolation/tenant_policy.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "audit/private_file.h"
#include "nlohmann/json.hpp"

namespace kvguard::isolation {
namespace {

bool ValidName(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == '-';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

const char* ModeName(Mode mode) {
  switch (mode) {
    case Mode::kOff:
      return "off";
    case Mode::kEnforce:
      return "enforce";
    case Mode::kStrict:
      return "strict";
  }
  return "?";
}

absl::StatusOr<Mode> ParseMode(std::string_view name) {
  if (name == "off") return Mode::kOff;
  if (name == "enforce") return Mode::kEnforce;
  if (name == "strict") return Mode::kStrict;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown isolation mode '", std::string(name), "' (off, enforce, strict)"));
}

TenantPolicy TenantPolicy::Default() {
  TenantPolicy p;
  p.tenants.push_back(TenantSettings{"default", Mode::kEnforce, 3});
  return p;
}

absl::StatusOr<TenantPolicy> TenantPolicy::Parse(std::string_view text,
                                                 std::span<const std::string_view> extension_keys) {
  return Parse(text, extension_keys,
               [](size_t, std::string_view, const nlohmann::json&) { return absl::OkStatus(); });
}

absl::StatusOr<TenantPolicy> TenantPolicy::Parse(std::string_view text,
                                                 std::span<const std::string_view> extension_keys,
                                                 ExtensionHandler on_extension) {
  // No exceptions: parse with allow_exceptions = false and check every type before reading.
  // JSON lets a key repeat and nlohmann keeps the last; here a repeat is an error, or
  // {"mode": "strict", "mode": "off"} would quietly run a tenant with checks off.
  std::vector<absl::flat_hash_set<std::string>> keys;  // one set per open object
  std::string repeated;
  const nlohmann::json::parser_callback_t no_repeats = [&](int /*depth*/,
                                                           nlohmann::json::parse_event_t event,
                                                           nlohmann::json& parsed) {
    if (event == nlohmann::json::parse_event_t::object_start) {
      keys.emplace_back();
    } else if (event == nlohmann::json::parse_event_t::object_end && !keys.empty()) {
      keys.pop_back();
    } else if (event == nlohmann::json::parse_event_t::key && !keys.empty() && parsed.is_string() &&
               !keys.back().insert(parsed.get_ref<const std::string&>()).second &&
               repeated.empty()) {
      repeated = parsed.get<std::string>();
    }
    return true;
  };
  const nlohmann::json doc = nlohmann::json::parse(text.begin(), text.end(), no_repeats, false);
  if (doc.is_discarded()) return absl::InvalidArgumentError("tenant config: not valid JSON");
  if (!repeated.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tenant config: key '", repeated, "' appears twice in one object"));
  }
  if (!doc.is_object()) return absl::InvalidArgumentError("tenant config: not a JSON object");
  for (const auto& [key, value] : doc.items()) {
    if (key != "tenants") {
      return absl::InvalidArgumentError(absl::StrCat("tenant config: unknown key '", key, "'"));
    }
  }
  auto it = doc.find("tenants");
  if (it == doc.end() || !it->is_array() || it->empty()) {
    return absl::InvalidArgumentError("tenant config: 'tenants' must be a non-empty array");
  }
  TenantPolicy policy;
  absl::flat_hash_set<std::string> seen;
  for (size_t i = 0; i < it->size(); ++i) {
    const nlohmann::json& t = (*it)[i];
    const std::string where = absl::StrCat("tenant config: tenants[", i, "]");
    if (!t.is_object()) return absl::InvalidArgumentError(absl::StrCat(where, " is not an object"));
    TenantSettings s;
    bool has_name = false;
    for (const auto& [key, value] : t.items()) {
      if (key == "name") {
        if (!value.is_string() || !ValidName(value.get_ref<const std::string&>())) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ".name must be 1-64 characters of [A-Za-z0-9_.-]"));
        }
        s.name = value.get<std::string>();
        has_name = true;
      } else if (key == "mode") {
        if (!value.is_string()) {
          return absl::InvalidArgumentError(absl::StrCat(where, ".mode must be a string"));
        }
        absl::StatusOr<Mode> m = ParseMode(value.get_ref<const std::string&>());
        if (!m.ok())
          return absl::InvalidArgumentError(absl::StrCat(where, ": ", m.status().message()));
        s.mode = *m;
      } else if (key == "quarantine_after") {
        if (!value.is_number_integer() || value.get<int64_t>() < 1 ||
            value.get<int64_t>() > 1000000) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ".quarantine_after must be an integer in [1, 1000000]"));
        }
        s.quarantine_after = static_cast<int>(value.get<int64_t>());
      } else if (std::find(extension_keys.begin(), extension_keys.end(), key) ==
                 extension_keys.end()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": unknown key '", key, "'"));
      } else if (absl::Status e = on_extension(i, key, value); !e.ok()) {
        return e;
      }
    }
    if (!has_name) return absl::InvalidArgumentError(absl::StrCat(where, " has no name"));
    if (!seen.insert(s.name).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": duplicate tenant '", s.name, "'"));
    }
    policy.tenants.push_back(std::move(s));
  }
  return policy;
}

absl::StatusOr<std::string> ReadTenantsFile(const std::string& path) {
  return audit::ReadPrivateFile("tenant config", path, kMaxTenantsFileBytes);
}

absl::StatusOr<TenantPolicy> TenantPolicy::LoadFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadTenantsFile(path);
  if (!text.ok()) return text.status();
  absl::StatusOr<TenantPolicy> p = Parse(*text);
  if (!p.ok())
    return absl::Status(p.status().code(), absl::StrCat(path, ": ", p.status().message()));
  return p;
}

}  // namespace kvguard::isolation
