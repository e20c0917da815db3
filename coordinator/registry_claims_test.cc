// Who may register under a live host's name (issue 16, hostile clients): a restart at the same
// address replaces the live incarnation at once; another address must wait until the live one
// stops heartbeating; an address that is not host:port is refused, naming the field.
#include <gtest/gtest.h>

#include "coordinator/worker_registry.h"

namespace meshrun::coordinator {
namespace {

class RegistryClaimsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto registry =
        WorkerRegistry::Create({.heartbeat_timeout = absl::Seconds(10), .clock = &clock_});
    ASSERT_TRUE(registry.ok());
    registry_ = std::move(*registry);
    ASSERT_TRUE(registry_->Register({.host = "a", .address = "10.0.0.1:7071", .incarnation = "a1"})
                    .ok());
  }
  std::string AliveIncarnation() {
    for (const WorkerEntry& e : registry_->List()) {
      if (e.info.host == "a" && e.state == WorkerState::kAlive) return e.info.incarnation;
    }
    return "";
  }
  FakeClock clock_;
  std::unique_ptr<WorkerRegistry> registry_;
};

TEST_F(RegistryClaimsTest, AnotherAddressCannotTakeAHeartbeatingHostsName) {
  clock_.Advance(absl::Seconds(4));
  ASSERT_TRUE(registry_->Heartbeat("a", "a1").ok());
  const absl::Status s =
      registry_->Register({.host = "a", .address = "10.0.0.9:7071", .incarnation = "evil"});
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists) << s;
  EXPECT_NE(s.message().find("10.0.0.1:7071"), absl::string_view::npos) << s;
  EXPECT_EQ(AliveIncarnation(), "a1");
  EXPECT_TRUE(registry_->Heartbeat("a", "a1").ok()) << "the live worker is not fenced";
  // Once it is quiet for 1.5 heartbeat intervals, a new process elsewhere may take over.
  clock_.Advance(absl::Milliseconds(7500));
  EXPECT_TRUE(
      registry_->Register({.host = "a", .address = "10.0.0.9:7071", .incarnation = "a2"}).ok());
  EXPECT_EQ(AliveIncarnation(), "a2");
}

TEST_F(RegistryClaimsTest, ARestartAtTheSameAddressReplacesAtOnce) {
  ASSERT_TRUE(
      registry_->Register({.host = "a", .address = "10.0.0.1:7071", .incarnation = "a2"}).ok());
  EXPECT_EQ(AliveIncarnation(), "a2");
  EXPECT_EQ(registry_->Heartbeat("a", "a1").code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(RegistryClaimsTest, AddressMustBeHostPort) {
  for (const char* address : {"not an address", "host", ":7071", "h:0", "h:99999", "h:7x"}) {
    const absl::Status s = registry_->Register({.host = "b", .address = address, .incarnation = address});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << address;
    EXPECT_NE(s.message().find("registration.address"), absl::string_view::npos) << s;
  }
  EXPECT_TRUE(registry_->Register({.host = "b", .address = "[::1]:7071", .incarnation = "b1"}).ok());
}

}  // namespace
}  // namespace meshrun::coordinator
