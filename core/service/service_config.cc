#include "core/service/service_config.h"

#include <openssl/crypto.h>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "audit/hex.h"
#include "audit/merkle.h"
#include "nlohmann/json.hpp"

namespace kvguard::core {
namespace {

constexpr std::string_view kExtensionKeys[] = {"api_keys", "limits"};
constexpr char kDigestPrefix[] = "sha256:";
constexpr size_t kDigestPrefixSize = sizeof(kDigestPrefix) - 1;
constexpr char kNeedKeys[] = ".api_keys must be a non-empty array of \"sha256:<hex>\" digests";

absl::Status ParseLimit(const nlohmann::json& value, const std::string& where, int lo, int* out) {
  if (!value.is_number_integer() || value.get<int64_t>() < lo ||
      value.get<int64_t>() > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " must be an integer in [", lo, ", ", int64_t{1} << 30, "]"));
  }
  *out = static_cast<int>(value.get<int64_t>());
  return absl::OkStatus();
}

absl::Status ParseLimits(const nlohmann::json& value, const std::string& where,
                         TenantLimits* limits) {
  if (!value.is_object())
    return absl::InvalidArgumentError(absl::StrCat(where, " is not an object"));
  for (const auto& [key, v] : value.items()) {
    const std::string field = absl::StrCat(where, ".", key);
    absl::Status s;
    if (key == "concurrent_requests") {
      s = ParseLimit(v, field, 1, &limits->concurrent_requests);
    } else if (key == "tokens_per_request") {
      s = ParseLimit(v, field, 1, &limits->tokens_per_request);
    } else if (key == "kv_page_quota") {
      s = ParseLimit(v, field, 0, &limits->kv_page_quota);
    } else {
      s = absl::InvalidArgumentError(absl::StrCat(where, ": unknown key '", key, "'"));
    }
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

KeyDigest KeyDigestOf(std::string_view api_key) { return audit::Sha256({api_key}); }

std::string DigestText(const KeyDigest& digest) {
  return absl::StrCat(
      kDigestPrefix, absl::BytesToHexString(
                         std::string(reinterpret_cast<const char*>(digest.data()), digest.size())));
}

absl::StatusOr<KeyDigest> ParseDigestText(std::string_view text) {
  // One spelling, as DigestText writes it and as the audit log's hashes have (audit/hex.h).
  KeyDigest d;
  if (text.substr(0, kDigestPrefixSize) != kDigestPrefix ||
      !audit::ParseLowerHex(text.substr(kDigestPrefixSize), d)) {
    return absl::InvalidArgumentError("must be \"sha256:\" followed by 64 lowercase hex digits");
  }
  return d;
}

bool DigestsEqual(const KeyDigest& a, const KeyDigest& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

absl::StatusOr<ServiceConfig> ServiceConfig::Parse(std::string_view text) {
  // One parse, the isolation layer's (valid JSON, no repeated keys, known keys, names, modes);
  // it hands this layer the values of its own keys as it meets them.
  ServiceConfig config;
  std::vector<bool> has_keys;
  absl::flat_hash_set<std::string> all_digests;
  const auto on_extension = [&](size_t i, std::string_view key,
                                const nlohmann::json& value) -> absl::Status {
    if (config.tenants.size() <= i) {
      config.tenants.resize(i + 1);
      has_keys.resize(i + 1, false);
    }
    ServiceTenant& st = config.tenants[i];
    const std::string where = absl::StrCat("tenant config: tenants[", i, "]");
    if (key == "limits") return ParseLimits(value, where + ".limits", &st.limits);
    if (!value.is_array() || value.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(where, kNeedKeys));
    }
    for (size_t k = 0; k < value.size(); ++k) {
      const nlohmann::json& digest = value[k];
      const std::string field = absl::StrCat(where, ".api_keys[", k, "]");
      if (!digest.is_string())
        return absl::InvalidArgumentError(absl::StrCat(field, " is not a string"));
      absl::StatusOr<KeyDigest> d = ParseDigestText(digest.get_ref<const std::string&>());
      if (!d.ok())
        return absl::InvalidArgumentError(absl::StrCat(field, " ", d.status().message()));
      if (!all_digests.insert(DigestText(*d)).second) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, " is already the key of a tenant (keys must be unique)"));
      }
      st.key_digests.push_back(*d);
    }
    has_keys[i] = true;
    return absl::OkStatus();
  };
  absl::StatusOr<isolation::TenantPolicy> policy =
      isolation::TenantPolicy::Parse(text, kExtensionKeys, on_extension);
  if (!policy.ok()) return policy.status();
  config.policy = *std::move(policy);
  config.tenants.resize(config.policy.tenants.size());
  has_keys.resize(config.policy.tenants.size(), false);
  for (size_t i = 0; i < config.tenants.size(); ++i) {
    if (!has_keys[i]) {
      return absl::InvalidArgumentError(absl::StrCat("tenant config: tenants[", i, "]", kNeedKeys));
    }
    config.tenants[i].name = config.policy.tenants[i].name;
  }
  return config;
}

absl::StatusOr<ServiceConfig> ServiceConfig::LoadFile(const std::string& path) {
  absl::StatusOr<std::string> text = isolation::ReadTenantsFile(path);
  if (!text.ok()) return text.status();
  absl::StatusOr<ServiceConfig> c = Parse(*text);
  if (!c.ok()) {
    return absl::Status(c.status().code(), absl::StrCat(path, ": ", c.status().message()));
  }
  return c;
}

std::optional<size_t> ServiceConfig::Authenticate(std::string_view api_key) const {
  const KeyDigest digest = KeyDigestOf(api_key);
  std::optional<size_t> found;
  for (size_t i = 0; i < tenants.size(); ++i) {
    for (const KeyDigest& d : tenants[i].key_digests) {
      if (DigestsEqual(d, digest)) found = i;
    }
  }
  return found;
}

}  // namespace kvguard::core
