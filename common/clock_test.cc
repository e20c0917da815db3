#include "common/clock.h"

#include <gtest/gtest.h>

namespace meshrun {
namespace {

TEST(FakeClockTest, MovesOnlyWhenAdvanced) {
  FakeClock clock;
  const absl::Time start = clock.Now();
  EXPECT_EQ(clock.Now(), start);
  clock.Advance(absl::Seconds(3));
  EXPECT_EQ(clock.Now() - start, absl::Seconds(3));
}

TEST(RealClockTest, IsMonotonicEnoughForTimeouts) {
  const absl::Time a = RealClock().Now();
  const absl::Time b = RealClock().Now();
  EXPECT_LE(a, b);
  EXPECT_GT(a, absl::UnixEpoch() + absl::Hours(24 * 365 * 50));
}

}  // namespace
}  // namespace meshrun
