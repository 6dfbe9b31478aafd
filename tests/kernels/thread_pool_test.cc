#include "kernels/cpu/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
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
  // A chunk the caller claims holds it until a worker has run a chunk, so the remaining chunks
  // are left for the worker, however late it wakes. A pool that never hands work to its worker
  // hangs here (and fails at ctest's timeout).
  std::atomic<bool> on_worker{false};
  const std::thread::id caller = std::this_thread::get_id();
  pool.ParallelFor(64, 1, [&](int64_t, int64_t) {
    if (std::this_thread::get_id() != caller) {
      on_worker.store(true);
      on_worker.notify_all();
    } else {
      on_worker.wait(false);
    }
  });
  EXPECT_TRUE(on_worker.load()) << "the worker never ran a chunk";
  // Positive twin: a range no larger than the grain runs as one chunk on the caller.
  chunks = 0;
  pool.ParallelFor(10, 16, [&](int64_t b, int64_t e) {
    EXPECT_EQ(b, 0);
    EXPECT_EQ(e, 10);
    chunks.fetch_add(1);
  });
  EXPECT_EQ(chunks.load(), 1);
}

// Chunk sizes: guided (shrinking, so the threads finish together) at the default of
// kChunksPerThread per thread; equal, one per thread, when the caller asks for one; equal when
// the range holds too few units for the guided weights.
TEST(ThreadPoolTest, ChunksShrinkTowardsTheEndAndHonourChunksPerThread) {
  ThreadPool pool(2);
  auto chunk_sizes = [&](int64_t n, int64_t grain, int64_t per_thread) {
    std::mutex mu;
    std::map<int64_t, int64_t> sizes;  // begin -> size, in range order
    pool.ParallelFor(
        n, grain,
        [&](int64_t b, int64_t e) {
          std::lock_guard<std::mutex> lock(mu);
          sizes[b] = e - b;
        },
        per_thread);
    std::vector<int64_t> out;
    for (const auto& [b, size] : sizes) out.push_back(size);
    return out;
  };
  // 2048 rows in blocks of 16 (a 2048-row matrix): weights 4 4 3 3 2 2 1 1 of 20 over 128
  // units; chunk i ends at unit floor(128 * (cumulative weight) / 20): 25 51 70 89 102 115 121 128.
  EXPECT_EQ(chunk_sizes(2048, 16, ThreadPool::kChunksPerThread),
            (std::vector<int64_t>{400, 416, 304, 304, 208, 208, 96, 112}));
  // Positive twin of the shrinking: one chunk per thread is an even split.
  EXPECT_EQ(chunk_sizes(2048, 16, 1), (std::vector<int64_t>{1024, 1024}));
  // Out-of-range requests are clamped to [1, kChunksPerThread].
  EXPECT_EQ(chunk_sizes(2048, 16, 0), (std::vector<int64_t>{1024, 1024}));
  EXPECT_EQ(chunk_sizes(2048, 16, 100).size(), size_t{2 * ThreadPool::kChunksPerThread});
  // 16 units for 8 chunks: too few for the weights, so equal chunks of 2 units.
  EXPECT_EQ(chunk_sizes(256, 16, ThreadPool::kChunksPerThread), (std::vector<int64_t>(8, 32)));
  // A ragged end (n not a multiple of the grain, 129 units) goes to the last chunk only.
  EXPECT_EQ(chunk_sizes(2050, 16, ThreadPool::kChunksPerThread),
            (std::vector<int64_t>{400, 416, 304, 320, 208, 208, 96, 98}));
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
