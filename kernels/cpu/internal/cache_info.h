// kernels/cpu/internal/cache_info.h: the cache sizes that kernels tune their software prefetch to
// (not public).
#ifndef KVGUARD_KERNELS_CPU_INTERNAL_CACHE_INFO_H_
#define KVGUARD_KERNELS_CPU_INTERNAL_CACHE_INFO_H_

#include <unistd.h>

#include <cstddef>
#include <cstdint>

namespace kvguard::kernels::internal {

// L1DataCacheBytes returns the size of one core's L1 data cache as the OS reports it (32 KiB on
// Zen 4, 48 KiB on Zen 5 and Ice Lake server), or 32 KiB where it does not say. Read once.
inline size_t L1DataCacheBytes() {
  static const size_t bytes = [] {
    int64_t reported = 0;
#ifdef _SC_LEVEL1_DCACHE_SIZE  // glibc
    reported = sysconf(_SC_LEVEL1_DCACHE_SIZE);
#endif
    return reported > 0 ? static_cast<size_t>(reported) : size_t{32} << 10;
  }();
  return bytes;
}

}  // namespace kvguard::kernels::internal

#endif  // KVGUARD_KERNELS_CPU_INTERNAL_CACHE_INFO_H_
