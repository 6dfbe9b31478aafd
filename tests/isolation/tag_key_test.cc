// Tests of isolation/tag_key.h: key file handling, the tag derivation (known answers computed
// independently with Python's hmac module), rotation, retirement and concurrent use.
#include "isolation/tag_key.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/temp_dir.h"

namespace kvguard::isolation {
namespace {

using kernels::PageTag;

constexpr char kHeader[] = "kvguard-tag-keys v1\n";
// Two fixed keys: bytes 00..1f and a0..bf.
constexpr char kKeyA[] = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
constexpr char kKeyB[] = "a0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebf";
constexpr char kKeyC[] = "5555555555555555555555555555555555555555555555555555555555555555";

constexpr TagInput kInput = {.page = 0x0102030405060708,
                             .generation = 0x1112131415161718,
                             .tenant = 0x2122232425262728,
                             .session = 0x3132333435363738};

class TagKeyTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = tests::NewTempDir("tag_key_test"); }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  // WriteKeyFile writes `contents` to `name` in the test's directory with `mode`; returns the path.
  std::string WriteKeyFile(const std::string& name, const std::string& contents,
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

std::unique_ptr<TagKeyRing> MustLoad(const std::string& path) {
  auto ring = TagKeyRing::LoadOrCreate(path);
  EXPECT_TRUE(ring.ok()) << ring.status();
  return ring.ok() ? *std::move(ring) : nullptr;
}

PageTag MustDerive(const TagKeyRing& ring, KeyId id, const TagInput& in) {
  auto tag = ring.Derive(id, in);
  EXPECT_TRUE(tag.ok()) << tag.status();
  return tag.ok() ? *tag : PageTag{};
}

// HexRuns returns every run of 16 or more hex digits in `text`, and the first 16 digits of each:
// an error message must contain none of them.
std::vector<std::string> HexRuns(const std::string& text) {
  std::vector<std::string> runs;
  std::string run;
  for (size_t i = 0; i <= text.size(); ++i) {
    const char c = i < text.size() ? text[i] : ' ';
    if (std::isxdigit(static_cast<unsigned char>(c))) {
      run.push_back(c);
      continue;
    }
    if (run.size() >= 16) {
      runs.push_back(run);
      runs.push_back(run.substr(0, 16));
    }
    run.clear();
  }
  return runs;
}

TEST(TagsEqualTest, EqualTagsMatchAndEveryFlippedByteMismatches) {
  const PageTag a{.lo = 0x0123456789abcdef, .hi = 0xfedcba9876543210};
  EXPECT_TRUE(TagsEqual(a, a));
  EXPECT_TRUE(TagsEqual(a, PageTag{a.lo, a.hi}));
  for (int byte = 0; byte < 16; ++byte) {
    PageTag b = a;
    uint64_t& word = byte < 8 ? b.lo : b.hi;
    word ^= uint64_t{0x42} << (8 * (byte % 8));
    EXPECT_FALSE(TagsEqual(a, b)) << "byte " << byte;
  }
}

TEST_F(TagKeyTest, CreateThenReloadGivesIdenticalTagsAndFingerprints) {
  const std::string path = Path("keys");
  ASSERT_FALSE(std::filesystem::exists(path));
  auto created = MustLoad(path);
  ASSERT_NE(created, nullptr);
  EXPECT_EQ(created->active_id(), 1u);
  EXPECT_EQ(created->key_ids(), std::vector<KeyId>{1});
  ASSERT_TRUE(std::filesystem::exists(path));

  auto reloaded = MustLoad(path);
  ASSERT_NE(reloaded, nullptr);
  EXPECT_EQ(reloaded->key_ids(), std::vector<KeyId>{1});
  EXPECT_EQ(MustDerive(*reloaded, 1, kInput), MustDerive(*created, 1, kInput));
  EXPECT_EQ(*reloaded->Fingerprint(1), *created->Fingerprint(1));
  EXPECT_EQ(created->Fingerprint(1)->size(), 16u);

  // Twin: a ring created at another path has another key.
  auto other = MustLoad(Path("other-keys"));
  ASSERT_NE(other, nullptr);
  EXPECT_NE(MustDerive(*other, 1, kInput), MustDerive(*created, 1, kInput));
  EXPECT_NE(*other->Fingerprint(1), *created->Fingerprint(1));
}

TEST_F(TagKeyTest, CreatedFileIsMode0600AndWellFormed) {
  const mode_t old_umask = umask(0);  // the file must not depend on the umask
  const std::string path = Path("keys");
  auto ring = MustLoad(path);
  umask(old_umask);
  ASSERT_NE(ring, nullptr);
  EXPECT_EQ(Mode(path), 0600u);
  const std::string text = ReadFile(path);
  ASSERT_EQ(text.size(), sizeof(kHeader) - 1 + 2 + 64 + 1) << "header + '1 ' + key + newline";
  EXPECT_EQ(text.substr(0, sizeof(kHeader) - 1), kHeader);
  EXPECT_EQ(text.substr(sizeof(kHeader) - 1, 2), "1 ");
  for (char c : text.substr(sizeof(kHeader) + 1, 64)) {
    EXPECT_TRUE((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')) << c;
  }
  EXPECT_EQ(text.back(), '\n');
}

TEST_F(TagKeyTest, RefusesFileThatGroupOrOthersCanAccess) {
  const std::string contents = std::string(kHeader) + "1 " + kKeyA + "\n";
  for (mode_t mode : {0644, 0640, 0604, 0620, 0602, 0660, 0666, 0610, 0601}) {
    const std::string path = WriteKeyFile("keys", contents, mode);
    auto ring = TagKeyRing::LoadOrCreate(path);
    ASSERT_FALSE(ring.ok()) << std::oct << mode;
    EXPECT_EQ(ring.status().code(), absl::StatusCode::kFailedPrecondition) << ring.status();
    EXPECT_EQ(std::string(ring.status().message()).find(kKeyA), std::string::npos);
    EXPECT_EQ(ReadFile(path), contents) << "a refused file is left alone";
  }
  // Twin: the owner-only modes load.
  for (mode_t mode : {0600, 0400}) {
    const std::string path = WriteKeyFile("keys", contents, mode);
    auto ring = TagKeyRing::LoadOrCreate(path);
    EXPECT_TRUE(ring.ok()) << std::oct << mode << " " << ring.status();
  }
}

// A 0600 file that another user owns (planted where the service will look) is refused; the
// service's own file is the twin. Needs root to give the file away.
TEST_F(TagKeyTest, RefusesAKeyFileOwnedByAnotherUser) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to chown a file to another uid";
  const std::string path = Path("planted.keys");
  ASSERT_TRUE(TagKeyRing::LoadOrCreate(path).ok());
  ASSERT_TRUE(TagKeyRing::LoadOrCreate(path).ok());  // twin: our own file loads
  ASSERT_EQ(chown(path.c_str(), 12345, 12345), 0);
  const absl::Status s = TagKeyRing::LoadOrCreate(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("owned by uid 12345"), absl::string_view::npos) << s;
}

TEST_F(TagKeyTest, RefusesSymlinksDirectoriesAndFifos) {
  const std::string target =
      WriteKeyFile("target", std::string(kHeader) + "1 " + kKeyA + "\n", 0600);
  const std::string link = Path("link");
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
  auto via_link = TagKeyRing::LoadOrCreate(link);
  EXPECT_EQ(via_link.status().code(), absl::StatusCode::kFailedPrecondition) << via_link.status();

  const std::string dangling = Path("dangling");
  ASSERT_EQ(symlink(Path("nowhere").c_str(), dangling.c_str()), 0);
  auto via_dangling = TagKeyRing::LoadOrCreate(dangling);
  EXPECT_EQ(via_dangling.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(std::filesystem::exists(Path("nowhere"))) << "created through a symlink";

  const std::string dir = Path("dir");
  ASSERT_TRUE(std::filesystem::create_directory(dir));
  chmod(dir.c_str(), 0700);
  EXPECT_EQ(TagKeyRing::LoadOrCreate(dir).status().code(), absl::StatusCode::kFailedPrecondition);

  const std::string fifo = Path("fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(TagKeyRing::LoadOrCreate(fifo).status().code(), absl::StatusCode::kFailedPrecondition);

  // Twin: the link's target itself loads.
  EXPECT_TRUE(TagKeyRing::LoadOrCreate(target).ok());
}

TEST_F(TagKeyTest, MissingDirectoryIsAnErrorNotACrash) {
  auto ring = TagKeyRing::LoadOrCreate(Path("no-such-dir/keys"));
  EXPECT_FALSE(ring.ok());
  EXPECT_TRUE(TagKeyRing::LoadOrCreate(Path("keys")).ok());  // twin
  EXPECT_EQ(TagKeyRing::LoadOrCreate("").status().code(), absl::StatusCode::kInvalidArgument);
}

struct MalformedCase {
  const char* name;
  std::string bad;  // refused, naming `line`
  int line;
  std::string good;  // the same file, fixed: loads
};

std::vector<MalformedCase> MalformedCases() {
  const std::string h = kHeader;
  const std::string a = kKeyA;
  const std::string b = kKeyB;
  const std::string c = kKeyC;
  std::string bad_hex = a;
  bad_hex[10] = 'g';
  std::string upper = a;
  upper[21] = 'A';
  return {
      {"empty file", "", 1, h + "1 " + a + "\n"},
      {"bad header", "kvguard-tag-keys v2\n1 " + a + "\n", 1, h + "1 " + a + "\n"},
      {"header with CR", "kvguard-tag-keys v1\r\n1 " + a + "\n", 1, h + "1 " + a + "\n"},
      {"key before header", "1 " + a + "\n" + h, 1, h + "1 " + a + "\n"},
      {"bad hex", h + "1 " + a + "\n2 " + bad_hex + "\n", 3, h + "1 " + a + "\n2 " + b + "\n"},
      {"uppercase hex", h + "1 " + upper + "\n", 2, h + "1 " + a + "\n"},
      {"short key", h + "1 " + a.substr(0, 62) + "\n", 2, h + "1 " + a + "\n"},
      {"long key", h + "1 " + a + "00\n", 2, h + "1 " + a + "\n"},
      {"no key", h + "1\n", 2, h + "1 " + a + "\n"},
      {"two spaces", h + "1  " + a + "\n", 2, h + "1 " + a + "\n"},
      {"decreasing ids", h + "1 " + a + "\n3 " + b + "\n2 " + c + "\n", 4,
       h + "1 " + a + "\n2 " + b + "\n3 " + c + "\n"},
      {"repeated id", h + "2 " + a + "\n2 " + b + "\n", 3, h + "2 " + a + "\n3 " + b + "\n"},
      {"id zero", h + "0 " + a + "\n", 2, h + "1 " + a + "\n"},
      {"id with leading zero", h + "01 " + a + "\n", 2, h + "1 " + a + "\n"},
      {"id past 2^32-1", h + "4294967296 " + a + "\n", 2, h + "4294967295 " + a + "\n"},
      {"negative id", h + "-1 " + a + "\n", 2, h + "1 " + a + "\n"},
      {"empty key list", h, 2, h + "1 " + a + "\n"},
      {"trailing garbage line", h + "1 " + a + "\n2 " + b + "\ngarbage\n", 4,
       h + "1 " + a + "\n2 " + b + "\n"},
      {"trailing garbage on a key line", h + "1 " + a + " " + b + "\n", 2, h + "1 " + a + "\n"},
      {"blank line", h + "1 " + a + "\n\n", 3, h + "1 " + a + "\n"},
      {"no final newline", h + "1 " + a + "\n2 " + b, 3, h + "1 " + a + "\n2 " + b + "\n"},
      {"NUL in file", h + "1 " + a + "\n" + std::string(1, '\0') + "\n", 3, h + "1 " + a + "\n"},
  };
}

TEST_F(TagKeyTest, MalformedFilesAreRefusedByLineWithoutEchoingKeys) {
  for (const MalformedCase& mc : MalformedCases()) {
    SCOPED_TRACE(mc.name);
    const std::string bad_path = WriteKeyFile("bad", mc.bad);
    auto bad = TagKeyRing::LoadOrCreate(bad_path);
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
    const std::string message(bad.status().message());
    EXPECT_NE(message.find(": line " + std::to_string(mc.line) + ": "), std::string::npos)
        << message;
    for (const std::string& key : HexRuns(mc.bad)) {
      EXPECT_EQ(message.find(key), std::string::npos) << "message echoes key material";
    }
    EXPECT_EQ(ReadFile(bad_path), mc.bad) << "a refused file is left alone";

    // Twin: the fixed file loads.
    auto good = TagKeyRing::LoadOrCreate(WriteKeyFile("good", mc.good));
    EXPECT_TRUE(good.ok()) << good.status();
  }
}

// Expected values computed independently, when this test was written, with
//   python3 -c 'import hmac, hashlib, struct
//   m = b"kvguard/page-tag/v1" + struct.pack(">IQQQQ", key_id, page, generation, tenant, session)
//   d = hmac.new(key, m, hashlib.sha256).digest()
//   print(hex(int.from_bytes(d[0:8], "little")), hex(int.from_bytes(d[8:16], "little")))
//   print(hashlib.sha256(b"kvguard/tag-key-fingerprint/v1" + key).digest()[:8].hex())'
TEST_F(TagKeyTest, KnownAnswers) {
  // Key A is id 1; key B is id 16909060 = 0x01020304, so the id's byte order matters.
  const std::string path =
      WriteKeyFile("keys", std::string(kHeader) + "1 " + kKeyA + "\n16909060 " + kKeyB + "\n");
  auto ring = MustLoad(path);
  ASSERT_NE(ring, nullptr);
  EXPECT_EQ(ring->active_id(), 16909060u);
  EXPECT_EQ(ring->key_ids(), (std::vector<KeyId>{1, 16909060}));
  EXPECT_EQ(*ring->Fingerprint(1), "f44310ac7e0e160a");
  EXPECT_EQ(*ring->Fingerprint(16909060), "64cfeb258d747e1a");

  const PageTag want_a{.lo = 0x923e08115bf52ca9, .hi = 0x62af6b4b92b82380};
  const PageTag want_b{.lo = 0x769cc9193e4e077b, .hi = 0x6ed9a33d7fcb0dd0};
  const PageTag want_b_zero{.lo = 0x31e5baaad8d175f0, .hi = 0x96be0e3fd5b3108c};
  // Many times over: later calls run on reused (reinitialised) MAC contexts.
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(TagsEqual(MustDerive(*ring, 1, kInput), want_a));
    ASSERT_TRUE(TagsEqual(MustDerive(*ring, 16909060, kInput), want_b));
    ASSERT_TRUE(TagsEqual(MustDerive(*ring, 16909060, TagInput{}), want_b_zero));
  }
  // Twin: a tag off by one bit is not the answer.
  EXPECT_FALSE(TagsEqual(MustDerive(*ring, 1, kInput), PageTag{want_a.lo ^ 1, want_a.hi}));
  EXPECT_FALSE(TagsEqual(MustDerive(*ring, 1, kInput), want_b));
}

TEST_F(TagKeyTest, FlippingAnyInputByteOrKeyIdByteChangesTheTag) {
  // The same key under ids 1 and 1 ^ (0x42 << 8 * byte), so a different tag can only come from
  // the id being part of the message, not from a different key being picked.
  std::string contents = kHeader;
  std::vector<KeyId> flipped_ids;
  for (int byte = 0; byte < 4; ++byte) flipped_ids.push_back(1u ^ (0x42u << (8 * byte)));
  contents += std::string("1 ") + kKeyA + "\n";
  for (KeyId id : flipped_ids) contents += std::to_string(id) + " " + kKeyA + "\n";
  auto ring = MustLoad(WriteKeyFile("keys", contents));
  ASSERT_NE(ring, nullptr);

  const PageTag base = MustDerive(*ring, 1, kInput);
  EXPECT_EQ(MustDerive(*ring, 1, kInput), base);  // twin: same input, same tag
  std::vector<PageTag> seen = {base};
  for (KeyId id : flipped_ids) {
    const PageTag t = MustDerive(*ring, id, kInput);
    EXPECT_FALSE(TagsEqual(t, base)) << "key id " << id;
    seen.push_back(t);
  }
  uint64_t TagInput::*const fields[] = {&TagInput::page, &TagInput::generation, &TagInput::tenant,
                                        &TagInput::session};
  for (int f = 0; f < 4; ++f) {
    for (int byte = 0; byte < 8; ++byte) {
      TagInput in = kInput;
      in.*fields[f] ^= uint64_t{0x42} << (8 * byte);
      const PageTag t = MustDerive(*ring, 1, in);
      EXPECT_FALSE(TagsEqual(t, base)) << "field " << f << " byte " << byte;
      seen.push_back(t);
    }
  }
  // Every flip gives its own tag, not just one that differs from the base.
  for (size_t i = 0; i < seen.size(); ++i) {
    for (size_t j = i + 1; j < seen.size(); ++j) EXPECT_NE(seen[i], seen[j]) << i << " " << j;
  }
}

TEST_F(TagKeyTest, DifferentKeyGivesDifferentTag) {
  auto a = MustLoad(WriteKeyFile("a", std::string(kHeader) + "1 " + kKeyA + "\n"));
  auto b = MustLoad(WriteKeyFile("b", std::string(kHeader) + "1 " + kKeyB + "\n"));
  auto a_again = MustLoad(WriteKeyFile("a2", std::string(kHeader) + "1 " + kKeyA + "\n"));
  ASSERT_TRUE(a && b && a_again);
  EXPECT_NE(MustDerive(*a, 1, kInput), MustDerive(*b, 1, kInput));
  EXPECT_NE(*a->Fingerprint(1), *b->Fingerprint(1));
  EXPECT_EQ(MustDerive(*a, 1, kInput), MustDerive(*a_again, 1, kInput));  // twin
  EXPECT_EQ(*a->Fingerprint(1), *a_again->Fingerprint(1));

  auto e1 = TagKeyRing::CreateEphemeral();
  auto e2 = TagKeyRing::CreateEphemeral();
  ASSERT_TRUE(e1.ok() && e2.ok());
  EXPECT_NE(MustDerive(**e1, 1, kInput), MustDerive(**e2, 1, kInput));
  EXPECT_EQ(MustDerive(**e1, 1, kInput), MustDerive(**e1, 1, kInput));  // twin
}

TEST_F(TagKeyTest, UnknownKeyIdIsNotFound) {
  auto ring = TagKeyRing::CreateEphemeral();
  ASSERT_TRUE(ring.ok());
  EXPECT_EQ((*ring)->Derive(2, kInput).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*ring)->Derive(0, kInput).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*ring)->Fingerprint(2).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE((*ring)->Derive(1, kInput).ok());  // twin
  EXPECT_TRUE((*ring)->Fingerprint(1).ok());
}

TEST_F(TagKeyTest, RotationKeepsOldTagsAndSurvivesReload) {
  const std::string path = Path("keys");
  auto ring = MustLoad(path);
  ASSERT_NE(ring, nullptr);
  const PageTag old_tag = MustDerive(*ring, 1, kInput);
  const std::string old_fp = *ring->Fingerprint(1);

  auto rotated = ring->Rotate();
  ASSERT_TRUE(rotated.ok()) << rotated.status();
  EXPECT_EQ(*rotated, 2u);
  EXPECT_EQ(ring->active_id(), 2u);
  EXPECT_EQ(ring->key_ids(), (std::vector<KeyId>{1, 2}));
  EXPECT_EQ(MustDerive(*ring, 1, kInput), old_tag);
  const PageTag new_tag = MustDerive(*ring, 2, kInput);
  EXPECT_NE(new_tag, old_tag);
  EXPECT_NE(*ring->Fingerprint(2), old_fp);
  EXPECT_EQ(Mode(path), 0600u);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  auto reloaded = MustLoad(path);
  ASSERT_NE(reloaded, nullptr);
  EXPECT_EQ(reloaded->active_id(), 2u);
  EXPECT_EQ(reloaded->key_ids(), (std::vector<KeyId>{1, 2}));
  EXPECT_EQ(MustDerive(*reloaded, 1, kInput), old_tag);
  EXPECT_EQ(MustDerive(*reloaded, 2, kInput), new_tag);
  EXPECT_EQ(*reloaded->Fingerprint(1), old_fp);
  EXPECT_EQ(*reloaded->Fingerprint(2), *ring->Fingerprint(2));
}

TEST_F(TagKeyTest, RotationReplacesAStaleTempFile) {
  const std::string path = Path("keys");
  auto ring = MustLoad(path);
  ASSERT_NE(ring, nullptr);
  // A leftover <path>.tmp that others may read must not end up holding the keys.
  WriteKeyFile("keys.tmp", "stale", 0644);
  ASSERT_TRUE(ring->Rotate().ok());
  EXPECT_EQ(Mode(path), 0600u);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  auto reloaded = MustLoad(path);
  ASSERT_NE(reloaded, nullptr);
  EXPECT_EQ(reloaded->key_ids(), (std::vector<KeyId>{1, 2}));
}

TEST_F(TagKeyTest, RetireRefusesActiveAndUnknownAndForgetsOldKeys) {
  const std::string path = Path("keys");
  auto ring = MustLoad(path);
  ASSERT_NE(ring, nullptr);
  ASSERT_TRUE(ring->Rotate().ok());
  const PageTag tag2 = MustDerive(*ring, 2, kInput);

  EXPECT_EQ(ring->Retire(2).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ring->Retire(7).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ring->key_ids(), (std::vector<KeyId>{1, 2}));
  EXPECT_TRUE(ring->Derive(1, kInput).ok());

  // Twin: an old key retires.
  ASSERT_TRUE(ring->Retire(1).ok());
  EXPECT_EQ(ring->key_ids(), std::vector<KeyId>{2});
  EXPECT_EQ(ring->Derive(1, kInput).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ring->Fingerprint(1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ring->Retire(1).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(MustDerive(*ring, 2, kInput), tag2);

  auto reloaded = MustLoad(path);
  ASSERT_NE(reloaded, nullptr);
  EXPECT_EQ(reloaded->key_ids(), std::vector<KeyId>{2});
  EXPECT_EQ(MustDerive(*reloaded, 2, kInput), tag2);
  EXPECT_EQ(Mode(path), 0600u);
}

TEST_F(TagKeyTest, EphemeralRingRotatesWithoutAFile) {
  auto ring = TagKeyRing::CreateEphemeral();
  ASSERT_TRUE(ring.ok());
  const PageTag tag1 = MustDerive(**ring, 1, kInput);
  ASSERT_EQ(*(*ring)->Rotate(), 2u);
  ASSERT_EQ(*(*ring)->Rotate(), 3u);
  EXPECT_EQ(MustDerive(**ring, 1, kInput), tag1);
  EXPECT_TRUE((*ring)->Retire(2).ok());
  EXPECT_EQ((*ring)->key_ids(), (std::vector<KeyId>{1, 3}));
  EXPECT_TRUE(std::filesystem::is_empty(dir_));
}

TEST_F(TagKeyTest, ConcurrentDeriveWhileRotatingAndRetiring) {
  const std::string path = Path("keys");
  auto ring = MustLoad(path);
  ASSERT_NE(ring, nullptr);
  constexpr int kInputs = 64;
  std::vector<TagInput> inputs;
  std::vector<PageTag> expected;
  for (int i = 0; i < kInputs; ++i) {
    inputs.push_back(TagInput{.page = static_cast<uint64_t>(i),
                              .generation = static_cast<uint64_t>(i) * 7,
                              .tenant = 3,
                              .session = static_cast<uint64_t>(100 + i)});
    expected.push_back(MustDerive(*ring, 1, inputs.back()));
  }

  std::atomic<bool> stop{false};
  std::atomic<int> mismatches{0};
  std::atomic<int> unexpected_errors{0};
  std::atomic<int> derived{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = t; !stop.load(std::memory_order_relaxed); ++i) {
        const int k = i % kInputs;
        auto tag = ring->Derive(1, inputs[k]);
        if (!tag.ok()) {
          unexpected_errors.fetch_add(1);
        } else if (!TagsEqual(*tag, expected[k])) {
          mismatches.fetch_add(1);
        }
        // The active key may be retired between active_id() and Derive: NotFound is allowed.
        auto active = ring->Derive(ring->active_id(), inputs[k]);
        if (!active.ok() && !absl::IsNotFound(active.status())) unexpected_errors.fetch_add(1);
        derived.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  while (derived.load() < 100) std::this_thread::yield();  // every rotation races with readers
  // Rotate (rewriting the file each time) and retire every key but 1 and the newest.
  for (int r = 0; r < 20; ++r) {
    auto id = ring->Rotate();
    ASSERT_TRUE(id.ok()) << id.status();
    if (*id > 2) {
      ASSERT_TRUE(ring->Retire(*id - 1).ok());
    }
  }
  const int derived_at_last_rotation = derived.load();
  while (derived.load() < derived_at_last_rotation + 100) std::this_thread::yield();
  stop.store(true);
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(unexpected_errors.load(), 0);
  EXPECT_EQ(ring->key_ids(), (std::vector<KeyId>{1, 21}));

  auto reloaded = MustLoad(path);
  ASSERT_NE(reloaded, nullptr);
  EXPECT_EQ(reloaded->key_ids(), (std::vector<KeyId>{1, 21}));
  for (int k = 0; k < kInputs; ++k) EXPECT_EQ(MustDerive(*reloaded, 1, inputs[k]), expected[k]);
}

}  // namespace
}  // namespace kvguard::isolation
