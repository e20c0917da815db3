#include <gtest/gtest.h>

#include "telemetry/cadence.h"
#include "telemetry/combine.h"

namespace meshrun::telemetry {
namespace {

TEST(CadenceTest, LogsEveryNthStepFromOne) {
  auto cadence = Cadence::Create(100);
  ASSERT_TRUE(cadence.ok());
  int logging_steps = 0;
  for (int64_t step = 1; step <= 1000; ++step) logging_steps += cadence->IsLoggingStep(step);
  EXPECT_EQ(logging_steps, 10);
  EXPECT_FALSE(cadence->IsLoggingStep(0));
}

TEST(CadenceTest, RefusesZeroNamingTheField) {
  auto cadence = Cadence::Create(0);
  EXPECT_EQ(cadence.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(cadence.status().message().find("telemetry_cadence"), absl::string_view::npos);
}

TEST(CombineTest, ParsesEveryNameAndRefusesOthers) {
  for (Combine c : {Combine::kMean, Combine::kMax, Combine::kMin, Combine::kSum, Combine::kLast}) {
    EXPECT_EQ(ParseCombine(CombineName(c)).value(), c);
  }
  EXPECT_EQ(ParseCombine("avg").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CombineTest, EachSemantics) {
  const std::vector<HostValues> hosts = {
      {.host_index = 1, .replica_count = 3, .values = {1.0f, 10.0f}},
      {.host_index = 0, .replica_count = 1, .values = {5.0f, -2.0f}},
  };
  EXPECT_EQ(CombineValues(Combine::kMean, hosts).value(), (std::vector<float>{2.0f, 7.0f}));
  EXPECT_EQ(CombineValues(Combine::kMax, hosts).value(), (std::vector<float>{5.0f, 10.0f}));
  EXPECT_EQ(CombineValues(Combine::kMin, hosts).value(), (std::vector<float>{1.0f, -2.0f}));
  EXPECT_EQ(CombineValues(Combine::kSum, hosts).value(), (std::vector<float>{6.0f, 8.0f}));
  EXPECT_EQ(CombineValues(Combine::kLast, hosts).value(), (std::vector<float>{1.0f, 10.0f}));
}

TEST(CombineTest, RefusesMismatchedShapesAndEmptyInput) {
  const std::vector<HostValues> hosts = {{.host_index = 0, .values = {1.0f}},
                                         {.host_index = 1, .values = {1.0f, 2.0f}}};
  EXPECT_EQ(CombineValues(Combine::kSum, hosts).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CombineValues(Combine::kSum, {}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace meshrun::telemetry
