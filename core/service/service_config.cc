#include "core/service/service_config.h"

#include <openssl/crypto.h>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "audit/merkle.h"
#include "nlohmann/json.hpp"

namespace kvguard::core {
namespace {

constexpr std::string_view kExtensionKeys[] = {"api_keys", "limits"};
constexpr char kDigestPrefix[] = "sha256:";
constexpr size_t kDigestPrefixSize = sizeof(kDigestPrefix) - 1;

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
  const auto bad = [&] {
    return absl::InvalidArgumentError("must be \"sha256:\" followed by 64 hex digits");
  };
  if (text.substr(0, kDigestPrefixSize) != kDigestPrefix) return bad();
  const std::string hex(text.substr(kDigestPrefixSize));
  if (hex.size() != 64) return bad();
  for (char c : hex) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return bad();
  }
  const std::string bytes = absl::HexStringToBytes(hex);
  KeyDigest d;
  std::copy(bytes.begin(), bytes.end(), d.begin());
  return d;
}

bool DigestsEqual(const KeyDigest& a, const KeyDigest& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

absl::StatusOr<ServiceConfig> ServiceConfig::Parse(std::string_view text) {
  // The isolation layer checks the document (valid JSON, no repeated keys, known keys, names,
  // modes); only then are the service's own keys read from it.
  absl::StatusOr<isolation::TenantPolicy> policy =
      isolation::TenantPolicy::Parse(text, kExtensionKeys);
  if (!policy.ok()) return policy.status();
  const nlohmann::json doc = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  ServiceConfig config;
  config.policy = *std::move(policy);
  absl::flat_hash_set<std::string> all_digests;
  const nlohmann::json& tenants = doc["tenants"];
  for (size_t i = 0; i < tenants.size(); ++i) {
    const nlohmann::json& t = tenants[i];
    const std::string where = absl::StrCat("tenant config: tenants[", i, "]");
    ServiceTenant st;
    st.name = config.policy.tenants[i].name;
    auto keys = t.find("api_keys");
    if (keys == t.end() || !keys->is_array() || keys->empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".api_keys must be a non-empty array of \"sha256:<hex>\" digests"));
    }
    for (size_t k = 0; k < keys->size(); ++k) {
      const nlohmann::json& key = (*keys)[k];
      const std::string field = absl::StrCat(where, ".api_keys[", k, "]");
      if (!key.is_string())
        return absl::InvalidArgumentError(absl::StrCat(field, " is not a string"));
      absl::StatusOr<KeyDigest> d = ParseDigestText(key.get_ref<const std::string&>());
      if (!d.ok())
        return absl::InvalidArgumentError(absl::StrCat(field, " ", d.status().message()));
      if (!all_digests.insert(DigestText(*d)).second) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, " is already the key of a tenant (keys must be unique)"));
      }
      st.key_digests.push_back(*d);
    }
    if (auto limits = t.find("limits"); limits != t.end()) {
      if (absl::Status s = ParseLimits(*limits, where + ".limits", &st.limits); !s.ok()) return s;
    }
    config.tenants.push_back(std::move(st));
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
