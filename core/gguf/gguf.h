// core/gguf/gguf.h: a bounds-checked reader of GGUF files (versions 2 and 3), the format of the
// C++ local-inference world (ggml / llama.cpp).
//
// Layout (all little-endian):
//   "GGUF"  u32 version  u64 tensor_count  u64 kv_count
//   kv_count x   { string key, u32 value_type, value }
//   tensor_count x { string name, u32 n_dims (1..4), u64 ne[n_dims], u32 tensor_type,
//                    u64 offset (from the start of the data section, a multiple of alignment) }
//   padding to `general.alignment` (default 32), then the data section.
// A string is u64 length + bytes (no terminator); an array is u32 element type + u64 count +
// elements. ne[0] is the fastest-varying dimension: a matrix [rows, cols] has ne = {cols, rows}.
//
// Every length, count and offset is checked against the bytes that are actually there before
// anything is read or allocated: a count that claims more entries than the remaining bytes
// could hold is refused as such, so no input makes the parser allocate more than a small
// multiple of its own size. Errors name the key, tensor or byte offset at fault.
//
// Tensor types read: F32, F16, BF16, Q8_0, Q4_0. Any other type is refused at parse time (its
// byte size is needed to bounds-check the tensor), naming the type.
#ifndef KVGUARD_CORE_GGUF_GGUF_H_
#define KVGUARD_CORE_GGUF_GGUF_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvguard::core::gguf {

enum class ValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

// ValueTypeName returns "u32", "string", ... ("type N" for an unknown value).
std::string ValueTypeName(ValueType type);

// The ggml tensor types this reader accepts (ggml numbering).
enum class TensorType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,  // blocks of 32: FP16 scale d, 16 bytes of nibbles; x = (q - 8) * d
  kQ8_0 = 8,  // blocks of 32: FP16 scale d, 32 int8; x = q * d
  kBF16 = 30,
};

// TensorTypeName returns "F32", "Q4_0", ... and ggml's name for types this reader refuses
// ("Q4_K (12)"), "type N" beyond ggml's list.
std::string TensorTypeName(uint32_t type);

// Value is one metadata value. Strings and arrays of numbers point into the file's bytes.
struct Value {
  ValueType type = ValueType::kUint8;
  uint64_t u = 0;                           // unsigned integers and bool
  int64_t i = 0;                            // signed integers
  double f = 0;                             // floats
  std::string_view str;                     // kString
  ValueType elem_type = ValueType::kUint8;  // kArray: the element type (never kArray)
  uint64_t count = 0;                       // kArray: elements
  const uint8_t* raw = nullptr;             // kArray of numbers: count little-endian elements
  std::vector<std::string_view> strings;    // kArray of strings
};

struct TensorInfo {
  std::string name;
  uint32_t type = 0;              // a TensorType
  std::vector<uint64_t> ne;       // ne[0] fastest
  uint64_t offset = 0;            // from the start of the data section
  uint64_t bytes = 0;             // stored size
  const uint8_t* data = nullptr;  // into the file; not aligned for the element type
  uint64_t elements() const;
};

class File {
 public:
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  // Open memory-maps `path` read-only and parses it. NotFound / PermissionDenied when it
  // cannot be opened, InvalidArgument or DataLoss (naming the key, tensor or offset) when it
  // is not a well-formed GGUF v2/v3 file of supported tensor types.
  static absl::StatusOr<std::unique_ptr<File>> Open(const std::string& path);

  // Parse parses `bytes`, which the caller keeps alive and unchanged for the File's lifetime
  // (everything returned points into it). Errors as for Open.
  static absl::StatusOr<std::unique_ptr<File>> Parse(std::span<const uint8_t> bytes);

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  size_t size() const { return bytes_.size(); }
  const std::vector<std::string>& keys() const { return keys_; }       // in file order
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // in file order

  // Find returns the value of `key`, or nullptr.
  const Value* Find(std::string_view key) const;
  // FindTensor returns the tensor named `name`, or nullptr.
  const TensorInfo* FindTensor(std::string_view name) const;

  // Typed getters. NotFound when the key is absent; InvalidArgument naming the key, its type
  // and the wanted type when the type differs (any integer type is accepted for an integer,
  // F32 or F64 for a float) or the value does not fit.
  absl::StatusOr<uint64_t> GetUint(std::string_view key, uint64_t max) const;
  absl::StatusOr<double> GetFloat(std::string_view key) const;
  absl::StatusOr<bool> GetBool(std::string_view key) const;
  absl::StatusOr<std::string_view> GetString(std::string_view key) const;
  // GetArray returns the array at `key`, whose elements must be of type `elem` (InvalidArgument
  // otherwise).
  absl::StatusOr<const Value*> GetArray(std::string_view key, ValueType elem) const;

 private:
  File() = default;
  class Parser;

  std::span<const uint8_t> bytes_;
  void* mapping_ = nullptr;  // from mmap (Open), else null
  size_t mapping_size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::vector<std::string> keys_;
  absl::flat_hash_map<std::string, Value> values_;
  std::vector<TensorInfo> tensors_;
  absl::flat_hash_map<std::string, size_t> tensor_index_;
};

// ArrayFloat returns element `i` of a numeric array as a double (the caller checked i < count).
double ArrayFloat(const Value& array, uint64_t i);
// ArrayInt returns element `i` of an integer array as int64 (u64 values above INT64_MAX clamp).
int64_t ArrayInt(const Value& array, uint64_t i);

// DequantizeRow writes `n` FP32 values decoded from `src` (n elements of tensor type `type`,
// n a multiple of the block size for Q8_0 / Q4_0) to `out`. `type` must be supported.
void DequantizeRow(uint32_t type, const uint8_t* src, uint64_t n, float* out);

// TensorBytes returns the stored size of `elements` elements of `type` with ne[0] = `row`:
// InvalidArgument when the type is not supported or `row` is not a multiple of its block.
absl::StatusOr<uint64_t> TensorBytes(uint32_t type, uint64_t row, uint64_t elements);

}  // namespace kvguard::core::gguf

#endif  // KVGUARD_CORE_GGUF_GGUF_H_
