// audit/signing_key.h: the audit log's Ed25519 checkpoint key (FORMAT.md, "Keys").
//
// The writer signs each checkpoint with a SigningKey; an auditor checks it with a VerifyingKey
// made from the public key alone. Signatures are plain RFC 8032 Ed25519 (OpenSSL's EVP
// interface, no prehash, no context), 64 raw bytes; the checkpoint message they cover is
// defined in FORMAT.md, not here.
//
// Key file (SigningKey::LoadOrCreate): one PEM block of an unencrypted PKCS#8 Ed25519 private
// key ("-----BEGIN PRIVATE KEY-----"), as `openssl genpkey -algorithm ed25519` writes it. The
// file must be a regular file (not a symbolic link) that grants group and others nothing
// (st_mode & 077 == 0, as ssh asks of a private key). It is separate from the page-tag key file.
//
// Fingerprint (both classes): 16 lowercase hex digits, the first 8 bytes of SHA-256 of the raw
// 32-byte public key; the `key_fp` of a checkpoint line. Safe to log.
//
// The private key never leaves signing_key.cc: no accessor returns it, and no error message
// contains it or any part of the key file.
#ifndef KVGUARD_AUDIT_SIGNING_KEY_H_
#define KVGUARD_AUDIT_SIGNING_KEY_H_

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// OpenSSL's key type, so that this header does not include OpenSSL's.
typedef struct evp_pkey_st EVP_PKEY;

namespace kvguard::audit {

// kEd25519SignatureBytes is the size of a raw Ed25519 signature.
inline constexpr size_t kEd25519SignatureBytes = 64;
// kEd25519PublicKeyBytes is the size of a raw Ed25519 public key.
inline constexpr size_t kEd25519PublicKeyBytes = 32;

// SigningKey is the log's Ed25519 private key. It never exposes the private key bytes. All
// methods are thread-safe.
class SigningKey {
 public:
  // LoadOrCreate returns the key stored at `path` (see the top of this file). If `path` does not
  // exist it is created with a new key (mode 0600, exclusively, never through a symbolic link;
  // the file and its directory are fsynced). Returns FailedPrecondition if the file is not a
  // regular file (a symbolic link included) or grants group or others any access,
  // InvalidArgument naming the path (and never quoting the file) if it is not a PEM PKCS#8
  // Ed25519 private key, and another error if it cannot be read or written.
  static absl::StatusOr<std::unique_ptr<SigningKey>> LoadOrCreate(const std::string& path);

  // CreateEphemeral returns a new in-memory key (for tests and benchmarks), or Internal if
  // OpenSSL fails.
  static absl::StatusOr<std::unique_ptr<SigningKey>> CreateEphemeral();

  SigningKey(const SigningKey&) = delete;
  SigningKey& operator=(const SigningKey&) = delete;
  // ~SigningKey frees the key; OpenSSL cleanses the private key bytes.
  ~SigningKey();

  // Sign returns the 64-byte raw Ed25519 signature of `message`, or Internal if OpenSSL fails.
  absl::StatusOr<std::string> Sign(std::string_view message) const;

  // PublicKeyPem returns the public key as a SubjectPublicKeyInfo PEM block
  // ("-----BEGIN PUBLIC KEY-----", ending in '\n'), what `kvguard audit pubkey` prints.
  std::string PublicKeyPem() const;

  // Fingerprint returns the public key's fingerprint (see the top of this file).
  std::string Fingerprint() const;

  // PublicKeyRaw returns the raw 32-byte public key.
  std::string PublicKeyRaw() const;

 private:
  // Make returns a SigningKey that owns `pkey`, an Ed25519 private key, or Internal (having
  // freed `pkey`) if OpenSSL fails.
  static absl::StatusOr<std::unique_ptr<SigningKey>> Make(EVP_PKEY* pkey);
  SigningKey(EVP_PKEY* pkey, std::string public_raw, std::string public_pem,
             std::string fingerprint);

  EVP_PKEY* const pkey_;
  const std::string public_raw_;
  const std::string public_pem_;
  const std::string fingerprint_;
};

// VerifyingKey is an auditor's copy of the log's public key. Copies share one OpenSSL key; all
// methods are thread-safe.
class VerifyingKey {
 public:
  // FromPem returns the key in `pem`, which must hold exactly one SubjectPublicKeyInfo PEM block
  // ("-----BEGIN PUBLIC KEY-----") of an Ed25519 key and nothing else but whitespace, or
  // InvalidArgument (a private key PEM included).
  static absl::StatusOr<VerifyingKey> FromPem(std::string_view pem);

  // LoadFile returns the key in the PEM file at `path`: NotFound if there is none, FromPem's
  // error prefixed with the path, or another error if the file cannot be read.
  static absl::StatusOr<VerifyingKey> LoadFile(const std::string& path);

  // FromRaw returns the key whose raw 32 bytes are `raw32`, or InvalidArgument for another size.
  static absl::StatusOr<VerifyingKey> FromRaw(std::string_view raw32);

  // Verify returns whether `signature64` is a valid Ed25519 signature of `message` under this
  // key; false for a signature of any length but 64 bytes.
  bool Verify(std::string_view message, std::string_view signature64) const;

  // Fingerprint returns the key's fingerprint (see the top of this file).
  std::string Fingerprint() const;

  // PublicKeyRaw returns the raw 32-byte public key.
  std::string PublicKeyRaw() const;

 private:
  // Make returns a VerifyingKey that owns `pkey`, an Ed25519 key, or Internal (having freed
  // `pkey`) if OpenSSL fails.
  static absl::StatusOr<VerifyingKey> Make(EVP_PKEY* pkey);
  VerifyingKey(std::shared_ptr<EVP_PKEY> pkey, std::string public_raw, std::string fingerprint);

  std::shared_ptr<EVP_PKEY> pkey_;  // never null; shared by copies, never modified
  std::string public_raw_;
  std::string fingerprint_;
};

}  // namespace kvguard::audit

#endif  // KVGUARD_AUDIT_SIGNING_KEY_H_
