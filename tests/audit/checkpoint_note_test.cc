// Tests of audit/checkpoint_note.h: the C2SP tlog-checkpoint signed note. The layout and the key
// ID are recomputed here from the specs' words (tlog-checkpoint.md, signed-note.md), not from
// the code under test; every byte of a note flipped fails, the untouched note passes.
#include "audit/checkpoint_note.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "audit/merkle.h"
#include "audit/record.h"
#include "audit/signing_key.h"

namespace kvguard::audit {
namespace {

constexpr char kLogId[] = "0123456789abcdef0123456789abcdef";

class CheckpointNoteTest : public ::testing::Test {
 protected:
  void SetUp() override {
    key_ = *SigningKey::CreateEphemeral();
    other_ = *SigningKey::CreateEphemeral();
    c_.log_id = kLogId;
    c_.size = 1234;
    for (size_t i = 0; i < c_.root.size(); ++i) c_.root[i] = static_cast<uint8_t>(i * 7);
    note_ = *FormatCheckpointNote(c_, *key_);
  }
  VerifyingKey Pub(const SigningKey& k) const { return *VerifyingKey::FromRaw(k.PublicKeyRaw()); }

  std::unique_ptr<SigningKey> key_, other_;
  Checkpoint c_;
  std::string note_;
};

TEST_F(CheckpointNoteTest, LayoutKeyIdAndSignatureFollowTheSpecs) {
  const std::string origin = std::string("kvguard.audit/") + kLogId;
  const std::string root(reinterpret_cast<const char*>(c_.root.data()), 32);
  const std::string text = absl::StrCat(origin, "\n1234\n", absl::Base64Escape(root), "\n");
  ASSERT_TRUE(note_.starts_with(text + "\n\xe2\x80\x94 " + origin + " ")) << note_;
  ASSERT_TRUE(note_.ends_with("\n"));
  const std::string b64 = note_.substr(text.size() + 1 + 4 + origin.size() + 1);
  std::string blob;
  ASSERT_TRUE(absl::Base64Unescape(b64.substr(0, b64.size() - 1), &blob));
  ASSERT_EQ(blob.size(), 68u);
  // Key ID: SHA-256(name || 0x0A || 0x01 || public key), first 4 bytes.
  const Hash id = Sha256({origin, std::string("\n\x01", 2), key_->PublicKeyRaw()});
  EXPECT_EQ(blob.substr(0, 4), std::string(reinterpret_cast<const char*>(id.data()), 4));
  // Plain Ed25519 over the text, the three lines with their newlines.
  EXPECT_TRUE(Pub(*key_).Verify(text, blob.substr(4)));
  EXPECT_FALSE(Pub(*key_).Verify(text + "\n", blob.substr(4)));
  // The verifier key string: name+hex(key ID)+base64(0x01 || key).
  EXPECT_EQ(NoteVerifierKey(origin, key_->PublicKeyRaw()),
            absl::StrCat(origin, "+", absl::BytesToHexString(blob.substr(0, 4)), "+",
                         absl::Base64Escape(std::string("\x01", 1) + key_->PublicKeyRaw())));
  absl::StatusOr<NoteCheckpoint> checked = CheckCheckpointNote(note_, kLogId, Pub(*key_));
  ASSERT_TRUE(checked.ok()) << checked.status();
  EXPECT_EQ(checked->origin, origin);
  EXPECT_EQ(checked->size, 1234u);
  EXPECT_EQ(checked->root, c_.root);
  EXPECT_TRUE(CheckCheckpointNote(note_, "", Pub(*key_)).ok());  // any kvguard log
}

TEST_F(CheckpointNoteTest, EveryByteFlippedFails) {
  for (size_t i = 0; i < note_.size(); ++i) {
    std::string bad = note_;
    bad[i] ^= 0x01;
    EXPECT_FALSE(CheckCheckpointNote(bad, kLogId, Pub(*key_)).ok()) << "byte " << i;
  }
  EXPECT_TRUE(CheckCheckpointNote(note_, kLogId, Pub(*key_)).ok());
}

TEST_F(CheckpointNoteTest, AnotherKeyLogOrTruncationFails) {
  EXPECT_FALSE(CheckCheckpointNote(note_, kLogId, Pub(*other_)).ok());
  std::string other_log = kLogId;
  other_log[0] = 'f';
  EXPECT_FALSE(CheckCheckpointNote(note_, other_log, Pub(*key_)).ok());
  EXPECT_FALSE(CheckCheckpointNote(note_.substr(0, note_.size() - 1), kLogId, Pub(*key_)).ok());
  EXPECT_FALSE(
      CheckCheckpointNote(note_.substr(0, note_.find("\n\n") + 2), kLogId, Pub(*key_)).ok());
  EXPECT_FALSE(CheckCheckpointNote("", kLogId, Pub(*key_)).ok());
  // A cosignature by another key (a witness's) beside the log's is allowed.
  const std::string cosigned =
      note_ + FormatCheckpointNote(c_, *other_)->substr(note_.find("\n\n") + 2);
  EXPECT_TRUE(CheckCheckpointNote(cosigned, kLogId, Pub(*key_)).ok());
  EXPECT_TRUE(CheckCheckpointNote(cosigned, kLogId, Pub(*other_)).ok());
}

}  // namespace
}  // namespace kvguard::audit
