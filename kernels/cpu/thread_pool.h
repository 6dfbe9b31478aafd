// kernels/cpu/thread_pool.h: a small fork-join pool that the caller owns and passes to kernels.
//
// Decode steps call ParallelFor hundreds of times per token (several matmuls per layer), so the
// hand-off latency matters more than anything else here: workers spin briefly on an atomic
// generation counter before they sleep on it (std::atomic::wait, a futex on Linux), the
// calling thread always takes a share of the work itself, and it too spins only briefly
// before sleeping while it waits for the workers (so an oversubscribed machine degrades
// gracefully instead of burning scheduler slices).
#ifndef KVGUARD_KERNELS_CPU_THREAD_POOL_H_
#define KVGUARD_KERNELS_CPU_THREAD_POOL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace kvguard::kernels {

class ThreadPool {
 public:
  // ThreadPool starts `num_threads - 1` workers; the caller of ParallelFor is the last thread.
  // num_threads < 1 is treated as 1 (no workers: everything runs on the caller).
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // size returns the number of threads that share a ParallelFor, the caller included.
  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // ParallelFor splits [0, n) into size() contiguous chunks, each a multiple of `grain` (the
  // last one takes the remainder), runs fn(begin, end) on each and returns when all are done.
  // Not reentrant: one ParallelFor at a time per pool, and fn must not call back into it.
  void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void WorkerLoop(int index);
  void RunChunk(int index);

  std::vector<std::thread> workers_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t grain_ = 1;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace kvguard::kernels

#endif  // KVGUARD_KERNELS_CPU_THREAD_POOL_H_
