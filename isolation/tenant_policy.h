// isolation/tenant_policy.h: per-tenant isolation modes, from the tenant config file.
//
//   off      no checks: the fast path, for deployments that do not need isolation.
//   enforce  (default) every decode step verifies each request's page table (owner,
//            generation, tag) and the kernels check tags as well; a mismatch aborts the
//            request alone and is reported.
//   strict   enforce, plus: pages are zeroed on release; a session is quarantined at its
//            first violation and the tenant after `quarantine_after` violations; new
//            requests are refused while the audit sink cannot record.
// No page is ever shared across sessions in this engine (the ownership table has one owner
// per page), so "the strictest mode among a page's users" is always its one owner's mode.
//
// Config file (JSON; unknown keys are errors, so a typo never silently weakens a tenant; mode
// 0600 and owned by the user the process runs as, see ReadTenantsFile):
//   {"tenants": [{"name": "acme", "mode": "strict", "quarantine_after": 3},
//                {"name": "beta"}]}
#ifndef KVGUARD_ISOLATION_TENANT_POLICY_H_
#define KVGUARD_ISOLATION_TENANT_POLICY_H_

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace kvguard::isolation {

enum class Mode : uint8_t { kOff, kEnforce, kStrict };

// ModeName returns "off", "enforce" or "strict"; ParseMode the reverse (InvalidArgument else).
const char* ModeName(Mode mode);
absl::StatusOr<Mode> ParseMode(std::string_view name);

struct TenantSettings {
  std::string name;  // 1-64 of [A-Za-z0-9_.-]
  Mode mode = Mode::kEnforce;
  int quarantine_after = 3;  // strict: violations before the tenant is quarantined, >= 1
};

struct TenantPolicy {
  std::vector<TenantSettings> tenants;  // tenant id = index + 1

  // Default returns one tenant, "default", in enforce mode.
  static TenantPolicy Default();
  // Parse reads the JSON above. InvalidArgument naming the field for malformed JSON, unknown
  // or mistyped keys, bad or duplicate names, unknown modes, or an out-of-range limit.
  // `extension_keys` are per-tenant keys that a layer above owns (the service's API keys and
  // limits, core/service/service_config.h): they are skipped here, and that layer checks them.
  static absl::StatusOr<TenantPolicy> Parse(std::string_view json,
                                            std::span<const std::string_view> extension_keys = {});
  // ExtensionHandler receives each extension key's value as the one parse of the document
  // meets it: the tenant's index, the key and the value. An error it returns ends the parse
  // with that error.
  using ExtensionHandler = absl::FunctionRef<absl::Status(size_t tenant, std::string_view key,
                                                          const nlohmann::json& value)>;
  // Parse(json, extension_keys, on_extension) is Parse that hands the extension keys' values
  // to `on_extension` (ServiceConfig::Parse reads its keys and limits this way), so the file
  // is parsed once, by this parser, with its checks (no repeated keys, among them).
  static absl::StatusOr<TenantPolicy> Parse(std::string_view json,
                                            std::span<const std::string_view> extension_keys,
                                            ExtensionHandler on_extension);
  // LoadFile reads `path` (ReadTenantsFile) and parses it; ReadTenantsFile's errors, or the
  // parse error prefixed with the path.
  static absl::StatusOr<TenantPolicy> LoadFile(const std::string& path);
};

// ReadTenantsFile returns the text of tenants file `path`, the one reader of that file (the
// service's config reads it through here too). The file decides who is which tenant and how
// strictly each is checked, so it gets the key files' checks (audit::ReadPrivateFile): a
// regular file, not a symbolic link, owned by this process's user, no access for group or
// others (chmod 600). NotFound ("cannot read tenant config PATH") if absent,
// FailedPrecondition naming what to fix, InvalidArgument past kMaxTenantsFileBytes.
inline constexpr size_t kMaxTenantsFileBytes = size_t{8} << 20;
absl::StatusOr<std::string> ReadTenantsFile(const std::string& path);

}  // namespace kvguard::isolation

#endif  // KVGUARD_ISOLATION_TENANT_POLICY_H_
