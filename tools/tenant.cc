// `kvguard tenant`: list tenants and change a tenant's mode through a running server's admin API
// (core/service/server.h). The admin key comes from --admin-key or $KVGUARD_ADMIN_KEY.
#include <httplib.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "tools/commands.h"
#include "tools/flags.h"

namespace kvguard::tools {
namespace {

int TenantUsage(const std::string& error) {
  if (!error.empty()) std::fprintf(stderr, "kvguard tenant: %s\n\n", error.c_str());
  std::fprintf(stderr,
               "usage: kvguard tenant list [options]\n"
               "       kvguard tenant set-mode ID off|enforce|strict [options]\n"
               "  --admin URL        the server's admin listener (default http://127.0.0.1:8081)\n"
               "  --admin-key KEY    the admin key (default: $KVGUARD_ADMIN_KEY)\n");
  return error.empty() ? 0 : 2;
}

// Describe returns the error message of an admin API response, or its status.
std::string Describe(const httplib::Result& r) {
  if (!r) return absl::StrCat("cannot reach the admin API: ", httplib::to_string(r.error()));
  const nlohmann::json body = nlohmann::json::parse(r->body, nullptr, false);
  if (body.is_object() && body.contains("error") && body["error"].is_object() &&
      body["error"].contains("message") && body["error"]["message"].is_string()) {
    return absl::StrCat("HTTP ", r->status, ": ", body["error"]["message"].get<std::string>());
  }
  return absl::StrCat("HTTP ", r->status);
}

}  // namespace

int RunTenant(const std::vector<std::string>& argv) {
  std::string url = "http://127.0.0.1:8081";
  const char* env_key = std::getenv("KVGUARD_ADMIN_KEY");
  std::string key = env_key ? env_key : "";
  std::vector<std::string> positional;
  Args a(argv);
  while (!a.done()) {
    absl::Status s;
    if (a.Flag("--help") || a.Flag("-h")) {
      return TenantUsage("");
    } else if (a.Flag("--admin")) {
      s = a.Value(&url);
    } else if (a.Flag("--admin-key")) {
      s = a.Value(&key);
    } else if (!a.peek().empty() && a.peek()[0] == '-') {
      return TenantUsage("unknown argument '" + a.peek() + "'");
    } else {
      positional.push_back(a.peek());
      a.Skip();
    }
    if (!s.ok()) return TenantUsage(std::string(s.message()));
  }
  if (positional.empty()) return TenantUsage("which tenant command? (list, set-mode)");
  const std::string& command = positional[0];
  if (command == "list" && positional.size() != 1) return TenantUsage("list takes no arguments");
  if (command == "set-mode" && positional.size() != 3) {
    return TenantUsage("set-mode needs ID and MODE");
  }
  if (command != "list" && command != "set-mode") {
    return TenantUsage("unknown tenant command '" + command + "'");
  }
  if (key.empty()) return TenantUsage("no admin key: pass --admin-key or set KVGUARD_ADMIN_KEY");

  httplib::Client client(url);
  client.set_bearer_token_auth(key);
  client.set_connection_timeout(5);
  client.set_read_timeout(30);
  if (command == "list") {
    httplib::Result r = client.Get("/admin/tenants");
    if (!r || r->status != 200) {
      std::fprintf(stderr, "kvguard tenant: %s\n", Describe(r).c_str());
      return 1;
    }
    const nlohmann::json body = nlohmann::json::parse(r->body, nullptr, false);
    if (!body.is_object() || !body.contains("tenants") || !body["tenants"].is_array()) {
      std::fprintf(stderr, "kvguard tenant: the admin API answered something else\n");
      return 1;
    }
    std::printf("%-20s %-8s %9s %11s %10s %9s %10s\n", "TENANT", "MODE", "IN_FLIGHT", "CONCURRENCY",
                "MAX_TOKENS", "KV_QUOTA", "VIOLATIONS");
    for (const nlohmann::json& t : body["tenants"]) {
      const nlohmann::json& l = t.value("limits", nlohmann::json::object());
      std::printf("%-20s %-8s %9d %11d %10d %9d %10lld\n", t.value("id", "?").c_str(),
                  t.value("mode", "?").c_str(), t.value("in_flight", 0),
                  l.value("concurrent_requests", 0), l.value("tokens_per_request", 0),
                  l.value("kv_page_quota", 0), t.value("violations", 0LL));
    }
    return 0;
  }
  const std::string body = nlohmann::json{{"mode", positional[2]}}.dump();
  httplib::Result r =
      client.Put(absl::StrCat("/admin/tenants/", positional[1], "/mode"), body, "application/json");
  if (!r || r->status != 200) {
    std::fprintf(stderr, "kvguard tenant: %s\n", Describe(r).c_str());
    return 1;
  }
  const nlohmann::json reply = nlohmann::json::parse(r->body, nullptr, false);
  std::printf("%s: %s -> %s (recorded in the audit log)\n", positional[1].c_str(),
              reply.value("mode_from", "?").c_str(), reply.value("mode_to", "?").c_str());
  return 0;
}

}  // namespace kvguard::tools
