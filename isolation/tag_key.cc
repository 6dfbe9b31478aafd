#include "isolation/tag_key.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>
#include <pthread.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <utility>
#include <vector>

#include "absl/base/internal/raw_logging.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "audit/hex.h"
#include "audit/private_file.h"

namespace kvguard::isolation {
namespace {

using audit::FsyncParentDir;
using audit::Prefix;
using audit::SecretBuffer;
using audit::WriteNewPrivateFile;

constexpr size_t kKeyBytes = 32;
constexpr char kFileHeader[] = "kvguard-tag-keys v1";
constexpr char kTagDomain[] = "kvguard/page-tag/v1";
constexpr char kFingerprintDomain[] = "kvguard/tag-key-fingerprint/v1";
constexpr size_t kTagDomainLen = sizeof(kTagDomain) - 1;   // 19: the NUL is not hashed
constexpr size_t kMessageLen = kTagDomainLen + 4 + 4 * 8;  // 55
// A key line is at most 10 + 1 + 64 + 1 bytes, so this allows over 13,000 keys.
constexpr size_t kMaxFileBytes = size_t{1} << 20;
// Reusable MAC contexts kept per key. More concurrent Derive calls than this still work; the
// extra ones duplicate the key's master context (about twice the cost).
constexpr int kPoolSlots = 16;

// RwLock is a reader-writer lock (SharedMutex requirements) that makes new readers wait behind
// a waiting writer. glibc's default, which std::shared_mutex uses, lets a steady stream of
// readers starve a writer: Rotate behind four busy Derive threads waited for seconds. pthread
// rather than absl::Mutex: Debian's Abseil is not built with ThreadSanitizer, so TSan could not
// see absl::Mutex's synchronisation.
class RwLock {
 public:
  RwLock() {
    pthread_rwlockattr_t attr;
    ABSL_RAW_CHECK(pthread_rwlockattr_init(&attr) == 0, "RwLock: attr init failed");
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    ABSL_RAW_CHECK(pthread_rwlock_init(&lock_, &attr) == 0, "RwLock: init failed");
    pthread_rwlockattr_destroy(&attr);
  }
  RwLock(const RwLock&) = delete;
  RwLock& operator=(const RwLock&) = delete;
  ~RwLock() { pthread_rwlock_destroy(&lock_); }

  void lock() { ABSL_RAW_CHECK(pthread_rwlock_wrlock(&lock_) == 0, "RwLock: wrlock failed"); }
  void unlock() { ABSL_RAW_CHECK(pthread_rwlock_unlock(&lock_) == 0, "RwLock: unlock failed"); }
  // Nonrecursive: a thread that holds the lock shared must not take it shared again.
  void lock_shared() {
    ABSL_RAW_CHECK(pthread_rwlock_rdlock(&lock_) == 0, "RwLock: rdlock failed");
  }
  void unlock_shared() { unlock(); }

 private:
  pthread_rwlock_t lock_;
};

void StoreBe(uint64_t v, int bytes, uint8_t* out) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<uint8_t>(v >> (8 * (bytes - 1 - i)));
}

uint64_t LoadLe64(const uint8_t* in) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | in[i];
  return v;
}

// EncodeMessage writes the 55-byte MAC input for key `id` and `in` (tag_key.h, top).
void EncodeMessage(KeyId id, const TagInput& in, uint8_t out[kMessageLen]) {
  memcpy(out, kTagDomain, kTagDomainLen);
  uint8_t* p = out + kTagDomainLen;
  StoreBe(id, 4, p);
  StoreBe(in.page, 8, p + 4);
  StoreBe(in.generation, 8, p + 12);
  StoreBe(in.tenant, 8, p + 20);
  StoreBe(in.session, 8, p + 28);
}

// AppendHex appends `bytes` as lowercase hex (audit/hex.h: in place, no temporary copy of a
// key).
void AppendHex(const uint8_t* bytes, size_t n, std::string& out) {
  audit::AppendLowerHex(std::span(bytes, n), out);
}

// ParseHexKey returns whether `hex` is exactly 64 lowercase hex digits, decoding them to `out`
// (uppercase is refused too: the file has one spelling of each key).
bool ParseHexKey(absl::string_view hex, uint8_t out[kKeyBytes]) {
  return audit::ParseLowerHex(std::string_view(hex.data(), hex.size()), std::span(out, kKeyBytes));
}

// ParseKeyId returns whether `s` is a decimal id in [1, 2^32 - 1] without leading zeros.
bool ParseKeyId(absl::string_view s, KeyId* id) {
  if (s.empty() || s.size() > 10 || s[0] == '0') return false;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  if (v > std::numeric_limits<KeyId>::max()) return false;
  *id = static_cast<KeyId>(v);
  return true;
}

// KeyFileCapacity returns an upper bound on the size of a key file holding `num_keys` keys.
size_t KeyFileCapacity(size_t num_keys) {
  return sizeof(kFileHeader) + num_keys * (10 + 1 + 2 * kKeyBytes + 1);
}

}  // namespace

bool TagsEqual(const kernels::PageTag& a, const kernels::PageTag& b) {
  return CRYPTO_memcmp(&a, &b, sizeof(kernels::PageTag)) == 0;
}

// Key holds one key, its fingerprint and its MAC contexts. `master` is keyed once and never
// used to compute; Derive takes a context from `pool` (or duplicates `master` when the pool is
// empty), reinitialises it with EVP_MAC_init(ctx, NULL, 0, NULL), which keeps the key and its
// precomputed HMAC pad states, computes, and puts it back. Duplicating a context costs several
// allocations per call; reinitialising one costs a copy of the inner hash state.
struct TagKeyRing::Key {
  // One cache line per slot, so threads taking contexts from different slots do not contend.
  struct alignas(64) Slot {
    std::atomic<EVP_MAC_CTX*> ctx{nullptr};
  };

  KeyId id = 0;
  uint8_t bytes[kKeyBytes] = {};
  std::string fingerprint;
  EVP_MAC_CTX* master = nullptr;
  mutable std::array<Slot, kPoolSlots> pool;

  Key() = default;
  Key(const Key&) = delete;
  Key& operator=(const Key&) = delete;
  ~Key() {
    // EVP_MAC_CTX_free cleanses the HMAC states (and OpenSSL's copy of the key).
    for (Slot& slot : pool) EVP_MAC_CTX_free(slot.ctx.exchange(nullptr));
    EVP_MAC_CTX_free(master);
    OPENSSL_cleanse(bytes, sizeof(bytes));
  }

  // Make returns key `id` with the `bytes` given (the caller cleanses its copy), or Internal.
  static absl::StatusOr<std::unique_ptr<Key>> Make(KeyId id, const uint8_t key[kKeyBytes]) {
    auto k = std::make_unique<Key>();
    k->id = id;
    memcpy(k->bytes, key, kKeyBytes);

    uint8_t digest[32];
    unsigned int digest_len = 0;
    EVP_MD_CTX* md = EVP_MD_CTX_new();
    const bool hashed = md != nullptr && EVP_DigestInit_ex(md, EVP_sha256(), nullptr) == 1 &&
                        EVP_DigestUpdate(md, kFingerprintDomain, strlen(kFingerprintDomain)) == 1 &&
                        EVP_DigestUpdate(md, k->bytes, kKeyBytes) == 1 &&
                        EVP_DigestFinal_ex(md, digest, &digest_len) == 1 && digest_len == 32;
    EVP_MD_CTX_free(md);
    if (!hashed) return absl::InternalError("tag key: SHA-256 failed");
    AppendHex(digest, 8, k->fingerprint);

    EVP_MAC* mac = EVP_MAC_fetch(nullptr, OSSL_MAC_NAME_HMAC, nullptr);
    if (mac == nullptr) return absl::InternalError("tag key: OpenSSL has no HMAC");
    k->master = EVP_MAC_CTX_new(mac);
    EVP_MAC_free(mac);  // the context holds its own reference
    char digest_name[] = "SHA256";
    const OSSL_PARAM params[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest_name, 0),
        OSSL_PARAM_construct_end()};
    if (k->master == nullptr || EVP_MAC_init(k->master, k->bytes, kKeyBytes, params) != 1) {
      return absl::InternalError("tag key: HMAC-SHA256 init failed");
    }
    return k;
  }

  // Random returns key `id` with fresh bytes from the CSPRNG, or Internal.
  static absl::StatusOr<std::unique_ptr<Key>> Random(KeyId id) {
    uint8_t raw[kKeyBytes];
    if (RAND_priv_bytes(raw, kKeyBytes) != 1) {
      return absl::InternalError("tag key: RAND_priv_bytes failed");
    }
    absl::StatusOr<std::unique_ptr<Key>> key = Make(id, raw);
    OPENSSL_cleanse(raw, sizeof(raw));
    return key;
  }

  // AppendLine appends this key's line of the key file ("<id> <64 hex>\n") to `out`.
  void AppendLine(std::string& out) const {
    out.append(std::to_string(id)).push_back(' ');
    AppendHex(bytes, kKeyBytes, out);
    out.push_back('\n');
  }

  // Acquire returns a keyed context for this thread's exclusive use, or nullptr if OpenSSL
  // cannot allocate one. Give it back with Release.
  EVP_MAC_CTX* Acquire() const {
    const int start = SlotHint();
    for (int i = 0; i < kPoolSlots; ++i) {
      EVP_MAC_CTX* ctx =
          pool[(start + i) % kPoolSlots].ctx.exchange(nullptr, std::memory_order_acquire);
      if (ctx != nullptr) return ctx;
    }
    return EVP_MAC_CTX_dup(master);
  }

  // Release returns `ctx` to the pool, or frees it if the pool is full.
  void Release(EVP_MAC_CTX* ctx) const {
    const int start = SlotHint();
    for (int i = 0; i < kPoolSlots; ++i) {
      EVP_MAC_CTX* expected = nullptr;
      if (pool[(start + i) % kPoolSlots].ctx.compare_exchange_strong(
              expected, ctx, std::memory_order_release, std::memory_order_relaxed)) {
        return;
      }
    }
    EVP_MAC_CTX_free(ctx);
  }

  // SlotHint returns where this thread starts looking in a pool: threads spread over slots.
  static int SlotHint() {
    static std::atomic<int> next{0};
    thread_local const int hint = next.fetch_add(1, std::memory_order_relaxed) % kPoolSlots;
    return hint;
  }
};

struct TagKeyRing::State {
  using KeyMap = std::map<KeyId, std::unique_ptr<Key>>;

  State(std::string path_in, KeyMap keys_in) : path(std::move(path_in)), keys(std::move(keys_in)) {
    ABSL_RAW_CHECK(!keys.empty(), "TagKeyRing: a ring holds at least one key");
  }

  // WriteFile returns OK once `keys` (ascending ids) replace the contents of `path` atomically,
  // or at once when `path` is empty (an ephemeral ring).
  absl::Status WriteFile(const std::vector<const Key*>& keys) const;

  const std::string path;  // empty: ephemeral
  // Serialises Rotate and Retire (file write, then the in-memory change) without blocking
  // Derive while the file is written.
  std::mutex update_mu;
  // Guards `keys`. Derive holds it shared for the whole MAC, so a retired key's contexts are
  // never freed under a reader; writers hold it only to insert or erase one map entry.
  mutable RwLock mu;
  KeyMap keys;  // never empty; the last entry is the active key
};

TagKeyRing::TagKeyRing(std::unique_ptr<State> state) : state_(std::move(state)) {}

TagKeyRing::~TagKeyRing() = default;

absl::StatusOr<std::unique_ptr<TagKeyRing>> TagKeyRing::CreateEphemeral() {
  absl::StatusOr<std::unique_ptr<Key>> key = Key::Random(1);
  if (!key.ok()) return key.status();
  State::KeyMap keys;
  keys.emplace(1, *std::move(key));
  return std::unique_ptr<TagKeyRing>(new TagKeyRing(std::make_unique<State>("", std::move(keys))));
}

absl::Status TagKeyRing::State::WriteFile(const std::vector<const Key*>& keys) const {
  if (path.empty()) return absl::OkStatus();
  SecretBuffer contents(KeyFileCapacity(keys.size()));
  contents.str().append(kFileHeader).push_back('\n');
  for (const Key* key : keys) key->AppendLine(contents.str());
  // A stale <path>.tmp (a crash mid-rotation) is removed rather than reused: whoever made it
  // chose its mode, and O_EXCL then guarantees the file written is the one just created.
  const std::string tmp = path + ".tmp";
  if (unlink(tmp.c_str()) != 0 && errno != ENOENT) {
    return absl::ErrnoToStatus(errno, absl::StrCat("tag key file: remove stale ", tmp));
  }
  if (absl::Status s = WriteNewPrivateFile(tmp, contents.str()); !s.ok()) {
    return Prefix(s, "tag key file");
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    unlink(tmp.c_str());
    return absl::ErrnoToStatus(err, absl::StrCat("tag key file: rename ", tmp, " to ", path));
  }
  if (absl::Status s = FsyncParentDir(path); !s.ok()) return Prefix(s, "tag key file");
  return absl::OkStatus();
}

namespace {

// ParseKeyFile returns OK after passing every key in `text` (the contents of key file `path`) to
// `add_key`, InvalidArgument naming the first bad line, or the first error `add_key` returns.
// Messages never quote the file, which holds key material. `add_key` is called once per key line,
// in file order; the bytes it gets are cleansed after.
absl::Status ParseKeyFile(const std::string& path, absl::string_view text,
                          absl::FunctionRef<absl::Status(KeyId, const uint8_t*)> add_key) {
  auto bad = [&path](int line, absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("tag key file ", path, ": line ", line, ": ", why));
  };
  int line_no = 0;
  KeyId previous = 0;
  while (!text.empty()) {
    ++line_no;
    const size_t eol = text.find('\n');
    if (eol == absl::string_view::npos) return bad(line_no, "not terminated by a newline");
    const absl::string_view line = text.substr(0, eol);
    text.remove_prefix(eol + 1);
    if (line_no == 1) {
      if (line != kFileHeader) {
        return bad(line_no, absl::StrCat("expected the header '", kFileHeader, "'"));
      }
      continue;
    }
    const size_t space = line.find(' ');
    if (space == absl::string_view::npos || line.find(' ', space + 1) != absl::string_view::npos) {
      return bad(line_no, "expected '<key id> <64 lowercase hex digits>', one space between");
    }
    KeyId id = 0;
    if (!ParseKeyId(line.substr(0, space), &id)) {
      return bad(line_no, "key id must be a decimal number in [1, 4294967295], no leading zeros");
    }
    if (id <= previous) {
      return bad(line_no,
                 absl::StrCat("key ids must strictly increase (", id, " follows ", previous, ")"));
    }
    uint8_t raw[kKeyBytes];
    const bool hex_ok = ParseHexKey(line.substr(space + 1), raw);
    if (!hex_ok) {
      OPENSSL_cleanse(raw, sizeof(raw));
      return bad(line_no, "key must be exactly 64 lowercase hex digits");
    }
    absl::Status added = add_key(id, raw);
    OPENSSL_cleanse(raw, sizeof(raw));
    if (!added.ok()) return added;
    previous = id;
  }
  if (line_no == 0) return bad(1, absl::StrCat("expected the header '", kFileHeader, "'"));
  if (previous == 0) return bad(line_no + 1, "no keys after the header");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<TagKeyRing>> TagKeyRing::LoadOrCreate(const std::string& path) {
  std::unique_ptr<Key> created;
  auto create = [&created](const std::string& p) -> absl::Status {
    // No file yet: write one holding a new key 1.
    absl::StatusOr<std::unique_ptr<Key>> key = Key::Random(1);
    if (!key.ok()) return key.status();
    SecretBuffer contents(KeyFileCapacity(1));
    contents.str().append(kFileHeader).push_back('\n');
    (*key)->AppendLine(contents.str());
    if (absl::Status s = WriteNewPrivateFile(p, contents.str()); !s.ok()) return s;
    created = *std::move(key);
    return absl::OkStatus();
  };
  SecretBuffer contents(kMaxFileBytes + 1);
  absl::StatusOr<bool> made =
      audit::LoadOrCreatePrivateFile("tag key file", path, kMaxFileBytes, contents.str(), create);
  if (!made.ok()) return made.status();
  State::KeyMap keys;
  if (*made) {
    keys.emplace(1, std::move(created));
  } else {
    auto add_key = [&keys](KeyId id, const uint8_t* raw) -> absl::Status {
      absl::StatusOr<std::unique_ptr<Key>> key = Key::Make(id, raw);
      if (!key.ok()) return key.status();
      keys.emplace(id, *std::move(key));
      return absl::OkStatus();
    };
    const std::string& text = contents.str();
    if (absl::Status s = ParseKeyFile(path, absl::string_view(text.data(), text.size()), add_key);
        !s.ok()) {
      return s;
    }
  }
  return std::unique_ptr<TagKeyRing>(
      new TagKeyRing(std::make_unique<State>(path, std::move(keys))));
}

absl::StatusOr<KeyId> TagKeyRing::Rotate() {
  return Rotate([](KeyId, const std::string&) { return absl::OkStatus(); });
}

absl::StatusOr<KeyId> TagKeyRing::Rotate(
    absl::FunctionRef<absl::Status(KeyId id, const std::string& fingerprint)> record) {
  State& st = *state_;
  std::lock_guard<std::mutex> update(st.update_mu);
  // Only updaters (serialised by update_mu, which this call holds) change `keys`, so the
  // pointers taken here stay valid after the shared lock is dropped.
  std::vector<const Key*> keys;
  {
    std::shared_lock<RwLock> lock(st.mu);
    for (const auto& [id, key] : st.keys) keys.push_back(key.get());
  }
  const KeyId active = keys.back()->id;
  if (active == std::numeric_limits<KeyId>::max()) {
    return absl::ResourceExhaustedError("tag keys: no key id left after 4294967295");
  }
  absl::StatusOr<std::unique_ptr<Key>> key = Key::Random(active + 1);
  if (!key.ok()) return key.status();
  if (absl::Status s = record(active + 1, (*key)->fingerprint); !s.ok()) return s;
  keys.push_back(key->get());
  if (absl::Status s = st.WriteFile(keys); !s.ok()) return s;
  std::unique_lock<RwLock> lock(st.mu);
  st.keys.emplace(active + 1, *std::move(key));
  return active + 1;
}

absl::Status TagKeyRing::Retire(KeyId id) {
  State& st = *state_;
  std::lock_guard<std::mutex> update(st.update_mu);
  std::vector<const Key*> rest;
  {
    std::shared_lock<RwLock> lock(st.mu);
    if (st.keys.find(id) == st.keys.end()) {
      return absl::NotFoundError(absl::StrCat("tag keys: no key ", id));
    }
    if (id == st.keys.rbegin()->first) {
      return absl::FailedPreconditionError(
          absl::StrCat("tag keys: key ", id, " is active; rotate before retiring it"));
    }
    for (const auto& [other, key] : st.keys) {
      if (other != id) rest.push_back(key.get());
    }
  }
  if (absl::Status s = st.WriteFile(rest); !s.ok()) return s;
  std::unique_ptr<Key> retired;
  {
    std::unique_lock<RwLock> lock(st.mu);
    auto it = st.keys.find(id);
    retired = std::move(it->second);
    st.keys.erase(it);
  }
  return absl::OkStatus();  // `retired` is cleansed here, outside the lock
}

KeyId TagKeyRing::active_id() const {
  std::shared_lock<RwLock> lock(state_->mu);
  return state_->keys.rbegin()->first;
}

std::vector<KeyId> TagKeyRing::key_ids() const {
  std::shared_lock<RwLock> lock(state_->mu);
  std::vector<KeyId> ids;
  ids.reserve(state_->keys.size());
  for (const auto& [id, key] : state_->keys) ids.push_back(id);
  return ids;
}

absl::StatusOr<std::string> TagKeyRing::Fingerprint(KeyId id) const {
  std::shared_lock<RwLock> lock(state_->mu);
  auto it = state_->keys.find(id);
  if (it == state_->keys.end()) return absl::NotFoundError(absl::StrCat("tag keys: no key ", id));
  return it->second->fingerprint;
}

absl::StatusOr<kernels::PageTag> TagKeyRing::Derive(KeyId id, const TagInput& in) const {
  uint8_t msg[kMessageLen];
  EncodeMessage(id, in, msg);
  uint8_t mac[32];
  size_t mac_len = 0;
  {
    std::shared_lock<RwLock> lock(state_->mu);
    auto it = state_->keys.find(id);
    if (it == state_->keys.end()) {
      return absl::NotFoundError(absl::StrCat("tag keys: no key ", id));
    }
    const Key& key = *it->second;
    EVP_MAC_CTX* ctx = key.Acquire();
    const bool ok = ctx != nullptr && EVP_MAC_init(ctx, nullptr, 0, nullptr) == 1 &&
                    EVP_MAC_update(ctx, msg, kMessageLen) == 1 &&
                    EVP_MAC_final(ctx, mac, &mac_len, sizeof(mac)) == 1 && mac_len == sizeof(mac);
    if (!ok) {
      EVP_MAC_CTX_free(ctx);  // its state is unknown: do not pool it
      return absl::InternalError("tag keys: HMAC-SHA256 failed");
    }
    key.Release(ctx);
  }
  kernels::PageTag tag;
  tag.lo = LoadLe64(mac);
  tag.hi = LoadLe64(mac + 8);
  // The all-zero tag means "not owned" to the table and the kernels (a freed page carries
  // it), so no grant may carry it: a zero MAC prefix (probability 2^-128) becomes 1.
  if ((tag.lo | tag.hi) == 0) tag.lo = 1;
  return tag;
}

}  // namespace kvguard::isolation
