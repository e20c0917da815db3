#include "rpc/channel_health.h"

#include <gtest/gtest.h>

#include <set>

namespace meshrun::services {
namespace {

TEST(HeartbeatTickTest, NextBeatComesWithinOneIntervalAndAtMostOneTickEarly) {
  const absl::Duration interval = absl::Seconds(5);  // tick: 250 ms
  for (absl::Time now = absl::FromUnixMillis(1'700'000'000'000);
       now < absl::FromUnixMillis(1'700'000'001'000); now += absl::Milliseconds(37)) {
    const absl::Time next = HeartbeatTick(now + interval, interval);
    EXPECT_LE(next, now + interval);
    EXPECT_GT(next, now + interval - absl::Milliseconds(250));
    EXPECT_EQ(absl::ToUnixMillis(next) % 250, 0);
  }
}

TEST(HeartbeatTickTest, AFleetSpreadOverTheIntervalBeatsOnTwentyTicks) {
  const absl::Duration interval = absl::Seconds(5);
  const absl::Time start = absl::FromUnixMillis(1'700'000'000'123);
  std::set<absl::Time> ticks;
  for (int host = 0; host < 1024; ++host) {
    ticks.insert(HeartbeatTick(start + interval * host / 1024, interval));
  }
  EXPECT_EQ(ticks.size(), 21u);  // 20 per interval; the spread starts between two ticks
}

TEST(HeartbeatTickTest, LongIntervalsTickEverySecondAndTinyOnesStillAdvance) {
  const absl::Time t = absl::FromUnixMillis(1'700'000'000'999);
  EXPECT_EQ(HeartbeatTick(t, absl::Minutes(2)), absl::FromUnixSeconds(1'700'000'000));
  const absl::Duration tiny = absl::Milliseconds(20);  // tests' short timeouts: a 1 ms tick
  EXPECT_GT(HeartbeatTick(t + tiny, tiny), t);
}

}  // namespace
}  // namespace meshrun::services
