#include "kernels/cpu/thread_pool.h"

#include <algorithm>

namespace kvguard::kernels {
namespace {

// How long a worker spins before it sleeps: long enough to bridge the gap between two
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
  for (int i = 0; i < workers; ++i) workers_.emplace_back([this, i] { WorkerLoop(i + 1); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::RunChunk(int index) {
  const int64_t threads = size();
  const int64_t units = (n_ + grain_ - 1) / grain_;
  const int64_t per = units / threads;
  const int64_t extra = units % threads;
  const int64_t first_unit = index * per + std::min<int64_t>(index, extra);
  const int64_t count = per + (index < extra ? 1 : 0);
  const int64_t begin = std::min(n_, first_unit * grain_);
  const int64_t end = std::min(n_, (first_unit + count) * grain_);
  if (begin < end) (*fn_)(begin, end);
}

void ThreadPool::WorkerLoop(int index) {
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
    RunChunk(index);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain_ = std::max<int64_t>(grain, 1);
  if (workers_.empty() || n <= grain_) {
    fn(0, n);
    return;
  }
  fn_ = &fn;
  n_ = n;
  pending_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  RunChunk(0);
  // Spin first (the workers usually finish within microseconds of the caller), then sleep:
  // on an oversubscribed machine a pure spin would burn whole scheduler slices waiting for a
  // descheduled worker.
  int spin = 0;
  for (int p; (p = pending_.load(std::memory_order_acquire)) != 0;) {
    if (++spin < kSpinIterations) {
      CpuRelax();
    } else {
      pending_.wait(p, std::memory_order_acquire);
    }
  }
  fn_ = nullptr;
}

}  // namespace kvguard::kernels
