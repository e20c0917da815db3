#include "telemetry/watch_hub.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "telemetry/step_combiner.h"

namespace meshrun::telemetry {
namespace {

using Kind = Watcher::Kind;

v1::GlobalSummary Global(const std::string& job, int64_t step) {
  v1::GlobalSummary summary;
  summary.set_job_id(job);
  summary.set_step(step);
  for (const char* name : {"loss", "grad_norm"}) {
    v1::TelemetryValue* value = summary.add_values();
    value->set_name(name);
    value->add_values(static_cast<float>(step));
  }
  v1::HostSummary* host = summary.add_host_detail();
  host->set_job_id(job);
  host->set_step(step);
  host->set_host("h0");
  *host->mutable_values() = summary.values();
  return summary;
}

class WatchHubTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "watch_hub_test.XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    HistoryStore::Config config;
    config.path = dir_ + "/history.db";
    config.synchronous_full = false;
    history_ = HistoryStore::Create(config).value();
    MakeHub(256, 64);
  }
  void TearDown() override {
    hub_.reset();
    history_.reset();
    std::filesystem::remove_all(dir_);
  }

  void MakeHub(size_t capacity, size_t batch) {
    hub_.reset();
    WatchHub::Config config;
    config.history = history_.get();
    config.watcher_capacity = capacity;
    config.backfill_batch = batch;
    hub_ = WatchHub::Create(config).value();
  }

  // What the coordinator does with each emitted summary: commit, then publish.
  void Commit(const std::string& job, int64_t step) {
    const v1::GlobalSummary summary = Global(job, step);
    ASSERT_TRUE(history_->Append(summary).ok());
    ASSERT_TRUE(hub_->Publish(summary).ok());
  }

  std::shared_ptr<Watcher> Subscribe(const std::string& job, int64_t since_step) {
    WatchHub::SubscribeRequest request;
    request.job_id = job;
    request.since_step = since_step;
    auto watcher = hub_->Subscribe(request);
    EXPECT_TRUE(watcher.ok()) << watcher.status();
    return watcher.ok() ? *watcher : nullptr;
  }

  // Pops until `count` items arrived; returns their steps.
  std::vector<int64_t> PopSteps(Watcher& watcher, int count) {
    std::vector<int64_t> steps;
    while (static_cast<int>(steps.size()) < count) {
      auto result = watcher.Pop(absl::Seconds(10));
      if (result.kind != Kind::kItem) {
        ADD_FAILURE() << "expected an item, got " << static_cast<int>(result.kind) << " "
                      << result.status;
        break;
      }
      steps.push_back(result.summary->step());
    }
    return steps;
  }

  static std::vector<int64_t> Range(int64_t from, int64_t to) {
    std::vector<int64_t> out;
    for (int64_t s = from; s <= to; ++s) out.push_back(s);
    return out;
  }

  std::string dir_;
  std::unique_ptr<HistoryStore> history_;
  std::unique_ptr<WatchHub> hub_;
};

TEST_F(WatchHubTest, HistoryOnlyEndsAfterTheHistoryOfARunningJob) {
  ASSERT_TRUE(hub_->OpenJob("job-1", {"loss", "grad_norm"}).ok());
  for (int step = 1; step <= 5; ++step) Commit("job-1", step);
  WatchHub::SubscribeRequest request{.job_id = "job-1", .since_step = 2, .history_only = true};
  auto watcher = hub_->Subscribe(request);
  ASSERT_TRUE(watcher.ok()) << watcher.status();
  EXPECT_EQ(hub_->WatcherCount("job-1"), 0);  // never registered for live summaries
  Commit("job-1", 6);  // in history before the lazy read reaches it: delivered
  EXPECT_EQ(PopSteps(**watcher, 5), Range(2, 6));
  auto end = (*watcher)->Pop(absl::Seconds(10));
  ASSERT_EQ(end.kind, Kind::kEnd);
  EXPECT_TRUE(end.status.ok()) << end.status;
}

TEST_F(WatchHubTest, BackfillThenLiveWithNotification) {
  ASSERT_TRUE(hub_->OpenJob("job-1", {"loss", "grad_norm"}).ok());
  for (int step = 1; step <= 10; ++step) Commit("job-1", step);
  auto watcher = Subscribe("job-1", 3);
  std::atomic<int> notified{0};
  watcher->SetNotify([&] { notified++; });
  EXPECT_EQ(PopSteps(*watcher, 8), Range(3, 10));
  auto empty = watcher->TryPop();
  EXPECT_EQ(empty.kind, Kind::kEmpty);
  EXPECT_EQ(notified.load(), 0);
  Commit("job-1", 11);
  hub_->FlushNotifications();
  EXPECT_EQ(notified.load(), 1);  // once per kEmpty
  Commit("job-1", 12);
  hub_->FlushNotifications();
  EXPECT_EQ(notified.load(), 1);
  auto item = watcher->TryPop();
  ASSERT_EQ(item.kind, Kind::kItem);
  EXPECT_EQ(item.summary->step(), 11);
  EXPECT_EQ(item.summary->host_detail_size(), 0);  // not asked for
  EXPECT_EQ(item.summary->values_size(), 2);
  EXPECT_EQ(watcher->resume_step(), 12);
  ASSERT_TRUE(hub_->EndJob("job-1").ok());
  // End of stream only after what was published before the end is delivered.
  item = watcher->TryPop();
  ASSERT_EQ(item.kind, Kind::kItem);
  EXPECT_EQ(item.summary->step(), 12);
  auto end = watcher->TryPop();
  EXPECT_EQ(end.kind, Kind::kEnd);
  EXPECT_TRUE(end.status.ok()) << end.status;
  EXPECT_EQ(watcher->TryPop().kind, Kind::kEnd);
  EXPECT_EQ(hub_->Publish(Global("job-1", 13)).code(), absl::StatusCode::kFailedPrecondition);
}

// A restart from the checkpoint of step 4: a watcher that delivered steps 5..6 gets the rewind
// event and then 5.. again; one subscribed after the rewind sees only the new values.
TEST_F(WatchHubTest, RewindTakesBackWhatWasDeliveredAfterTheCheckpoint) {
  ASSERT_TRUE(hub_->OpenJob("job-1", {"loss", "grad_norm"}).ok());
  for (int step = 1; step <= 6; ++step) Commit("job-1", step);
  auto watcher = Subscribe("job-1", 1);
  auto behind = Subscribe("job-1", 1);  // reads nothing before the rewind
  EXPECT_EQ(PopSteps(*watcher, 6), Range(1, 6));
  ASSERT_TRUE(history_->Rewind("job-1", 4).ok());
  v1::JobRewind rewind;
  rewind.set_attempt(2);
  rewind.set_host("h1");
  ASSERT_TRUE(hub_->Rewind("job-1", 4, rewind).ok());
  EXPECT_EQ(hub_->Publish(Global("job-1", 4)).code(), absl::StatusCode::kInvalidArgument);
  Commit("job-1", 5);
  Commit("job-1", 6);
  auto event = watcher->Pop(absl::Seconds(10));
  ASSERT_EQ(event.kind, Kind::kItem);
  ASSERT_TRUE(event.summary->has_rewind());
  EXPECT_EQ(event.summary->step(), 4);
  EXPECT_EQ(event.summary->rewind().attempt(), 2);
  EXPECT_EQ(PopSteps(*watcher, 2), Range(5, 6));
  EXPECT_EQ(PopSteps(*behind, 6), Range(1, 6));  // no rewind: it never saw the old 5..6
  EXPECT_EQ(behind->TryPop().kind, Kind::kEmpty);
  EXPECT_EQ(hub_->Rewind("job-9", 1, rewind).code(), absl::StatusCode::kFailedPrecondition);
}

// A restart that lost no step (restored from the step a host kept in memory when its peer
// died) is still an event for a watcher that delivered that step.
TEST_F(WatchHubTest, ARestartThatLostNoStepIsStillAnEvent) {
  ASSERT_TRUE(hub_->OpenJob("job-1", {"loss", "grad_norm"}).ok());
  for (int step = 1; step <= 6; ++step) Commit("job-1", step);
  auto watcher = Subscribe("job-1", 1);
  EXPECT_EQ(PopSteps(*watcher, 6), Range(1, 6));
  ASSERT_TRUE(history_->Rewind("job-1", 6).ok());
  v1::JobRewind rewind;
  rewind.set_attempt(2);
  ASSERT_TRUE(hub_->Rewind("job-1", 6, rewind).ok());
  Commit("job-1", 7);
  auto event = watcher->Pop(absl::Seconds(10));
  ASSERT_EQ(event.kind, Kind::kItem);
  ASSERT_TRUE(event.summary->has_rewind());
  EXPECT_EQ(event.summary->step(), 6);
  EXPECT_EQ(PopSteps(*watcher, 1), Range(7, 7));
}

TEST_F(WatchHubTest, NamesAndHostDetail) {
  ASSERT_TRUE(hub_->OpenJob("job-1", {"loss", "grad_norm"}).ok());
  Commit("job-1", 1);
  WatchHub::SubscribeRequest request;
  request.job_id = "job-1";
  request.names = {"grad_norm"};
  request.host_detail = true;
  auto watcher = hub_->Subscribe(request).value();
  Commit("job-1", 2);
  for (int64_t step : {1, 2}) {  // one from history, one live: shaped the same
    auto item = watcher->Pop(absl::Seconds(10));
    ASSERT_EQ(item.kind, Kind::kItem);
    EXPECT_EQ(item.summary->step(), step);
    ASSERT_EQ(item.summary->values_size(), 1);
    EXPECT_EQ(item.summary->values(0).name(), "grad_norm");
    ASSERT_EQ(item.summary->host_detail_size(), 1);
    ASSERT_EQ(item.summary->host_detail(0).values_size(), 1);
    EXPECT_EQ(item.summary->host_detail(0).values(0).name(), "grad_norm");
  }
}

TEST_F(WatchHubTest, SubscribeErrors) {
  ASSERT_TRUE(hub_->OpenJob("job-1", {"loss", "grad_norm"}).ok());
  for (int step = 1; step <= 10; ++step) Commit("job-1", step);
  WatchHub::SubscribeRequest request;
  request.job_id = "job-9";
  EXPECT_EQ(hub_->Subscribe(request).status().code(), absl::StatusCode::kNotFound);
  request.job_id = "job-1";
  request.since_step = 12;
  auto status = hub_->Subscribe(request).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("latest step 10"), absl::string_view::npos) << status;
  request.since_step = 11;  // the live edge is fine
  EXPECT_TRUE(hub_->Subscribe(request).ok());
  request.since_step = -1;
  EXPECT_EQ(hub_->Subscribe(request).status().code(), absl::StatusCode::kInvalidArgument);
  request.since_step = 0;
  request.names = {"loss", "nope"};
  status = hub_->Subscribe(request).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(status.message().find("nope"), absl::string_view::npos);
  // A job open in the hub with no history yet: its declared series are known.
  ASSERT_TRUE(hub_->OpenJob("job-2", {"loss"}).ok());
  request.job_id = "job-2";
  request.names = {"loss"};
  EXPECT_TRUE(hub_->Subscribe(request).ok());
  EXPECT_EQ(hub_->OpenJob("job-2", {}).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(hub_->Publish(Global("job-1", 10)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(hub_->EndJob("job-9").code(), absl::StatusCode::kNotFound);
}

// Publishing concurrently with repeated subscriptions: every subscription sees every step from
// its since_step exactly once, in order, across the backfill/live seam.
TEST_F(WatchHubTest, SeamHasNoGapAndNoDuplicateUnderConcurrentPublish) {
  MakeHub(/*capacity=*/100000, /*batch=*/7);
  ASSERT_TRUE(hub_->OpenJob("job-1", {"loss"}).ok());
  constexpr int64_t kSteps = 1500;
  std::atomic<int64_t> published{0};
  std::thread publisher([&] {
    for (int64_t step = 1; step <= kSteps; ++step) {
      Commit("job-1", step);
      published.store(step);
      if (step % 50 == 0) std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
  });
  std::mt19937 rng(11);
  int subscriptions = 0;
  while (published.load() < kSteps) {
    const int64_t latest = published.load();
    const int64_t since = std::uniform_int_distribution<int64_t>(
        std::max<int64_t>(1, latest - 40), latest + 1)(rng);
    auto watcher = Subscribe("job-1", since);
    ASSERT_NE(watcher, nullptr);
    const int want = static_cast<int>(std::min<int64_t>(60, kSteps - since + 1));
    const auto steps = PopSteps(*watcher, want);
    ASSERT_EQ(steps, Range(since, since + want - 1)) << "since " << since;
    ++subscriptions;
  }
  publisher.join();
  EXPECT_GT(subscriptions, 3);
  // One more from the start, to the end of stream.
  auto watcher = Subscribe("job-1", 1);
  ASSERT_TRUE(hub_->EndJob("job-1").ok());
  EXPECT_EQ(PopSteps(*watcher, kSteps), Range(1, kSteps));
  auto end = watcher->Pop(absl::Seconds(10));
  EXPECT_EQ(end.kind, Kind::kEnd);
  EXPECT_TRUE(end.status.ok()) << end.status;
}

TEST_F(WatchHubTest, OverflowNamesTheResumeStepAndResubscribingLosesNothing) {
  MakeHub(/*capacity=*/4, /*batch=*/64);
  ASSERT_TRUE(hub_->OpenJob("job-1", {"loss"}).ok());
  for (int step = 1; step <= 3; ++step) Commit("job-1", step);
  auto watcher = Subscribe("job-1", 1);
  std::atomic<int> notified{0};
  watcher->SetNotify([&] { notified++; });
  EXPECT_EQ(PopSteps(*watcher, 1), Range(1, 1));
  for (int step = 4; step <= 9; ++step) Commit("job-1", step);  // 6 > capacity 4
  EXPECT_EQ(hub_->WatcherCount("job-1"), 0);  // closed and forgotten by the hub
  auto end = watcher->TryPop();
  ASSERT_EQ(end.kind, Kind::kEnd);
  EXPECT_EQ(end.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(end.status.message().find("since_step=2"), absl::string_view::npos) << end.status;
  EXPECT_EQ(watcher->resume_step(), 2);

  auto again = Subscribe("job-1", watcher->resume_step());
  EXPECT_EQ(PopSteps(*again, 8), Range(2, 9));
  EXPECT_EQ(again->TryPop().kind, Kind::kEmpty);

  // The notification also fires for the close, so a waiting writer learns of it.
  auto waiting = Subscribe("job-1", 10);
  waiting->SetNotify([&] { notified++; });
  EXPECT_EQ(waiting->TryPop().kind, Kind::kEmpty);
  const int before = notified.load();
  for (int step = 10; step <= 15; ++step) Commit("job-1", step);
  hub_->FlushNotifications();
  EXPECT_EQ(notified.load(), before + 1);
}

TEST_F(WatchHubTest, StalledWatcherDoesNotSlowPublish) {
  constexpr int kPublishes = 10000;
  auto time_publishes = [&](const std::string& job) {
    const auto start = std::chrono::steady_clock::now();
    for (int step = 1; step <= kPublishes; ++step) {
      EXPECT_TRUE(hub_->Publish(Global(job, step)).ok());
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  // With the default capacity the stalled watcher is closed once its queue fills; with a
  // capacity above the publish count it stays subscribed and queues everything. Neither may
  // slow the publisher beyond the cost of one queue push.
  for (size_t capacity : {size_t{256}, size_t{2 * kPublishes}}) {
    MakeHub(capacity, 64);
    ASSERT_TRUE(hub_->OpenJob("warmup", {"loss"}).ok());
    ASSERT_TRUE(hub_->OpenJob("alone", {"loss"}).ok());
    ASSERT_TRUE(hub_->OpenJob("stalled", {"loss"}).ok());
    time_publishes("warmup");
    const double alone = time_publishes("alone");
    auto stalled = Subscribe("stalled", 0);
    const double with_stalled = time_publishes("stalled");
    std::printf("capacity %zu: 10k publishes %.1f ms alone, %.1f ms with a stalled watcher\n",
                capacity, alone * 1e3, with_stalled * 1e3);
    EXPECT_LT(with_stalled, 3 * alone + 0.05) << "capacity " << capacity;
    if (capacity < kPublishes) {
      auto end = stalled->TryPop();
      ASSERT_EQ(end.kind, Kind::kEnd);
      EXPECT_EQ(end.status.code(), absl::StatusCode::kResourceExhausted);
      EXPECT_EQ(stalled->resume_step(), 0);
    } else {
      EXPECT_EQ(hub_->WatcherCount("stalled"), 1);
    }
  }
}

TEST_F(WatchHubTest, ClearedNotifyNeverRunsAgain) {
  ASSERT_TRUE(hub_->OpenJob("job-1", {"loss"}).ok());
  auto watcher = Subscribe("job-1", 0);
  std::atomic<int> notified{0};
  watcher->SetNotify([&] { notified++; });
  EXPECT_EQ(watcher->TryPop().kind, Kind::kEmpty);
  watcher->SetNotify(nullptr);  // what a reactor does in OnDone
  Commit("job-1", 1);
  hub_->FlushNotifications();
  EXPECT_EQ(notified.load(), 0);
  auto item = watcher->TryPop();
  ASSERT_EQ(item.kind, Kind::kItem);
  EXPECT_EQ(item.summary->step(), 1);
}

// Callbacks run on the hub's notifier thread: a callback that takes its time (here: blocks
// until released) holds up neither Publish nor the other watchers' queues.
TEST_F(WatchHubTest, NotifyRunsOffThePublisherThread) {
  ASSERT_TRUE(hub_->OpenJob("job-1", {"loss", "grad_norm"}).ok());
  auto watcher = Subscribe("job-1", 0);
  absl::Notification release;
  std::atomic<int> notified{0};
  std::thread::id notify_thread;
  watcher->SetNotify([&] {
    notify_thread = std::this_thread::get_id();
    notified++;
    release.WaitForNotificationWithTimeout(absl::Seconds(10));
  });
  auto other = Subscribe("job-1", 0);
  EXPECT_EQ(watcher->TryPop().kind, Kind::kEmpty);
  for (int step = 1; step <= 3; ++step) Commit("job-1", step);  // returns while it blocks
  EXPECT_EQ(PopSteps(*other, 3), Range(1, 3));
  release.Notify();
  hub_->FlushNotifications();
  EXPECT_EQ(notified.load(), 1);
  EXPECT_NE(notify_thread, std::this_thread::get_id());
  EXPECT_EQ(PopSteps(*watcher, 3), Range(1, 3));
}

// Watchers without a names filter get the same immutable copy of a summary; host_detail and
// names still shape each watcher's view.
TEST_F(WatchHubTest, WatchersWithoutNamesShareOneCopy) {
  ASSERT_TRUE(hub_->OpenJob("job-1", {"loss", "grad_norm"}).ok());
  auto a = Subscribe("job-1", 0);
  auto b = Subscribe("job-1", 0);
  auto detail = hub_->Subscribe({.job_id = "job-1", .host_detail = true}).value();
  auto named = hub_->Subscribe({.job_id = "job-1", .names = {"loss"}}).value();
  for (const auto& w : {a, b, detail, named}) EXPECT_EQ(w->TryPop().kind, Kind::kEmpty);
  Commit("job-1", 1);
  auto item_a = a->Pop(absl::Seconds(10));
  auto item_b = b->Pop(absl::Seconds(10));
  auto item_detail = detail->Pop(absl::Seconds(10));
  auto item_named = named->Pop(absl::Seconds(10));
  for (const auto* item : {&item_a, &item_b, &item_detail, &item_named}) {
    ASSERT_EQ(item->kind, Kind::kItem);
    EXPECT_EQ(item->summary->step(), 1);
  }
  EXPECT_EQ(item_a.summary.get(), item_b.summary.get());
  EXPECT_EQ(item_a.summary->host_detail_size(), 0);
  EXPECT_EQ(item_a.summary->values_size(), 2);
  EXPECT_EQ(item_detail.summary->host_detail_size(), 1);
  EXPECT_EQ(item_detail.summary->values_size(), 2);
  ASSERT_EQ(item_named.summary->values_size(), 1);
  EXPECT_EQ(item_named.summary->values(0).name(), "loss");
  EXPECT_EQ(item_named.summary->host_detail_size(), 0);
  // Unfiltered watchers share the wire bytes too (serialized once per variant); a filtered
  // one gets none (its server serializes the shaped copy).
  ASSERT_NE(item_a.serialized, nullptr);
  EXPECT_EQ(item_a.serialized.get(), item_b.serialized.get());
  EXPECT_EQ(*item_a.serialized, item_a.summary->SerializeAsString());
  ASSERT_NE(item_detail.serialized, nullptr);
  EXPECT_EQ(*item_detail.serialized, item_detail.summary->SerializeAsString());
  EXPECT_EQ(item_named.serialized, nullptr);
}

TEST_F(WatchHubTest, CloseDrainsThenEndsWithOk) {
  ASSERT_TRUE(hub_->OpenJob("job-1", {"loss"}).ok());
  Commit("job-1", 1);
  auto watcher = Subscribe("job-1", 0);
  EXPECT_EQ(PopSteps(*watcher, 1), Range(1, 1));
  Commit("job-1", 2);
  watcher->Close();
  Commit("job-1", 3);  // after the close: not delivered
  EXPECT_EQ(PopSteps(*watcher, 1), Range(2, 2));
  auto end = watcher->TryPop();
  EXPECT_EQ(end.kind, Kind::kEnd);
  EXPECT_TRUE(end.status.ok());
  EXPECT_EQ(hub_->WatcherCount("job-1"), 0);

  // Dropping the handle unsubscribes.
  {
    auto dropped = Subscribe("job-1", 4);
    EXPECT_EQ(hub_->WatcherCount("job-1"), 1);
  }
  EXPECT_EQ(hub_->WatcherCount("job-1"), 0);
}

TEST_F(WatchHubTest, FinishedJobIsServedFromHistory) {
  ASSERT_TRUE(hub_->OpenJob("job-1", {"loss"}).ok());
  for (int step = 1; step <= 5; ++step) Commit("job-1", step);
  ASSERT_TRUE(hub_->EndJob("job-1").ok());
  MakeHub(256, 2);  // as after a coordinator restart: the hub knows nothing of job-1
  auto watcher = Subscribe("job-1", 2);
  EXPECT_EQ(PopSteps(*watcher, 4), Range(2, 5));
  auto end = watcher->Pop(absl::Seconds(10));
  EXPECT_EQ(end.kind, Kind::kEnd);
  EXPECT_TRUE(end.status.ok());
}

TEST_F(WatchHubTest, DestroyingTheHubEndsWatchersWithUnavailable) {
  ASSERT_TRUE(hub_->OpenJob("job-1", {"loss"}).ok());
  auto watcher = Subscribe("job-1", 0);
  EXPECT_EQ(watcher->TryPop().kind, Kind::kEmpty);
  hub_.reset();
  auto end = watcher->TryPop();
  EXPECT_EQ(end.kind, Kind::kEnd);
  EXPECT_EQ(end.status.code(), absl::StatusCode::kUnavailable);
}

// The whole hub path: hosts' summaries -> combiner -> history -> hub -> watcher.
TEST_F(WatchHubTest, CombinerHistoryHubPipeline) {
  FakeClock clock;
  StepCombiner::Config config;
  config.clock = &clock;
  config.sink = [&](v1::GlobalSummary global) {
    ASSERT_TRUE(history_->Append(global).ok());
    ASSERT_TRUE(hub_->Publish(global).ok());
  };
  auto combiner = StepCombiner::Create(config).value();
  v1::TelemetryDeclaration loss;
  loss.set_name("loss");
  loss.set_combine(v1::COMBINE_MEAN);
  StepCombiner::JobSetup setup;
  setup.job_id = "job-1";
  setup.hosts = {{"h0", 1}, {"h1", 1}};
  setup.declarations = {loss};
  ASSERT_TRUE(combiner->StartJob(setup).ok());
  ASSERT_TRUE(history_->RegisterJob("job-1", {loss}).ok());
  ASSERT_TRUE(hub_->OpenJob("job-1", {"loss"}).ok());
  auto watcher = Subscribe("job-1", 0);
  for (int64_t step = 1; step <= 3; ++step) {
    for (const char* host : {"h0", "h1"}) {
      v1::HostSummary summary;
      summary.set_job_id("job-1");
      summary.set_step(step);
      summary.set_host(host);
      v1::TelemetryValue* value = summary.add_values();
      value->set_name("loss");
      value->add_values(host == std::string("h0") ? 1.0f : 3.0f);
      ASSERT_TRUE(history_->AppendHost(summary).ok());
      if (step == 3 && host == std::string("h1")) break;  // h1 misses step 3
      ASSERT_TRUE(combiner->Add(summary).ok());
    }
  }
  clock.Advance(absl::Seconds(5));
  combiner->Poll();
  for (int64_t step = 1; step <= 3; ++step) {
    auto item = watcher->Pop(absl::Seconds(10));
    ASSERT_EQ(item.kind, Kind::kItem);
    EXPECT_EQ(item.summary->step(), step);
    EXPECT_FLOAT_EQ(item.summary->values(0).values(0), step == 3 ? 1.0f : 2.0f);
    EXPECT_EQ(item.summary->partial(), step == 3);
  }
  EXPECT_EQ(history_->LatestStep("job-1").value(), 3);
  EXPECT_EQ(history_->PersistedThroughStep("job-1", "h1").value(), 3);
}

}  // namespace
}  // namespace meshrun::telemetry
