#include "core/service/http_policy.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include "absl/strings/str_cat.h"

namespace kvguard::core {

std::optional<std::string> CheckHeaderBlock(size_t count, size_t bytes,
                                            const HeaderLimits& limits) {
  if (count > limits.max_count) {
    return absl::StrCat(count, " header lines; the limit is ", limits.max_count);
  }
  if (bytes > limits.max_bytes) {
    return absl::StrCat(bytes, " bytes of headers; the limit is ", limits.max_bytes);
  }
  return std::nullopt;
}

std::optional<MetricsAuth> ParseMetricsAuth(std::string_view text) {
  if (text == "admin") return MetricsAuth::kAdmin;
  if (text == "none") return MetricsAuth::kNone;
  return std::nullopt;
}

bool IsLoopbackHost(std::string_view host) {
  if (host == "localhost") return true;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const std::string h(host);
  in_addr v4;
  if (inet_pton(AF_INET, h.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6;
  if (inet_pton(AF_INET6, h.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;
}

MetricsAuth ResolveMetricsAuth(MetricsAuth auth, std::string_view admin_host) {
  if (auth != MetricsAuth::kAuto) return auth;
  return IsLoopbackHost(admin_host) ? MetricsAuth::kNone : MetricsAuth::kAdmin;
}

}  // namespace kvguard::core
