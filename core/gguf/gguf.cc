#include "core/gguf/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/formats.h"

namespace kvguard::core::gguf {
namespace {

constexpr uint64_t kBlock = 32;  // elements per Q8_0 / Q4_0 block
constexpr uint64_t kQ8Bytes = 2 + 32;
constexpr uint64_t kQ4Bytes = 2 + 16;
constexpr uint32_t kMaxDims = 4;
// Smallest encodings, used to refuse counts the remaining bytes cannot hold: a key-value pair
// is at least an empty key (8), a type (4) and a one-byte value; a tensor info at least an
// empty name (8), n_dims (4), one dim (8), a type (4) and an offset (8).
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;

// ScalarSize returns the byte size of a scalar value type, 0 for string, array and unknown.
uint64_t ScalarSize(ValueType t) {
  switch (t) {
    case ValueType::kUint8:
    case ValueType::kInt8:
    case ValueType::kBool:
      return 1;
    case ValueType::kUint16:
    case ValueType::kInt16:
      return 2;
    case ValueType::kUint32:
    case ValueType::kInt32:
    case ValueType::kFloat32:
      return 4;
    case ValueType::kUint64:
    case ValueType::kInt64:
    case ValueType::kFloat64:
      return 8;
    case ValueType::kString:
    case ValueType::kArray:
      return 0;
  }
  return 0;
}

bool IsInteger(ValueType t) {
  return t == ValueType::kUint8 || t == ValueType::kInt8 || t == ValueType::kUint16 ||
         t == ValueType::kInt16 || t == ValueType::kUint32 || t == ValueType::kInt32 ||
         t == ValueType::kUint64 || t == ValueType::kInt64;
}

bool IsSigned(ValueType t) {
  return t == ValueType::kInt8 || t == ValueType::kInt16 || t == ValueType::kInt32 ||
         t == ValueType::kInt64;
}

template <class T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// DecodeScalar fills the numeric fields of `v` from the `ScalarSize(t)` bytes at `p`.
void DecodeScalar(ValueType t, const uint8_t* p, Value* v) {
  v->type = t;
  switch (t) {
    case ValueType::kUint8:
    case ValueType::kBool:
      v->u = p[0];
      break;
    case ValueType::kInt8:
      v->i = static_cast<int8_t>(p[0]);
      break;
    case ValueType::kUint16:
      v->u = Load<uint16_t>(p);
      break;
    case ValueType::kInt16:
      v->i = Load<int16_t>(p);
      break;
    case ValueType::kUint32:
      v->u = Load<uint32_t>(p);
      break;
    case ValueType::kInt32:
      v->i = Load<int32_t>(p);
      break;
    case ValueType::kUint64:
      v->u = Load<uint64_t>(p);
      break;
    case ValueType::kInt64:
      v->i = Load<int64_t>(p);
      break;
    case ValueType::kFloat32:
      v->f = Load<float>(p);
      break;
    case ValueType::kFloat64:
      v->f = Load<double>(p);
      break;
    case ValueType::kString:
    case ValueType::kArray:
      break;
  }
}

}  // namespace

std::string ValueTypeName(ValueType type) {
  static constexpr const char* kNames[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                           "bool", "string", "array", "u64", "i64", "f64"};
  const auto i = static_cast<uint32_t>(type);
  return i < std::size(kNames) ? kNames[i] : absl::StrCat("type ", i);
}

std::string TensorTypeName(uint32_t type) {
  // ggml's numbering (ggml.h, enum ggml_type); 4 and 5 (Q4_2, Q4_3) were removed long ago.
  static constexpr const char* kNames[] = {
      "F32",     "F16",    "Q4_0",    "Q4_1",  "",       "",      "Q5_0",  "Q5_1",
      "Q8_0",    "Q8_1",   "Q2_K",    "Q3_K",  "Q4_K",   "Q5_K",  "Q6_K",  "Q8_K",
      "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS",
      "I8",      "I16",    "I32",     "I64",   "F64",    "IQ1_M", "BF16"};
  const bool supported = type == 0 || type == 1 || type == 2 || type == 8 || type == 30;
  if (type < std::size(kNames) && kNames[type][0] != '\0') {
    return supported ? kNames[type] : absl::StrCat(kNames[type], " (", type, ")");
  }
  return absl::StrCat("type ", type);
}

uint64_t TensorInfo::elements() const {
  uint64_t n = 1;
  for (uint64_t d : ne) n *= d;  // bounded at parse time
  return n;
}

absl::StatusOr<uint64_t> TensorBytes(uint32_t type, uint64_t row, uint64_t elements) {
  switch (static_cast<TensorType>(type)) {
    case TensorType::kF32:
      return elements * 4;
    case TensorType::kF16:
    case TensorType::kBF16:
      return elements * 2;
    case TensorType::kQ8_0:
    case TensorType::kQ4_0:
      if (row % kBlock != 0) {
        return absl::InvalidArgumentError(absl::StrCat("rows of ", row, " elements are not whole ",
                                                       TensorTypeName(type), " blocks of 32"));
      }
      return elements / kBlock *
             (type == static_cast<uint32_t>(TensorType::kQ8_0) ? kQ8Bytes : kQ4Bytes);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("tensor type ", TensorTypeName(type),
                   " is not supported (kvguard reads F32, F16, BF16, Q8_0, Q4_0)"));
}

void DequantizeRow(uint32_t type, const uint8_t* src, uint64_t n, float* out) {
  switch (static_cast<TensorType>(type)) {
    case TensorType::kF32:
      std::memcpy(out, src, n * sizeof(float));
      return;
    case TensorType::kF16:
      for (uint64_t i = 0; i < n; ++i) out[i] = kernels::Fp16ToFloat(Load<uint16_t>(src + 2 * i));
      return;
    case TensorType::kBF16:
      for (uint64_t i = 0; i < n; ++i) out[i] = kernels::Bf16ToFloat(Load<uint16_t>(src + 2 * i));
      return;
    case TensorType::kQ8_0:
      for (uint64_t b = 0; b < n / kBlock; ++b, src += kQ8Bytes) {
        const float d = kernels::Fp16ToFloat(Load<uint16_t>(src));
        for (uint64_t j = 0; j < kBlock; ++j) {
          out[b * kBlock + j] = static_cast<float>(static_cast<int8_t>(src[2 + j])) * d;
        }
      }
      return;
    case TensorType::kQ4_0:
      // ggml's layout: element j < 16 is the low nibble of byte j, element j + 16 its high one.
      for (uint64_t b = 0; b < n / kBlock; ++b, src += kQ4Bytes) {
        const float d = kernels::Fp16ToFloat(Load<uint16_t>(src));
        for (uint64_t j = 0; j < kBlock / 2; ++j) {
          out[b * kBlock + j] = static_cast<float>((src[2 + j] & 0x0F) - 8) * d;
          out[b * kBlock + j + 16] = static_cast<float>((src[2 + j] >> 4) - 8) * d;
        }
      }
      return;
  }
}

double ArrayFloat(const Value& a, uint64_t i) {
  Value v;
  DecodeScalar(a.elem_type, a.raw + i * ScalarSize(a.elem_type), &v);
  if (a.elem_type == ValueType::kFloat32 || a.elem_type == ValueType::kFloat64) return v.f;
  return IsSigned(a.elem_type) ? static_cast<double>(v.i) : static_cast<double>(v.u);
}

int64_t ArrayInt(const Value& a, uint64_t i) {
  Value v;
  DecodeScalar(a.elem_type, a.raw + i * ScalarSize(a.elem_type), &v);
  if (IsSigned(a.elem_type)) return v.i;
  if (a.elem_type == ValueType::kFloat32 || a.elem_type == ValueType::kFloat64) {
    return static_cast<int64_t>(v.f);
  }
  return v.u > uint64_t{INT64_MAX} ? INT64_MAX : static_cast<int64_t>(v.u);
}

// Parser walks the bytes with a cursor; every read is checked against the end first.
class File::Parser {
 public:
  Parser(File* file, std::span<const uint8_t> bytes) : f_(file), b_(bytes) {}

  absl::Status Run() {
    if (b_.size() < 4 || std::memcmp(b_.data(), "GGUF", 4) != 0) {
      return absl::InvalidArgumentError("not a GGUF file: the first 4 bytes are not \"GGUF\"");
    }
    pos_ = 4;
    uint32_t version = 0;
    uint64_t n_tensors = 0, n_kv = 0;
    if (auto s = Read(&version, "the version"); !s.ok()) return s;
    if (version != 2 && version != 3) {
      return absl::InvalidArgumentError(
          absl::StrCat("GGUF version ", version, " is not supported (2 or 3)",
                       version == 1       ? ": v1 files predate 64-bit counts; convert them again"
                       : version > 0xFFFF ? " (a big-endian file?)"
                                          : ""));
    }
    f_->version_ = version;
    if (auto s = Read(&n_tensors, "the tensor count"); !s.ok()) return s;
    if (auto s = Read(&n_kv, "the metadata count"); !s.ok()) return s;
    if (n_kv > Remaining() / kMinKvBytes) {
      return absl::InvalidArgumentError(absl::StrCat("metadata count ", n_kv, " cannot fit in the ",
                                                     Remaining(), " bytes that follow"));
    }
    if (n_tensors > Remaining() / kMinTensorInfoBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor count ", n_tensors, " cannot fit in the ", Remaining(), " bytes that follow"));
    }
    for (uint64_t i = 0; i < n_kv; ++i) {
      if (auto s = ReadKv(i); !s.ok()) return s;
    }
    if (const Value* a = f_->Find("general.alignment")) {
      if (a->type != ValueType::kUint32 || a->u == 0 || (a->u & (a->u - 1)) != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("key 'general.alignment' must be a u32 power of two (got ",
                         ValueTypeName(a->type), " ", a->u, ")"));
      }
      f_->alignment_ = a->u;
    }
    f_->tensors_.reserve(n_tensors);
    for (uint64_t i = 0; i < n_tensors; ++i) {
      if (auto s = ReadTensorInfo(i); !s.ok()) return s;
    }
    const uint64_t data_start = (pos_ + f_->alignment_ - 1) / f_->alignment_ * f_->alignment_;
    if (n_tensors > 0 && data_start > b_.size()) {
      return absl::DataLossError(absl::StrCat("truncated: the data section would start at offset ",
                                              data_start, " but the file has ", b_.size(),
                                              " bytes"));
    }
    const uint64_t data_size = data_start <= b_.size() ? b_.size() - data_start : 0;
    for (TensorInfo& t : f_->tensors_) {
      if (t.offset % f_->alignment_ != 0) {
        return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "': offset ", t.offset,
                                                       " is not a multiple of the alignment ",
                                                       f_->alignment_));
      }
      if (t.offset > data_size || t.bytes > data_size - t.offset) {
        return absl::DataLossError(absl::StrCat(
            "tensor '", t.name, "': ", t.bytes, " bytes at data offset ", t.offset,
            " (file offset ", data_start + t.offset, ") run past the end of the file (", b_.size(),
            " bytes): truncated or inconsistent"));
      }
      t.data = b_.data() + data_start + t.offset;
    }
    return absl::OkStatus();
  }

 private:
  uint64_t Remaining() const { return b_.size() - pos_; }

  absl::Status Truncated(std::string_view what) const {
    return absl::DataLossError(absl::StrCat("truncated at offset ", pos_, " while reading ",
                                            std::string(what), " (file of ", b_.size(), " bytes)"));
  }

  template <class T>
  absl::Status Read(T* out, std::string_view what) {
    if (Remaining() < sizeof(T)) return Truncated(what);
    std::memcpy(out, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return absl::OkStatus();
  }

  absl::Status ReadString(std::string_view* out, std::string_view what) {
    uint64_t n = 0;
    if (auto s = Read(&n, what); !s.ok()) return s;
    if (n > Remaining()) {
      return absl::DataLossError(absl::StrCat("truncated at offset ", pos_, ": ", std::string(what),
                                              " claims ", n, " bytes but ", Remaining(),
                                              " remain"));
    }
    *out = std::string_view(reinterpret_cast<const char*>(b_.data() + pos_), n);
    pos_ += n;
    return absl::OkStatus();
  }

  absl::Status ReadValue(ValueType type, const std::string& key, Value* v) {
    const std::string what = absl::StrCat("the value of key '", key, "'");
    v->type = type;
    if (type == ValueType::kString) return ReadString(&v->str, what);
    if (type == ValueType::kArray) {
      uint32_t elem = 0;
      if (auto s = Read(&elem, what); !s.ok()) return s;
      if (auto s = Read(&v->count, what); !s.ok()) return s;
      v->elem_type = static_cast<ValueType>(elem);
      if (v->elem_type == ValueType::kArray) {
        return absl::InvalidArgumentError(
            absl::StrCat("key '", key, "': nested arrays are not supported"));
      }
      if (v->elem_type == ValueType::kString) {
        // Each string is at least its 8-byte length.
        if (v->count > Remaining() / 8) {
          return absl::DataLossError(absl::StrCat("key '", key, "': array of ", v->count,
                                                  " strings cannot fit in the ", Remaining(),
                                                  " bytes that follow"));
        }
        v->strings.resize(v->count);
        for (uint64_t i = 0; i < v->count; ++i) {
          if (auto s = ReadString(&v->strings[i], what); !s.ok()) return s;
        }
        return absl::OkStatus();
      }
      const uint64_t size = ScalarSize(v->elem_type);
      if (size == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("key '", key, "': unknown array element type ", elem));
      }
      if (v->count > Remaining() / size) {
        return absl::DataLossError(absl::StrCat("key '", key, "': array of ", v->count, " ",
                                                ValueTypeName(v->elem_type), " cannot fit in the ",
                                                Remaining(), " bytes that follow"));
      }
      v->raw = b_.data() + pos_;
      pos_ += v->count * size;
      if (v->elem_type == ValueType::kBool) {
        for (uint64_t i = 0; i < v->count; ++i) {
          if (v->raw[i] > 1) {
            return absl::InvalidArgumentError(
                absl::StrCat("key '", key, "': element ", i, " is not a bool (", v->raw[i], ")"));
          }
        }
      }
      return absl::OkStatus();
    }
    const uint64_t size = ScalarSize(type);
    if (size == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("key '", key, "': unknown value type ", static_cast<uint32_t>(type)));
    }
    if (Remaining() < size) return Truncated(what);
    DecodeScalar(type, b_.data() + pos_, v);
    pos_ += size;
    if (type == ValueType::kBool && v->u > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("key '", key, "': ", v->u, " is not a bool (0 or 1)"));
    }
    return absl::OkStatus();
  }

  absl::Status ReadKv(uint64_t index) {
    std::string_view key_view;
    const uint64_t at = pos_;
    if (auto s = ReadString(&key_view, absl::StrCat("the key of metadata entry ", index));
        !s.ok()) {
      return s;
    }
    std::string key(key_view);
    if (key.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("metadata entry ", index, " at offset ", at, " has an empty key"));
    }
    uint32_t type = 0;
    if (auto s = Read(&type, absl::StrCat("the type of key '", key, "'")); !s.ok()) return s;
    Value v;
    if (auto s = ReadValue(static_cast<ValueType>(type), key, &v); !s.ok()) return s;
    if (!f_->values_.emplace(key, std::move(v)).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("duplicate key '", key, "' (metadata entry ", index, ", offset ", at, ")"));
    }
    f_->keys_.push_back(std::move(key));
    return absl::OkStatus();
  }

  absl::Status ReadTensorInfo(uint64_t index) {
    std::string_view name_view;
    if (auto s = ReadString(&name_view, absl::StrCat("the name of tensor ", index)); !s.ok()) {
      return s;
    }
    TensorInfo t;
    t.name = std::string(name_view);
    const std::string what = absl::StrCat("the header of tensor '", t.name, "'");
    if (t.name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", index, " has an empty name"));
    }
    uint32_t n_dims = 0;
    if (auto s = Read(&n_dims, what); !s.ok()) return s;
    if (n_dims < 1 || n_dims > kMaxDims) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", t.name, "': ", n_dims, " dimensions (must be 1..4)"));
    }
    t.ne.resize(n_dims);
    uint64_t elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      if (auto s = Read(&t.ne[d], what); !s.ok()) return s;
      // Every element takes at least half a byte, so a tensor cannot hold more elements than
      // twice the file's bytes; checking as we go also keeps the product from overflowing.
      if (t.ne[d] == 0 || t.ne[d] > 2 * b_.size() || elements > 2 * b_.size() / t.ne[d]) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", t.name, "': dimension ", d, " = ", t.ne[d],
                         " is zero or more than a file of ", b_.size(), " bytes can hold"));
      }
      elements *= t.ne[d];
    }
    if (auto s = Read(&t.type, what); !s.ok()) return s;
    if (auto s = Read(&t.offset, what); !s.ok()) return s;
    absl::StatusOr<uint64_t> bytes = TensorBytes(t.type, t.ne[0], elements);
    if (!bytes.ok()) {
      return absl::Status(bytes.status().code(),
                          absl::StrCat("tensor '", t.name, "': ", bytes.status().message()));
    }
    t.bytes = *bytes;
    if (!f_->tensor_index_.emplace(t.name, f_->tensors_.size()).second) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate tensor '", t.name, "'"));
    }
    f_->tensors_.push_back(std::move(t));
    return absl::OkStatus();
  }

  File* f_;
  std::span<const uint8_t> b_;
  uint64_t pos_ = 0;
};

File::~File() {
  if (mapping_ != nullptr) munmap(mapping_, mapping_size_);
}

absl::StatusOr<std::unique_ptr<File>> File::Parse(std::span<const uint8_t> bytes) {
  std::unique_ptr<File> f(new File());
  f->bytes_ = bytes;
  Parser parser(f.get(), bytes);
  if (absl::Status s = parser.Run(); !s.ok()) return s;
  return f;
}

absl::StatusOr<std::unique_ptr<File>> File::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    const std::string msg = absl::StrCat(path, ": ", std::strerror(err));
    if (err == ENOENT) return absl::NotFoundError(msg);
    if (err == EACCES) return absl::PermissionDeniedError(msg);
    return absl::UnavailableError(msg);
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* map = nullptr;
  if (size > 0) {
    map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return absl::UnavailableError(absl::StrCat(path, ": mmap: ", std::strerror(err)));
    }
  }
  ::close(fd);  // the mapping stays valid
  const std::span<const uint8_t> bytes(static_cast<const uint8_t*>(map), size);
  absl::StatusOr<std::unique_ptr<File>> f = Parse(bytes);
  if (!f.ok()) {
    if (map != nullptr) munmap(map, size);
    return absl::Status(f.status().code(), absl::StrCat(path, ": ", f.status().message()));
  }
  (*f)->mapping_ = map;
  (*f)->mapping_size_ = size;
  return f;
}

const Value* File::Find(std::string_view key) const {
  auto it = values_.find(std::string(key));
  return it == values_.end() ? nullptr : &it->second;
}

const TensorInfo* File::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {

absl::Status WrongType(std::string_view key, const Value& v, std::string_view want) {
  std::string got = ValueTypeName(v.type);
  if (v.type == ValueType::kArray) got = absl::StrCat("array of ", ValueTypeName(v.elem_type));
  return absl::InvalidArgumentError(
      absl::StrCat("key '", std::string(key), "' is ", got, ", expected ", std::string(want)));
}

absl::Status Missing(std::string_view key) {
  return absl::NotFoundError(absl::StrCat("missing key '", std::string(key), "'"));
}

}  // namespace

absl::StatusOr<uint64_t> File::GetUint(std::string_view key, uint64_t max) const {
  const Value* v = Find(key);
  if (v == nullptr) return Missing(key);
  if (!IsInteger(v->type)) return WrongType(key, *v, "an integer");
  if (IsSigned(v->type) ? (v->i < 0 || static_cast<uint64_t>(v->i) > max) : v->u > max) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key '", std::string(key), "' = ", IsSigned(v->type) ? v->i : static_cast<int64_t>(v->u),
        " is out of range [0, ", max, "]"));
  }
  return IsSigned(v->type) ? static_cast<uint64_t>(v->i) : v->u;
}

absl::StatusOr<double> File::GetFloat(std::string_view key) const {
  const Value* v = Find(key);
  if (v == nullptr) return Missing(key);
  if (v->type != ValueType::kFloat32 && v->type != ValueType::kFloat64) {
    return WrongType(key, *v, "f32");
  }
  return v->f;
}

absl::StatusOr<bool> File::GetBool(std::string_view key) const {
  const Value* v = Find(key);
  if (v == nullptr) return Missing(key);
  if (v->type != ValueType::kBool) return WrongType(key, *v, "bool");
  return v->u != 0;
}

absl::StatusOr<std::string_view> File::GetString(std::string_view key) const {
  const Value* v = Find(key);
  if (v == nullptr) return Missing(key);
  if (v->type != ValueType::kString) return WrongType(key, *v, "string");
  return v->str;
}

absl::StatusOr<const Value*> File::GetArray(std::string_view key, ValueType elem) const {
  const Value* v = Find(key);
  if (v == nullptr) return Missing(key);
  const bool numeric_ok = (elem == ValueType::kFloat32 && (v->elem_type == ValueType::kFloat32 ||
                                                           v->elem_type == ValueType::kFloat64)) ||
                          (IsInteger(elem) && IsInteger(v->elem_type));
  if (v->type != ValueType::kArray || (v->elem_type != elem && !numeric_ok)) {
    return WrongType(key, *v, absl::StrCat("array of ", ValueTypeName(elem)));
  }
  return v;
}

}  // namespace kvguard::core::gguf
