#include "common/grpc_status.h"

#include <gtest/gtest.h>

namespace meshrun {
namespace {

TEST(GrpcStatusTest, RoundTripsEveryCodeAndMessage) {
  for (int code = 0; code <= 16; ++code) {
    const absl::Status original(static_cast<absl::StatusCode>(code),
                                code == 0 ? "" : "field x: fix y");
    const grpc::Status wire = ToGrpcStatus(original);
    EXPECT_EQ(static_cast<int>(wire.error_code()), code);
    EXPECT_EQ(FromGrpcStatus(wire), original);
  }
}

}  // namespace
}  // namespace meshrun
