#include "rpc/security_policy.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

#include "common/sha256.h"
#include "rpc/refusal_log.h"

namespace meshrun::services {
namespace {

Identity As(Role role, const std::string& name = "n") { return {role, name, "certificate"}; }

TEST(SecurityPolicyTest, ParsesSpiffeIds) {
  auto id = ParseSpiffeId("spiffe://prod/worker/host-3");
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->role, Role::kWorker);
  EXPECT_EQ(id->name, "host-3");
  EXPECT_FALSE(ParseSpiffeId("spiffe://prod/root/x").ok());
  EXPECT_FALSE(ParseSpiffeId("spiffe://prod/worker").ok());
  EXPECT_FALSE(ParseSpiffeId("spiffe://prod/worker/a/b").ok());
  EXPECT_FALSE(ParseSpiffeId("https://prod/worker/a").ok());
}

TEST(SecurityPolicyTest, RolesFollowTheTable) {
  const std::string submit = "/meshrun.v1.Coordinator/SubmitJob";
  const std::string get = "/meshrun.v1.Coordinator/GetJob";
  const std::string reg = "/meshrun.v1.Coordinator/RegisterWorker";
  const std::string start = "/meshrun.v1.Worker/StartJob";
  EXPECT_EQ(Authorize(submit, std::nullopt).code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(Authorize(submit, As(Role::kSubmit)).ok());
  EXPECT_TRUE(Authorize(submit, As(Role::kAdmin)).ok());
  absl::Status denied = Authorize(submit, As(Role::kView, "viewer"));
  EXPECT_EQ(denied.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(denied.message().find("needs role submit"), absl::string_view::npos) << denied;
  EXPECT_NE(denied.message().find("viewer"), absl::string_view::npos) << denied;
  EXPECT_TRUE(Authorize(get, As(Role::kView)).ok());
  EXPECT_EQ(Authorize(submit, As(Role::kWorker)).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(Authorize(reg, As(Role::kWorker)).ok());
  EXPECT_EQ(Authorize(reg, As(Role::kAdmin)).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(Authorize(start, As(Role::kCoordinator)).ok());
  for (Role r : {Role::kAdmin, Role::kSubmit, Role::kView, Role::kWorker}) {
    EXPECT_EQ(Authorize(start, As(r)).code(), absl::StatusCode::kPermissionDenied) << RoleName(r);
  }
  // Methods nobody listed need admin.
  EXPECT_EQ(RequiredRole("/meshrun.v1.Coordinator/SomethingNew"), Role::kAdmin);
  EXPECT_TRUE(Authorize("/grpc.health.v1.Health/Check", As(Role::kWorker)).ok());
}

TEST(SecurityPolicyTest, TokensFileParsesAndNamesBadLines) {
  const std::string hash = Sha256Hex("secret");
  auto entries = TokenStore::Parse("# comment\n" + hash + " submit ci  # trailing\n\n");
  ASSERT_TRUE(entries.ok()) << entries.status();
  ASSERT_EQ(entries->size(), 1u);
  EXPECT_EQ((*entries)[0].identity.role, Role::kSubmit);
  auto bad = TokenStore::Parse(hash + " submit\n");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("line 1"), absl::string_view::npos);
  EXPECT_FALSE(TokenStore::Parse("abc view x\n").ok());
  EXPECT_FALSE(TokenStore::Parse(hash + " root x\n").ok());
}

TEST(SecurityPolicyTest, TokenStoreReloadsAndRevokes) {
  const std::string path = ::testing::TempDir() + "/tokens-" + std::to_string(getpid());
  std::ofstream(path) << Sha256Hex("alpha") << " admin alice\n" << Sha256Hex("beta") << " view bob\n";
  auto store = TokenStore::Create(path, absl::ZeroDuration());
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Lookup("alpha").has_value());
  EXPECT_EQ((*store)->Lookup("alpha")->name, "alice");
  EXPECT_EQ((*store)->Lookup("beta")->role, Role::kView);
  EXPECT_FALSE((*store)->Lookup("gamma").has_value());
  std::ofstream(path) << Sha256Hex("beta") << " view bob\n";  // alice revoked (size changes)
  EXPECT_FALSE((*store)->Lookup("alpha").has_value());
  EXPECT_TRUE((*store)->Lookup("beta").has_value());
  std::ofstream(path) << "garbage\n";  // a broken edit keeps the last good table
  EXPECT_TRUE((*store)->Lookup("beta").has_value());
  EXPECT_EQ(TokenStore::Create(path + ".missing", absl::Seconds(1)).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(SecurityPolicyTest, ConstantTimeEquals) {
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abcd"));
}

// security (issue 27, item 7): a pair logs once per interval and counts every refusal; however
// many callers and method paths a flood brings, the counts stay bounded.
TEST(RefusalLogTest, LogsOncePerIntervalCountsAllAndStaysBounded) {
  RefusalLog log(absl::Hours(1), 3);
  EXPECT_TRUE(log.Record("unauthenticated", "unauthenticated ListJobs", "refused"));
  EXPECT_FALSE(log.Record("unauthenticated", "unauthenticated ListJobs", "refused"));
  EXPECT_TRUE(log.Record("view/vic", "permission_denied SubmitJob", "refused"));
  EXPECT_TRUE(log.Record("view/val", "permission_denied SubmitJob", "refused"));
  EXPECT_FALSE(log.Record("view/eve", "permission_denied SubmitJob", "refused"))
      << "3 lines an interval in all";
  for (int i = 0; i < 3000; ++i) {
    log.RecordCall(std::nullopt, "/x/" + std::to_string(i),
                   absl::UnauthenticatedError("no identity"), "refused");
  }
  const auto counts = log.Counts();
  EXPECT_LE(counts.size(), RefusalLog::kMaxPairs + 1);
  int64_t total = 0;
  for (const auto& [key, count] : counts) total += count;
  EXPECT_EQ(total, 3005);
  EXPECT_EQ(counts.at({"unauthenticated", "unauthenticated ListJobs"}), 2);
  EXPECT_GT(counts.at({"other", "other"}), 0);
  EXPECT_EQ(counts.count({"unauthenticated", "unauthenticated 7"}), 1u);
}

}  // namespace
}  // namespace meshrun::services
