// core/service/http_policy.h: what the service's two listeners let through before any route
// runs: limits on a request's header block (answered 431) and who may read the admin
// listener's metrics and readiness detail.
//
// cpp-httplib 0.11 (Debian 12) caps each header line's length but not how many lines a request
// has; CheckHeaders is run from a pre-routing handler, before the body is read or any handler
// runs, so a request over either limit is refused with 431 and nothing else.
#ifndef KVGUARD_CORE_SERVICE_HTTP_POLICY_H_
#define KVGUARD_CORE_SERVICE_HTTP_POLICY_H_

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace kvguard::core {

struct HeaderLimits {
  size_t max_count = 100;               // header lines per request
  size_t max_bytes = size_t{32} << 10;  // names + values + ": " and CRLF of each line
};

// CheckHeaderBlock returns nullopt if a request's `count` header lines of `bytes` in all are
// within `limits`, else the reason (e.g. "20000 header lines; the limit is 100"), which quotes
// no header.
std::optional<std::string> CheckHeaderBlock(size_t count, size_t bytes, const HeaderLimits& limits);

// CheckHeaders is CheckHeaderBlock for a map of name -> value (httplib::Headers), counting
// each line as its name, its value, ": " and CRLF.
template <typename HeaderMap>
std::optional<std::string> CheckHeaders(const HeaderMap& headers, const HeaderLimits& limits) {
  size_t bytes = 0;
  for (const auto& [name, value] : headers) bytes += name.size() + value.size() + 4;
  return CheckHeaderBlock(headers.size(), bytes, limits);
}

// MetricsAuth says whether GET /metrics and the detail of the admin listener's /readyz need
// the admin key.
enum class MetricsAuth { kAuto, kAdmin, kNone };

// ParseMetricsAuth returns kAdmin for "admin", kNone for "none", nullopt otherwise.
std::optional<MetricsAuth> ParseMetricsAuth(std::string_view text);

// IsLoopbackHost returns true if `host` is "localhost" or an address in 127.0.0.0/8 or ::1
// (brackets allowed); false for anything else, names included (the safe answer).
bool IsLoopbackHost(std::string_view host);

// ResolveMetricsAuth returns `auth` unless it is kAuto; then kNone if the admin listener's
// host is loopback (only this machine can reach it) and kAdmin otherwise.
MetricsAuth ResolveMetricsAuth(MetricsAuth auth, std::string_view admin_host);

}  // namespace kvguard::core

#endif  // KVGUARD_CORE_SERVICE_HTTP_POLICY_H_
