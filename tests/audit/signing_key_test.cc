// Tests of audit/signing_key.h: the key file (creation, reload, mode, symbolic links, files that
// are not Ed25519 private keys), signatures against every corruption of the signature and the
// message, public key parsing, and RFC 8032 known answers (the fingerprint of TEST 1's key
// computed independently with Python's hashlib).
#include "audit/signing_key.h"

#include <gtest/gtest.h>
#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "tests/temp_dir.h"

namespace kvguard::audit {
namespace {

// RFC 8032 section 7.1, TEST 1 (empty message) and TEST 2 (the one byte 0x72).
constexpr char kRfcSecret1[] = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";
constexpr char kRfcPublic1[] = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";
constexpr char kRfcSignature1[] =
    "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065"
    "224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b";
constexpr char kRfcFingerprint1[] = "21fe31dfa154a261";  // hashlib.sha256(pub).hexdigest()[:16]
constexpr char kRfcSecret2[] = "4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb";
constexpr char kRfcPublic2[] = "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c";
constexpr char kRfcSignature2[] =
    "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223"
    "ebdb69da085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00";

constexpr char kMessage[] = "kvguard/audit/checkpoint/v1\n0123456789abcdef0123456789abcdef\n";

std::string FromHex(std::string_view hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16)));
  }
  return out;
}

std::string ToHex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

struct PkeyFree {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyFree>;

// PemKind chooses what Pem writes: the private key as PKCS#8, in the algorithm's own older
// format ("RSA PRIVATE KEY", "EC PRIVATE KEY"), as PKCS#8 encrypted under a passphrase, or the
// public key (SubjectPublicKeyInfo).
enum class PemKind { kPkcs8, kTraditional, kEncrypted, kPublic };

// Pem returns `pkey` written as `kind` chooses, by OpenSSL (not the code under test).
std::string Pem(EVP_PKEY* pkey, PemKind kind) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), &BIO_free);
  int ok = 0;
  switch (kind) {
    case PemKind::kPkcs8:
      ok = PEM_write_bio_PrivateKey(bio.get(), pkey, nullptr, nullptr, 0, nullptr, nullptr);
      break;
    case PemKind::kTraditional:
      ok = PEM_write_bio_PrivateKey_traditional(bio.get(), pkey, nullptr, nullptr, 0, nullptr,
                                                nullptr);
      break;
    case PemKind::kEncrypted: {
      static char kPassphrase[] = "correct horse";
      ok = PEM_write_bio_PKCS8PrivateKey(bio.get(), pkey, EVP_aes_256_cbc(), nullptr, 0, nullptr,
                                         kPassphrase);
      break;
    }
    case PemKind::kPublic:
      ok = PEM_write_bio_PUBKEY(bio.get(), pkey);
      break;
  }
  EXPECT_EQ(ok, 1);
  char* data = nullptr;
  const long len = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(len));
}

PkeyPtr Generate(const char* type) {
  PkeyPtr pkey;
  if (std::string_view(type) == "RSA") {
    pkey.reset(EVP_PKEY_Q_keygen(nullptr, nullptr, "RSA", size_t{1024}));
  } else if (std::string_view(type) == "EC") {
    pkey.reset(EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256"));
  } else {
    pkey.reset(EVP_PKEY_Q_keygen(nullptr, nullptr, type));
  }
  EXPECT_NE(pkey, nullptr) << type;
  return pkey;
}

PkeyPtr RawEd25519(std::string_view secret_hex) {
  const std::string secret = FromHex(secret_hex);
  PkeyPtr pkey(EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, nullptr,
                                            reinterpret_cast<const unsigned char*>(secret.data()),
                                            secret.size()));
  EXPECT_NE(pkey, nullptr);
  return pkey;
}

std::string RawPublic(const EVP_PKEY* pkey) {
  std::string raw(32, '\0');
  size_t len = raw.size();
  EXPECT_EQ(EVP_PKEY_get_raw_public_key(pkey, reinterpret_cast<unsigned char*>(raw.data()), &len),
            1);
  return raw.substr(0, len);
}

// Sha256Fingerprint computes a fingerprint the way FORMAT.md states it, independently of the
// code under test.
std::string Sha256Fingerprint(const std::string& raw) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EXPECT_EQ(EVP_Digest(raw.data(), raw.size(), digest, &len, EVP_sha256(), nullptr), 1);
  return ToHex(std::string_view(reinterpret_cast<const char*>(digest), 8));
}

// Secrets returns the pieces of `pem` an error message must not contain: every base64 line of
// 16 or more characters and the first 16 characters of each.
std::vector<std::string> Secrets(const std::string& pem) {
  std::vector<std::string> out;
  std::istringstream in(pem);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("-----", 0) == 0 || line.size() < 16) continue;
    out.push_back(line);
    out.push_back(line.substr(0, 16));
  }
  return out;
}

// HexRuns returns every run of 16 or more hex digits in `text` (key bytes printed as hex).
std::vector<std::string> HexRuns(const std::string& text) {
  std::vector<std::string> runs;
  std::string run;
  for (size_t i = 0; i <= text.size(); ++i) {
    const char c = i < text.size() ? text[i] : ' ';
    if (std::isxdigit(static_cast<unsigned char>(c))) {
      run.push_back(c);
      continue;
    }
    if (run.size() >= 16) runs.push_back(run);
    run.clear();
  }
  return runs;
}

class SigningKeyTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = tests::NewTempDir("signing_key_test"); }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  // WriteFile writes `contents` to `name` in the test's directory with `mode`; returns the path.
  std::string WriteFile(const std::string& name, const std::string& contents,
                        mode_t mode = 0600) const {
    const std::string path = Path(name);
    std::filesystem::remove(path);
    std::ofstream(path, std::ios::binary) << contents;
    EXPECT_EQ(chmod(path.c_str(), mode), 0);
    return path;
  }

  static std::string ReadFile(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  static mode_t Mode(const std::string& path) {
    struct stat st;
    EXPECT_EQ(lstat(path.c_str(), &st), 0);
    return st.st_mode & 07777;
  }

  std::string dir_;
};

std::unique_ptr<SigningKey> MustLoad(const std::string& path) {
  auto key = SigningKey::LoadOrCreate(path);
  EXPECT_TRUE(key.ok()) << key.status();
  return key.ok() ? *std::move(key) : nullptr;
}

std::unique_ptr<SigningKey> MustCreateEphemeral() {
  auto key = SigningKey::CreateEphemeral();
  EXPECT_TRUE(key.ok()) << key.status();
  return key.ok() ? *std::move(key) : nullptr;
}

std::string MustSign(const SigningKey& key, std::string_view message) {
  auto sig = key.Sign(message);
  EXPECT_TRUE(sig.ok()) << sig.status();
  return sig.ok() ? *sig : std::string();
}

VerifyingKey MustFromPem(const std::string& pem) {
  auto key = VerifyingKey::FromPem(pem);
  EXPECT_TRUE(key.ok()) << key.status();
  return *std::move(key);
}

TEST_F(SigningKeyTest, CreateWritesA0600FileAndReloadGivesTheSameKey) {
  const std::string path = Path("signing.pem");
  ASSERT_FALSE(std::filesystem::exists(path));
  auto created = MustLoad(path);
  ASSERT_NE(created, nullptr);
  EXPECT_EQ(Mode(path), 0600);
  EXPECT_EQ(ReadFile(path).rfind("-----BEGIN PRIVATE KEY-----\n", 0), 0u);

  auto reloaded = MustLoad(path);
  ASSERT_NE(reloaded, nullptr);
  EXPECT_EQ(reloaded->PublicKeyRaw(), created->PublicKeyRaw());
  EXPECT_EQ(reloaded->PublicKeyPem(), created->PublicKeyPem());
  EXPECT_EQ(reloaded->Fingerprint(), created->Fingerprint());
  // The reloaded key signs for the created key's public key.
  EXPECT_TRUE(MustFromPem(created->PublicKeyPem()).Verify(kMessage, MustSign(*reloaded, kMessage)));

  // Twin: a second file holds another key.
  auto other = MustLoad(Path("other.pem"));
  ASSERT_NE(other, nullptr);
  EXPECT_NE(other->PublicKeyRaw(), created->PublicKeyRaw());
  EXPECT_NE(other->Fingerprint(), created->Fingerprint());
}

TEST_F(SigningKeyTest, CreatedFileIs0600WhateverTheUmask) {
  const mode_t old = umask(0);
  auto a = MustLoad(Path("umask0.pem"));
  umask(0277);  // would leave the owner only read
  auto b = MustLoad(Path("umask277.pem"));
  umask(old);
  EXPECT_EQ(Mode(Path("umask0.pem")), 0600);
  EXPECT_EQ(Mode(Path("umask277.pem")), 0600);
}

TEST_F(SigningKeyTest, CreatedFileIsAStandardPkcs8Ed25519Key) {
  const std::string path = Path("signing.pem");
  auto key = MustLoad(path);
  ASSERT_NE(key, nullptr);
  const std::string pem = ReadFile(path);
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new_mem_buf(pem.data(), pem.size()), &BIO_free);
  PkeyPtr parsed(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  ASSERT_NE(parsed, nullptr);
  EXPECT_EQ(EVP_PKEY_get_id(parsed.get()), EVP_PKEY_ED25519);
  EXPECT_EQ(Pem(parsed.get(), PemKind::kPublic), key->PublicKeyPem());
}

TEST_F(SigningKeyTest, PublicKeyFormsAgreeAndFingerprintIsSha256OfTheRawKey) {
  auto key = MustCreateEphemeral();
  ASSERT_NE(key, nullptr);
  EXPECT_EQ(key->PublicKeyRaw().size(), 32u);
  EXPECT_EQ(key->PublicKeyPem().rfind("-----BEGIN PUBLIC KEY-----\n", 0), 0u);
  EXPECT_EQ(key->Fingerprint(), Sha256Fingerprint(key->PublicKeyRaw()));
  EXPECT_EQ(key->Fingerprint().size(), 16u);
  auto from_pem = VerifyingKey::FromPem(key->PublicKeyPem());
  auto from_raw = VerifyingKey::FromRaw(key->PublicKeyRaw());
  ASSERT_TRUE(from_pem.ok()) << from_pem.status();
  ASSERT_TRUE(from_raw.ok()) << from_raw.status();
  EXPECT_EQ(from_pem->Fingerprint(), key->Fingerprint());
  EXPECT_EQ(from_raw->Fingerprint(), key->Fingerprint());
}

TEST(SignatureTest, VerifiesUnderItsKeyAndNotUnderAnother) {
  auto key = MustCreateEphemeral();
  auto other = MustCreateEphemeral();
  ASSERT_NE(key, nullptr);
  ASSERT_NE(other, nullptr);
  const std::string sig = MustSign(*key, kMessage);
  ASSERT_EQ(sig.size(), 64u);
  EXPECT_TRUE(MustFromPem(key->PublicKeyPem()).Verify(kMessage, sig));
  EXPECT_FALSE(MustFromPem(other->PublicKeyPem()).Verify(kMessage, sig));
  // Ed25519 is deterministic: the same message gets the same signature.
  EXPECT_EQ(MustSign(*key, kMessage), sig);
}

TEST(SignatureTest, EveryFlippedByteOfTheSignatureFails) {
  auto key = MustCreateEphemeral();
  ASSERT_NE(key, nullptr);
  const VerifyingKey verifier = MustFromPem(key->PublicKeyPem());
  const std::string sig = MustSign(*key, kMessage);
  ASSERT_TRUE(verifier.Verify(kMessage, sig));
  for (size_t i = 0; i < sig.size(); ++i) {
    std::string bad = sig;
    bad[i] ^= 0x42;
    EXPECT_FALSE(verifier.Verify(kMessage, bad)) << "byte " << i;
  }
}

TEST(SignatureTest, EveryOneBitChangeOfTheMessageFails) {
  auto key = MustCreateEphemeral();
  ASSERT_NE(key, nullptr);
  const VerifyingKey verifier = MustFromPem(key->PublicKeyPem());
  const std::string message = kMessage;
  const std::string sig = MustSign(*key, message);
  ASSERT_TRUE(verifier.Verify(message, sig));
  for (size_t bit = 0; bit < 8 * message.size(); ++bit) {
    std::string bad = message;
    bad[bit / 8] ^= static_cast<char>(1 << (bit % 8));
    EXPECT_FALSE(verifier.Verify(bad, sig)) << "bit " << bit;
  }
  // Truncation and extension of the message fail too.
  EXPECT_FALSE(verifier.Verify(message.substr(0, message.size() - 1), sig));
  EXPECT_FALSE(verifier.Verify(message + '\0', sig));
}

TEST(SignatureTest, OnlyA64ByteSignatureIsAccepted) {
  auto key = MustCreateEphemeral();
  ASSERT_NE(key, nullptr);
  const VerifyingKey verifier = MustFromPem(key->PublicKeyPem());
  const std::string sig = MustSign(*key, kMessage);
  EXPECT_TRUE(verifier.Verify(kMessage, sig));
  EXPECT_FALSE(verifier.Verify(kMessage, sig.substr(0, 63)));
  EXPECT_FALSE(verifier.Verify(kMessage, sig + '\0'));
  EXPECT_FALSE(verifier.Verify(kMessage, sig + sig[0]));
  EXPECT_FALSE(verifier.Verify(kMessage, ""));
  EXPECT_FALSE(verifier.Verify(kMessage, sig + sig));
}

TEST(SignatureTest, EmptyAndLargeMessagesSignAndVerify) {
  auto key = MustCreateEphemeral();
  ASSERT_NE(key, nullptr);
  const VerifyingKey verifier = MustFromPem(key->PublicKeyPem());
  const std::string large(1 << 20, 'x');
  for (const std::string& message : {std::string(), std::string(1, '\0'), large}) {
    const std::string sig = MustSign(*key, message);
    EXPECT_TRUE(verifier.Verify(message, sig)) << message.size();
    EXPECT_FALSE(verifier.Verify(message + 'y', sig)) << message.size();
  }
}

TEST(SignatureTest, CopiesOfAVerifyingKeyOutliveTheOriginal) {
  auto key = MustCreateEphemeral();
  ASSERT_NE(key, nullptr);
  const std::string sig = MustSign(*key, kMessage);
  std::vector<VerifyingKey> copies;
  {
    const VerifyingKey original = MustFromPem(key->PublicKeyPem());
    copies.assign(3, original);
  }
  VerifyingKey assigned = copies[0];
  assigned = copies[1];
  for (const VerifyingKey& v : copies) {
    EXPECT_TRUE(v.Verify(kMessage, sig));
    EXPECT_FALSE(v.Verify("another message", sig));
    EXPECT_EQ(v.Fingerprint(), key->Fingerprint());
  }
  EXPECT_TRUE(assigned.Verify(kMessage, sig));
}

TEST(SignatureTest, ConcurrentSignAndVerify) {
  auto key = MustCreateEphemeral();
  ASSERT_NE(key, nullptr);
  const VerifyingKey verifier = MustFromPem(key->PublicKeyPem());
  constexpr int kThreads = 8;
  constexpr int kPerThread = 200;
  std::vector<int> good(kThreads, 0);
  std::vector<int> rejected(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const std::string message = std::to_string(t) + "/" + std::to_string(i);
        auto sig = key->Sign(message);
        if (!sig.ok()) continue;
        good[t] += verifier.Verify(message, *sig) ? 1 : 0;
        rejected[t] += verifier.Verify(message + "!", *sig) ? 0 : 1;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(good[t], kPerThread) << "thread " << t;
    EXPECT_EQ(rejected[t], kPerThread) << "thread " << t;
  }
}

// RFC 8032's test vectors show that the primitive is standard Ed25519, both through OpenSSL
// directly and through a key file the class loads.
TEST_F(SigningKeyTest, Rfc8032TestVectors) {
  struct Vector {
    const char* secret;
    const char* public_key;
    std::string message;
    const char* signature;
  };
  const Vector vectors[] = {{kRfcSecret1, kRfcPublic1, "", kRfcSignature1},
                            {kRfcSecret2, kRfcPublic2, "\x72", kRfcSignature2}};
  int n = 0;
  for (const Vector& v : vectors) {
    SCOPED_TRACE(n);
    PkeyPtr raw = RawEd25519(v.secret);
    ASSERT_NE(raw, nullptr);
    // OpenSSL directly: the standard primitive.
    std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
    ASSERT_EQ(EVP_DigestSignInit(ctx.get(), nullptr, nullptr, nullptr, raw.get()), 1);
    unsigned char direct[64];
    size_t direct_len = sizeof(direct);
    static const unsigned char kNothing = 0;
    ASSERT_EQ(
        EVP_DigestSign(ctx.get(), direct, &direct_len,
                       v.message.empty() ? &kNothing
                                         : reinterpret_cast<const unsigned char*>(v.message.data()),
                       v.message.size()),
        1);
    EXPECT_EQ(ToHex(std::string_view(reinterpret_cast<const char*>(direct), direct_len)),
              v.signature);

    // The same key through a key file and the classes.
    const std::string path =
        WriteFile("rfc" + std::to_string(n++) + ".pem", Pem(raw.get(), PemKind::kPkcs8), 0600);
    auto key = MustLoad(path);
    ASSERT_NE(key, nullptr);
    EXPECT_EQ(ToHex(key->PublicKeyRaw()), v.public_key);
    const std::string sig = MustSign(*key, v.message);
    EXPECT_EQ(ToHex(sig), v.signature);
    auto verifier = VerifyingKey::FromRaw(FromHex(v.public_key));
    ASSERT_TRUE(verifier.ok()) << verifier.status();
    EXPECT_TRUE(verifier->Verify(v.message, FromHex(v.signature)));
    EXPECT_FALSE(verifier->Verify(v.message + "x", FromHex(v.signature)));
  }
  auto rfc1 = VerifyingKey::FromRaw(FromHex(kRfcPublic1));
  ASSERT_TRUE(rfc1.ok());
  EXPECT_EQ(rfc1->Fingerprint(), kRfcFingerprint1);
}

TEST_F(SigningKeyTest, FileGrantingGroupOrOthersAnythingIsRefused) {
  const std::string pem = Pem(RawEd25519(kRfcSecret1).get(), PemKind::kPkcs8);
  for (mode_t mode : {0644, 0640, 0604, 0660, 0610, 0601, 0620, 0602, 0666}) {
    const std::string path = WriteFile("open.pem", pem, mode);
    auto key = SigningKey::LoadOrCreate(path);
    ASSERT_FALSE(key.ok()) << std::oct << mode;
    EXPECT_EQ(key.status().code(), absl::StatusCode::kFailedPrecondition) << key.status();
    const std::string message(key.status().message());
    EXPECT_NE(message.find(path), std::string::npos) << message;
    for (const std::string& secret : Secrets(pem))
      EXPECT_EQ(message.find(secret), std::string::npos);
    EXPECT_EQ(Mode(path), mode) << "the file must be left as it was";
  }
  // Twins: the owner-only modes are accepted.
  for (mode_t mode : {0600, 0400}) {
    const std::string path = WriteFile("closed.pem", pem, mode);
    auto key = SigningKey::LoadOrCreate(path);
    ASSERT_TRUE(key.ok()) << std::oct << mode << " " << key.status();
    EXPECT_EQ(ToHex((*key)->PublicKeyRaw()), kRfcPublic1);
  }
}

TEST_F(SigningKeyTest, SymbolicLinkIsRefusedAndNeverFollowed) {
  const std::string target = Path("real.pem");
  auto real = MustLoad(target);
  ASSERT_NE(real, nullptr);
  const std::string link = Path("link.pem");
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
  auto via_link = SigningKey::LoadOrCreate(link);
  ASSERT_FALSE(via_link.ok());
  EXPECT_EQ(via_link.status().code(), absl::StatusCode::kFailedPrecondition) << via_link.status();
  EXPECT_NE(via_link.status().message().find(link), std::string::npos);
  // Twin: the target itself loads.
  EXPECT_NE(MustLoad(target), nullptr);

  // A dangling link is refused too, and nothing is created where it points.
  const std::string missing = Path("missing.pem");
  const std::string dangling = Path("dangling.pem");
  ASSERT_EQ(symlink(missing.c_str(), dangling.c_str()), 0);
  auto via_dangling = SigningKey::LoadOrCreate(dangling);
  ASSERT_FALSE(via_dangling.ok());
  EXPECT_EQ(via_dangling.status().code(), absl::StatusCode::kFailedPrecondition)
      << via_dangling.status();
  EXPECT_FALSE(std::filesystem::exists(missing));
}

TEST_F(SigningKeyTest, NonRegularFilesAreRefused) {
  const std::string dir = Path("a-directory");
  ASSERT_TRUE(std::filesystem::create_directory(dir));
  ASSERT_EQ(chmod(dir.c_str(), 0700), 0);
  auto from_dir = SigningKey::LoadOrCreate(dir);
  ASSERT_FALSE(from_dir.ok());
  EXPECT_EQ(from_dir.status().code(), absl::StatusCode::kFailedPrecondition) << from_dir.status();

  const std::string fifo = Path("a-fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  auto from_fifo = SigningKey::LoadOrCreate(fifo);  // must not block waiting for a writer
  ASSERT_FALSE(from_fifo.ok());
  EXPECT_EQ(from_fifo.status().code(), absl::StatusCode::kFailedPrecondition) << from_fifo.status();

  // Twin: a regular file beside them loads.
  EXPECT_NE(MustLoad(Path("regular.pem")), nullptr);
}

TEST_F(SigningKeyTest, FilesThatAreNotEd25519PrivateKeysAreRefusedWithoutQuotingThem) {
  PkeyPtr ed25519 = Generate("ED25519");
  PkeyPtr rsa = Generate("RSA");
  PkeyPtr ec = Generate("EC");
  PkeyPtr ed448 = Generate("ED448");
  const std::string good = Pem(ed25519.get(), PemKind::kPkcs8);
  const std::string body_of_good = good.substr(28, good.size() - 28 - 26);  // base64 lines only
  struct Case {
    const char* name;
    std::string contents;
    const char* why;  // the message says this
  };
  constexpr char kExpectedPkcs8[] = "expected '-----BEGIN PRIVATE KEY-----'";
  constexpr char kNotEd25519[] = "but the audit log signs with Ed25519 only";
  const Case cases[] = {
      {"empty", "", "is empty"},
      {"whitespace", "\n \n", "is empty"},
      {"not PEM", "this is not a key at all, just some text that is long enough\n",
       "not a single PEM block"},
      {"garbage base64",
       "-----BEGIN PRIVATE KEY-----\nQUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo=\n-----END PRIVATE "
       "KEY-----\n",
       "malformed PKCS#8"},
      {"bad base64", "-----BEGIN PRIVATE KEY-----\n!!!!notbase64!!!!\n-----END PRIVATE KEY-----\n",
       "not a single PEM block"},
      {"truncated", good.substr(0, good.size() / 2), "not a single PEM block"},
      {"body only", body_of_good, "not a single PEM block"},
      {"RSA PKCS#8", Pem(rsa.get(), PemKind::kPkcs8), kNotEd25519},
      {"RSA traditional", Pem(rsa.get(), PemKind::kTraditional), kExpectedPkcs8},
      {"EC PKCS#8", Pem(ec.get(), PemKind::kPkcs8), kNotEd25519},
      {"EC traditional", Pem(ec.get(), PemKind::kTraditional), kExpectedPkcs8},
      {"Ed448", Pem(ed448.get(), PemKind::kPkcs8), kNotEd25519},
      {"encrypted Ed25519", Pem(ed25519.get(), PemKind::kEncrypted), "encrypted"},
      {"Ed25519 public key", Pem(ed25519.get(), PemKind::kPublic), kExpectedPkcs8},
      {"text before", "comment\n" + good, "not a single PEM block"},
      {"two keys", good + Pem(Generate("ED25519").get(), PemKind::kPkcs8),
       "not a single PEM block"},
      {"trailing text", good + "trailing\n", "not a single PEM block"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = WriteFile("bad.pem", c.contents);
    auto key = SigningKey::LoadOrCreate(path);
    ASSERT_FALSE(key.ok());
    EXPECT_EQ(key.status().code(), absl::StatusCode::kInvalidArgument) << key.status();
    const std::string message(key.status().message());
    EXPECT_NE(message.find(path), std::string::npos) << message;
    EXPECT_NE(message.find(c.why), std::string::npos) << message;
    for (const std::string& secret : Secrets(c.contents)) {
      EXPECT_EQ(message.find(secret), std::string::npos) << message;
    }
    EXPECT_TRUE(HexRuns(message).empty()) << message;
    EXPECT_EQ(ReadFile(path), c.contents) << "a refused file must be left as it was";
  }
  // Twins: the same Ed25519 key, as it should be stored, loads; whitespace around it is fine.
  for (const std::string& contents : {good, "\n" + good + "\n\n"}) {
    const std::string path = WriteFile("good.pem", contents);
    auto key = SigningKey::LoadOrCreate(path);
    ASSERT_TRUE(key.ok()) << key.status();
    EXPECT_EQ((*key)->PublicKeyPem(), Pem(ed25519.get(), PemKind::kPublic));
  }
}

TEST(VerifyingKeyTest, FromPemAcceptsOnlyAnEd25519PublicKey) {
  PkeyPtr ed25519 = Generate("ED25519");
  PkeyPtr rsa = Generate("RSA");
  PkeyPtr ed448 = Generate("ED448");
  const std::string good = Pem(ed25519.get(), PemKind::kPublic);
  const std::string private_pem = Pem(ed25519.get(), PemKind::kPkcs8);
  struct Case {
    const char* name;
    std::string pem;
    const char* why;  // the message says this
  };
  constexpr char kNotEd25519[] = "but the audit log signs with Ed25519 only";
  const Case cases[] = {
      {"empty", "", "not a single PEM block"},
      {"garbage", "not a key\n", "not a single PEM block"},
      {"garbage base64",
       "-----BEGIN PUBLIC KEY-----\nQUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo=\n-----END PUBLIC "
       "KEY-----\n",
       "malformed"},
      {"truncated", good.substr(0, good.size() - 10), "not a single PEM block"},
      {"private key", private_pem, "a private key, not a public key"},
      {"encrypted private key", Pem(ed25519.get(), PemKind::kEncrypted),
       "a private key, not a public key"},
      {"RSA private key, traditional", Pem(rsa.get(), PemKind::kTraditional),
       "a private key, not a public key"},
      {"certificate request",
       "-----BEGIN CERTIFICATE REQUEST-----\nMA==\n-----END CERTIFICATE REQUEST-----\n",
       "expected '-----BEGIN PUBLIC KEY-----'"},
      {"RSA public key", Pem(rsa.get(), PemKind::kPublic), kNotEd25519},
      {"Ed448 public key", Pem(ed448.get(), PemKind::kPublic), kNotEd25519},
      {"two keys", good + good, "not a single PEM block"},
      {"text before", "the key:\n" + good, "not a single PEM block"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto key = VerifyingKey::FromPem(c.pem);
    ASSERT_FALSE(key.ok());
    EXPECT_EQ(key.status().code(), absl::StatusCode::kInvalidArgument) << key.status();
    const std::string message(key.status().message());
    EXPECT_NE(message.find(c.why), std::string::npos) << message;
    for (const std::string& secret : Secrets(private_pem))
      EXPECT_EQ(message.find(secret), std::string::npos);
  }
  // Twin: the public key itself, with whitespace around it, is accepted.
  for (const std::string& pem : {good, "\n" + good + "\n"}) {
    auto key = VerifyingKey::FromPem(pem);
    ASSERT_TRUE(key.ok()) << key.status();
    EXPECT_EQ(key->Fingerprint(), Sha256Fingerprint(RawPublic(ed25519.get())));
  }
}

TEST(VerifyingKeyTest, FromRawAcceptsOnly32Bytes) {
  auto signer = MustCreateEphemeral();
  ASSERT_NE(signer, nullptr);
  const std::string raw = signer->PublicKeyRaw();
  for (const std::string& bad : {std::string(), raw.substr(0, 31), raw + '\0', raw + raw}) {
    auto key = VerifyingKey::FromRaw(bad);
    ASSERT_FALSE(key.ok()) << bad.size();
    EXPECT_EQ(key.status().code(), absl::StatusCode::kInvalidArgument) << key.status();
  }
  // Twin: the 32 bytes themselves.
  auto key = VerifyingKey::FromRaw(raw);
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_EQ(key->Fingerprint(), signer->Fingerprint());
  EXPECT_TRUE(key->Verify(kMessage, MustSign(*signer, kMessage)));
}

TEST_F(SigningKeyTest, LoadFileReadsAPublicKeyFileAndNamesItInErrors) {
  auto signer = MustCreateEphemeral();
  ASSERT_NE(signer, nullptr);
  const std::string missing = Path("missing.pub");
  auto from_missing = VerifyingKey::LoadFile(missing);
  ASSERT_FALSE(from_missing.ok());
  EXPECT_EQ(from_missing.status().code(), absl::StatusCode::kNotFound) << from_missing.status();
  EXPECT_NE(from_missing.status().message().find(missing), std::string::npos);

  const std::string private_path = Path("signing.pem");
  auto private_key = MustLoad(private_path);
  auto from_private = VerifyingKey::LoadFile(private_path);
  ASSERT_FALSE(from_private.ok());
  EXPECT_EQ(from_private.status().code(), absl::StatusCode::kInvalidArgument)
      << from_private.status();
  EXPECT_EQ(from_private.status().message(),
            "verifying key file " + private_path +
                ": a private key, not a public key; give auditors the public key only (kvguard "
                "audit pubkey)");
  for (const std::string& secret : Secrets(ReadFile(private_path))) {
    EXPECT_EQ(from_private.status().message().find(secret), std::string::npos);
  }

  // Twin: the public key file (public keys need no particular mode).
  const std::string public_path = WriteFile("signing.pub", signer->PublicKeyPem(), 0644);
  auto key = VerifyingKey::LoadFile(public_path);
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_EQ(key->Fingerprint(), signer->Fingerprint());
  EXPECT_TRUE(key->Verify(kMessage, MustSign(*signer, kMessage)));
}

}  // namespace
}  // namespace kvguard::audit
