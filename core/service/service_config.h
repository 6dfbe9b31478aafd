// core/service/service_config.h: the tenants of `kvguard serve`: the isolation policy of each
// tenant (isolation/tenant_policy.h) plus what only the service needs: the API keys that identify
// the tenant, stored as SHA-256 digests, and the tenant's limits.
//
// One JSON file holds both (unknown keys are errors naming the field):
//   {"tenants": [
//     {"name": "acme", "mode": "strict", "quarantine_after": 3,
//      "api_keys": ["sha256:<64 lowercase hex digits>"],
//      "limits": {"concurrent_requests": 8, "tokens_per_request": 1024, "kv_page_quota": 512}},
//     {"name": "beta", "api_keys": ["sha256:..."]}]}
// `name`, `mode` and `quarantine_after` are TenantPolicy's; `api_keys` (at least one, unique
// across tenants) and `limits` (each optional, >= 1) are checked here. The bearer key of a
// request is hashed and compared with every digest in constant time; the tenant it matches is
// the request's identity, and nothing else a client sends can change it.
#ifndef KVGUARD_CORE_SERVICE_SERVICE_CONFIG_H_
#define KVGUARD_CORE_SERVICE_SERVICE_CONFIG_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "isolation/tenant_policy.h"

namespace kvguard::core {

using KeyDigest = std::array<uint8_t, 32>;

// TenantLimits bound what one tenant may hold at once.
struct TenantLimits {
  int concurrent_requests = 16;   // requests in flight (queued or running)
  int tokens_per_request = 2048;  // max_tokens ceiling; also the default max_tokens cap
  // KV pages the tenant's requests in flight may reserve together: each request reserves
  // ceil((prompt + max_tokens) / page_size) pages at admission (its worst case), released
  // when it finishes. 0: no quota beyond the pool itself.
  int kv_page_quota = 0;
};

struct ServiceTenant {
  std::string name;  // = the isolation policy's tenant name
  std::vector<KeyDigest> key_digests;
  TenantLimits limits;
};

struct ServiceConfig {
  isolation::TenantPolicy policy;      // tenant i of tenants is policy.tenants[i]
  std::vector<ServiceTenant> tenants;  // same order as policy.tenants

  // Parse reads the JSON above. InvalidArgument naming the field (e.g.
  // "tenants[1].limits.kv_page_quota must be ...") for anything malformed.
  static absl::StatusOr<ServiceConfig> Parse(std::string_view json);
  // LoadFile reads `path` through isolation::ReadTenantsFile (owner, mode 0600, no symbolic
  // link) and parses it; ReadTenantsFile's errors, or the parse error prefixed with the path.
  static absl::StatusOr<ServiceConfig> LoadFile(const std::string& path);

  // Authenticate returns the index (in tenants) of the tenant whose key is `api_key`, or
  // nullopt. Every digest is compared (CRYPTO_memcmp), whichever matches, so the time taken
  // does not depend on which tenant or which byte matched.
  std::optional<size_t> Authenticate(std::string_view api_key) const;
};

// KeyDigestOf returns SHA-256(api_key).
KeyDigest KeyDigestOf(std::string_view api_key);
// DigestText returns "sha256:<hex>", the config file's form of `digest`.
std::string DigestText(const KeyDigest& digest);
// ParseDigestText is DigestText's inverse: InvalidArgument unless "sha256:" + 64 lowercase hex
// digits (one spelling, as audit/hex.h reads hashes).
absl::StatusOr<KeyDigest> ParseDigestText(std::string_view text);

// DigestsEqual compares two digests in constant time.
bool DigestsEqual(const KeyDigest& a, const KeyDigest& b);

}  // namespace kvguard::core

#endif  // KVGUARD_CORE_SERVICE_SERVICE_CONFIG_H_
