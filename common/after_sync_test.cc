#include "common/after_sync.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "absl/synchronization/notification.h"

namespace meshrun {
namespace {

// A sync the test holds at its start until released, counting its calls.
class HeldSync {
 public:
  absl::Status operator()() {
    calls.fetch_add(1);
    if (!started.HasBeenNotified()) started.Notify();
    release.WaitForNotification();
    return fail.load() ? absl::InternalError("disk gone") : absl::OkStatus();
  }
  std::atomic<int> calls{0};
  std::atomic<bool> fail{false};
  absl::Notification started, release;
};

TEST(AfterSyncTest, ActionsWaitForTheSyncAndShareOneAfterTheFirst) {
  HeldSync held;
  std::vector<int> ran;
  absl::Mutex mu;
  auto record = [&](int i) {
    return [&, i] {
      absl::MutexLock l(&mu);
      ran.push_back(i);
    };
  };
  {
    AfterSync after([&] { return held(); });
    after.Run(record(1));
    held.started.WaitForNotification();  // the first round's sync is under way
    after.Run(record(2));
    after.Run(record(3));
    absl::SleepFor(absl::Milliseconds(20));
    {
      absl::MutexLock l(&mu);
      EXPECT_TRUE(ran.empty()) << "an action ran before its sync returned";
    }
    held.release.Notify();
    // The destructor's last round runs what is still queued.
  }
  EXPECT_EQ(ran, (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(held.calls.load(), 2);  // 2 and 3 came during the first sync: one more for both
}

TEST(AfterSyncTest, AFailedSyncIsRetriedAndItsActionsRunOnlyAfterOneSucceeds) {
  std::atomic<int> calls{0};
  std::atomic<int> ran{0};
  {
    AfterSync after(
        [&] {
          return ++calls <= 2 ? absl::UnavailableError("disk busy") : absl::OkStatus();
        },
        absl::Milliseconds(5));
    after.Run([&] {
      EXPECT_EQ(calls.load(), 3) << "ran before a sync succeeded";
      ++ran;
    });
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (ran.load() == 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(2));
  }
  EXPECT_EQ(ran.load(), 1);
  EXPECT_EQ(calls.load(), 3);
}

TEST(AfterSyncTest, TheDestructorSyncsAndRunsWhatIsQueued) {
  std::atomic<int> syncs{0}, ran{0};
  {
    AfterSync after([&] {
      ++syncs;
      return absl::OkStatus();
    });
    for (int i = 0; i < 100; ++i) after.Run([&] { ++ran; });
  }
  EXPECT_EQ(ran.load(), 100);
  EXPECT_GE(syncs.load(), 1);
}

TEST(AfterSyncTest, AtTheEndActionsWhoseSyncFailsAreDropped) {
  std::atomic<int> ran{0};
  {
    AfterSync after([] { return absl::InternalError("disk gone"); }, absl::Hours(1));
    after.Run([&] { ++ran; });
  }  // the destructor does not wait out the hour
  EXPECT_EQ(ran.load(), 0);
}

}  // namespace
}  // namespace meshrun
