// audit/hex.h: the one lowercase-hex codec of the log and the key files. Encoding is Abseil's
// absl::BytesToHexString, except for key material, which AppendLowerHex writes straight into a
// cleansed buffer (no temporary copy). Decoding is ParseLowerHex, which accepts exactly one
// spelling: lowercase digits, the exact length (the log and the key files have one spelling of
// each hash and key, so an uppercase or padded variant is an edit, not the same value).
#ifndef KVGUARD_AUDIT_HEX_H_
#define KVGUARD_AUDIT_HEX_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace kvguard::audit {

// IsLowerHex returns whether every character of `s` is one of 0-9 a-f (true for "").
bool IsLowerHex(std::string_view s);

// ParseLowerHex returns true, with `out` filled, iff `hex` is exactly 2 * out.size() lowercase
// hex digits; otherwise false, `out` unspecified.
bool ParseLowerHex(std::string_view hex, std::span<uint8_t> out);

// AppendLowerHex appends `bytes` as lowercase hex to `out` (for key material: `out` may be a
// SecretBuffer's string whose capacity was reserved, so nothing is copied elsewhere).
void AppendLowerHex(std::span<const uint8_t> bytes, std::string& out);

}  // namespace kvguard::audit

#endif  // KVGUARD_AUDIT_HEX_H_
