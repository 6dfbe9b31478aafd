#include "kernels/cpu/thread_pool.h"

#include <algorithm>

namespace kvguard::kernels {
namespace {

// How long a thread spins before it sleeps: long enough to bridge the gap between two
// back-to-back matmuls of one decode step, short enough not to burn a core when idle.
constexpr int kSpinIterations = 1 << 14;

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  const int workers = std::max(num_threads, 1) - 1;
  workers_.reserve(workers);
  for (int i = 0; i < workers; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::RunChunks(uint64_t epoch) {
  for (;;) {
    uint64_t c = cursor_.load(std::memory_order_acquire);
    if ((c >> 32) != (epoch & 0xFFFFFFFFu)) return;  // a newer job, or none yet
    const int64_t index = static_cast<int64_t>(c & 0xFFFFFFFFu);
    if (index >= chunks_.load(std::memory_order_relaxed)) return;
    if (!cursor_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel)) continue;
    // Claimed: the job cannot change until this chunk is counted in done_.
    (*fn_)(bounds_[index], bounds_[index + 1]);
    if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 ==
        chunks_.load(std::memory_order_relaxed)) {
      done_.notify_one();
    }
  }
}

void ThreadPool::WorkerLoop() {
  uint64_t seen = 0;
  for (;;) {
    uint64_t g = generation_.load(std::memory_order_acquire);
    for (int spin = 0; g == seen && spin < kSpinIterations; ++spin) {
      CpuRelax();
      g = generation_.load(std::memory_order_acquire);
    }
    if (g == seen) {
      generation_.wait(seen, std::memory_order_acquire);
      continue;
    }
    seen = g;
    if (stop_.load(std::memory_order_acquire)) return;
    RunChunks(g);
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t)>& fn,
                             int64_t chunks_per_thread) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t units = (n + grain - 1) / grain;
  if (workers_.empty() || units <= 1) {
    fn(0, n);
    return;
  }
  chunks_per_thread = std::clamp<int64_t>(chunks_per_thread, 1, kChunksPerThread);
  const int64_t threads = size();
  const int64_t chunks = std::min<int64_t>(units, threads * chunks_per_thread);
  // Guided sizes (see the header): chunk i weighs ceil((chunks - i) / threads), e.g. 4 4 3 3 2 2
  // 1 1 for 8 chunks on 2 threads. Where units are too few for the weights to hold whole units,
  // equal weights. Every chunk gets at least one unit: boundaries strictly increase.
  const bool guided = units >= 4 * chunks;
  int64_t total_weight = 0;
  for (int64_t i = 0; i < chunks; ++i) {
    total_weight += guided ? (chunks - i + threads - 1) / threads : 1;
  }
  bounds_.resize(static_cast<size_t>(chunks) + 1);
  bounds_[0] = 0;
  for (int64_t i = 0, weight = 0; i < chunks; ++i) {
    weight += guided ? (chunks - i + threads - 1) / threads : 1;
    const int64_t unit_end = std::max(units * weight / total_weight, bounds_[i] / grain + 1);
    bounds_[i + 1] = std::min(n, unit_end * grain);
  }
  fn_ = &fn;
  chunks_.store(chunks, std::memory_order_relaxed);
  done_.store(0, std::memory_order_relaxed);
  const uint64_t epoch = ++epoch_;
  cursor_.store((epoch & 0xFFFFFFFFu) << 32, std::memory_order_release);  // publishes the job
  generation_.store(epoch, std::memory_order_release);
  generation_.notify_all();
  RunChunks(epoch);
  // Every chunk is claimed; wait for those still running on workers. Spin first (they usually
  // end within microseconds), then sleep: on an oversubscribed machine a pure spin would burn
  // whole scheduler slices waiting for a descheduled worker.
  int spin = 0;
  for (int64_t d; (d = done_.load(std::memory_order_acquire)) != chunks;) {
    if (++spin < kSpinIterations) {
      CpuRelax();
    } else {
      done_.wait(d, std::memory_order_acquire);
    }
  }
  // Close the job before any of its fields can change: a worker that read this job's cursor
  // just before the last claim, and whose compare-exchange is still to come, must fail it even
  // if it then reads the next job's chunk count (it would otherwise claim a phantom chunk and
  // count it in the next job's done_).
  cursor_.store(((epoch & 0xFFFFFFFFu) << 32) | 0xFFFFFFFFu, std::memory_order_release);
  fn_ = nullptr;
}

}  // namespace kvguard::kernels
