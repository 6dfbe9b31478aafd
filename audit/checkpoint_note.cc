#include "audit/checkpoint_note.h"

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kvguard::audit {
namespace {

constexpr char kSignatureTypeEd25519 = '\x01';
constexpr char kEmDash[] = "\xe2\x80\x94";  // U+2014, what starts a signature line

absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

absl::Status Bad(std::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("checkpoint note: ", Sv(why)));
}

// NoteText returns the signed text of the note for `origin`, `size`, `root`.
std::string NoteText(std::string_view origin, uint64_t size, const Hash& root) {
  const std::string_view raw(reinterpret_cast<const char*>(root.data()), root.size());
  return absl::StrCat(Sv(origin), "\n", size, "\n", absl::Base64Escape(Sv(raw)), "\n");
}

}  // namespace

std::string NoteOrigin(std::string_view log_id) {
  return absl::StrCat("kvguard.audit/", Sv(log_id));
}

std::string NoteKeyId(std::string_view name, std::string_view public_raw) {
  const std::string type(1, kSignatureTypeEd25519);
  const Hash h = Sha256({name, "\n", type, public_raw});
  return std::string(reinterpret_cast<const char*>(h.data()), 4);
}

std::string NoteVerifierKey(std::string_view name, std::string_view public_raw) {
  const std::string typed = absl::StrCat(std::string(1, kSignatureTypeEd25519), Sv(public_raw));
  return absl::StrCat(Sv(name), "+", absl::BytesToHexString(NoteKeyId(name, public_raw)), "+",
                      absl::Base64Escape(typed));
}

absl::StatusOr<std::string> FormatCheckpointNote(const Checkpoint& c, const SigningKey& key) {
  const std::string origin = NoteOrigin(c.log_id);
  const std::string text = NoteText(origin, c.size, c.root);
  absl::StatusOr<std::string> sig = key.Sign(text);
  if (!sig.ok()) return sig.status();
  const std::string blob = NoteKeyId(origin, key.PublicKeyRaw()) + *sig;
  return absl::StrCat(text, "\n", kEmDash, " ", origin, " ", absl::Base64Escape(blob), "\n");
}

absl::StatusOr<NoteCheckpoint> CheckCheckpointNote(std::string_view note, std::string_view log_id,
                                                   const VerifyingKey& key) {
  const size_t split = note.find("\n\n");
  if (split == std::string_view::npos) return Bad("no blank line before the signatures");
  const std::string_view text = note.substr(0, split + 1);
  std::string_view sigs = note.substr(split + 2);
  const std::vector<absl::string_view> lines =
      absl::StrSplit(Sv(text.substr(0, text.size() - 1)), '\n');
  if (lines.size() < 3) return Bad("the text is not origin, size and root lines");
  NoteCheckpoint out;
  out.origin = std::string(lines[0]);
  const std::string want = NoteOrigin(log_id.empty() ? "" : log_id);
  if (log_id.empty() ? !out.origin.starts_with(want) : out.origin != want) {
    return Bad(
        absl::StrCat("origin '", out.origin, "' is not ", want, log_id.empty() ? "..." : ""));
  }
  if (lines[1].empty() || lines[1].size() > 20 || (lines[1].size() > 1 && lines[1][0] == '0') ||
      lines[1].find_first_not_of("0123456789") != absl::string_view::npos ||
      !absl::SimpleAtoi(lines[1], &out.size)) {
    return Bad("the size line is not a decimal number");
  }
  std::string root;
  if (!absl::Base64Unescape(lines[2], &root) || root.size() != out.root.size() ||
      absl::Base64Escape(root) != lines[2]) {
    return Bad("the root line is not the base64 of 32 bytes");
  }
  std::copy(root.begin(), root.end(), out.root.begin());
  const std::string origin = out.origin;
  const std::string key_id = NoteKeyId(origin, key.PublicKeyRaw());
  const std::string prefix = absl::StrCat(kEmDash, " ", origin, " ");
  bool any = false;
  while (!sigs.empty()) {
    const size_t nl = sigs.find('\n');
    if (nl == std::string_view::npos) return Bad("a signature line does not end in a newline");
    const std::string_view line = sigs.substr(0, nl);
    sigs.remove_prefix(nl + 1);
    if (!line.starts_with(kEmDash)) return Bad("a signature line does not start with '— '");
    if (!line.starts_with(prefix)) continue;  // another signer's (a cosignature)
    std::string blob;
    const absl::string_view b64 = Sv(line.substr(prefix.size()));
    if (!absl::Base64Unescape(b64, &blob) || blob.size() != 4 + 64 ||
        absl::Base64Escape(blob) != b64) {  // one spelling: no stray padding bits
      return Bad("the signature is not base64 of a key ID and an Ed25519 signature");
    }
    if (blob.substr(0, 4) != key_id) continue;  // a signature by another key of that name
    if (!key.Verify(text, blob.substr(4))) {
      return Bad("the signature does not verify with the public key");
    }
    any = true;
  }
  if (!any) return Bad(absl::StrCat("no signature by the public key given (", origin, ")"));
  return out;
}

}  // namespace kvguard::audit
