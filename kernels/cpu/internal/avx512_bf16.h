// kernels/cpu/internal/avx512_bf16.h: what the BF16 dot-product kernels (attention_bf16dot.cc,
// matmul_bf16dot.cc) share (not public). They are compiled once, outside Highway's per-target
// compilation, with x86 intrinsics under a target attribute, and run only where
// internal::HasAvx512Bf16Vbmi() (cpu_features.h) says the CPU has the instructions.
//   KVGUARD_AVX512_BF16           1 where they are compiled (x86-64, GCC or clang), else 0
//   KVG_AVX512_BF16_TARGET        the attribute every function using the intrinsics carries
//   KVG_AVX512_BF16_BEGIN / _END  around that code: GCC 12's AVX-512 headers build some
//                                 intrinsics from _mm512_undefined_*() and then warn, at every
//                                 inlined use, that the "undefined" operand is uninitialised (a
//                                 known false positive), so those two warnings are off there.
#ifndef KVGUARD_KERNELS_CPU_INTERNAL_AVX512_BF16_H_
#define KVGUARD_KERNELS_CPU_INTERNAL_AVX512_BF16_H_

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define KVGUARD_AVX512_BF16 1
#define KVG_AVX512_BF16_TARGET                                                     \
  __attribute__((                                                                  \
      target("avx2,fma,f16c,bmi,bmi2,avx512f,avx512bw,avx512vl,avx512dq,avx512cd," \
             "avx512vbmi,avx512bf16")))
#else
#define KVGUARD_AVX512_BF16 0
#endif

#if defined(__GNUC__) && !defined(__clang__)
#define KVG_AVX512_BF16_BEGIN                                                          \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wuninitialized\"") \
      _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")
#define KVG_AVX512_BF16_END _Pragma("GCC diagnostic pop")
#else
#define KVG_AVX512_BF16_BEGIN
#define KVG_AVX512_BF16_END
#endif

#endif  // KVGUARD_KERNELS_CPU_INTERNAL_AVX512_BF16_H_
