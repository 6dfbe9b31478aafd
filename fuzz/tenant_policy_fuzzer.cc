// fuzz/tenant_policy_fuzzer.cc: the tenant config parser (isolation/tenant_policy.h). Every
// input is either a policy or an InvalidArgument naming the field; a parsed policy must hold
// only valid tenants (the parser's own rules, re-checked here) and survive a second parse of
// its canonical form unchanged.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "isolation/tenant_policy.h"
#include "nlohmann/json.hpp"

namespace {

[[noreturn]] void Fail(const std::string& why) {
  std::fprintf(stderr, "==kvguard-fuzz== ORACLE tenant-policy: %s\n", why.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using kvguard::isolation::TenantPolicy;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<TenantPolicy> p = TenantPolicy::Parse(text);
  if (!p.ok()) {
    if (p.status().code() != absl::StatusCode::kInvalidArgument) {
      Fail("refused with " + p.status().ToString() + " instead of InvalidArgument");
    }
    if (p.status().message().empty()) Fail("refused without saying why");
    return 0;
  }
  if (p->tenants.empty()) Fail("accepted a policy with no tenants");
  std::set<std::string> names;
  nlohmann::json canonical;
  canonical["tenants"] = nlohmann::json::array();
  for (const auto& t : p->tenants) {
    if (t.name.empty() || t.name.size() > 64) Fail("accepted tenant name '" + t.name + "'");
    for (char c : t.name) {
      const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '_' || c == '.' || c == '-';
      if (!ok) Fail("accepted tenant name '" + t.name + "'");
    }
    if (!names.insert(t.name).second) Fail("accepted duplicate tenant '" + t.name + "'");
    if (t.quarantine_after < 1) Fail("accepted quarantine_after < 1");
    canonical["tenants"].push_back({{"name", t.name},
                                    {"mode", kvguard::isolation::ModeName(t.mode)},
                                    {"quarantine_after", t.quarantine_after}});
  }
  absl::StatusOr<TenantPolicy> again = TenantPolicy::Parse(canonical.dump());
  if (!again.ok()) Fail("its canonical form does not parse: " + again.status().ToString());
  if (again->tenants.size() != p->tenants.size()) Fail("canonical form changed the tenant count");
  for (size_t i = 0; i < p->tenants.size(); ++i) {
    const auto& a = p->tenants[i];
    const auto& b = again->tenants[i];
    if (a.name != b.name || a.mode != b.mode || a.quarantine_after != b.quarantine_after) {
      Fail("canonical form changed tenant '" + a.name + "'");
    }
  }
  return 0;
}
