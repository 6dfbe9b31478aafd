// Tests of core/service/http_policy.h: header limits (431) and who may read /metrics. Each
// refusal has an accepted twin at the limit.
#include "core/service/http_policy.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace kvguard::core {
namespace {

TEST(HttpPolicyTest, HeaderCountAtTheLimitPassesOneMoreIsRefused) {
  HeaderLimits limits;
  limits.max_count = 30;
  std::multimap<std::string, std::string> headers;
  for (int i = 0; i < 30; ++i) headers.emplace("X-H" + std::to_string(i), "v");
  EXPECT_EQ(CheckHeaders(headers, limits), std::nullopt);
  headers.emplace("X-Last", "v");
  std::optional<std::string> why = CheckHeaders(headers, limits);
  ASSERT_TRUE(why.has_value());
  EXPECT_EQ(*why, "31 header lines; the limit is 30");
}

TEST(HttpPolicyTest, HeaderBytesAtTheLimitPassOneMoreIsRefused) {
  HeaderLimits limits;
  limits.max_bytes = 100;
  // "Name: value\r\n": 4 + 92 + 4 = 100 bytes.
  std::multimap<std::string, std::string> headers = {{"Name", std::string(92, 'v')}};
  EXPECT_EQ(CheckHeaders(headers, limits), std::nullopt);
  headers.begin()->second.push_back('v');
  std::optional<std::string> why = CheckHeaders(headers, limits);
  ASSERT_TRUE(why.has_value());
  EXPECT_EQ(*why, "101 bytes of headers; the limit is 100");
  EXPECT_EQ(why->find('v'), std::string::npos) << "the reason quotes a header";
}

TEST(HttpPolicyTest, DefaultsTakeAnOrdinaryRequestAndRefuseTwentyThousandLines) {
  std::multimap<std::string, std::string> headers;
  for (int i = 0; i < 30; ++i) headers.emplace("X-Header-" + std::to_string(i), "some value");
  EXPECT_EQ(CheckHeaders(headers, HeaderLimits{}), std::nullopt);
  for (int i = 30; i < 20000; ++i) headers.emplace("X-Header-" + std::to_string(i), "v");
  EXPECT_NE(CheckHeaders(headers, HeaderLimits{}), std::nullopt);
}

// cpp-httplib adds REMOTE_ADDR, REMOTE_PORT, LOCAL_ADDR and LOCAL_PORT to every request's map:
// they are not the client's lines. A client's own line of such a name (parsed first) counts.
TEST(HttpPolicyTest, HeadersTheServerAddsAreNotCountedTheClientsAre) {
  HeaderLimits limits;
  limits.max_count = 30;
  std::multimap<std::string, std::string> headers;
  for (int i = 0; i < 30; ++i) headers.emplace("X-H" + std::to_string(i), "v");
  for (std::string_view name : kServerAddedHeaders) headers.emplace(std::string(name), "1234");
  EXPECT_EQ(CheckHeaders(headers, limits), std::nullopt);  // 34 entries, 30 client lines
  // A client line named REMOTE_ADDR, inserted before the server's entry as httplib parses it.
  std::multimap<std::string, std::string> spoofed;
  for (int i = 0; i < 30; ++i) spoofed.emplace("X-H" + std::to_string(i), "v");
  spoofed.emplace("REMOTE_ADDR", "client");
  for (std::string_view name : kServerAddedHeaders) spoofed.emplace(std::string(name), "1234");
  std::optional<std::string> why = CheckHeaders(spoofed, limits);
  ASSERT_TRUE(why.has_value());
  EXPECT_EQ(*why, "31 header lines; the limit is 30");
}

TEST(HttpPolicyTest, LoopbackHosts) {
  for (const char* host : {"127.0.0.1", "127.1.2.3", "localhost", "::1", "[::1]"}) {
    EXPECT_TRUE(IsLoopbackHost(host)) << host;
  }
  for (const char* host : {"0.0.0.0", "10.0.0.1", "128.0.0.1", "::", "[::]", "example.com",
                           "localhost.example.com", "", "127.0.0.1.nip.io"}) {
    EXPECT_FALSE(IsLoopbackHost(host)) << host;
  }
}

TEST(HttpPolicyTest, MetricsAuthDefaultsToTheAdminKeyOffLoopback) {
  EXPECT_EQ(ResolveMetricsAuth(MetricsAuth::kAuto, "127.0.0.1"), MetricsAuth::kNone);
  EXPECT_EQ(ResolveMetricsAuth(MetricsAuth::kAuto, "0.0.0.0"), MetricsAuth::kAdmin);
  EXPECT_EQ(ResolveMetricsAuth(MetricsAuth::kAdmin, "127.0.0.1"), MetricsAuth::kAdmin);
  EXPECT_EQ(ResolveMetricsAuth(MetricsAuth::kNone, "0.0.0.0"), MetricsAuth::kNone);
  EXPECT_EQ(ParseMetricsAuth("admin"), MetricsAuth::kAdmin);
  EXPECT_EQ(ParseMetricsAuth("none"), MetricsAuth::kNone);
  EXPECT_EQ(ParseMetricsAuth("Admin"), std::nullopt);
  EXPECT_EQ(ParseMetricsAuth(""), std::nullopt);
}

}  // namespace
}  // namespace kvguard::core
