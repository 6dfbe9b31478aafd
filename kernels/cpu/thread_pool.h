// kernels/cpu/thread_pool.h: a small fork-join pool that the caller owns and passes to kernels.
//
// Decode steps call ParallelFor hundreds of times per token (several matmuls per layer), so the
// hand-off latency matters more than anything else here. Two choices follow from that, and
// from running on small shared machines where a core can be taken away at any moment:
//   * Work is cut into a few chunks per thread that threads claim one at a time from an atomic
//     cursor, the caller included. A worker that is descheduled, or wakes late, simply claims
//     fewer chunks; the caller never idles waiting for a share that nobody has started.
//   * Workers spin briefly on an atomic generation counter before they sleep on it
//     (std::atomic::wait, a futex on Linux); the caller, once the cursor is exhausted, also
//     spins only briefly before sleeping until the last claimed chunk is done.
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

  // ParallelFor splits [0, n) into contiguous chunks whose boundaries are multiples of `grain`
  // (at most chunks_per_thread per thread, clamped to [1, kChunksPerThread]), runs fn(begin, end)
  // once for each chunk on whichever thread claims it, and returns when all are done. Which
  // thread runs which chunk is not fixed. Not reentrant: one ParallelFor at a time per pool, and
  // fn must not call back into it.
  //
  // More chunks than threads let a thread that is running take over the share of one that the
  // OS has descheduled (this machine is shared, and serving runs a prefill and a decode pool on
  // the same cores); fewer cost less when the job is short, since every chunk is a new stream
  // for the memory system to ramp up (see RunRows in matmul.cc). Chunks shrink towards the end
  // (guided scheduling): with c chunks per thread, the i-th chunk of every thread's round weighs
  // c - i, so the last ones to be claimed are the smallest and the threads finish close together
  // (with equal chunks, one thread waits up to a whole chunk for the other at every call; a
  // `medium` decode step made 155 calls (89 since Q/K/V and gate/up are fused), and `perf` put 7%
  // of its samples in the two threads' waits). Measured on Zen 5, `medium` INT4 decode at batch 1
  // (kvguard bench, one run each, same session): 59.5 tok/s with equal chunks, 63.1 guided.
  void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn,
                   int64_t chunks_per_thread = kChunksPerThread);

  static constexpr int64_t kChunksPerThread = 4;

 private:
  void WorkerLoop();
  // RunChunks claims and runs chunks of job `epoch` until none is left (or another job began).
  void RunChunks(uint64_t epoch);

  std::vector<std::thread> workers_;
  // The current job. Written by the caller before it publishes the job through cursor_ (a
  // release store); read by a worker only after it has claimed a chunk of that job.
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  std::vector<int64_t> bounds_;          // chunk i is [bounds_[i], bounds_[i + 1])
  std::atomic<int64_t> chunks_{0};       // chunks in the current job
  std::atomic<uint64_t> cursor_{0};      // (epoch << 32) | next unclaimed chunk
  std::atomic<int64_t> done_{0};         // chunks of the current job finished
  std::atomic<uint64_t> generation_{0};  // epoch of the latest job; workers wake on change
  uint64_t epoch_ = 0;                   // caller-side job counter
  std::atomic<bool> stop_{false};
};

}  // namespace kvguard::kernels

#endif  // KVGUARD_KERNELS_CPU_THREAD_POOL_H_
