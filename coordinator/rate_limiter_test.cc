// limits (issue 16): per-client rate limits.
#include "coordinator/rate_limiter.h"

#include <gtest/gtest.h>

namespace meshrun::coordinator {
namespace {

TEST(RateLimiterTest, BurstThenRatePerClient) {
  FakeClock clock;
  auto limiter = RateLimiter::Create({.per_second = 2, .burst = 3, .what = "SubmitJob calls",
                                      .clock = &clock})
                     .value();
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(limiter->Admit("alice").ok());
  const absl::Status refused = limiter->Admit("alice");
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("client alice is over its rate of 2 SubmitJob calls a second"),
            std::string::npos)
      << refused;
  EXPECT_TRUE(limiter->Admit("bob").ok()) << "another client has its own bucket";
  clock.Advance(absl::Milliseconds(500));
  EXPECT_TRUE(limiter->Admit("alice").ok());
  EXPECT_FALSE(limiter->Admit("alice").ok());
}

TEST(RateLimiterTest, TableOfClientsIsBounded) {
  FakeClock clock;
  auto limiter =
      RateLimiter::Create({.per_second = 1, .burst = 1, .max_clients = 2, .clock = &clock})
          .value();
  EXPECT_TRUE(limiter->Admit("a").ok());
  EXPECT_TRUE(limiter->Admit("b").ok());
  EXPECT_EQ(limiter->Admit("c").code(), absl::StatusCode::kResourceExhausted);
  clock.Advance(absl::Seconds(2));  // a and b refilled: dropped to make room
  EXPECT_TRUE(limiter->Admit("c").ok());
  EXPECT_TRUE(RateLimiter::Create({.per_second = 0}).value()->Admit("x").ok());
}

}  // namespace
}  // namespace meshrun::coordinator
