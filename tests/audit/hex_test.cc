// Tests of audit/hex.h: the one hex codec of the log and the key files. Every byte value round
// trips; every other spelling (uppercase, wrong length, a non-hex character) is refused.
#include "audit/hex.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <string>

#include "absl/strings/escaping.h"

namespace kvguard::audit {
namespace {

TEST(HexCodecTest, EveryByteRoundTrips) {
  std::array<uint8_t, 256> all;
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint8_t>(i);
  std::string hex;
  AppendLowerHex(all, hex);
  EXPECT_EQ(hex, absl::BytesToHexString(
                     absl::string_view(reinterpret_cast<const char*>(all.data()), all.size())));
  EXPECT_TRUE(IsLowerHex(hex));
  std::array<uint8_t, 256> back{};
  ASSERT_TRUE(ParseLowerHex(hex, back));
  EXPECT_EQ(back, all);
}

TEST(HexCodecTest, OnlyOneSpellingParses) {
  std::array<uint8_t, 2> out{};
  EXPECT_TRUE(ParseLowerHex("0aff", out));  // the twin of each refusal below
  EXPECT_EQ(out, (std::array<uint8_t, 2>{0x0a, 0xff}));
  EXPECT_FALSE(ParseLowerHex("0AFF", out));
  EXPECT_FALSE(ParseLowerHex("0aff0", out));
  EXPECT_FALSE(ParseLowerHex("0af", out));
  EXPECT_FALSE(ParseLowerHex("0ag0", out));
  EXPECT_FALSE(ParseLowerHex(" aff", out));
  EXPECT_FALSE(IsLowerHex("0A"));
  EXPECT_FALSE(IsLowerHex("g"));
  EXPECT_TRUE(IsLowerHex(""));
}

}  // namespace
}  // namespace kvguard::audit
