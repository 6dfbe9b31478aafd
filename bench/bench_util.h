// bench/bench_util.h: what the kernel benchmarks share: thread pools by size, page-aligned
// buffers that are touched before timing, and the counter names the summary reads.
#ifndef KVGUARD_BENCH_BENCH_UTIL_H_
#define KVGUARD_BENCH_BENCH_UTIL_H_

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "kernels/cpu/huge_page_allocator.h"
#include "kernels/cpu/thread_pool.h"

namespace kvguard::bench {

// Pool returns a process-wide pool of `threads` threads (1 means no workers).
kernels::ThreadPool* Pool(int threads);

// StreamReadGBps returns the median of `reps` timed read-only passes over a fresh array of
// `bytes` (STREAM-style, as BM_StreamRead), in GB/s: the reference that engine benchmarks
// record beside their own figures, measured in the same run.
double StreamReadGBps(int threads, int reps = 5, size_t bytes = size_t{1} << 30);

// Counter names: every memory-bound benchmark reports the bytes it must move per iteration as
// kBytes (a rate, bytes/s), so the summary can divide it by STREAM's read rate.
inline constexpr const char* kBytes = "bytes";
// Compute-bound benchmarks also report the floating-point operations per iteration as kFlops.
inline constexpr const char* kFlops = "flops";

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// AllocTouched returns `bytes` of 2 MiB-aligned memory, every page written once (so neither
// page faults nor zero-page sharing land inside a timed loop), backed by transparent huge pages
// where the kernel grants them, as the engine's KV pool and weights are (core/model/kv_pool.cc):
// with 4 KiB pages, scattered KV pages cost a TLB miss each, which the engine never pays.
template <typename T>
std::unique_ptr<T[], FreeDeleter> AllocTouched(size_t count) {
  const size_t align = kernels::kHugePageBytes;
  const size_t bytes = (count * sizeof(T) + align - 1) / align * align;
  void* p = kernels::AllocateHugePageBacked(bytes);
  if (p == nullptr) std::abort();
  std::memset(p, 1, bytes);
  return std::unique_ptr<T[], FreeDeleter>(static_cast<T*>(p));
}

}  // namespace kvguard::bench

#endif  // KVGUARD_BENCH_BENCH_UTIL_H_
