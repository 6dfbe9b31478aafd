// isolation/tag_key.h: the page-tag keys and the keyed MAC that derives a page's tag (P4).
//
// A tag binds one physical KV page to (generation, tenant, session) under a secret key:
//
//   msg = "kvguard/page-tag/v1"          19 bytes of ASCII, no NUL
//         || be32(key id)
//         || be64(page) || be64(generation) || be64(tenant) || be64(session)      (55 bytes)
//   mac = HMAC-SHA256(key[key id], msg)                                             (32 bytes)
//   tag.lo = mac[0..7] loaded little-endian, tag.hi = mac[8..15] loaded little-endian
//
// (so the tag's 16 bytes in memory on a little-endian machine are the first 16 bytes of the
// MAC). Keys are 32 bytes from the CSPRNG. They never leave this file's implementation: no
// accessor returns them, and no error message, log line or fingerprint contains them.
//
// Key file (TagKeyRing::LoadOrCreate), text, every line ending in '\n':
//
//   kvguard-tag-keys v1
//   <id> <key>
//   ...
//
// <id> is a decimal key id in [1, 2^32 - 1] without leading zeros, <key> 64 lowercase hex
// digits; ids strictly increase down the file and the last line's key is the active one. The
// file must be a regular file (not a symbolic link) that grants group and others nothing
// (st_mode & 077 == 0, as ssh asks of a private key).
#ifndef KVGUARD_ISOLATION_TAG_KEY_H_
#define KVGUARD_ISOLATION_TAG_KEY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/formats.h"

namespace kvguard::isolation {

using TenantId = uint64_t;
using SessionId = uint64_t;
using KeyId = uint32_t;

// TagInput is what a page tag binds: the physical page, its generation (moves on at every
// release, so old tags die), and the owning tenant and session.
struct TagInput {
  uint64_t page = 0;
  uint64_t generation = 0;
  TenantId tenant = 0;
  SessionId session = 0;
};

// TagsEqual returns whether `a` and `b` are the same tag, in time that does not depend on
// where they differ (CRYPTO_memcmp). Every check of a presented tag uses it.
bool TagsEqual(const kernels::PageTag& a, const kernels::PageTag& b);

// TagKeyRing holds the tag keys: the active one, which derives new tags, and older ones kept so
// that tags derived before a rotation still verify until their key is retired. All methods are
// thread-safe; Derive may run on many threads while another thread rotates or retires.
class TagKeyRing {
 public:
  // LoadOrCreate returns the ring stored at `path`. If `path` does not exist it is created
  // (mode 0600, exclusively, never through a symbolic link) holding one new key with id 1.
  // Returns FailedPrecondition if the file is not a regular file (a symbolic link included)
  // or grants group or others any access, InvalidArgument naming the line for a malformed
  // file, and another error if the file cannot be read or written. The ring keeps `path` and
  // rewrites it on Rotate and Retire.
  static absl::StatusOr<std::unique_ptr<TagKeyRing>> LoadOrCreate(const std::string& path);

  // CreateEphemeral returns an in-memory ring with one new key with id 1 (for tests and
  // benchmarks: Rotate and Retire write no file), or Internal if the CSPRNG fails.
  static absl::StatusOr<std::unique_ptr<TagKeyRing>> CreateEphemeral();

  TagKeyRing(const TagKeyRing&) = delete;
  TagKeyRing& operator=(const TagKeyRing&) = delete;
  // ~TagKeyRing cleanses every key (OPENSSL_cleanse).
  ~TagKeyRing();

  // Rotate adds a new key with id active_id() + 1 and makes it the active one; the older keys
  // stay and still derive their tags. A ring with a file rewrites it atomically first
  // (<path>.tmp, mode 0600, fsync, rename, fsync of the directory). Returns the new key id, or
  // an error with the ring unchanged (ResourceExhausted when the ids run out).
  absl::StatusOr<KeyId> Rotate();
  // Rotate(record) is Rotate with a say before the change: once the new key exists, and before
  // the file is written or the key used, it calls record(new id, new fingerprint); if that
  // fails, the new key is discarded (cleansed) and its error returned with the ring unchanged.
  // (Guard::RotateKey records the rotation in the audit log this way: a rotation that could
  // not be recorded never takes effect.)
  absl::StatusOr<KeyId> Rotate(
      absl::FunctionRef<absl::Status(KeyId id, const std::string& fingerprint)> record);

  // Retire forgets key `id` and cleanses it; Derive with it fails from then on. The ownership
  // table compares the tags it stored at grant time, so pages granted under the key stay
  // valid until released: retire through Guard::RetireKey, which refuses while any are. A ring
  // with a file rewrites it first, as Rotate does. Returns OK, FailedPrecondition for the
  // active key, NotFound for an id the ring does not hold, or an error with the ring unchanged.
  absl::Status Retire(KeyId id);

  // active_id returns the id of the key that derives new tags.
  KeyId active_id() const;

  // key_ids returns the ids of every key the ring holds, ascending (the last is active_id()).
  std::vector<KeyId> key_ids() const;

  // Fingerprint returns 16 lowercase hex digits naming key `id`: the first 8 bytes of
  // SHA-256("kvguard/tag-key-fingerprint/v1" || key). Safe to log. NotFound for an unknown id.
  absl::StatusOr<std::string> Fingerprint(KeyId id) const;

  // Derive returns the tag of `in` under key `id` (see the top of this file), NotFound if the
  // ring does not hold `id`, or Internal if OpenSSL fails.
  absl::StatusOr<kernels::PageTag> Derive(KeyId id, const TagInput& in) const;

 private:
  struct Key;    // one key, its fingerprint and its MAC contexts (tag_key.cc)
  struct State;  // the keys, their file and the locks (tag_key.cc)

  explicit TagKeyRing(std::unique_ptr<State> state);

  std::unique_ptr<State> state_;
};

}  // namespace kvguard::isolation

#endif  // KVGUARD_ISOLATION_TAG_KEY_H_
