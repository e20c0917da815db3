// HostAllReduce in one process: ranks on threads, gloo over loopback TCP, rendezvous through
// an in-memory key-value store.
#include "worker/collectives/host_allreduce.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/time/clock.h"

namespace meshrun::worker::collectives {
namespace {

using runtime::InMemoryKeyValueClient;
using runtime::KeyValueClient;

// The in-memory store, remembering which keys are live so a test can see the clean-up.
class RecordingStore final : public KeyValueClient {
 public:
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override {
    return store_.Get(key, timeout);
  }
  absl::Status Set(absl::string_view key, absl::string_view value) override {
    absl::MutexLock l(&mu_);
    live_.insert(std::string(key));
    ever_.insert(std::string(key));
    return store_.Set(key, value);
  }
  absl::Status Delete(absl::string_view key) override {
    absl::MutexLock l(&mu_);
    live_.erase(std::string(key));
    return store_.Delete(key);
  }
  std::set<std::string> live() {
    absl::MutexLock l(&mu_);
    return live_;
  }
  std::set<std::string> ever() {
    absl::MutexLock l(&mu_);
    return ever_;
  }

 private:
  InMemoryKeyValueClient store_;
  absl::Mutex mu_;
  std::set<std::string> live_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> ever_ ABSL_GUARDED_BY(mu_);
};

HostAllReduce::Config RankConfig(int rank, int size, std::shared_ptr<KeyValueClient> store,
                                 const std::string& prefix, absl::Duration timeout) {
  return {.rank = rank,
          .size = size,
          .store = std::move(store),
          .prefix = prefix,
          .timeout = timeout,
          .peer_names = {}};
}

// Creates `ranks` of a job of `size` concurrently (each Create blocks until all arrive).
std::vector<absl::StatusOr<std::unique_ptr<HostAllReduce>>> CreateRanks(
    int size, std::shared_ptr<KeyValueClient> store, const std::string& prefix,
    absl::Duration timeout = absl::Seconds(20), std::vector<int> ranks = {},
    std::vector<std::string> names = {}) {
  if (ranks.empty()) {
    for (int r = 0; r < size; ++r) ranks.push_back(r);
  }
  std::vector<absl::StatusOr<std::unique_ptr<HostAllReduce>>> out;
  for (size_t i = 0; i < ranks.size(); ++i) out.emplace_back(absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ranks.size(); ++i) {
    threads.emplace_back([&, i] {
      HostAllReduce::Config config = RankConfig(ranks[i], size, store, prefix, timeout);
      config.peer_names = names;
      out[i] = HostAllReduce::Create(std::move(config));
    });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

std::vector<std::unique_ptr<HostAllReduce>> Connected(int size,
                                                      std::shared_ptr<KeyValueClient> store,
                                                      const std::string& prefix,
                                                      absl::Duration timeout = absl::Seconds(20)) {
  std::vector<std::unique_ptr<HostAllReduce>> out;
  for (auto& created : CreateRanks(size, std::move(store), prefix, timeout)) {
    EXPECT_TRUE(created.ok()) << created.status();
    out.push_back(created.ok() ? std::move(*created) : nullptr);
  }
  return out;
}

// Runs fn(rank) on one thread per rank; returns each rank's status.
std::vector<absl::Status> OnRanks(int size, const std::function<absl::Status(int)>& fn) {
  std::vector<absl::Status> out(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back([&, r] { out[r] = fn(r); });
  for (std::thread& t : threads) t.join();
  return out;
}

float Value(int rank, size_t i) { return static_cast<float>(i % 97) + 100.0f * rank; }

TEST(HostAllReduceTest, ConfigErrorsNameTheField) {
  auto store = std::make_shared<InMemoryKeyValueClient>();
  struct Case {
    HostAllReduce::Config config;
    std::string field;
  };
  std::vector<Case> cases = {
      {RankConfig(0, 0, store, "p", absl::Seconds(1)), "size"},
      {RankConfig(2, 2, store, "p", absl::Seconds(1)), "rank"},
      {RankConfig(0, 2, nullptr, "p", absl::Seconds(1)), "store"},
      {RankConfig(0, 2, store, "", absl::Seconds(1)), "prefix"},
      {RankConfig(0, 2, store, "job/", absl::Seconds(1)), "prefix"},
      {RankConfig(0, 2, store, "p", absl::ZeroDuration()), "timeout"},
  };
  cases.push_back({RankConfig(0, 2, store, "p", absl::Seconds(1)), "peer_names"});
  cases.back().config.peer_names = {"only-one"};
  cases.push_back({RankConfig(0, 2, store, "p", absl::Seconds(1)), "network_interface"});
  cases.back().config.network_interface = "meshrun-none0";
  for (const Case& c : cases) {
    auto created = HostAllReduce::Create(c.config);
    ASSERT_FALSE(created.ok()) << c.field;
    EXPECT_EQ(created.status().code(), absl::StatusCode::kInvalidArgument) << created.status();
    EXPECT_TRUE(absl::StrContains(created.status().message(), c.field)) << created.status();
  }
}

TEST(HostAllReduceTest, OneRankNeedsNoStoreAndLeavesBuffersAlone) {
  auto one = HostAllReduce::Create({.rank = 0, .size = 1});
  ASSERT_TRUE(one.ok()) << one.status();
  std::vector<float> data = {1.5f, -2.0f};
  ASSERT_TRUE((*one)->AllReduce({absl::MakeSpan(data)}, ReduceOp::kMean).ok());
  EXPECT_EQ(data, (std::vector<float>{1.5f, -2.0f}));
}

TEST(HostAllReduceTest, SumsAndMeansOverTwoAndThreeRanksForManySizesAndRounds) {
  for (int size : {2, 3}) {
    auto store = std::make_shared<RecordingStore>();
    const std::string prefix = "collectives/job-" + std::to_string(size) + "/0";
    auto ranks = Connected(size, store, prefix);
    ASSERT_EQ(ranks.size(), static_cast<size_t>(size));
    for (auto& r : ranks) ASSERT_NE(r, nullptr);
    // Every key went under the prefix and none is left once all ranks are connected.
    EXPECT_TRUE(store->live().empty()) << *store->live().begin();
    EXPECT_FALSE(store->ever().empty());
    for (const std::string& key : store->ever()) EXPECT_TRUE(absl::StartsWith(key, prefix + "/"));

    for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}, size_t{3'000'000}}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean}) {
        std::vector<std::vector<float>> data(size);
        auto statuses = OnRanks(size, [&](int r) {
          data[r].resize(n);
          for (size_t i = 0; i < n; ++i) data[r][i] = Value(r, i);
          return ranks[r]->AllReduce({absl::MakeSpan(data[r])}, op);
        });
        for (int r = 0; r < size; ++r) {
          ASSERT_TRUE(statuses[r].ok()) << statuses[r];
          for (size_t i = 0; i < n; ++i) {
            float sum = 0;
            for (int q = 0; q < size; ++q) sum += Value(q, i);  // integers: exact in any order
            const float want = op == ReduceOp::kSum ? sum : sum / static_cast<float>(size);
            ASSERT_EQ(data[r][i], want) << "size " << size << " n " << n << " rank " << r;
          }
        }
      }
    }
  }
}

TEST(HostAllReduceTest, SeveralBuffersOfDifferentLengthsInOneCall) {
  auto ranks = Connected(3, std::make_shared<InMemoryKeyValueClient>(), "collectives/multi/0");
  const std::vector<size_t> lengths = {5, 0, 1000, 3, 0};
  std::vector<std::vector<std::vector<float>>> data(3);
  auto statuses = OnRanks(3, [&](int r) {
    std::vector<absl::Span<float>> spans;
    data[r].resize(lengths.size());
    for (size_t b = 0; b < lengths.size(); ++b) {
      data[r][b].resize(lengths[b]);
      for (size_t i = 0; i < lengths[b]; ++i) data[r][b][i] = Value(r, i + 10 * b);
      spans.push_back(absl::MakeSpan(data[r][b]));
    }
    return ranks[r]->AllReduce(spans, ReduceOp::kSum);
  });
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(statuses[r].ok()) << statuses[r];
    for (size_t b = 0; b < lengths.size(); ++b) {
      for (size_t i = 0; i < lengths[b]; ++i) {
        const size_t k = i + 10 * b;
        ASSERT_EQ(data[r][b][i], Value(0, k) + Value(1, k) + Value(2, k));
      }
    }
  }
}

TEST(HostAllReduceTest, SameBitsOnEveryRankAndRoundWhateverTheArrivalOrder) {
  constexpr int kSize = 3;
  constexpr size_t kN = 100'003;
  auto ranks = Connected(kSize, std::make_shared<InMemoryKeyValueClient>(), "collectives/det/0");
  std::vector<std::vector<float>> inputs(kSize);
  for (int r = 0; r < kSize; ++r) {
    std::mt19937 rng(1234 + r);
    std::uniform_real_distribution<float> dist(-1e3f, 1e3f);
    for (size_t i = 0; i < kN; ++i) inputs[r].push_back(dist(rng) * (i % 5 == 0 ? 1e-4f : 1.0f));
  }
  std::vector<float> first;
  // Round k delays rank (k % kSize) so that the ranks arrive in a different order each time.
  for (int round = 0; round < 3; ++round) {
    std::vector<std::vector<float>> data = inputs;
    auto statuses = OnRanks(kSize, [&](int r) {
      if (r == round % kSize) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      return ranks[r]->AllReduce({absl::MakeSpan(data[r])}, ReduceOp::kSum);
    });
    for (int r = 0; r < kSize; ++r) {
      ASSERT_TRUE(statuses[r].ok()) << statuses[r];
      ASSERT_EQ(std::memcmp(data[r].data(), data[0].data(), kN * sizeof(float)), 0)
          << "rank " << r << " differs from rank 0 in round " << round;
    }
    if (round == 0) {
      first = data[0];
      for (size_t i = 0; i < kN; ++i) {
        const double want = double{inputs[0][i]} + inputs[1][i] + inputs[2][i];
        ASSERT_NEAR(first[i], want, 1e-3) << i;
      }
    } else {
      ASSERT_EQ(std::memcmp(data[0].data(), first.data(), kN * sizeof(float)), 0)
          << "round " << round << " differs from round 0";
    }
  }
}

TEST(HostAllReduceTest, MissingPeerTimesOutNamingItOnEveryWaitingRank) {
  auto store = std::make_shared<RecordingStore>();
  const absl::Time start = absl::Now();
  auto created = CreateRanks(3, store, "collectives/missing/0", absl::Milliseconds(500), {0, 1},
                             {"host-a", "host-b", "host-c"});
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  for (auto& c : created) {
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), absl::StatusCode::kDeadlineExceeded) << c.status();
    EXPECT_TRUE(absl::StrContains(c.status().message(), "rank 2 (host-c) did not arrive"))
        << c.status();
    EXPECT_FALSE(absl::StrContains(c.status().message(), "rank 1 (host-b) did")) << c.status();
  }
  EXPECT_TRUE(store->live().empty());  // the ranks that came cleaned up after themselves
}

TEST(HostAllReduceTest, TwoJobsOnOneStoreDoNotMeet) {
  auto store = std::make_shared<InMemoryKeyValueClient>();
  std::vector<std::vector<absl::StatusOr<std::unique_ptr<HostAllReduce>>>> jobs(2);
  std::thread a([&] { jobs[0] = CreateRanks(2, store, "collectives/job-a/0"); });
  std::thread b([&] { jobs[1] = CreateRanks(2, store, "collectives/job-b/0"); });
  a.join();
  b.join();
  for (int j = 0; j < 2; ++j) {
    std::vector<std::vector<float>> data(2);
    auto statuses = OnRanks(2, [&](int r) {
      if (!jobs[j][r].ok()) return jobs[j][r].status();
      data[r] = {static_cast<float>(10 * j + r)};
      return (*jobs[j][r])->AllReduce({absl::MakeSpan(data[r])}, ReduceOp::kSum);
    });
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(statuses[r].ok()) << statuses[r];
      EXPECT_EQ(data[r][0], static_cast<float>(20 * j + 1)) << "job " << j;
    }
  }
}

TEST(HostAllReduceTest, MismatchedLayoutIsRefusedOnEveryRankAndTheNextRoundWorks) {
  auto ranks = Connected(2, std::make_shared<InMemoryKeyValueClient>(), "collectives/layout/0");
  std::vector<std::vector<float>> data = {std::vector<float>(10, 1.0f),
                                          std::vector<float>(12, 1.0f)};
  auto statuses = OnRanks(2, [&](int r) {
    return ranks[r]->AllReduce({absl::MakeSpan(data[r])}, ReduceOp::kSum);
  });
  for (const absl::Status& s : statuses) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "floats over [10, 12]")) << s;
  }
  data[1].resize(10);
  statuses = OnRanks(2, [&](int r) {
    return ranks[r]->AllReduce({absl::MakeSpan(data[r])}, ReduceOp::kSum);
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(statuses[r].ok()) << statuses[r];
    EXPECT_EQ(data[r], std::vector<float>(10, 2.0f));
  }
}

TEST(HostAllReduceTest, StalledPeerTimesOutInsteadOfHanging) {
  auto ranks = Connected(2, std::make_shared<InMemoryKeyValueClient>(), "collectives/stall/0",
                         absl::Milliseconds(300));
  std::vector<float> data(1000, 1.0f);
  const absl::Time start = absl::Now();
  // Rank 1 never joins.
  absl::Status status = ranks[0]->AllReduce({absl::MakeSpan(data)}, ReduceOp::kSum);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "round 0 of 1000 floats on rank 0 of 2"))
      << status;
}

TEST(HostAllReduceTest, PeerGoneAfterRendezvousFailsBoundedAndStaysFailed) {
  auto ranks = Connected(2, std::make_shared<InMemoryKeyValueClient>(), "collectives/gone/0",
                         absl::Seconds(2));
  ranks[1].reset();
  std::vector<float> data(1000, 1.0f);
  const absl::Time start = absl::Now();
  absl::Status status = ranks[0]->AllReduce({absl::MakeSpan(data)}, ReduceOp::kSum);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  ASSERT_FALSE(status.ok());
  EXPECT_TRUE(status.code() == absl::StatusCode::kUnavailable ||
              status.code() == absl::StatusCode::kDeadlineExceeded)
      << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "a peer is gone or stalled")) << status;
  absl::Status again = ranks[0]->AllReduce({absl::MakeSpan(data)}, ReduceOp::kSum);
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
  EXPECT_TRUE(absl::StrContains(again.message(), "new prefix")) << again;
}

}  // namespace
}  // namespace meshrun::worker::collectives
