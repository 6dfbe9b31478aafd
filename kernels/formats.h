// kernels/formats.h: every numeric format and in-memory layout that two places must agree on.
//
// This header is the single owner of:
//   * FP8 e4m3 (OCP "e4m3fn") and BF16 / FP16 scalar codecs (the references every SIMD and
//     CUDA codec is tested against bit for bit),
//   * the quantisation conventions (written once, here),
//   * the INT4 group-quantised weight layout,
//   * the paged KV layout seen by the attention kernels.
//
// Quantisation convention (all formats with a scale):
//     stored = sat(rne(x / scale));     x ~= stored * scale
// rne = round to nearest, ties to even; sat = clamp to the format's finite range (NaN stays NaN
// for FP8/BF16; +-inf saturates to the largest finite value for FP8).
//
// The codecs assume the default floating-point environment (round-to-nearest-even, no
// flush-to-zero / denormals-are-zero); kvguard never changes it.
#ifndef KVGUARD_KERNELS_FORMATS_H_
#define KVGUARD_KERNELS_FORMATS_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

// The scalar codecs are shared by host code and CUDA device code (kernels/cuda/), so that one
// definition of each format serves both.
#if defined(__CUDACC__)
#define KVG_HOST_DEVICE __host__ __device__
#else
#define KVG_HOST_DEVICE
#endif

namespace kvguard::kernels {

// BitCast reinterprets the bytes of `from` as a `To` (std::bit_cast, which CUDA's C++17
// device code lacks; compilers turn the memcpy into a register move).
template <typename To, typename From>
KVG_HOST_DEVICE inline To BitCast(From from) {
  static_assert(sizeof(To) == sizeof(From));
  To to;
  memcpy(&to, &from, sizeof(to));
  return to;
}

// ------------------------------------------------------------------------------------------
// FP8 e4m3 (OCP 8-bit floating point, e4m3fn variant)
//   bit layout S.EEEE.MMM, exponent bias 7, no infinities, NaN = S.1111.111,
//   largest finite +-448 (S.1111.110), smallest normal 2^-6, subnormals M/8 * 2^-6.
// ------------------------------------------------------------------------------------------
inline constexpr float kFp8E4m3Max = 448.0f;
inline constexpr uint8_t kFp8E4m3MaxCode = 0x7E;  // +448
inline constexpr uint8_t kFp8E4m3NanCode = 0x7F;  // canonical (positive) NaN

// Fp8E4m3ToFloat returns the value of e4m3 code `c` (NaN for S.1111.111).
// Placing the 7 magnitude bits at the top of an FP32 mantissa/exponent gives the value
// scaled by 2^-120 (subnormals included, as FP32 denormals), so one multiply finishes it.
KVG_HOST_DEVICE inline float Fp8E4m3ToFloat(uint8_t c) {
  if ((c & 0x7F) == 0x7F) return BitCast<float>(0x7FC00000u | (uint32_t{c & 0x80u} << 24));
  const uint32_t bits = (uint32_t{c & 0x80u} << 24) | (uint32_t{c & 0x7Fu} << 20);
  return BitCast<float>(bits) * 0x1p120f;
}

// Fp8E4m3FromFloat returns the e4m3 code nearest to `x` (ties to even), saturating to +-448;
// +-inf saturates to +-448 and NaN maps to a NaN code of the same sign.
KVG_HOST_DEVICE inline uint8_t Fp8E4m3FromFloat(float x) {
  const uint32_t bits = BitCast<uint32_t>(x);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t abs_bits = bits & 0x7FFFFFFFu;
  if (abs_bits > 0x7F800000u) return sign | kFp8E4m3NanCode;
  const float a = BitCast<float>(abs_bits);
  if (a >= kFp8E4m3Max) return sign | kFp8E4m3MaxCode;
  if (a < 0x1p-6f) {
    // Subnormal range: the quantum is 2^-9; a * 512 is exact, nearbyint rounds ties to even.
    // A result of 8 is the code of 2^-6, the smallest normal, so no special case is needed.
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));
  }
  // Normal range: keep 3 of FP32's 23 mantissa bits, rounding the dropped 20 to nearest even.
  // A carry out of the mantissa bumps the exponent, which is the right answer; a < 448 keeps the
  // result at or below 448.
  uint32_t r = abs_bits + 0x7FFFFu + ((abs_bits >> 20) & 1u);
  r &= ~0xFFFFFu;
  const uint32_t exponent = (r >> 23) - 127 + 7;  // 1..15
  return sign | static_cast<uint8_t>((exponent << 3) | ((r >> 20) & 7u));
}

// ------------------------------------------------------------------------------------------
// BF16: the upper 16 bits of an IEEE binary32.
// ------------------------------------------------------------------------------------------
// Bf16ToFloat returns the value of bf16 bits `h` exactly.
KVG_HOST_DEVICE inline float Bf16ToFloat(uint16_t h) { return BitCast<float>(uint32_t{h} << 16); }

// Bf16FromFloat returns bf16 bits for `x`, rounded to nearest even; NaN stays a quiet NaN of
// the same sign; values that round past the largest finite bf16 become +-inf (IEEE rounding).
KVG_HOST_DEVICE inline uint16_t Bf16FromFloat(float x) {
  const uint32_t bits = BitCast<uint32_t>(x);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

// ------------------------------------------------------------------------------------------
// FP16 (IEEE binary16), used for INT4 group scales.
// ------------------------------------------------------------------------------------------
// Fp16ToFloat returns the value of binary16 bits `h` exactly (subnormals, inf, NaN included).
KVG_HOST_DEVICE inline float Fp16ToFloat(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t man = h & 0x3FFu;
  if (exp == 0x1F) return BitCast<float>(sign | 0x7F800000u | (man << 13));
  if (exp == 0) {
    const float v = static_cast<float>(man) * 0x1p-24f;
    return sign ? -v : v;
  }
  return BitCast<float>(sign | ((exp + 112) << 23) | (man << 13));
}

// Fp16FromFloat returns binary16 bits nearest to `x` (ties to even); overflow gives +-inf.
KVG_HOST_DEVICE inline uint16_t Fp16FromFloat(float x) {
  const uint32_t bits = BitCast<uint32_t>(x);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs_bits = bits & 0x7FFFFFFFu;
  if (abs_bits > 0x7F800000u) return sign | 0x7E00u;
  const float a = BitCast<float>(abs_bits);
  if (a < 0x1p-14f) {  // subnormal: quantum 2^-24, exact scaling then ties-to-even
    return sign | static_cast<uint16_t>(std::nearbyint(a * 0x1p24f));
  }
  uint32_t r = abs_bits + 0xFFFu + ((abs_bits >> 13) & 1u);
  r &= ~0x1FFFu;
  const int32_t exp = static_cast<int32_t>(r >> 23) - 127 + 15;
  if (exp >= 31) return sign | 0x7C00u;
  return sign | static_cast<uint16_t>((static_cast<uint32_t>(exp) << 10) | ((r >> 13) & 0x3FFu));
}

// ------------------------------------------------------------------------------------------
// Weight formats for y = W x.  W is [rows, cols] (rows = output features): row-major in FP32,
// BF16 and FP8, in blocks of 16 rows in INT4 (below).
// ------------------------------------------------------------------------------------------
enum class WeightFormat : uint8_t { kFp32, kBf16, kFp8, kInt4 };

// FP8 weights: one e4m3 byte per element, row-major [rows, cols], one FP32 scale per output
// row (per output channel): scale[r] = max_c |W[r, c]| / 448.

// INT4 weights: symmetric group quantisation along each row, stored with rows in the lanes.
//   group G in {32, 64, 128}; cols % G == 0.
//   scale:  max |w| over the group / 7, rounded to FP16 first, then q = clamp(rne(w / scale),
//           -8, 7), stored as the code q + 8 in a nibble. A group of zeros has scale 0 and q = 0.
//   codes:  rows in blocks of kInt4BlockRows = 16; the last block is padded with rows of code 8
//           (q = 0) and scale 0. Block b (rows 16b .. 16b + 15) is 8 * cols bytes: cols / 8 tiles
//           of 64 bytes, tile t holding columns 8t .. 8t + 7 of the 16 rows. Byte 4i + k of a
//           tile (row 16b + i, k in 0..3) holds column 8t + k in its low nibble and 8t + 4 + k in
//           its high nibble. Int4CodeByte below is the index.
//   scales: FP16, per block [cols / G][16]: group g's scales of the block's 16 rows side by side.
//   (Why rows in the lanes: a 64-byte load is 16 rows x 8 columns, so one integer dot-product
//   instruction against 4 bytes of x broadcast to every lane adds 4 products to each of 16 rows,
//   each row in its own int32 lane. A group's sum per row is then exact in int32 in one lane, and
//   converting and scaling it costs one FMA per 16 rows and column. With rows along the bytes the
//   16 lanes held 16 partial sums of one row, each converted and scaled: as many instructions as
//   the dot products themselves, which bounded every batch > 1.)
inline constexpr int kInt4BlockRows = 16;
inline constexpr int kInt4ZeroPoint = 8;

// WeightFormatName returns "fp32", "bf16", "fp8" or "int4".
inline constexpr const char* WeightFormatName(WeightFormat f) {
  return f == WeightFormat::kFp32   ? "fp32"
         : f == WeightFormat::kBf16 ? "bf16"
         : f == WeightFormat::kFp8  ? "fp8"
                                    : "int4";
}
inline constexpr bool IsValidInt4Group(int g) { return g == 32 || g == 64 || g == 128; }

// Int4PaddedRows returns rows rounded up to whole blocks of kInt4BlockRows: the rows that INT4
// codes and scales are stored for.
KVG_HOST_DEVICE inline constexpr int64_t Int4PaddedRows(int64_t rows) {
  return (rows + kInt4BlockRows - 1) / kInt4BlockRows * kInt4BlockRows;
}

// Int4CodeByte returns the index, in an INT4 matrix of `cols` columns, of the byte that holds
// element (r, c): in its low nibble where c % 8 < 4, in its high nibble otherwise.
KVG_HOST_DEVICE inline constexpr int64_t Int4CodeByte(int64_t r, int64_t c, int64_t cols) {
  return (r / kInt4BlockRows) * (cols / 2 * kInt4BlockRows) + (c / 8) * 64 +
         (r % kInt4BlockRows) * 4 + c % 4;
}

// Int4ScaleIndex returns the index of row r's group g scale, in an INT4 matrix of `groups`
// groups per row.
KVG_HOST_DEVICE inline constexpr int64_t Int4ScaleIndex(int64_t r, int64_t g, int64_t groups) {
  return ((r / kInt4BlockRows) * groups + g) * kInt4BlockRows + r % kInt4BlockRows;
}

// Int4Code returns the stored code (q + 8, 0..15) of element (r, c) of INT4 codes.
KVG_HOST_DEVICE inline int Int4Code(const uint8_t* codes, int64_t r, int64_t c, int64_t cols) {
  const uint8_t byte = codes[Int4CodeByte(r, c, cols)];
  return c % 8 < 4 ? (byte & 0xF) : (byte >> 4);
}

// WeightView is a non-owning view of a quantised weight matrix; which pointers are used
// depends on `format`. All pointers stay owned by the caller.
struct WeightView {
  WeightFormat format = WeightFormat::kFp32;
  int rows = 0;                       // output features
  int cols = 0;                       // input features
  int group = 0;                      // INT4 group size (kInt4 only)
  const void* data = nullptr;         // fp32 / bf16 / e4m3 [rows, cols]; int4 blocks (see above)
  const float* row_scales = nullptr;  // [rows]          (kFp8 only)
  const uint16_t* group_scales = nullptr;  // fp16, per block [cols/group][16] (kInt4 only)
};

// WeightBytes returns the bytes a full pass over `w` reads (codes plus scales).
inline size_t WeightBytes(const WeightView& w) {
  const size_t n = static_cast<size_t>(w.rows) * static_cast<size_t>(w.cols);
  switch (w.format) {
    case WeightFormat::kFp32:
      return n * 4;
    case WeightFormat::kBf16:
      return n * 2;
    case WeightFormat::kFp8:
      return n + static_cast<size_t>(w.rows) * 4;
    case WeightFormat::kInt4: {
      const size_t padded = static_cast<size_t>(Int4PaddedRows(w.rows)) * w.cols;
      return padded / 2 + (w.group > 0 ? padded / static_cast<size_t>(w.group) * 2 : 0);
    }
  }
  return 0;
}

// ------------------------------------------------------------------------------------------
// Paged KV cache, as the attention kernels see it.
//
// The pool is an array of physical pages. A page holds `page_size` (P) consecutive tokens of
// one sequence, for every kv head of one layer, K and V separately:
//   K page, per kv head:  [head_dim, P]   (transposed: one row of P scores' inputs per dim,
//                                          so a score vector for P tokens is head_dim FMAs
//                                          with no horizontal sums)
//   V page, per kv head:  [P, head_dim]   (one output row per token)
// Elements are FP32, BF16 bits or e4m3 codes. FP8 pages carry one FP32 scale per
// (layer, kv head) for K and one for V, with the convention above.
// ------------------------------------------------------------------------------------------
enum class KvDtype : uint8_t { kFp32, kBf16, kFp8E4m3 };

// KvDtypeName returns "fp32", "bf16" or "fp8_e4m3" (the names --kv-cache-dtype takes).
inline constexpr const char* KvDtypeName(KvDtype t) {
  return t == KvDtype::kFp32 ? "fp32" : t == KvDtype::kBf16 ? "bf16" : "fp8_e4m3";
}

inline constexpr size_t KvDtypeBytes(KvDtype t) {
  return t == KvDtype::kFp32 ? 4 : t == KvDtype::kBf16 ? 2 : 1;
}

// StoreKvElement writes `x` as element `i` of a K or V buffer of `dtype`: FP32 as is, BF16
// rounded, FP8 as stored = sat(rne(x / scale)) (`scale` is used by FP8 only). LoadKvElement
// reads element `i` back as the value the kernels see (FP8: stored * scale). Host only; for
// code that fills pages element by element (tests, benchmarks, fuzz targets).
inline void StoreKvElement(KvDtype dtype, float x, float scale, void* buf, size_t i) {
  uint8_t* b = static_cast<uint8_t*>(buf);
  switch (dtype) {
    case KvDtype::kFp32:
      std::memcpy(b + i * 4, &x, 4);
      break;
    case KvDtype::kBf16: {
      const uint16_t h = Bf16FromFloat(x);
      std::memcpy(b + i * 2, &h, 2);
      break;
    }
    case KvDtype::kFp8E4m3:
      b[i] = Fp8E4m3FromFloat(x / scale);
      break;
  }
}
inline float LoadKvElement(KvDtype dtype, const void* buf, size_t i, float scale) {
  const uint8_t* b = static_cast<const uint8_t*>(buf);
  switch (dtype) {
    case KvDtype::kFp32: {
      float x;
      std::memcpy(&x, b + i * 4, 4);
      return x;
    }
    case KvDtype::kBf16: {
      uint16_t h;
      std::memcpy(&h, b + i * 2, 2);
      return Bf16ToFloat(h);
    }
    case KvDtype::kFp8E4m3:
      return Fp8E4m3ToFloat(b[i]) * scale;
  }
  return 0.0f;
}

// ------------------------------------------------------------------------------------------
// Page tags (the page-tag record): isolation/ derives them (keyed MAC over key id, page,
// generation, tenant, session) and keeps the current tag of every physical page in one
// array [num_pages] that kernels read. A free page's tag is all zero, which no derived tag
// equals except with probability 2^-128.
// ------------------------------------------------------------------------------------------
struct PageTag {
  uint64_t lo = 0;  // bytes 0..7 of the MAC output, loaded little-endian
  uint64_t hi = 0;  // bytes 8..15
  // Written out, not defaulted: the CUDA code that includes this header is C++17. Not
  // constant time (isolation::TagsEqual is, for checks where timing could leak a tag).
  KVG_HOST_DEVICE friend bool operator==(const PageTag& a, const PageTag& b) {
    return a.lo == b.lo && a.hi == b.hi;
  }
  KVG_HOST_DEVICE friend bool operator!=(const PageTag& a, const PageTag& b) { return !(a == b); }
};
static_assert(sizeof(PageTag) == 16, "PageTag is the 16-byte page-tag record");

// PagedKvView is a non-owning view of one layer of the paged cache. Element (page, head, ...)
// of K lives at k + page * page_stride + head * head_stride + dim * page_size + token,
// of V at v + page * page_stride + head * head_stride + token * head_dim + dim
// (offsets in elements of `dtype`).
struct PagedKvView {
  KvDtype dtype = KvDtype::kFp32;
  int page_size = 16;  // P, tokens per page
  int num_kv_heads = 0;
  int head_dim = 0;                // IsSupportedHeadDim (attention.h): 16..256, multiple of 16
  const void* k = nullptr;         // [num_pages, num_kv_heads, head_dim, P] with the strides below
  const void* v = nullptr;         // [num_pages, num_kv_heads, P, head_dim] with the strides below
  int64_t page_stride = 0;         // elements between consecutive physical pages
  int64_t head_stride = 0;         // elements between kv heads within a page (>= P * head_dim)
  const float* k_scale = nullptr;  // [num_kv_heads], FP8 only
  const float* v_scale = nullptr;  // [num_kv_heads], FP8 only
  // In-kernel tag check (defence in depth beneath isolation's verifier): when both are set,
  // a query whose expected_tags are given has every page id checked against num_pages and
  // every page's current tag against the expected one before any of its KV is loaded.
  const PageTag* page_tags = nullptr;  // [num_pages] current tag of each physical page
  int32_t num_pages = 0;               // physical pages in the pool
};

// PackedKvView returns the view of a pool whose pages are packed back to back (head_stride =
// page_size * head_dim, page_stride = num_kv_heads * head_stride) at k and v; scales and tags
// are left for the caller to set. For tests, benchmarks and fuzz targets that build pools by
// hand (the engine's pool, core/model/kv_pool.h, interleaves layers and has its own strides).
inline PagedKvView PackedKvView(KvDtype dtype, int page_size, int num_kv_heads, int head_dim,
                                const void* k, const void* v) {
  PagedKvView kv;
  kv.dtype = dtype;
  kv.page_size = page_size;
  kv.num_kv_heads = num_kv_heads;
  kv.head_dim = head_dim;
  kv.k = k;
  kv.v = v;
  kv.head_stride = int64_t{page_size} * head_dim;
  kv.page_stride = kv.head_stride * num_kv_heads;
  return kv;
}

// DecodeQuery describes one request of a decode batch: one query token attending to the
// first `length` tokens of its sequence, which live in pages page_table[0 .. ceil(length/P)).
struct DecodeQuery {
  const float* q = nullptr;             // [num_heads, head_dim]
  const int32_t* page_table = nullptr;  // [ceil(length / P)] physical page ids, any order
  int length = 0;                       // tokens to attend to (causal: the token itself included)
  float* out = nullptr;                 // [num_heads, head_dim]
  // Optional in-kernel tag check (see PagedKvView::page_tags): the tag each page must carry.
  const PageTag* expected_tags = nullptr;  // [ceil(length / P)], parallel to page_table
  // Set by the kernel when expected_tags is given: -1 if every page matched, else the index
  // into page_table of the first page that did not (out is then zeroed, no KV was read).
  int32_t* tag_fault = nullptr;
};

// LoadPageTag reads one tag that another thread may be rewriting (a release during a step
// is exactly the fault the check exists for): two relaxed atomic loads, so a torn read is a
// mismatch, never undefined behaviour. Host only.
inline PageTag LoadPageTag(const PageTag* tags, int32_t page) {
  PageTag t;
  t.lo = __atomic_load_n(&tags[page].lo, __ATOMIC_RELAXED);
  t.hi = __atomic_load_n(&tags[page].hi, __ATOMIC_RELAXED);
  return t;
}

// TagMatches is the kernels' tag check of one page: its current tag equals the expected one,
// and the expected one is not zero. Zero is the tag of a page nobody owns (a freed page
// carries it; TagKeyRing::Derive never returns it), so an entry expecting zero must never
// match a free page. Every read and write check uses this one function. Host only.
inline bool TagMatches(const PageTag& current, const PageTag& expected) {
  return ((current.lo ^ expected.lo) | (current.hi ^ expected.hi)) == 0 &&
         (expected.lo | expected.hi) != 0;
}

// PageTagMatches checks page `page` of a pool of `num_pages` against `expected`: in range and
// TagMatches.
inline bool PageTagMatches(const PageTag* tags, int32_t num_pages, int32_t page,
                           const PageTag& expected) {
  return page >= 0 && page < num_pages && TagMatches(LoadPageTag(tags, page), expected);
}

// FirstTagFault returns -1 when the query needs no check (no tags on either side) or every
// page of it is inside the pool and carries its expected tag, else the index into page_table
// of the first that is not. Not constant time: tags are compared after the verifier already
// did (in constant time); a mismatch here aborts the request either way. Host only.
inline int32_t FirstTagFault(const PagedKvView& kv, const DecodeQuery& q) {
  if (kv.page_tags == nullptr || q.expected_tags == nullptr) return -1;
  const int32_t pages = (q.length + kv.page_size - 1) / kv.page_size;
  for (int32_t i = 0; i < pages; ++i) {
    if (!PageTagMatches(kv.page_tags, kv.num_pages, q.page_table[i], q.expected_tags[i])) return i;
  }
  return -1;
}

}  // namespace kvguard::kernels

#endif  // KVGUARD_KERNELS_FORMATS_H_
