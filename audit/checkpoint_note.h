// audit/checkpoint_note.h: a checkpoint in the C2SP tlog-checkpoint format, a signed note
// (https://github.com/C2SP/C2SP: tlog-checkpoint.md, signed-note.md), so that transparency-log
// tools (witnesses, golang.org/x/mod/sumdb/note) can read and check it:
//
//   kvguard.audit/<log_id>\n          origin: the log's identity
//   <size>\n                          tree size, decimal
//   <base64 of the 32-byte root>\n    RFC 9162 root of the first `size` records (FORMAT.md)
//   \n
//   — kvguard.audit/<log_id> <base64(key ID (4 bytes) || Ed25519 signature (64 bytes))>\n
//
// The signature is plain Ed25519 (the log's key, audit/signing_key.h) over the note's text:
// the three lines above the blank line, each ending in '\n'. The key ID is the first 4 bytes of
// SHA-256(key name || 0x0A || 0x01 || raw 32-byte public key) (0x01: signature type Ed25519);
// the key name is the origin. A note signs size and root only (not the chain head or a time):
// it is the checkpoint line's tree head, for tools that speak C2SP; the checkpoint line stays
// what the verifier checks. The writer keeps the latest checkpoint as a note in
// DIR/checkpoint.note (FORMAT.md); `kvguard audit check-note` checks one.
#ifndef KVGUARD_AUDIT_CHECKPOINT_NOTE_H_
#define KVGUARD_AUDIT_CHECKPOINT_NOTE_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "audit/merkle.h"
#include "audit/record.h"
#include "audit/signing_key.h"

namespace kvguard::audit {

// NoteOrigin returns the origin (and key name) of the log `log_id`: "kvguard.audit/<log_id>".
std::string NoteOrigin(std::string_view log_id);

// NoteKeyId returns the 4-byte key ID of the Ed25519 key `public_raw` named `name`.
std::string NoteKeyId(std::string_view name, std::string_view public_raw);

// NoteVerifierKey returns the key as a signed-note verifier key string,
// "<name>+<key ID, 8 hex>+<base64(0x01 || public key)>", what note tools take.
std::string NoteVerifierKey(std::string_view name, std::string_view public_raw);

// FormatCheckpointNote returns checkpoint `c` as a signed note, signed by `key`; Internal if
// signing fails.
absl::StatusOr<std::string> FormatCheckpointNote(const Checkpoint& c, const SigningKey& key);

// NoteCheckpoint is what a checked note says.
struct NoteCheckpoint {
  std::string origin;
  uint64_t size = 0;
  Hash root{};
};

// CheckCheckpointNote parses the signed note `note` and checks that it is a checkpoint of log
// `log_id` (any kvguard log when empty) with a signature line by `key` that verifies; other
// signature lines (a witness's cosignature) are allowed and not checked. Returns what it says, or
// InvalidArgument saying why not.
absl::StatusOr<NoteCheckpoint> CheckCheckpointNote(std::string_view note, std::string_view log_id,
                                                   const VerifyingKey& key);

}  // namespace kvguard::audit

#endif  // KVGUARD_AUDIT_CHECKPOINT_NOTE_H_
