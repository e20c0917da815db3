#include "coordinator/key_value_store.h"

#include <gtest/gtest.h>

#include <thread>

#include "absl/time/clock.h"

namespace meshrun::coordinator {
namespace {

std::unique_ptr<KeyValueStore> NewStore() { return KeyValueStore::Create({}).value(); }

TEST(KeyValueStoreTest, SetGetListDelete) {
  auto store = NewStore();
  ASSERT_TRUE(store->Set("topology/0", "a", false).ok());
  ASSERT_TRUE(store->Set("topology/1", "b", false).ok());
  ASSERT_TRUE(store->Set("topologyX", "c", false).ok());
  EXPECT_EQ(store->TryGet("topology/1").value(), "b");
  EXPECT_EQ(store->Set("topology/1", "z", false).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(store->Set("topology/1", "z", true).ok());
  auto listed = store->List("topology");
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[1], (std::pair<std::string, std::string>{"topology/1", "z"}));
  ASSERT_TRUE(store->Delete("topology/").ok());
  EXPECT_TRUE(store->List("topology").empty());
  EXPECT_EQ(store->TryGet("topologyX").value(), "c");
  EXPECT_EQ(store->Delete("topology/").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->TryGet("missing").status().code(), absl::StatusCode::kNotFound);
}

TEST(KeyValueStoreTest, BadInputIsRefusedAndChangesNothing) {
  auto store = KeyValueStore::Create({.max_value_bytes = 4, .max_keys = 1}).value();
  EXPECT_EQ(store->Set("", "v", false).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->Set("dir/", "v", false).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->Set("k", "too long", false).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(store->Set("k", "v", false).ok());
  EXPECT_EQ(store->Set("k2", "v", false).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(store->TryGet("k").value(), "v");
}

TEST(KeyValueStoreTest, BlockingGetWakesOnSetAndTimesOutNamingTheKey) {
  auto store = NewStore();
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_TRUE(store->Set("late", "value", false).ok());
  });
  EXPECT_EQ(store->Get("late", absl::Seconds(5)).value(), "value");
  setter.join();

  const absl::Time start = absl::Now();
  auto missing = store->Get("never", absl::Milliseconds(100));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(missing.status().message().find("never"), absl::string_view::npos);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

TEST(KeyValueStoreTest, BarrierReleasesEveryoneWhenAllArrive) {
  auto store = NewStore();
  const std::vector<std::string> tasks = {"w0", "w1", "w2"};
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(3);
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      results[i] = store->WaitAtBarrierBlocking("init", tasks[i], tasks, absl::Seconds(5));
    });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE(store->WaitAtBarrierBlocking("init", "w1", tasks, absl::Seconds(1)).ok())
      << "a completed barrier stays complete";
}

TEST(KeyValueStoreTest, BarrierTimeoutNamesTheMissingTasks) {
  auto store = NewStore();
  absl::Status status =
      store->WaitAtBarrierBlocking("sync", "w0", {"w0", "w1", "w2"}, absl::Milliseconds(100));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(status.message().find("w1, w2"), absl::string_view::npos) << status;
  EXPECT_EQ(store->WaitAtBarrierBlocking("sync", "w9", {"w0", "w9"}, absl::Seconds(1)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->WaitAtBarrierBlocking("sync", "x", {"w0"}, absl::Seconds(1)).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(KeyValueStoreTest, ShutdownCancelsPendingWaiters) {
  auto store = NewStore();
  absl::Status seen;
  store->GetAsync("pending", absl::Now() + absl::Hours(1),
                  [&](absl::StatusOr<std::string> v) { seen = v.status(); });
  store.reset();
  EXPECT_EQ(seen.code(), absl::StatusCode::kCancelled);
}

}  // namespace
}  // namespace meshrun::coordinator
