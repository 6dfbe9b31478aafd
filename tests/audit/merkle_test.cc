// Tests of audit/merkle.h: SHA-256 and hex helpers, RFC 9162 tree heads and audit paths (known
// answers computed independently with Python's hashlib from the RFC's recursive definitions),
// the accumulator against RootOf, and VerifyInclusion against a matrix of corruptions. Every
// corruption test first checks that the uncorrupted proof verifies.
#include "audit/merkle.h"

#include <gtest/gtest.h>

#include <bit>
#include <cctype>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvguard::audit {
namespace {

constexpr uint64_t kMaxProofTree = 65;
// Up to this tree size every byte of every path element is flipped (bits 0 and 7); above it,
// one rotating bit per element.
constexpr uint64_t kFullFlipTree = 33;

// Leaves returns the leaf hashes of "leaf-0", "leaf-1", ... "leaf-<n-1>".
std::vector<Hash> Leaves(uint64_t n) {
  std::vector<Hash> leaves;
  for (uint64_t i = 0; i < n; ++i) leaves.push_back(LeafHash("leaf-" + std::to_string(i)));
  return leaves;
}

Hash MustHex(std::string_view hex) {
  absl::StatusOr<Hash> h = HashFromHex(hex);
  EXPECT_TRUE(h.ok()) << h.status();
  return h.ok() ? *h : Hash{};
}

Hash Flip(Hash h, size_t byte, int bit) {
  h[byte] ^= static_cast<uint8_t>(1u << bit);
  return h;
}

// Shape returns the sides of the audit path of leaf `index` in a tree of `size` leaves, leaf
// first (true: the sibling is on the left), straight from RFC 9162's recursive PATH.
std::vector<bool> Shape(uint64_t index, uint64_t size) {
  if (size <= 1) return {};
  uint64_t k = 1;
  while (2 * k < size) k *= 2;
  std::vector<bool> shape = index < k ? Shape(index, k) : Shape(index - k, size - k);
  shape.push_back(index >= k);
  return shape;
}

// ProofCase is one valid inclusion proof: leaf `index` of the tree over leaves[0, size).
struct ProofCase {
  const std::vector<Hash>* leaves;  // at least size + 1 of them, for the size + 1 tree
  uint64_t index;
  uint64_t size;
  std::vector<Hash> path;
  Hash root;
  const Hash& leaf() const { return (*leaves)[index]; }
};

// ForEachProof calls fn(c) for every leaf of every tree of 1..kMaxProofTree leaves, after
// checking that the proof verifies as given (the positive twin of each corruption).
template <typename Fn>
void ForEachProof(Fn fn) {
  const std::vector<Hash> leaves = Leaves(kMaxProofTree + 1);
  for (uint64_t n = 1; n <= kMaxProofTree; ++n) {
    const Hash root = RootOf(std::span(leaves).first(n));
    for (uint64_t i = 0; i < n; ++i) {
      absl::StatusOr<std::vector<Hash>> path = InclusionProof(leaves, i, n);
      ASSERT_TRUE(path.ok()) << path.status();
      ProofCase c{&leaves, i, n, *std::move(path), root};
      ASSERT_TRUE(VerifyInclusion(c.leaf(), i, n, c.path, root)) << "n=" << n << " i=" << i;
      fn(c);
    }
  }
}

// ---- SHA-256 and hex --------------------------------------------------------------------------

TEST(Sha256Test, KnownAnswers) {
  EXPECT_EQ(ToHex(Sha256({})), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(ToHex(EmptyRoot()), ToHex(Sha256({})));
  const std::string abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
  EXPECT_EQ(ToHex(Sha256({"abc"})), abc);
  EXPECT_EQ(ToHex(Sha256({"a", "", "bc"})), abc);  // the concatenation of the parts
  EXPECT_NE(ToHex(Sha256({"ab", "d"})), abc);
  EXPECT_NE(ToHex(Sha256({"abc", "\n"})), abc);
}

TEST(Sha256Test, LeafAndNodeHashesAreDomainSeparated) {
  // RFC 6962 / 9162 test vector: the leaf hash of empty data.
  EXPECT_EQ(ToHex(LeafHash("")),
            "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d");
  const Hash a = LeafHash("a");
  const Hash b = LeafHash("b");
  EXPECT_EQ(a, Sha256({std::string_view("\0", 1), "a"}));
  EXPECT_NE(a, Sha256({"a"}));
  const std::string_view ab(reinterpret_cast<const char*>(a.data()), a.size());
  const std::string_view bb(reinterpret_cast<const char*>(b.data()), b.size());
  EXPECT_EQ(NodeHash(a, b), Sha256({"\x01", ab, bb}));
  EXPECT_NE(NodeHash(a, b), Sha256({ab, bb}));
  EXPECT_NE(NodeHash(a, b), NodeHash(b, a));
}

TEST(HexTest, RoundTrips) {
  for (const Hash& h : {Sha256({}), Sha256({"x"}), Hash{}, Flip(Hash{}, 31, 7)}) {
    const std::string hex = ToHex(h);
    ASSERT_EQ(hex.size(), 64u);
    absl::StatusOr<Hash> back = HashFromHex(hex);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, h);
    EXPECT_EQ(ToHex(*back), hex);
  }
  // Every hex digit (as a low nibble), against Python's bytes.hex().
  Hash pattern;
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<uint8_t>(i * 37 + 11);
  EXPECT_EQ(ToHex(pattern), "0b30557a9fc4e90e33587da2c7ec11365b80a5caef14395e83a8cdf2173c6186");
}

TEST(HexTest, RefusesMalformedHex) {
  const std::string good = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
  ASSERT_TRUE(HashFromHex(good).ok());  // the twin: each variant below differs in one way
  std::vector<std::string> bad = {
      "", good.substr(0, 63), good + "0", good.substr(0, 62), good + good,
  };
  for (size_t i = 0; i < good.size(); ++i) {
    for (char c : {'A', 'F', 'g', 'G', 'x', ' ', '\0', '-', '/', ':', '`', '\xff'}) {
      std::string s = good;
      s[i] = c;
      bad.push_back(s);
    }
    std::string upper = good;
    upper[i] = static_cast<char>(std::toupper(static_cast<unsigned char>(upper[i])));
    if (upper != good) bad.push_back(upper);
  }
  for (const std::string& s : bad) {
    absl::StatusOr<Hash> h = HashFromHex(s);
    EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument) << "accepted: " << s;
  }
  EXPECT_GT(bad.size(), 64u * 12);
}

// ---- Tree heads -------------------------------------------------------------------------------

TEST(RootTest, KnownAnswers) {
  // MTH over "leaf-0" .. "leaf-<n-1>", from RFC 9162's recursive definition in Python.
  const struct {
    uint64_t n;
    const char* root;
  } kCases[] = {
      {0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
      {1, "305df59f9590c3c9ac63d2b2743c388e3792449078cebf7fb3dbe6471643b2b7"},
      {2, "60a53eed0de87a90c8e59427c59c46253c33a76a09502a51801300927b7e6bdc"},
      {3, "cf763a041c81ceef1578a6083f75c61bef2e0014f2a3e683a97fcfca5be7f19a"},
      {4, "bdd1c5ff55b19cb6b0e7c761bf9a6ccaa27fbbfc07b74f1fabb6e911a0bd2ab3"},
      {5, "00d21829a5503145348abcf712513eacf2a274211ad83e970202bb5b6d80b286"},
      {7, "0b007fb915eb9b2a146f54b1c86ec53b664f8e455b7660b0b6ee13edc0d921c0"},
      {8, "ca6b7b3e674ac86c1027b59c87c064fc3bc27b313294c75f83bd05fdd13f0dcf"},
      {9, "1374d3a5ecbef4cd7c109e5d0127955f4ef014756496d70a0f99f65aa0ac8a30"},
      {16, "cba3a9fefaccc7480d94577a738a22b99d3b7ded3a218a5628b4c5c8f77b87a7"},
      {17, "9bff4478570b1fa635917302d4a4a88d610ab38bf01e9ce302f991554beaa848"},
  };
  for (const auto& c : kCases) {
    SCOPED_TRACE(c.n);
    std::vector<Hash> leaves = Leaves(c.n);
    EXPECT_EQ(ToHex(RootOf(leaves)), c.root);
    MerkleAccumulator acc;
    for (const Hash& leaf : leaves) acc.Append(leaf);
    EXPECT_EQ(acc.size(), c.n);
    EXPECT_EQ(ToHex(acc.Root()), c.root);
    if (c.n >= 2) {  // the twin: order matters
      std::swap(leaves[0], leaves[c.n - 1]);
      EXPECT_NE(ToHex(RootOf(leaves)), c.root);
    }
  }
}

TEST(RootTest, AccumulatorMatchesRootOfForEverySize) {
  const std::vector<Hash> leaves = Leaves(300);
  MerkleAccumulator acc;
  EXPECT_EQ(acc.size(), 0u);
  EXPECT_EQ(acc.Root(), EmptyRoot());
  std::set<Hash> roots = {acc.Root()};
  for (uint64_t n = 1; n <= leaves.size(); ++n) {
    acc.Append(leaves[n - 1]);
    ASSERT_EQ(acc.size(), n);
    ASSERT_EQ(acc.Root(), RootOf(std::span(leaves).first(n))) << "n=" << n;
    roots.insert(acc.Root());
  }
  EXPECT_EQ(roots.size(), leaves.size() + 1);  // the twin: every size has its own head
}

// ---- Inclusion proofs -------------------------------------------------------------------------

TEST(InclusionProofTest, KnownAnswers) {
  const struct {
    uint64_t n;
    uint64_t index;
    std::vector<std::string> path;
  } kCases[] = {
      {7,
       0,
       {"3145c409f259b7c53e32036090ff76751025a2498ba9823ef718cac50b4e616f",
        "bd45ff28796704d88bdac51b1df553fda59837b616d6d1cb2114dbc3b087ff69",
        "8eae6bd3b3a07f1f75ee72a531629e6eb31e42e62f760e47de52a53c3641ef23"}},
      {7,
       3,
       {"fca89f57c9f8c8eb4047a7ff9d333acf9e0f3384b20b255bceab0f216dcca267",
        "60a53eed0de87a90c8e59427c59c46253c33a76a09502a51801300927b7e6bdc",
        "8eae6bd3b3a07f1f75ee72a531629e6eb31e42e62f760e47de52a53c3641ef23"}},
      {7,
       6,
       {"985bb5d36b927800876871da925a7e82abe83a9ddba5882920a007a55ea2b376",
        "bdd1c5ff55b19cb6b0e7c761bf9a6ccaa27fbbfc07b74f1fabb6e911a0bd2ab3"}},
      {17, 16, {"cba3a9fefaccc7480d94577a738a22b99d3b7ded3a218a5628b4c5c8f77b87a7"}},
      {9,
       5,
       {"ea9fc1a1b6e191b460d0d6306e3e870c173f39330f13cda1b70cfc72bdc398ba",
        "398ebdeb46e179eeffacef4635fd30410954e169b88e22741fa96cffb1022a85",
        "bdd1c5ff55b19cb6b0e7c761bf9a6ccaa27fbbfc07b74f1fabb6e911a0bd2ab3",
        "95ceab0ef2c3135bf4ede6c0bdbed41b01c30848c09b1d79deb7c396fbc77667"}},
      {1, 0, {}},
  };
  for (const auto& c : kCases) {
    SCOPED_TRACE(testing::Message() << "n=" << c.n << " index=" << c.index);
    const std::vector<Hash> leaves = Leaves(c.n);
    absl::StatusOr<std::vector<Hash>> path = InclusionProof(leaves, c.index, c.n);
    ASSERT_TRUE(path.ok()) << path.status();
    std::vector<std::string> hex;
    for (const Hash& h : *path) hex.push_back(ToHex(h));
    EXPECT_EQ(hex, c.path);
    std::vector<Hash> expected;
    for (const std::string& h : c.path) expected.push_back(MustHex(h));
    EXPECT_TRUE(VerifyInclusion(leaves[c.index], c.index, c.n, expected, RootOf(leaves)));
  }
}

TEST(InclusionProofTest, EveryLeafOfEveryTreeVerifies) {
  uint64_t proofs = 0;
  ForEachProof([&](const ProofCase& c) {
    EXPECT_EQ(c.path.size(), Shape(c.index, c.size).size());
    ++proofs;
  });
  EXPECT_EQ(proofs, kMaxProofTree * (kMaxProofTree + 1) / 2);
}

TEST(InclusionProofTest, ProvesAgainstAPrefixOfTheLeaves) {
  const std::vector<Hash> leaves = Leaves(20);
  for (uint64_t size = 1; size <= leaves.size(); ++size) {
    const std::vector<Hash> prefix(leaves.begin(), leaves.begin() + size);
    const Hash root = RootOf(prefix);
    for (uint64_t i = 0; i < size; ++i) {
      absl::StatusOr<std::vector<Hash>> from_all = InclusionProof(leaves, i, size);
      absl::StatusOr<std::vector<Hash>> from_prefix = InclusionProof(prefix, i, size);
      ASSERT_TRUE(from_all.ok() && from_prefix.ok());
      EXPECT_EQ(*from_all, *from_prefix);
      EXPECT_TRUE(VerifyInclusion(leaves[i], i, size, *from_all, root));
      if (size < leaves.size()) {  // the twin: not against the head of all the leaves
        EXPECT_FALSE(VerifyInclusion(leaves[i], i, size, *from_all, RootOf(leaves)));
      }
    }
  }
}

TEST(InclusionProofTest, RefusesBadArguments) {
  const std::vector<Hash> leaves = Leaves(5);
  // The twins: the extreme valid arguments.
  EXPECT_TRUE(InclusionProof(leaves, 4, 5).ok());
  EXPECT_TRUE(InclusionProof(leaves, 0, 1).ok());
  EXPECT_TRUE(InclusionProof(leaves, 2, 3).ok());
  const uint64_t kMax = std::numeric_limits<uint64_t>::max();
  const struct {
    uint64_t index;
    uint64_t size;
  } kBad[] = {{5, 5}, {6, 5}, {0, 0}, {0, 6}, {5, 6}, {kMax, 5}, {0, kMax}, {kMax, kMax}};
  for (const auto& b : kBad) {
    EXPECT_EQ(InclusionProof(leaves, b.index, b.size).status().code(),
              absl::StatusCode::kInvalidArgument)
        << "index=" << b.index << " size=" << b.size;
  }
  EXPECT_EQ(InclusionProof({}, 0, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(InclusionProof({}, 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
}

// ---- VerifyInclusion against corruptions -------------------------------------------------------

TEST(VerifyInclusionTest, RefusesIndexNotBelowSize) {
  const Hash leaf = LeafHash("leaf-0");
  EXPECT_TRUE(VerifyInclusion(leaf, 0, 1, {}, leaf));  // the twin: a one-leaf tree
  EXPECT_FALSE(VerifyInclusion(leaf, 1, 1, {}, leaf));
  EXPECT_FALSE(VerifyInclusion(leaf, 0, 0, {}, leaf));
  EXPECT_FALSE(VerifyInclusion(EmptyRoot(), 0, 0, {}, EmptyRoot()));
  const uint64_t kMax = std::numeric_limits<uint64_t>::max();
  EXPECT_FALSE(VerifyInclusion(leaf, kMax, kMax, {}, leaf));
  EXPECT_FALSE(VerifyInclusion(leaf, kMax, 1, {}, leaf));
}

TEST(VerifyInclusionTest, WrongIndexFails) {
  uint64_t checked = 0;
  ForEachProof([&](const ProofCase& c) {
    // index - 1 wraps to 2^64 - 1 for leaf 0, and index + 1 is the size for the last leaf.
    for (uint64_t wrong : {c.index - 1, c.index + 1}) {
      EXPECT_FALSE(VerifyInclusion(c.leaf(), wrong, c.size, c.path, c.root))
          << "n=" << c.size << " index=" << c.index << " claimed=" << wrong;
      ++checked;
    }
    if (c.size <= 17) {
      for (uint64_t wrong = 0; wrong < c.size; ++wrong) {
        if (wrong == c.index) continue;
        EXPECT_FALSE(VerifyInclusion(c.leaf(), wrong, c.size, c.path, c.root));
        ++checked;
      }
    }
  });
  EXPECT_GT(checked, 2 * kMaxProofTree * (kMaxProofTree + 1) / 2);
}

// RFC 9162's verifier does not bind the size by itself: the size only decides which side each
// path element goes and how long the path is, so the path verifies for any size whose path has
// the same shape. Most leaves are not on the tree's right edge, and for them a neighbouring size
// usually has the same shape (leaf 0 of 5 and of 6 leaves: three right siblings); in trees up to
// 65 leaves, 3712 of the 4290 (leaf, size +- 1) pairs do. Only the signed checkpoint, which
// covers size and root together, binds the size. This test pins that behaviour exactly: a
// wrong size fails iff its shape differs, and it always fails against its own tree's head.
TEST(VerifyInclusionTest, WrongSizeFailsUnlessThePathHasTheSameShape) {
  uint64_t failed = 0;
  uint64_t same_shape = 0;
  ForEachProof([&](const ProofCase& c) {
    for (uint64_t wrong : {c.size - 1, c.size + 1}) {
      SCOPED_TRACE(testing::Message()
                   << "n=" << c.size << " index=" << c.index << " claimed size=" << wrong);
      const bool same = c.index < wrong && Shape(c.index, wrong) == Shape(c.index, c.size);
      EXPECT_EQ(VerifyInclusion(c.leaf(), c.index, wrong, c.path, c.root), same);
      (same ? same_shape : failed) += 1;
      const Hash wrong_root = RootOf(std::span(*c.leaves).first(wrong));
      EXPECT_FALSE(VerifyInclusion(c.leaf(), c.index, wrong, c.path, wrong_root));
    }
  });
  EXPECT_EQ(failed + same_shape, 2 * kMaxProofTree * (kMaxProofTree + 1) / 2);
  EXPECT_GT(failed, 500u);
  EXPECT_GT(same_shape, 0u);
}

TEST(VerifyInclusionTest, EveryBitFlipInThePathFails) {
  uint64_t flips = 0;
  ForEachProof([&](const ProofCase& c) {
    for (size_t e = 0; e < c.path.size(); ++e) {
      std::vector<Hash> path = c.path;
      if (c.size <= kFullFlipTree) {
        for (size_t byte = 0; byte < sizeof(Hash); ++byte) {
          for (int bit : {0, 7}) {
            path[e] = Flip(c.path[e], byte, bit);
            EXPECT_FALSE(VerifyInclusion(c.leaf(), c.index, c.size, path, c.root))
                << "n=" << c.size << " index=" << c.index << " element=" << e << " byte=" << byte
                << " bit=" << bit;
            ++flips;
          }
        }
      } else {
        path[e] = Flip(c.path[e], (e * 11 + c.index) % sizeof(Hash), (e + c.index) % 8);
        EXPECT_FALSE(VerifyInclusion(c.leaf(), c.index, c.size, path, c.root))
            << "n=" << c.size << " index=" << c.index << " element=" << e;
        ++flips;
      }
    }
  });
  EXPECT_GT(flips, 100000u);
}

TEST(VerifyInclusionTest, DroppedElementFails) {
  uint64_t checked = 0;
  ForEachProof([&](const ProofCase& c) {
    for (size_t e = 0; e < c.path.size(); ++e) {
      std::vector<Hash> path = c.path;
      path.erase(path.begin() + e);
      EXPECT_FALSE(VerifyInclusion(c.leaf(), c.index, c.size, path, c.root))
          << "n=" << c.size << " index=" << c.index << " dropped=" << e;
      ++checked;
    }
  });
  EXPECT_GT(checked, 10000u);
}

TEST(VerifyInclusionTest, AddedElementFails) {
  uint64_t checked = 0;
  ForEachProof([&](const ProofCase& c) {
    // Extras: an unrelated hash, the leaf itself, and a copy of the path's own elements.
    std::vector<Hash> extras = {LeafHash("extra"), c.leaf(), Hash{}};
    extras.insert(extras.end(), c.path.begin(), c.path.end());
    for (size_t at = 0; at <= c.path.size(); ++at) {
      for (const Hash& extra : extras) {
        std::vector<Hash> path = c.path;
        path.insert(path.begin() + at, extra);
        EXPECT_FALSE(VerifyInclusion(c.leaf(), c.index, c.size, path, c.root))
            << "n=" << c.size << " index=" << c.index << " added at=" << at;
        ++checked;
      }
    }
  });
  EXPECT_GT(checked, 10000u);
}

TEST(VerifyInclusionTest, WrongLeafFails) {
  uint64_t checked = 0;
  ForEachProof([&](const ProofCase& c) {
    const std::string data = "leaf-" + std::to_string(c.index);
    std::vector<Hash> wrong = {
        Sha256({data}),         // without the leaf prefix
        LeafHash(data + "\n"),  // the line with its newline
        LeafHash("leaf-" + std::to_string(c.index + 1000)),
        Flip(c.leaf(), c.index % sizeof(Hash), 0),
    };
    for (uint64_t j = 0; j < c.size; ++j) {
      if (j != c.index) wrong.push_back((*c.leaves)[j]);
    }
    for (const Hash& leaf : wrong) {
      EXPECT_FALSE(VerifyInclusion(leaf, c.index, c.size, c.path, c.root))
          << "n=" << c.size << " index=" << c.index;
      ++checked;
    }
  });
  EXPECT_GT(checked, 50000u);
}

TEST(VerifyInclusionTest, WrongRootFails) {
  uint64_t checked = 0;
  ForEachProof([&](const ProofCase& c) {
    std::vector<Hash> wrong = {
        RootOf(std::span(*c.leaves).first(c.size + 1)),
        RootOf(std::span(*c.leaves).first(c.size - 1)),
        EmptyRoot(),
        Hash{},
    };
    if (c.size >= 2) wrong.push_back(c.leaf());
    for (size_t byte = 0; byte < sizeof(Hash); ++byte) wrong.push_back(Flip(c.root, byte, 3));
    for (const Hash& root : wrong) {
      EXPECT_FALSE(VerifyInclusion(c.leaf(), c.index, c.size, c.path, root))
          << "n=" << c.size << " index=" << c.index;
      ++checked;
    }
  });
  EXPECT_GT(checked, 70000u);
}

// ---- Threads ----------------------------------------------------------------------------------

TEST(ThreadTest, ConcurrentHashingAgrees) {
  const std::vector<Hash> leaves = Leaves(1000);
  const Hash expected = RootOf(leaves);
  std::vector<Hash> got(4);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < got.size(); ++t) {
    threads.emplace_back([&, t] {
      MerkleAccumulator acc;
      for (uint64_t i = 0; i < 1000; ++i) acc.Append(LeafHash("leaf-" + std::to_string(i)));
      got[t] = acc.Root();
    });
  }
  for (std::thread& t : threads) t.join();
  for (const Hash& h : got) EXPECT_EQ(h, expected);
  EXPECT_NE(expected, RootOf(std::span(leaves).first(999)));
}

// ---- Consistency proofs (RFC 9162 2.1.4) ------------------------------------------------------

// The example of RFC 9162 2.1.5, the tree of 7 leaves d0..d6 ("leaf-0".."leaf-6" here):
// PROOF(3, D[7]) = [c, d, g, l], PROOF(4, D[7]) = [l], PROOF(6, D[7]) = [i, j, k], where c, d, j
// are the leaf hashes of d2, d3, d6, g = MTH(D[0:2]), k = MTH(D[0:4]), i = MTH(D[4:6]) and
// l = MTH(D[4:7]).
TEST(ConsistencyProofTest, Rfc9162Example) {
  const std::vector<Hash> d = Leaves(7);
  const std::span<const Hash> all(d);
  const Hash c = d[2], dd = d[3], j = d[6];
  const Hash g = RootOf(all.subspan(0, 2)), k = RootOf(all.subspan(0, 4));
  const Hash i = RootOf(all.subspan(4, 2)), l = RootOf(all.subspan(4, 3));
  EXPECT_EQ(*ConsistencyProof(d, 3, 7), (std::vector<Hash>{c, dd, g, l}));
  EXPECT_EQ(*ConsistencyProof(d, 4, 7), (std::vector<Hash>{l}));
  EXPECT_EQ(*ConsistencyProof(d, 6, 7), (std::vector<Hash>{i, j, k}));
  EXPECT_TRUE(ConsistencyProof(d, 7, 7)->empty());
  const Hash root7 = RootOf(all);
  for (uint64_t m : {3, 4, 6}) {
    EXPECT_TRUE(VerifyConsistency(m, 7, RootOf(all.first(m)), root7, *ConsistencyProof(d, m, 7)));
  }
}

// Every pair of sizes 1 <= m <= n <= 33: the proof verifies (the twin of what follows), and
// fails with either head changed, any bit of any element flipped, an element dropped or added,
// or the old size off by one.
TEST(ConsistencyProofTest, EveryPairOfSizesVerifiesAndEveryCorruptionFails) {
  const std::vector<Hash> leaves = Leaves(kFullFlipTree + 1);
  const std::span<const Hash> all(leaves);
  for (uint64_t n = 1; n <= kFullFlipTree; ++n) {
    const Hash root_n = RootOf(all.first(n));
    for (uint64_t m = 1; m <= n; ++m) {
      SCOPED_TRACE(absl::StrCat("m=", m, " n=", n));
      const Hash root_m = RootOf(all.first(m));
      const std::vector<Hash> proof = *ConsistencyProof(leaves, m, n);
      ASSERT_TRUE(VerifyConsistency(m, n, root_m, root_n, proof));
      EXPECT_LE(proof.size(), 2 * static_cast<size_t>(std::bit_width(n)));
      EXPECT_FALSE(VerifyConsistency(m, n, Flip(root_m, 0, 0), root_n, proof));
      EXPECT_FALSE(VerifyConsistency(m, n, root_m, Flip(root_n, 31, 7), proof));
      for (size_t e = 0; e < proof.size(); ++e) {
        for (size_t byte = 0; byte < 32; byte += 7) {
          std::vector<Hash> bad = proof;
          bad[e] = Flip(bad[e], byte, static_cast<int>(byte % 8));
          EXPECT_FALSE(VerifyConsistency(m, n, root_m, root_n, bad)) << "element " << e;
        }
        std::vector<Hash> dropped = proof;
        dropped.erase(dropped.begin() + static_cast<long>(e));
        EXPECT_FALSE(VerifyConsistency(m, n, root_m, root_n, dropped)) << "dropped " << e;
      }
      std::vector<Hash> added = proof;
      added.push_back(leaves[0]);
      EXPECT_FALSE(VerifyConsistency(m, n, root_m, root_n, added));
      if (m > 1) {
        EXPECT_FALSE(VerifyConsistency(m - 1, n, root_m, root_n, proof));
      }
      // A tree that is not a prefix: the last leaf of the old tree replaced.
      std::vector<Hash> other(leaves.begin(), leaves.begin() + static_cast<long>(n));
      other[m - 1] = Flip(other[m - 1], 3, 3);
      const std::vector<Hash> forked = *ConsistencyProof(other, m, n);
      EXPECT_FALSE(VerifyConsistency(m, n, root_m, RootOf(other), forked));
    }
  }
}

TEST(ConsistencyProofTest, RefusesBadSizes) {
  const std::vector<Hash> leaves = Leaves(5);
  EXPECT_FALSE(ConsistencyProof(leaves, 0, 3).ok());
  EXPECT_FALSE(ConsistencyProof(leaves, 4, 3).ok());
  EXPECT_FALSE(ConsistencyProof(leaves, 3, 6).ok());
  EXPECT_TRUE(ConsistencyProof(leaves, 3, 5).ok());  // the twin
  const Hash r = RootOf(leaves);
  EXPECT_FALSE(VerifyConsistency(0, 5, EmptyRoot(), r, {}));
  EXPECT_FALSE(VerifyConsistency(6, 5, r, r, {}));
  EXPECT_TRUE(VerifyConsistency(5, 5, r, r, {}));
  EXPECT_FALSE(VerifyConsistency(5, 5, r, Flip(r, 0, 0), {}));
  EXPECT_FALSE(VerifyConsistency(5, 5, r, r, std::vector<Hash>{r}));
}
}  // namespace
}  // namespace kvguard::audit
