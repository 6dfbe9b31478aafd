// Tests of core/service/service_config.h: the service's tenants file (API key digests, limits) on
// top of the isolation policy. Each refusal names the field and has an accepted twin.
#include "core/service/service_config.h"

#include <gtest/gtest.h>

#include <string>

namespace kvguard::core {
namespace {

std::string Digest(const std::string& key) { return DigestText(KeyDigestOf(key)); }

std::string Config(const std::string& a_extra, const std::string& b_extra = "") {
  return R"({"tenants": [{"name": "acme", "mode": "strict", "api_keys": [")" + Digest("key-a") +
         "\"]" + a_extra + R"(}, {"name": "beta", "api_keys": [")" + Digest("key-b1") + "\", \"" +
         Digest("key-b2") + "\"]" + b_extra + "}]}";
}

void ExpectRefused(const std::string& json, const std::string& what) {
  absl::StatusOr<ServiceConfig> c = ServiceConfig::Parse(json);
  ASSERT_FALSE(c.ok()) << json;
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(c.status().message()).find(what), std::string::npos)
      << c.status().message() << " does not mention " << what;
}

TEST(ServiceConfigTest, ParsesTenantsKeysAndLimits) {
  absl::StatusOr<ServiceConfig> c = ServiceConfig::Parse(Config(
      R"(, "limits": {"concurrent_requests": 3, "tokens_per_request": 100, "kv_page_quota": 7})"));
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->tenants.size(), 2u);
  ASSERT_EQ(c->policy.tenants.size(), 2u);
  EXPECT_EQ(c->tenants[0].name, "acme");
  EXPECT_EQ(c->policy.tenants[0].mode, isolation::Mode::kStrict);
  EXPECT_EQ(c->tenants[0].limits.concurrent_requests, 3);
  EXPECT_EQ(c->tenants[0].limits.tokens_per_request, 100);
  EXPECT_EQ(c->tenants[0].limits.kv_page_quota, 7);
  EXPECT_EQ(c->tenants[1].key_digests.size(), 2u);
  EXPECT_EQ(c->tenants[1].limits.concurrent_requests, TenantLimits{}.concurrent_requests);
}

TEST(ServiceConfigTest, KeyDecidesTheTenant) {
  absl::StatusOr<ServiceConfig> c = ServiceConfig::Parse(Config(""));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->Authenticate("key-a"), std::optional<size_t>(0));
  EXPECT_EQ(c->Authenticate("key-b1"), std::optional<size_t>(1));
  EXPECT_EQ(c->Authenticate("key-b2"), std::optional<size_t>(1));
  EXPECT_EQ(c->Authenticate("key-c"), std::nullopt);
  EXPECT_EQ(c->Authenticate(""), std::nullopt);
  EXPECT_EQ(c->Authenticate("key-a "), std::nullopt);
  // A digest is not a key: sending the stored digest does not authenticate.
  EXPECT_EQ(c->Authenticate(Digest("key-a")), std::nullopt);
}

TEST(ServiceConfigTest, DigestTextRoundTrips) {
  const KeyDigest d = KeyDigestOf("abc");
  // SHA-256("abc"), FIPS 180-2's test vector.
  EXPECT_EQ(DigestText(d),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  absl::StatusOr<KeyDigest> back = ParseDigestText(DigestText(d));
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(DigestsEqual(*back, d));
  for (size_t i = 0; i < d.size(); ++i) {
    KeyDigest flipped = d;
    flipped[i] ^= 0x42;
    EXPECT_FALSE(DigestsEqual(flipped, d)) << "byte " << i;
  }
  EXPECT_FALSE(ParseDigestText("sha256:abc").ok());
  EXPECT_FALSE(ParseDigestText("md5:" + std::string(64, 'a')).ok());
  EXPECT_FALSE(ParseDigestText("sha256:" + std::string(63, 'a') + "g").ok());
  // One spelling (audit/hex.h): lowercase, as DigestText writes it.
  EXPECT_FALSE(ParseDigestText("sha256:" + std::string(64, 'A')).ok());
  EXPECT_TRUE(ParseDigestText("sha256:" + std::string(64, 'a')).ok());
}

TEST(ServiceConfigTest, RefusesBadKeysAndLimitsNamingTheField) {
  ExpectRefused(R"({"tenants": [{"name": "acme"}]})", "tenants[0].api_keys");
  ExpectRefused(R"({"tenants": [{"name": "acme", "api_keys": []}]})", "tenants[0].api_keys");
  ExpectRefused(R"({"tenants": [{"name": "acme", "api_keys": ["plain-key"]}]})",
                "tenants[0].api_keys[0]");
  ExpectRefused(R"({"tenants": [{"name": "acme", "api_keys": [7]}]})", "tenants[0].api_keys[0]");
  ExpectRefused(Config("", ", \"api_keys\": [\"" + Digest("key-a") + "\"]"),
                "key 'api_keys' appears twice");
  // The same key for two tenants would make the key not decide the tenant.
  ExpectRefused(R"({"tenants": [{"name": "a", "api_keys": [")" + Digest("k") +
                    R"("]}, {"name": "b", "api_keys": [")" + Digest("k") + "\"]}]}",
                "tenants[1].api_keys[0] is already the key of a tenant");
  ExpectRefused(Config(R"(, "limits": {"concurrent_requests": 0})"),
                "tenants[0].limits.concurrent_requests");
  ExpectRefused(Config(R"(, "limits": {"tokens_per_request": "10"})"),
                "tenants[0].limits.tokens_per_request");
  ExpectRefused(Config("", R"(, "limits": {"kv_page_quota": -1})"),
                "tenants[1].limits.kv_page_quota");
  ExpectRefused(Config(R"(, "limits": {"concurency": 3})"), "tenants[0].limits: unknown key");
  ExpectRefused(Config(R"(, "limits": 3)"), "tenants[0].limits is not an object");
  ExpectRefused(Config(R"(, "api_key": "x")"), "unknown key 'api_key'");
  ExpectRefused(Config("", R"(, "mode": "paranoid")"), "unknown isolation mode");
  // Twins: the same shapes, valid.
  EXPECT_TRUE(ServiceConfig::Parse(Config(R"(, "limits": {"kv_page_quota": 0})")).ok());
  EXPECT_TRUE(ServiceConfig::Parse(Config(R"(, "limits": {})")).ok());
}

}  // namespace
}  // namespace kvguard::core
