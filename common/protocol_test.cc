#include "common/protocol.h"

#include <gtest/gtest.h>

namespace meshrun {
namespace {

TEST(ProtocolTest, AcceptsOwnVersion) {
  EXPECT_TRUE(CheckProtocolVersion(kProtocolVersion).ok());
}

TEST(ProtocolTest, RefusesVersionsOutsideRangeNamingTheRange) {
  const absl::Status status = CheckProtocolVersion(kProtocolMaxVersion + 1);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("versions 1 to 1"), absl::string_view::npos) << status;
  EXPECT_EQ(CheckProtocolVersion(0).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace meshrun
