#include "common/status_macros.h"

#include <gtest/gtest.h>

#include <memory>

namespace meshrun {
namespace {

int calls = 0;

absl::StatusOr<std::unique_ptr<int>> MakeInt(bool ok) {
  ++calls;
  if (!ok) return absl::NotFoundError("no int");
  return std::make_unique<int>(7);
}

absl::Status Check(bool ok) {
  ++calls;
  return ok ? absl::OkStatus() : absl::InvalidArgumentError("bad");
}

absl::StatusOr<int> UseBoth(bool first_ok, bool second_ok) {
  RETURN_IF_ERROR(Check(first_ok));
  ASSIGN_OR_RETURN(std::unique_ptr<int> value, MakeInt(second_ok));  // move-only works
  ASSIGN_OR_RETURN(auto again, MakeInt(true));  // two on one function need distinct temps
  return *value + *again;
}

TEST(StatusMacrosTest, PropagatesFirstErrorAndEvaluatesOnce) {
  calls = 0;
  EXPECT_EQ(UseBoth(true, true).value(), 14);
  EXPECT_EQ(calls, 3);

  calls = 0;
  EXPECT_EQ(UseBoth(false, true).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(calls, 1);

  calls = 0;
  EXPECT_EQ(UseBoth(true, false).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(calls, 2);
}

}  // namespace
}  // namespace meshrun
