#include "audit/signing_key.h"

#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string_view>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "audit/private_file.h"

namespace kvguard::audit {
namespace {

// An Ed25519 PKCS#8 PEM file is 119 bytes; this leaves room for whitespace and line endings
// while refusing to read a large file someone pointed us at by mistake.
constexpr size_t kMaxKeyFileBytes = 64 * 1024;
constexpr char kPrivateKeyLabel[] = "PRIVATE KEY";
constexpr char kEncryptedPrivateKeyLabel[] = "ENCRYPTED PRIVATE KEY";
constexpr char kPublicKeyLabel[] = "PUBLIC KEY";

struct PkeyFree {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
struct PkeyCtxFree {
  void operator()(EVP_PKEY_CTX* p) const { EVP_PKEY_CTX_free(p); }
};
struct MdCtxFree {
  void operator()(EVP_MD_CTX* p) const { EVP_MD_CTX_free(p); }
};
struct BioFree {
  void operator()(BIO* p) const { BIO_free(p); }
};
struct Pkcs8Free {
  void operator()(PKCS8_PRIV_KEY_INFO* p) const { PKCS8_PRIV_KEY_INFO_free(p); }
};
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyFree>;
using PkeyCtxPtr = std::unique_ptr<EVP_PKEY_CTX, PkeyCtxFree>;
using MdCtxPtr = std::unique_ptr<EVP_MD_CTX, MdCtxFree>;
using BioPtr = std::unique_ptr<BIO, BioFree>;
using Pkcs8Ptr = std::unique_ptr<PKCS8_PRIV_KEY_INFO, Pkcs8Free>;

// OpenSslError returns Internal for a failed OpenSSL call `what`, after clearing this thread's
// OpenSSL error queue so that the failure does not surface later in an unrelated caller.
absl::Status OpenSslError(absl::string_view what) {
  ERR_clear_error();
  return absl::InternalError(absl::StrCat("OpenSSL: ", what, " failed"));
}

// PemBlock is one PEM block read by PEM_read_bio_ex into OpenSSL's secure heap (a plain
// allocation when the process has none); the decoded bytes are cleansed when it is destroyed.
struct PemBlock {
  PemBlock() = default;
  PemBlock(const PemBlock&) = delete;
  PemBlock& operator=(const PemBlock&) = delete;
  ~PemBlock() {
    OPENSSL_secure_free(name);
    OPENSSL_secure_free(header);
    OPENSSL_secure_clear_free(data, data_len > 0 ? static_cast<size_t>(data_len) : 0);
  }

  char* name = nullptr;
  char* header = nullptr;
  unsigned char* data = nullptr;
  long data_len = 0;
};

bool IsAsciiSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

bool OnlyWhitespace(absl::string_view s) {
  for (char c : s) {
    if (!IsAsciiSpace(c)) return false;
  }
  return true;
}

// ReadOnePem returns whether `text` is exactly one PEM block without headers, whitespace around
// it allowed, filling `block`. PEM_read_bio alone would skip any text before the block and
// ignore any after it (a second key, say); a key file holds one thing.
bool ReadOnePem(absl::string_view text, PemBlock& block) {
  size_t start = 0;
  while (start < text.size() && IsAsciiSpace(text[start])) ++start;
  if (text.substr(start).rfind("-----BEGIN ", 0) != 0) return false;
  if (text.size() > static_cast<size_t>(INT32_MAX)) return false;
  BioPtr bio(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())));
  if (bio == nullptr) return false;
  if (PEM_read_bio_ex(bio.get(), &block.name, &block.header, &block.data, &block.data_len,
                      PEM_FLAG_SECURE | PEM_FLAG_ONLY_B64) != 1) {
    ERR_clear_error();
    return false;
  }
  char* rest = nullptr;
  const long rest_len = BIO_get_mem_data(bio.get(), &rest);
  return rest_len <= 0 || OnlyWhitespace(absl::string_view(rest, static_cast<size_t>(rest_len)));
}

// FingerprintOfRaw returns the fingerprint of the raw public key `raw` (signing_key.h, top).
absl::StatusOr<std::string> FingerprintOfRaw(absl::string_view raw) {
  uint8_t digest[EVP_MAX_MD_SIZE];
  unsigned int digest_len = 0;
  if (EVP_Digest(raw.data(), raw.size(), digest, &digest_len, EVP_sha256(), nullptr) != 1 ||
      digest_len != 32) {
    return OpenSslError("SHA-256");
  }
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(digest), 8));
}

// RawPublicKey returns the raw 32-byte public key of the Ed25519 key `pkey`.
absl::StatusOr<std::string> RawPublicKey(const EVP_PKEY* pkey) {
  std::string raw(kEd25519PublicKeyBytes, '\0');
  size_t len = raw.size();
  if (EVP_PKEY_get_raw_public_key(pkey, reinterpret_cast<uint8_t*>(raw.data()), &len) != 1 ||
      len != kEd25519PublicKeyBytes) {
    return OpenSslError("EVP_PKEY_get_raw_public_key");
  }
  return raw;
}

// PublicKeyPemOf returns the SubjectPublicKeyInfo PEM of `pkey`.
absl::StatusOr<std::string> PublicKeyPemOf(const EVP_PKEY* pkey) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (bio == nullptr || PEM_write_bio_PUBKEY(bio.get(), pkey) != 1) {
    return OpenSslError("PEM_write_bio_PUBKEY");
  }
  char* data = nullptr;
  const long len = BIO_get_mem_data(bio.get(), &data);
  if (len <= 0) return OpenSslError("PEM_write_bio_PUBKEY");
  return std::string(data, static_cast<size_t>(len));
}

// NewEd25519Key returns a fresh Ed25519 key from OpenSSL's CSPRNG.
absl::StatusOr<PkeyPtr> NewEd25519Key() {
  PkeyCtxPtr ctx(EVP_PKEY_CTX_new_id(EVP_PKEY_ED25519, nullptr));
  EVP_PKEY* pkey = nullptr;
  if (ctx == nullptr || EVP_PKEY_keygen_init(ctx.get()) != 1 ||
      EVP_PKEY_keygen(ctx.get(), &pkey) != 1) {
    return OpenSslError("Ed25519 key generation");
  }
  return PkeyPtr(pkey);
}

// ParsePrivateKeyPem returns the Ed25519 key in `text`, the contents of key file `path`, or
// InvalidArgument naming `path`. Messages never quote `text`, which holds the key.
absl::StatusOr<PkeyPtr> ParsePrivateKeyPem(const std::string& path, absl::string_view text) {
  auto bad = [&path](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("signing key file ", path, ": ", why));
  };
  if (OnlyWhitespace(text)) {
    return bad(
        "is empty (left by a crash while it was being created?); if no log was signed with it, "
        "remove it and a new key is created");
  }
  PemBlock block;
  if (!ReadOnePem(text, block)) {
    return bad("not a single PEM block (expected one '-----BEGIN PRIVATE KEY-----' block)");
  }
  if (strcmp(block.name, kEncryptedPrivateKeyLabel) == 0) {
    return bad("the key is encrypted; store it unencrypted, with mode 0600");
  }
  if (strcmp(block.name, kPrivateKeyLabel) != 0) {
    return bad("not a PKCS#8 private key (expected '-----BEGIN PRIVATE KEY-----')");
  }
  const unsigned char* p = block.data;
  Pkcs8Ptr p8(d2i_PKCS8_PRIV_KEY_INFO(nullptr, &p, block.data_len));
  if (p8 == nullptr || p != block.data + block.data_len) {
    ERR_clear_error();
    return bad("malformed PKCS#8 private key");
  }
  PkeyPtr pkey(EVP_PKCS82PKEY(p8.get()));
  if (pkey == nullptr) {
    ERR_clear_error();
    return bad("malformed or unsupported PKCS#8 private key");
  }
  if (EVP_PKEY_get_id(pkey.get()) != EVP_PKEY_ED25519) {
    const char* type = EVP_PKEY_get0_type_name(pkey.get());
    return bad(absl::StrCat("key type ", type != nullptr ? type : "unknown",
                            ", but the audit log signs with Ed25519 only"));
  }
  return pkey;
}

// ParsePublicKeyPem returns the Ed25519 key in `pem` (VerifyingKey::FromPem), or
// InvalidArgument whose message starts with `context`.
absl::StatusOr<PkeyPtr> ParsePublicKeyPem(absl::string_view pem, absl::string_view context) {
  auto bad = [context](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(context, ": ", why));
  };
  PemBlock block;
  if (!ReadOnePem(pem, block)) {
    return bad("not a single PEM block (expected one '-----BEGIN PUBLIC KEY-----' block)");
  }
  // "PRIVATE KEY", "ENCRYPTED PRIVATE KEY", "RSA PRIVATE KEY", ...
  if (absl::EndsWith(block.name, kPrivateKeyLabel)) {
    return bad(
        "a private key, not a public key; give auditors the public key only (kvguard audit "
        "pubkey)");
  }
  if (strcmp(block.name, kPublicKeyLabel) != 0) {
    return bad("not a SubjectPublicKeyInfo public key (expected '-----BEGIN PUBLIC KEY-----')");
  }
  const unsigned char* p = block.data;
  PkeyPtr pkey(d2i_PUBKEY(nullptr, &p, block.data_len));
  if (pkey == nullptr || p != block.data + block.data_len) {
    ERR_clear_error();
    return bad("malformed or unsupported SubjectPublicKeyInfo");
  }
  if (EVP_PKEY_get_id(pkey.get()) != EVP_PKEY_ED25519) {
    const char* type = EVP_PKEY_get0_type_name(pkey.get());
    return bad(absl::StrCat("key type ", type != nullptr ? type : "unknown",
                            ", but the audit log signs with Ed25519 only"));
  }
  return pkey;
}

// WritePrivateKeyFile returns OK once `pkey` is durable in the new file `path` as PKCS#8 PEM
// (WriteNewPrivateFile's errors). The PEM is built in a secure-memory BIO, which cleanses it when
// freed.
absl::Status WritePrivateKeyFile(const std::string& path, EVP_PKEY* pkey) {
  BioPtr bio(BIO_new(BIO_s_secmem()));
  if (bio == nullptr ||
      PEM_write_bio_PrivateKey(bio.get(), pkey, nullptr, nullptr, 0, nullptr, nullptr) != 1) {
    return OpenSslError("PEM_write_bio_PrivateKey");
  }
  char* data = nullptr;
  const long len = BIO_get_mem_data(bio.get(), &data);
  if (len <= 0) return OpenSslError("PEM_write_bio_PrivateKey");
  return WriteNewPrivateFile(path, std::string_view(data, static_cast<size_t>(len)));
}

// Bytes returns `s` as the unsigned bytes OpenSSL takes; never null, even for an empty view
// (whose data() may be).
const uint8_t* Bytes(std::string_view s) {
  static const uint8_t kNothing = 0;
  return s.empty() ? &kNothing : reinterpret_cast<const uint8_t*>(s.data());
}

// Absl returns `s` as Abseil's string_view (Debian's Abseil has its own, not std's).
absl::string_view Absl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

}  // namespace

// ---- SigningKey -------------------------------------------------------------------------------

SigningKey::SigningKey(EVP_PKEY* pkey, std::string public_raw, std::string public_pem,
                       std::string fingerprint)
    : pkey_(pkey),
      public_raw_(std::move(public_raw)),
      public_pem_(std::move(public_pem)),
      fingerprint_(std::move(fingerprint)) {}

SigningKey::~SigningKey() { EVP_PKEY_free(pkey_); }

absl::StatusOr<std::unique_ptr<SigningKey>> SigningKey::Make(EVP_PKEY* pkey) {
  PkeyPtr owned(pkey);
  absl::StatusOr<std::string> raw = RawPublicKey(pkey);
  if (!raw.ok()) return raw.status();
  absl::StatusOr<std::string> pem = PublicKeyPemOf(pkey);
  if (!pem.ok()) return pem.status();
  absl::StatusOr<std::string> fp = FingerprintOfRaw(*raw);
  if (!fp.ok()) return fp.status();
  return std::unique_ptr<SigningKey>(
      new SigningKey(owned.release(), *std::move(raw), *std::move(pem), *std::move(fp)));
}

absl::StatusOr<std::unique_ptr<SigningKey>> SigningKey::CreateEphemeral() {
  absl::StatusOr<PkeyPtr> pkey = NewEd25519Key();
  if (!pkey.ok()) return pkey.status();
  return Make(pkey->release());
}

absl::StatusOr<std::unique_ptr<SigningKey>> SigningKey::LoadOrCreate(const std::string& path) {
  PkeyPtr created;
  auto create = [&created](const std::string& p) -> absl::Status {
    absl::StatusOr<PkeyPtr> pkey = NewEd25519Key();
    if (!pkey.ok()) return pkey.status();
    if (absl::Status s = WritePrivateKeyFile(p, pkey->get()); !s.ok()) return s;
    created = *std::move(pkey);
    return absl::OkStatus();
  };
  SecretBuffer contents(kMaxKeyFileBytes + 1);
  absl::StatusOr<bool> made =
      LoadOrCreatePrivateFile("signing key file", path, kMaxKeyFileBytes, contents.str(), create);
  if (!made.ok()) return made.status();
  if (*made) return Make(created.release());
  absl::StatusOr<PkeyPtr> pkey = ParsePrivateKeyPem(path, contents.str());
  if (!pkey.ok()) return pkey.status();
  return Make(pkey->release());
}

absl::StatusOr<std::string> SigningKey::Sign(std::string_view message) const {
  // A context per call: EVP_MD_CTX is not shareable between threads, the key is (read only).
  MdCtxPtr ctx(EVP_MD_CTX_new());
  if (ctx == nullptr ||
      EVP_DigestSignInit_ex(ctx.get(), nullptr, nullptr, nullptr, nullptr, pkey_, nullptr) != 1) {
    return OpenSslError("EVP_DigestSignInit_ex");
  }
  std::string sig(kEd25519SignatureBytes, '\0');
  size_t sig_len = sig.size();
  if (EVP_DigestSign(ctx.get(), reinterpret_cast<uint8_t*>(sig.data()), &sig_len, Bytes(message),
                     message.size()) != 1 ||
      sig_len != kEd25519SignatureBytes) {
    return OpenSslError("Ed25519 signing");
  }
  return sig;
}

std::string SigningKey::PublicKeyPem() const { return public_pem_; }

std::string SigningKey::Fingerprint() const { return fingerprint_; }

std::string SigningKey::PublicKeyRaw() const { return public_raw_; }

// ---- VerifyingKey -----------------------------------------------------------------------------

VerifyingKey::VerifyingKey(std::shared_ptr<EVP_PKEY> pkey, std::string public_raw,
                           std::string fingerprint)
    : pkey_(std::move(pkey)),
      public_raw_(std::move(public_raw)),
      fingerprint_(std::move(fingerprint)) {}

absl::StatusOr<VerifyingKey> VerifyingKey::Make(EVP_PKEY* pkey) {
  std::shared_ptr<EVP_PKEY> shared(pkey, PkeyFree());
  absl::StatusOr<std::string> raw = RawPublicKey(pkey);
  if (!raw.ok()) return raw.status();
  absl::StatusOr<std::string> fp = FingerprintOfRaw(*raw);
  if (!fp.ok()) return fp.status();
  return VerifyingKey(std::move(shared), *std::move(raw), *std::move(fp));
}

absl::StatusOr<VerifyingKey> VerifyingKey::FromPem(std::string_view pem) {
  absl::StatusOr<PkeyPtr> pkey = ParsePublicKeyPem(Absl(pem), "verifying key");
  if (!pkey.ok()) return pkey.status();
  return Make(pkey->release());
}

absl::StatusOr<VerifyingKey> VerifyingKey::LoadFile(const std::string& path) {
  const std::string context = absl::StrCat("verifying key file ", path);
  FdCloser fd(open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0) return absl::ErrnoToStatus(errno, absl::StrCat(context, ": open"));
  struct stat st;
  if (fstat(fd.get(), &st) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat(context, ": fstat"));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(context, ": not a regular file"));
  }
  std::string text;
  if (absl::Status s = ReadUpTo(fd.get(), kMaxKeyFileBytes, text); !s.ok()) {
    return absl::Status(absl::IsOutOfRange(s) ? absl::StatusCode::kInvalidArgument : s.code(),
                        absl::StrCat(context, ": ", s.message()));
  }
  absl::StatusOr<PkeyPtr> pkey = ParsePublicKeyPem(text, context);
  if (!pkey.ok()) return pkey.status();
  return Make(pkey->release());
}

absl::StatusOr<VerifyingKey> VerifyingKey::FromRaw(std::string_view raw32) {
  if (raw32.size() != kEd25519PublicKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat("verifying key: a raw Ed25519 public key is ",
                                                   kEd25519PublicKeyBytes, " bytes, not ",
                                                   raw32.size()));
  }
  PkeyPtr pkey(EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nullptr, Bytes(raw32), raw32.size()));
  if (pkey == nullptr) {
    ERR_clear_error();
    return absl::InvalidArgumentError("verifying key: not a valid raw Ed25519 public key");
  }
  return Make(pkey.release());
}

bool VerifyingKey::Verify(std::string_view message, std::string_view signature64) const {
  if (signature64.size() != kEd25519SignatureBytes) return false;
  MdCtxPtr ctx(EVP_MD_CTX_new());
  const bool ok = ctx != nullptr &&
                  EVP_DigestVerifyInit_ex(ctx.get(), nullptr, nullptr, nullptr, nullptr,
                                          pkey_.get(), nullptr) == 1 &&
                  EVP_DigestVerify(ctx.get(), Bytes(signature64), signature64.size(),
                                   Bytes(message), message.size()) == 1;
  if (!ok) ERR_clear_error();
  return ok;
}

std::string VerifyingKey::Fingerprint() const { return fingerprint_; }

std::string VerifyingKey::PublicKeyRaw() const { return public_raw_; }

}  // namespace kvguard::audit
