// audit/merkle.h: SHA-256 and the RFC 9162 (section 2.1) Merkle tree over the audit log's
// records: tree heads, inclusion proofs and their verification (FORMAT.md, "Merkle tree").
//
//   leaf hash = SHA-256(0x00 || leaf data)
//   node hash = SHA-256(0x01 || left || right)
//   MTH({})   = SHA-256("")
//   MTH(D[n]) = node hash(MTH(D[0:k]), MTH(D[k:n])), k the largest power of two < n
//
// Every function here is thread-safe; a MerkleAccumulator is not (one writer owns it).
#ifndef KVGUARD_AUDIT_MERKLE_H_
#define KVGUARD_AUDIT_MERKLE_H_

#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kvguard::audit {

// Hash is a raw SHA-256 digest.
using Hash = std::array<uint8_t, 32>;

// Sha256 returns the SHA-256 of the concatenation of `parts`. An OpenSSL failure (out of
// memory) is a CHECK failure.
Hash Sha256(std::initializer_list<std::string_view> parts);

// ToHex returns `h` as 64 lowercase hex digits.
std::string ToHex(const Hash& h);

// HashFromHex returns the hash written as `hex`, or InvalidArgument unless `hex` is exactly
// 64 lowercase hex digits (uppercase is refused: the log has one spelling per hash).
absl::StatusOr<Hash> HashFromHex(std::string_view hex);

// LeafHash returns the RFC 9162 leaf hash of `leaf_data`: SHA-256(0x00 || leaf_data). For the
// audit log, `leaf_data` is a record's whole line without its trailing '\n'.
Hash LeafHash(std::string_view leaf_data);

// NodeHash returns the RFC 9162 interior node hash: SHA-256(0x01 || left || right).
Hash NodeHash(const Hash& left, const Hash& right);

// EmptyRoot returns the head of the empty tree: SHA-256 of the empty string.
Hash EmptyRoot();

// MerkleAccumulator keeps the head of an append-only tree in O(log n) memory, for the writer:
// it holds the compact range of the tree, the roots of its perfect subtrees, largest (leftmost)
// first, one per set bit of size(). Append costs amortised one node hash (at most log2 n).
class MerkleAccumulator {
 public:
  // Append adds the leaf whose leaf hash (LeafHash) is `leaf_hash` as leaf number size().
  void Append(const Hash& leaf_hash);

  // Root returns the RFC 9162 tree head over all leaves appended so far (EmptyRoot() when
  // none), at the cost of one node hash per perfect subtree after the first.
  Hash Root() const;

  // size returns the number of leaves appended so far.
  uint64_t size() const { return size_; }

 private:
  uint64_t size_ = 0;
  // Roots of the perfect subtrees covering leaves [0, size_), left to right; subtree j covers
  // 2^b leaves for the j-th highest set bit b of size_.
  std::vector<Hash> subtrees_;
};

// RootOf returns the RFC 9162 tree head (MTH) over `leaf_hashes` (EmptyRoot() when empty),
// computing leaf_hashes.size() - 1 node hashes in O(log n) memory.
Hash RootOf(std::span<const Hash> leaf_hashes);

// InclusionProof returns the audit path (RFC 9162 2.1.3.1) of leaf `index` in the tree of the
// first `size` entries of `leaf_hashes`: the sibling hashes from the leaf up to the root,
// ceil(log2(size)) or fewer of them. Costs at most size - 1 node hashes. Returns
// InvalidArgument if index >= size or size > leaf_hashes.size().
absl::StatusOr<std::vector<Hash>> InclusionProof(std::span<const Hash> leaf_hashes, uint64_t index,
                                                 uint64_t size);

// VerifyInclusion returns true iff `path` is an audit path that takes `leaf_hash`, as leaf
// `index` of a tree of `size` leaves, to `root` (RFC 9162 2.1.3.2). Returns false if
// index >= size, if `path` is longer or shorter than such a path is, or if it recomputes any
// other root. The path does not bind `size` on its own: a path may verify for another size
// whose path has the same shape, which is why a checkpoint signs size and root together.
bool VerifyInclusion(const Hash& leaf_hash, uint64_t index, uint64_t size,
                     std::span<const Hash> path, const Hash& root);

// ConsistencyProof returns the RFC 9162 (2.1.4.1) consistency proof PROOF(m, D[n]) between
// the tree of the first `m` and the tree of the first `n` of `leaf_hashes`: the node hashes a
// verifier needs to recompute both heads, the first of them from the left. Empty when m == n.
// Costs at most n node hashes. Returns InvalidArgument unless 0 < m <= n <= leaf_hashes.size().
absl::StatusOr<std::vector<Hash>> ConsistencyProof(std::span<const Hash> leaf_hashes, uint64_t m,
                                                   uint64_t n);

// VerifyConsistency returns true iff `path` proves that the tree of `m` leaves with head
// `root_m` is a prefix of the tree of `n` leaves with head `root_n` (RFC 9162 2.1.4.2): for
// m == n, iff the path is empty and the heads are equal. Returns false if m == 0 or m > n, and
// for a path of the wrong length or that recomputes either head otherwise.
bool VerifyConsistency(uint64_t m, uint64_t n, const Hash& root_m, const Hash& root_n,
                       std::span<const Hash> path);

}  // namespace kvguard::audit

#endif  // KVGUARD_AUDIT_MERKLE_H_
