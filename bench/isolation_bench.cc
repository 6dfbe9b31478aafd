// Page-tag derivation cost (isolation/tag_key.h): the price of one tag, paid at every page grant
// and, where tags are re-derived to verify, per page per step.
//
//   BM_DeriveTag          TagKeyRing::Derive: a pooled HMAC context per key, reinitialised per
//                         call (EVP_MAC_init with a NULL key keeps the precomputed pad states).
//   BM_DeriveTagDupCtx    the same MAC with EVP_MAC_CTX_dup of a keyed context per call (the
//                         straightforward thread-safe design Derive improves on).
//   BM_DeriveTagOneShot   the same MAC with OpenSSL's one-shot HMAC(), which keys from scratch.
//
// Every variant is checked once against Derive before timing; items = tags derived.
#include <benchmark/benchmark.h>
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/params.h>
#include <stdlib.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "isolation/tag_key.h"

namespace kvguard::bench {
namespace {

using isolation::TagInput;
using isolation::TagKeyRing;
using kernels::PageTag;

// A fixed key (bytes 00..1f), so the raw-OpenSSL variants can use it too.
constexpr char kKeyHex[] = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
constexpr uint8_t kKey[32] = {0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15,
                              16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31};

// Ring returns a ring holding kKey as key 1 (loaded from a key file in a temporary directory,
// which is removed again), or nullptr.
const TagKeyRing* Ring() {
  static const std::unique_ptr<TagKeyRing> ring = []() -> std::unique_ptr<TagKeyRing> {
    std::string dir = (std::filesystem::temp_directory_path() / "isolation_bench.XXXXXX").string();
    if (mkdtemp(dir.data()) == nullptr) return nullptr;
    const std::string path = dir + "/keys";
    std::ofstream(path) << "kvguard-tag-keys v1\n1 " << kKeyHex << "\n";
    std::filesystem::permissions(
        path, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
    auto loaded = TagKeyRing::LoadOrCreate(path);
    std::filesystem::remove_all(dir);
    return loaded.ok() ? *std::move(loaded) : nullptr;
  }();
  return ring.get();
}

// Message returns the 55-byte MAC input (tag_key.h) for key 1 and `in`.
std::array<uint8_t, 55> Message(const TagInput& in) {
  std::array<uint8_t, 55> m;
  memcpy(m.data(), "kvguard/page-tag/v1", 19);
  const uint64_t words[5] = {1, in.page, in.generation, in.tenant, in.session};
  size_t at = 19;
  for (int w = 0; w < 5; ++w) {
    const int bytes = w == 0 ? 4 : 8;
    for (int i = bytes - 1; i >= 0; --i) m[at++] = static_cast<uint8_t>(words[w] >> (8 * i));
  }
  return m;
}

PageTag TagFromMac(const uint8_t* mac) {
  PageTag t;
  for (int i = 7; i >= 0; --i) t.lo = (t.lo << 8) | mac[i];
  for (int i = 15; i >= 8; --i) t.hi = (t.hi << 8) | mac[i];
  return t;
}

TagInput InputFor(uint64_t i) {
  return TagInput{.page = i & 0xFFFF, .generation = i, .tenant = 7, .session = 42};
}

// Matches returns whether `tag` is what Derive gives for `in` (skipping the benchmark if not).
bool Matches(benchmark::State& state, const TagInput& in, const PageTag& tag) {
  auto want = Ring()->Derive(1, in);
  if (!want.ok() || !(*want == tag)) {
    state.SkipWithError("variant disagrees with TagKeyRing::Derive");
    return false;
  }
  return true;
}

void BM_DeriveTag(benchmark::State& state) {
  const TagKeyRing* ring = Ring();
  if (ring == nullptr) {
    state.SkipWithError("no key ring");
    return;
  }
  uint64_t i = static_cast<uint64_t>(state.thread_index()) << 40;
  for (auto _ : state) {
    auto tag = ring->Derive(1, InputFor(i++));
    benchmark::DoNotOptimize(tag);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_DeriveTag);
BENCHMARK(BM_DeriveTag)->Threads(2)->Threads(4)->UseRealTime();

void BM_DeriveTagDupCtx(benchmark::State& state) {
  if (Ring() == nullptr) {
    state.SkipWithError("no key ring");
    return;
  }
  EVP_MAC* mac = EVP_MAC_fetch(nullptr, OSSL_MAC_NAME_HMAC, nullptr);
  EVP_MAC_CTX* keyed = EVP_MAC_CTX_new(mac);
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                               OSSL_PARAM_construct_end()};
  EVP_MAC_init(keyed, kKey, sizeof(kKey), params);
  auto derive = [keyed](const TagInput& in) {
    const std::array<uint8_t, 55> m = Message(in);
    uint8_t out[32];
    size_t out_len = 0;
    EVP_MAC_CTX* ctx = EVP_MAC_CTX_dup(keyed);
    EVP_MAC_update(ctx, m.data(), m.size());
    EVP_MAC_final(ctx, out, &out_len, sizeof(out));
    EVP_MAC_CTX_free(ctx);
    return TagFromMac(out);
  };
  if (Matches(state, InputFor(5), derive(InputFor(5)))) {
    uint64_t i = 0;
    for (auto _ : state) benchmark::DoNotOptimize(derive(InputFor(i++)));
    state.SetItemsProcessed(state.iterations());
  }
  EVP_MAC_CTX_free(keyed);
  EVP_MAC_free(mac);
}
BENCHMARK(BM_DeriveTagDupCtx);

void BM_DeriveTagOneShot(benchmark::State& state) {
  if (Ring() == nullptr) {
    state.SkipWithError("no key ring");
    return;
  }
  auto derive = [](const TagInput& in) {
    const std::array<uint8_t, 55> m = Message(in);
    uint8_t out[32];
    unsigned int out_len = 0;
    HMAC(EVP_sha256(), kKey, sizeof(kKey), m.data(), m.size(), out, &out_len);
    return TagFromMac(out);
  };
  if (!Matches(state, InputFor(5), derive(InputFor(5)))) return;
  uint64_t i = 0;
  for (auto _ : state) benchmark::DoNotOptimize(derive(InputFor(i++)));
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_DeriveTagOneShot);

}  // namespace
}  // namespace kvguard::bench

BENCHMARK_MAIN();
