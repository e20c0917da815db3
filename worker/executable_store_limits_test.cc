// limits (issue 16): the worker's executable store is an LRU with a byte cap, and bounds
// uploads.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "worker/executable_store.h"

namespace meshrun::worker {
namespace {

std::string Dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/executable_store_limits_test/" + name;
  std::filesystem::remove_all(dir);
  return dir;
}

void Put(ExecutableStore& store, const std::string& bytes) {
  auto upload = store.Begin(Sha256Hex(bytes), static_cast<int64_t>(bytes.size())).value();
  ASSERT_TRUE(upload->Append(0, bytes).ok());
  ASSERT_TRUE(upload->Commit(Sha256Hex(bytes)).ok());
  store.Flush();
}

TEST(ExecutableStoreLimitsTest, EvictsLeastRecentlyUsedPastTheByteCap) {
  const std::string dir = Dir("lru");
  auto store =
      ExecutableStore::Create(dir, {.max_bytes = 2500, .keep_recent = absl::ZeroDuration()})
          .value();
  const std::string a(1000, 'a'), b(1000, 'b'), c(1000, 'c');
  Put(*store, a);
  absl::SleepFor(absl::Milliseconds(5));
  Put(*store, b);
  absl::SleepFor(absl::Milliseconds(5));
  ASSERT_TRUE(store->Read(Sha256Hex(a)).ok());  // a is now more recent than b
  absl::SleepFor(absl::Milliseconds(5));
  Put(*store, c);
  EXPECT_TRUE(store->Has(Sha256Hex(a)));
  EXPECT_FALSE(store->Has(Sha256Hex(b))) << "b was the least recently used";
  EXPECT_TRUE(store->Has(Sha256Hex(c)));
  EXPECT_EQ(store->DurableBytes(), 2000);
  // A restarted store applies the cap to what it finds.
  store.reset();
  store = ExecutableStore::Create(dir, {.max_bytes = 1500, .keep_recent = absl::ZeroDuration()})
              .value();
  EXPECT_EQ(store->Fingerprints().size(), 1u);
  EXPECT_LE(store->DurableBytes(), 1500);
}

TEST(ExecutableStoreLimitsTest, RecentlyUsedExecutablesAreKeptOverTheCap) {
  auto store = ExecutableStore::Create(Dir("recent"), {.max_bytes = 100}).value();
  const std::string a(1000, 'a'), b(1000, 'b');
  Put(*store, a);
  Put(*store, b);
  EXPECT_TRUE(store->Has(Sha256Hex(a)));
  EXPECT_TRUE(store->Has(Sha256Hex(b)));
}

TEST(ExecutableStoreLimitsTest, BoundsUploads) {
  auto store =
      ExecutableStore::Create(Dir("uploads"), {.max_executable_bytes = 4096, .max_uploads = 2})
          .value();
  const std::string fp(64, 'a');
  absl::StatusOr<std::unique_ptr<ExecutableStore::Upload>> huge = store->Begin(fp, 5000);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(huge.status().message().find("over the 4096 bytes"), std::string::npos);
  auto one = store->Begin(fp, 10).value();
  auto two = store->Begin(fp, 10).value();
  absl::StatusOr<std::unique_ptr<ExecutableStore::Upload>> three = store->Begin(fp, 10);
  EXPECT_EQ(three.status().code(), absl::StatusCode::kResourceExhausted);
  one.reset();  // an abandoned upload frees its place
  EXPECT_TRUE(store->Begin(fp, 10).ok());
}

}  // namespace
}  // namespace meshrun::worker
