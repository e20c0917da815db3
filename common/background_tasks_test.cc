#include "common/background_tasks.h"

#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

namespace meshrun {
namespace {

TEST(BackgroundTasksTest, RunsEveryTaskAndJoinAllWaitsForThem) {
  std::atomic<int> ran{0};
  BackgroundTasks tasks;
  for (int i = 0; i < 20; ++i) tasks.Run([&] { ++ran; });
  tasks.JoinAll();
  EXPECT_EQ(ran, 20);
  EXPECT_EQ(tasks.size(), 0u);
}

TEST(BackgroundTasksTest, FinishedTasksAreJoinedByTheNextRun) {
  // Declared before the tasks: they are joined (destroyed) first, while the blocked task may
  // still be returning from its wait on `release`.
  absl::Notification release, quick_done;
  BackgroundTasks tasks;
  tasks.Run([&] { release.WaitForNotification(); });  // stays running
  tasks.Run([&] { quick_done.Notify(); });
  quick_done.WaitForNotification();
  // The quick task's thread may still be marking itself done; a few runs later it is gone.
  for (int i = 0; i < 100 && tasks.size() > 2; ++i) tasks.Run([] {});
  tasks.Run([] {});
  EXPECT_LE(tasks.size(), 3u);  // the blocked task, at most one just-finished, the new one
  release.Notify();
}

TEST(BackgroundTasksTest, DestructorWaitsForRunningTasks) {
  std::atomic<bool> finished{false};
  {
    BackgroundTasks tasks;
    tasks.Run([&] {
      absl::SleepFor(absl::Milliseconds(50));
      finished = true;
    });
  }
  EXPECT_TRUE(finished);
}

// Every index runs once, all at the same time: each task waits until all have started.
TEST(RunConcurrentlyTest, RunsEachIndexOnceAllAtOnce) {
  constexpr size_t kTasks = 4;
  std::atomic<int> started{0};
  std::atomic<int> runs[kTasks] = {};
  RunConcurrently(kTasks, [&](size_t i) {
    ++runs[i];
    ++started;
    for (int spin = 0; spin < 1000 && started < static_cast<int>(kTasks); ++spin) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    EXPECT_EQ(started, static_cast<int>(kTasks)) << "task " << i << " ran alone";
  });
  for (const auto& n : runs) EXPECT_EQ(n, 1);
  RunConcurrently(0, [](size_t) { ADD_FAILURE() << "ran a task of none"; });
}

// Past max_threads, tasks wait for a free thread: never more than max_threads at once, each
// index once.
TEST(RunConcurrentlyTest, BoundsTheThreads) {
  constexpr size_t kTasks = 200, kThreads = 8;
  std::atomic<int> running{0}, most{0};
  std::atomic<int> runs[kTasks] = {};
  absl::Mutex mu;
  std::set<std::thread::id> threads;
  RunConcurrently(
      kTasks,
      [&](size_t i) {
        ++runs[i];
        const int now = ++running;
        for (int seen = most; now > seen && !most.compare_exchange_weak(seen, now);) {
        }
        {
          absl::MutexLock lock(&mu);
          threads.insert(std::this_thread::get_id());
        }
        absl::SleepFor(absl::Microseconds(200));
        --running;
      },
      kThreads);
  for (const auto& n : runs) EXPECT_EQ(n, 1);
  EXPECT_LE(most, static_cast<int>(kThreads));
  EXPECT_GT(most, 1);  // they did run side by side
  EXPECT_LE(threads.size(), kThreads);
}

}  // namespace
}  // namespace meshrun
