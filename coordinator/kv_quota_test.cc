// limits (issue 16): the key-value store's quotas and barrier collection.
#include <gtest/gtest.h>

#include <string>

#include "absl/time/clock.h"
#include "coordinator/key_value_store.h"

namespace meshrun::coordinator {
namespace {

TEST(KeyValueQuotaTest, RefusesOversizedKeysAndValuesAndFullNamespaces) {
  auto store = KeyValueStore::Create({.max_key_bytes = 16,
                                      .max_value_bytes = 8,
                                      .max_keys = 5,
                                      .max_total_bytes = 1000,
                                      .max_keys_per_namespace = 2,
                                      .max_bytes_per_namespace = 40})
                   .value();
  absl::Status s = store->Set(std::string(17, 'k'), "v", false);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("key has 17 bytes; the limit is 16"), std::string::npos) << s;
  s = store->Set("job-1/a", std::string(9, 'v'), false);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(store->Set("job-1/a", "1", false).ok());
  ASSERT_TRUE(store->Set("job-1/b", "2", false).ok());
  s = store->Set("job-1/c", "3", false);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("namespace \"job-1/\" holds its limit of 2 keys"), std::string::npos)
      << s;
  EXPECT_FALSE(store->TryGet("job-1/c").ok());  // nothing stored
  // Another namespace has its own quota; overwriting counts bytes, not keys.
  ASSERT_TRUE(store->Set("job-2/a", "1", false).ok());
  ASSERT_TRUE(store->Set("job-1/a", "12345678", true).ok());
  ASSERT_TRUE(store->Set("job-1/b", "12345678", true).ok());
  EXPECT_EQ(store->stats().keys, 3);
  EXPECT_EQ(store->stats().bytes, 7 + 8 + 7 + 8 + 7 + 1);
  // Deleting gives the quota back.
  ASSERT_TRUE(store->Delete("job-1/").ok());
  EXPECT_EQ(store->stats().keys, 1);
  EXPECT_EQ(store->stats().bytes, 8);
  EXPECT_TRUE(store->Set("job-1/c", "3", false).ok());
  // The store-wide key limit.
  for (const char* key : {"a/1", "b/1", "c/1"}) store->Set(key, "x", false).IgnoreError();
  s = store->Set("d/1", "x", false);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("limit of 5 keys"), std::string::npos) << s;
}

TEST(KeyValueQuotaTest, NamespaceBytesAreBounded) {
  auto store = KeyValueStore::Create({.max_value_bytes = 100, .max_bytes_per_namespace = 50})
                   .value();
  ASSERT_TRUE(store->Set("j/a", std::string(40, 'x'), false).ok());
  const absl::Status s = store->Set("j/b", std::string(40, 'x'), false);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("holds its limit of 50 bytes"), std::string::npos) << s;
}

TEST(KeyValueQuotaTest, BarriersAreBoundedAndCollected) {
  auto store = KeyValueStore::Create({.max_barriers = 2,
                                      .max_barrier_tasks = 3,
                                      .barrier_ttl = absl::Milliseconds(200)})
                   .value();
  absl::Status s = store->WaitAtBarrierBlocking("b", "t0", {"t0", "t1", "t2", "t3"},
                                               absl::Seconds(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("names 4 tasks; the limit is 3"), std::string::npos) << s;
  EXPECT_TRUE(store->WaitAtBarrierBlocking("b1", "t", {"t"}, absl::Seconds(1)).ok());
  EXPECT_TRUE(store->WaitAtBarrierBlocking("b2", "t", {"t"}, absl::Seconds(1)).ok());
  s = store->WaitAtBarrierBlocking("b3", "t", {"t"}, absl::Seconds(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(store->stats().barriers, 2);
  // Completed barriers are collected after the TTL (the timer looks about once a second).
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (store->stats().barriers > 0 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(store->stats().barriers, 0);
  EXPECT_TRUE(store->WaitAtBarrierBlocking("b3", "t", {"t"}, absl::Seconds(1)).ok());
}

}  // namespace
}  // namespace meshrun::coordinator
