#include "kernels/cpu/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

namespace kvguard::kernels {
namespace {

// Every index of [0, n) is visited exactly once, in chunks that respect the grain, for
// thread counts below, at and above the range size.
TEST(ThreadPoolTest, ParallelForCoversRangeExactlyOnce) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (int64_t n : {0, 1, 2, 7, 64, 1000, 4097}) {
      for (int64_t grain : {1, 8, 16, 5000}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        std::atomic<int> misaligned{0};
        pool.ParallelFor(n, grain, [&](int64_t b, int64_t e) {
          if (b % grain != 0) misaligned.fetch_add(1);
          for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
        });
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1)
              << "threads " << threads << " n " << n << " grain " << grain << " i " << i;
        }
        EXPECT_EQ(misaligned.load(), 0);
      }
    }
  }
}

// Work is cut into a few chunks per thread; with enough of it, workers take a share.
TEST(ThreadPoolTest, WorkIsSharedWithWorkers) {
  ThreadPool pool(2);
  std::atomic<int> chunks{0};
  pool.ParallelFor(1000, 1, [&](int64_t, int64_t) { chunks.fetch_add(1); });
  EXPECT_EQ(chunks.load(), 2 * ThreadPool::kChunksPerThread);
  std::atomic<int> on_worker{0};
  const std::thread::id caller = std::this_thread::get_id();
  for (int round = 0; round < 200 && on_worker.load() == 0; ++round) {
    pool.ParallelFor(64, 1, [&](int64_t, int64_t) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      if (std::this_thread::get_id() != caller) on_worker.fetch_add(1);
    });
  }
  EXPECT_GT(on_worker.load(), 0) << "the worker never ran a chunk";
  // Positive twin: a range no larger than the grain runs as one chunk on the caller.
  chunks = 0;
  pool.ParallelFor(10, 16, [&](int64_t b, int64_t e) {
    EXPECT_EQ(b, 0);
    EXPECT_EQ(e, 10);
    chunks.fetch_add(1);
  });
  EXPECT_EQ(chunks.load(), 1);
}

// Many back-to-back calls (the decode-step pattern) neither lose nor repeat work, and the
// results written by workers are visible to the caller when ParallelFor returns.
TEST(ThreadPoolTest, BackToBackCallsPublishResults) {
  ThreadPool pool(2);
  std::vector<int64_t> out(256);
  for (int round = 0; round < 2000; ++round) {
    pool.ParallelFor(256, 16, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) out[static_cast<size_t>(i)] = i * round;
    });
    for (int64_t i = 0; i < 256; i += 37) ASSERT_EQ(out[static_cast<size_t>(i)], i * round);
  }
}

// Regression: consecutive jobs with a growing chunk count. A worker still holding the previous
// job's exhausted cursor once claimed a phantom chunk against the next job's (larger) count,
// ran it and counted it in the next job, which then never saw done == chunks and hung.
TEST(ThreadPoolTest, JobsOfChangingSizeNeitherLoseNorRepeatWork) {
  for (int threads : {2, 3}) {
    ThreadPool pool(threads);
    std::vector<std::atomic<int>> hits(64 * 16);
    for (int round = 0; round < 20000; ++round) {
      const int64_t n = 16 * (1 + (round * 7) % 64);  // 1..64 grains: chunk counts vary
      for (int64_t i = 0; i < n; ++i) hits[static_cast<size_t>(i)].store(0);
      pool.ParallelFor(n, 16, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "round " << round << " i " << i;
      }
    }
  }
}

TEST(ThreadPoolTest, NonPositiveThreadCountRunsOnCaller) {
  ThreadPool pool(0);
  EXPECT_EQ(pool.size(), 1);
  int64_t sum = 0;
  pool.ParallelFor(100, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) sum += i;
  });
  EXPECT_EQ(sum, 4950);
}

}  // namespace
}  // namespace kvguard::kernels
