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
#include <iterator>
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

// kServerAddedHeaders: what cpp-httplib 0.11 inserts into every request's header map after
// parsing the client's (the peer's and the listener's address and port); not the client's
// lines, so not counted against its limits.
inline constexpr std::string_view kServerAddedHeaders[] = {"REMOTE_ADDR", "REMOTE_PORT",
                                                           "LOCAL_ADDR", "LOCAL_PORT"};

// CheckHeaders is CheckHeaderBlock for a multimap of name -> value (httplib::Headers), counting
// each line as its name, its value, ": " and CRLF, less the last entry of each
// kServerAddedHeaders name (the one the server inserted; a client's own line of that name,
// parsed first, still counts).
template <typename HeaderMap>
std::optional<std::string> CheckHeaders(const HeaderMap& headers, const HeaderLimits& limits) {
  const auto line_bytes = [](const auto& entry) {
    return entry.first.size() + entry.second.size() + 4;
  };
  size_t count = headers.size(), bytes = 0;
  for (const auto& entry : headers) bytes += line_bytes(entry);
  for (std::string_view name : kServerAddedHeaders) {
    const auto [first, last] = headers.equal_range(std::string(name));
    if (first == last) continue;
    --count;
    bytes -= line_bytes(*std::prev(last));
  }
  return CheckHeaderBlock(count, bytes, limits);
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
