#include "common/background_tasks.h"

#include <gtest/gtest.h>

#include <atomic>

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
  BackgroundTasks tasks;
  absl::Notification release;
  tasks.Run([&] { release.WaitForNotification(); });  // stays running
  absl::Notification quick_done;
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

}  // namespace
}  // namespace meshrun
