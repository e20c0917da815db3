// limits (issue 16): idle streams are cancelled.
#include "common/idle_watchdog.h"

#include <gtest/gtest.h>

#include <atomic>

#include "absl/time/clock.h"

namespace meshrun {
namespace {

TEST(IdleWatchdogTest, CancelsOnlyWhatGoesIdle) {
  IdleWatchdog watchdog(absl::Milliseconds(300), absl::Milliseconds(20));
  std::atomic<int> idle{0}, busy{0};
  auto quiet = watchdog.Watch([&] { ++idle; });
  auto talking = watchdog.Watch([&] { ++busy; });
  for (int i = 0; i < 40; ++i) {  // 800 ms of touches every 20 ms
    talking->Touch();
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(idle.load(), 1) << "fired once";
  EXPECT_EQ(busy.load(), 0);
  talking.reset();  // a released lease never fires
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_EQ(busy.load(), 0);
  EXPECT_EQ(watchdog.cancelled(), 1);
}

}  // namespace
}  // namespace meshrun
