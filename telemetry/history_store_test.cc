#include "telemetry/history_store.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace meshrun::telemetry {
namespace {

std::string MakeTempDir() {
  std::string pattern = ::testing::TempDir() + "history_store_test.XXXXXX";
  char* dir = mkdtemp(pattern.data());
  EXPECT_NE(dir, nullptr);
  return pattern;
}

v1::HostSummary Host(const std::string& job, int64_t step, const std::string& host,
                     float loss) {
  v1::HostSummary summary;
  summary.set_job_id(job);
  summary.set_step(step);
  summary.set_host(host);
  summary.set_replica_count(1);
  v1::TelemetryValue* value = summary.add_values();
  value->set_name("loss");
  value->add_values(loss);
  return summary;
}

// A global summary with a scalar "loss", a 2-element "sink" and host detail from two hosts.
v1::GlobalSummary Global(const std::string& job, int64_t step, float loss) {
  v1::GlobalSummary summary;
  summary.set_job_id(job);
  summary.set_step(step);
  summary.set_step_time_seconds(0.5);
  v1::TelemetryValue* value = summary.add_values();
  value->set_name("loss");
  value->add_values(loss);
  v1::TelemetryValue* sink = summary.add_values();
  sink->set_name("sink");
  sink->add_shape(2);
  sink->add_values(loss * 10);
  sink->add_values(loss * 100);
  // Detail in host order "h1", "h0": the store keeps that order, not the names' order.
  *summary.add_host_detail() = Host(job, step, "h1", loss);
  *summary.add_host_detail() = Host(job, step, "h0", loss);
  return summary;
}

class HistoryStoreTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = MakeTempDir(); }
  void TearDown() override {
    store_.reset();
    std::filesystem::remove_all(dir_);
  }

  HistoryStore::Config MakeConfig() {
    HistoryStore::Config config;
    config.path = dir_ + "/history.db";
    config.clock = &clock_;
    config.synchronous_full = false;  // tests only need kill -9 durability
    return config;
  }
  void Open(HistoryStore::Config config) {
    store_.reset();
    auto store = HistoryStore::Create(std::move(config));
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }
  void Open() { Open(MakeConfig()); }

  std::vector<int64_t> Steps(const std::vector<v1::GlobalSummary>& summaries) {
    std::vector<int64_t> steps;
    for (const auto& s : summaries) steps.push_back(s.step());
    return steps;
  }

  std::string dir_;
  FakeClock clock_;
  std::unique_ptr<HistoryStore> store_;
};

TEST_F(HistoryStoreTest, AppendReadFilterAndReopen) {
  Open();
  for (int64_t step = 10; step <= 50; step += 10) {
    ASSERT_TRUE(store_->Append(Global("job-1", step, static_cast<float>(step))).ok());
  }
  Open();  // reopen: everything committed is there
  EXPECT_EQ(store_->LatestStep("job-1").value(), 50);

  HistoryStore::ReadRequest request;
  request.job_id = "job-1";
  request.since_step = 20;
  request.limit = 2;
  auto read = store_->Read(request);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(Steps(*read), (std::vector<int64_t>{20, 30}));
  EXPECT_EQ((*read)[0].values_size(), 2);
  EXPECT_EQ((*read)[0].host_detail_size(), 0);  // only on request

  request.since_step = 0;
  request.limit = 100;
  request.names = {"sink"};
  request.host_detail = true;
  read = store_->Read(request);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->size(), 5u);
  const v1::GlobalSummary& first = (*read)[0];
  ASSERT_EQ(first.values_size(), 1);
  EXPECT_EQ(first.values(0).name(), "sink");
  EXPECT_FLOAT_EQ(first.values(0).values(1), 1000.0f);
  ASSERT_EQ(first.host_detail_size(), 2);
  EXPECT_EQ(first.host_detail(0).host(), "h1");  // host order as appended
  EXPECT_EQ(first.host_detail(1).host(), "h0");
  EXPECT_EQ(first.host_detail(0).values_size(), 0);  // "loss" filtered out of the detail too

  // since_step = latest + 1 is the live edge: empty, not an error.
  request.names.clear();
  request.since_step = 51;
  EXPECT_TRUE(store_->Read(request).value().empty());

  auto jobs = store_->ListJobs().value();
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(jobs[0].job_id, "job-1");
  EXPECT_EQ(jobs[0].first_step, 10);
  EXPECT_EQ(jobs[0].latest_step, 50);
  EXPECT_EQ(jobs[0].summaries, 5);

  auto series = store_->Series("job-1").value();
  ASSERT_EQ(series.size(), 2u);
  EXPECT_EQ(series[1].name(), "sink");
  EXPECT_EQ(series[1].shape(0), 2);
}

// Runs `sql` on the database at `path` with SQLite directly (the store closed); returns the
// first column of the first row, if any.
std::string RawSql(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  std::string first;
  char* error = nullptr;
  EXPECT_EQ(sqlite3_exec(
                db, sql.c_str(),
                [](void* out, int, char** values, char**) {
                  if (values[0] != nullptr) *static_cast<std::string*>(out) = values[0];
                  return 0;
                },
                &first, &error),
            SQLITE_OK)
      << (error != nullptr ? error : "") << " in " << sql;
  sqlite3_free(error);
  sqlite3_close(db);
  return first;
}

// A history written by a build of schema version 1 (series points keyed element first) opens
// with every point in place, now keyed step first.
TEST_F(HistoryStoreTest, VersionOneHistoryIsConvertedWithEveryPoint) {
  Open();
  for (int64_t step = 1; step <= 30; ++step) {
    ASSERT_TRUE(store_->Append(Global("job-1", step, static_cast<float>(step))).ok());
  }
  store_.reset();
  const std::string path = dir_ + "/history.db";
  // Put the points back in version 1's layout, as that build left them.
  RawSql(path, R"sql(
    BEGIN;
    ALTER TABLE series_points RENAME TO series_points_new;
    CREATE TABLE series_points(job_id TEXT NOT NULL, name TEXT NOT NULL,
      element INTEGER NOT NULL, step INTEGER NOT NULL, value REAL,
      PRIMARY KEY(job_id, name, element, step)) WITHOUT ROWID;
    INSERT INTO series_points SELECT * FROM series_points_new;
    DROP TABLE series_points_new;
    PRAGMA user_version=1;
    COMMIT;)sql");
  ASSERT_EQ(RawSql(path, "SELECT COUNT(*) FROM series_points"), "90");  // 30 steps x 3

  Open();
  HistoryStore::SeriesRequest request{.job_id = "job-1", .name = "sink", .element = 1};
  const std::vector<HistoryStore::Point> sink = store_->ReadSeries(request).value();
  ASSERT_EQ(sink.size(), 30u);
  for (int64_t step = 1; step <= 30; ++step) {
    EXPECT_EQ(sink[step - 1].step, step);
    EXPECT_FLOAT_EQ(static_cast<float>(sink[step - 1].value), step * 100.0f);
  }
  request.name = "loss";
  request.element = 0;
  EXPECT_EQ(store_->ReadSeries(request).value().size(), 30u);
  ASSERT_TRUE(store_->Append(Global("job-1", 31, 31.0f)).ok());  // and it takes new points
  store_.reset();
  EXPECT_EQ(RawSql(path, "PRAGMA user_version"), "2");
  EXPECT_EQ(RawSql(path, "SELECT COUNT(*) FROM series_points"), "93");
  EXPECT_TRUE(absl::StrContains(
      RawSql(path, "SELECT sql FROM sqlite_master WHERE name = 'series_points'"),
      "PRIMARY KEY(job_id, step, name, element)"));
  EXPECT_EQ(RawSql(path, "SELECT COUNT(*) FROM sqlite_master WHERE name LIKE '%element_major%'"),
            "0");
}

// Commits leave the write-ahead log's checkpoint to CheckpointIfDue, which the owner calls
// after publishing, up to four times `checkpoint_pages`, where a commit checkpoints itself.
TEST_F(HistoryStoreTest, CheckpointsWaitForCheckpointIfDueUpToFourTimesThePages) {
  HistoryStore::Config config = MakeConfig();
  config.checkpoint_pages = 20;
  Open(config);
  int64_t step = 0;
  while (store_->WalPages() < 20 && step < 1000) {
    ASSERT_TRUE(store_->Append(Global("job-1", ++step, 1.0f)).ok());
  }
  ASSERT_GE(store_->WalPages(), 20) << "after " << step << " steps";
  const int64_t due = store_->WalPages();
  ASSERT_TRUE(store_->Append(Global("job-1", ++step, 1.0f)).ok());
  EXPECT_GT(store_->WalPages(), due);  // the commit did not checkpoint
  ASSERT_TRUE(store_->CheckpointIfDue().ok());
  EXPECT_EQ(store_->WalPages(), 0);
  ASSERT_TRUE(store_->Append(Global("job-1", ++step, 1.0f)).ok());
  EXPECT_LT(store_->WalPages(), 20);  // the log starts over
  ASSERT_TRUE(store_->CheckpointIfDue().ok());  // not due: nothing happens
  EXPECT_GT(store_->WalPages(), 0);

  // Without CheckpointIfDue, the log stays under four times the pages and one commit's more.
  int64_t most = 0;
  for (int i = 0; i < 300; ++i) {
    ASSERT_TRUE(store_->Append(Global("job-1", ++step, 1.0f)).ok());
    most = std::max(most, store_->WalPages());
  }
  EXPECT_LT(most, 4 * 20 + 10);
  Open(config);  // everything committed is there
  HistoryStore::SeriesRequest request{.job_id = "job-1", .name = "loss"};
  EXPECT_EQ(store_->ReadSeries(request).value().size(), static_cast<size_t>(step));
}

TEST_F(HistoryStoreTest, ReadErrors) {
  Open();
  ASSERT_TRUE(store_->Append(Global("job-1", 10, 1)).ok());
  HistoryStore::ReadRequest request;
  request.job_id = "job-2";
  EXPECT_EQ(store_->Read(request).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->LatestStep("job-2").status().code(), absl::StatusCode::kNotFound);
  request.job_id = "job-1";
  request.since_step = 12;
  auto read = store_->Read(request);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(read.status().message().find("latest step 10"), absl::string_view::npos)
      << read.status();
  request.since_step = 0;
  request.names = {"nope"};
  read = store_->Read(request);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(read.status().message().find("nope"), absl::string_view::npos);
  request.names.clear();
  request.limit = 0;
  EXPECT_EQ(store_->Read(request).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->Append(Global("", 1, 1)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->Append(Global("job-1", 0, 1)).code(), absl::StatusCode::kInvalidArgument);
  // The host summaries go apart or inside, not both ways at once.
  const v1::GlobalSummary with_detail = Global("job-1", 11, 1);
  EXPECT_EQ(store_->Append(with_detail, with_detail.host_detail()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(HistoryStoreTest, RegisteredJobKnowsItsSeriesBeforeTheFirstSummary) {
  Open();
  v1::TelemetryDeclaration decl;
  decl.set_name("loss");
  ASSERT_TRUE(store_->RegisterJob("job-1", {decl}).ok());
  EXPECT_EQ(store_->LatestStep("job-1").value(), 0);
  HistoryStore::ReadRequest request;
  request.job_id = "job-1";
  request.names = {"loss"};
  request.since_step = 1;
  EXPECT_TRUE(store_->Read(request).value().empty());
  request.since_step = 2;
  EXPECT_EQ(store_->Read(request).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(HistoryStoreTest, HostSummariesAndProgress) {
  Open();
  EXPECT_EQ(store_->AppendHost(Host("job-1", 10, "h0", 1)).value(), 10);
  EXPECT_EQ(store_->AppendHost(Host("job-1", 20, "h0", 2)).value(), 20);
  EXPECT_EQ(store_->AppendHost(Host("job-1", 10, "h1", 3)).value(), 10);
  // A resent summary is stored once and the progress never moves backwards.
  EXPECT_EQ(store_->AppendHost(Host("job-1", 10, "h0", 99)).value(), 20);
  Open();
  EXPECT_EQ(store_->PersistedThroughStep("job-1", "h0").value(), 20);
  EXPECT_EQ(store_->PersistedThroughStep("job-1", "h1").value(), 10);
  EXPECT_EQ(store_->PersistedThroughStep("job-1", "h9").value(), 0);
  EXPECT_EQ(store_->PersistedThroughStep("job-9", "h0").status().code(),
            absl::StatusCode::kNotFound);
  auto hosts = store_->ReadHostSummaries("job-1", 0).value();
  ASSERT_EQ(hosts.size(), 3u);
  EXPECT_EQ(hosts[0].step(), 10);
  EXPECT_EQ(hosts[0].host(), "h0");
  EXPECT_FLOAT_EQ(hosts[0].values(0).values(0), 1.0f);  // the first copy won
  EXPECT_EQ(hosts[1].host(), "h1");
  EXPECT_EQ(hosts[2].step(), 20);
  EXPECT_EQ(store_->ReadHostSummaries("job-1", 10).value().size(), 1u);
  EXPECT_EQ(store_->AppendHost(Host("job-1", 0, "h0", 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->AppendHost(Host("job-1", 1, "", 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Many hosts' upload streams append at once (group commit): each caller gets its own host's
// progress, every summary is stored once, and a resent one still keeps the first copy.
TEST_F(HistoryStoreTest, ConcurrentHostAppendsEachGetTheirOwnProgress) {
  Open();
  constexpr int kHosts = 16;
  constexpr int kSteps = 40;
  std::vector<std::thread> hosts;
  std::atomic<int> wrong{0};
  for (int h = 0; h < kHosts; ++h) {
    hosts.emplace_back([&, h] {
      const std::string host = absl::StrCat("h", h);
      for (int64_t step = 1; step <= kSteps; ++step) {
        absl::StatusOr<int64_t> persisted =
            store_->AppendHost(Host("job-1", step, host, static_cast<float>(h)));
        if (!persisted.ok() || *persisted != step) ++wrong;
      }
      // Resent: acknowledged with the host's progress, not stored again.
      absl::StatusOr<int64_t> again = store_->AppendHost(Host("job-1", 1, host, -1.0f));
      if (!again.ok() || *again != kSteps) ++wrong;
    });
  }
  for (std::thread& t : hosts) t.join();
  EXPECT_EQ(wrong.load(), 0);
  Open();  // all of it was committed
  const std::vector<v1::HostSummary> stored = store_->ReadHostSummaries("job-1", 0).value();
  ASSERT_EQ(stored.size(), static_cast<size_t>(kHosts * kSteps));
  for (const v1::HostSummary& summary : stored) {
    EXPECT_GE(summary.values(0).values(0), 0.0f) << summary.host() << " step " << summary.step();
  }
  for (int h = 0; h < kHosts; ++h) {
    EXPECT_EQ(store_->PersistedThroughStep("job-1", absl::StrCat("h", h)).value(), kSteps);
  }
}

// A job restarted from its checkpoint of step 20: what came after it goes, the re-run's values
// replace it, and the hosts' progress goes back so their acks cover only the new run.
TEST_F(HistoryStoreTest, RewindDropsTheStepsAfterTheCheckpoint) {
  Open();
  for (int64_t step = 10; step <= 30; step += 10) {
    ASSERT_TRUE(store_->Append(Global("job-1", step, static_cast<float>(step))).ok());
    ASSERT_TRUE(store_->AppendHost(Host("job-1", step, "h0", 1)).ok());
  }
  ASSERT_TRUE(store_->Append(Global("job-2", 30, 3)).ok());
  EXPECT_EQ(store_->Rewind("job-1", 20).value(), 1);
  EXPECT_EQ(store_->LatestStep("job-1").value(), 20);
  EXPECT_EQ(store_->PersistedThroughStep("job-1", "h0").value(), 20);
  EXPECT_EQ(store_->ReadHostSummaries("job-1", 20).value().size(), 0u);
  HistoryStore::SeriesRequest series{.job_id = "job-1", .name = "loss"};
  EXPECT_EQ(store_->ReadSeries(series).value().size(), 2u);
  ASSERT_TRUE(store_->Append(Global("job-1", 30, 33)).ok());
  HistoryStore::ReadRequest read{.job_id = "job-1", .since_step = 1};
  auto rows = store_->Read(read).value();
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_FLOAT_EQ(rows[2].values(0).values(0), 33.0f);          // the re-run's value
  EXPECT_EQ(store_->LatestStep("job-2").value(), 30);           // other jobs untouched
  EXPECT_EQ(store_->Rewind("job-9", 1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->Rewind("job-1", -1).status().code(), absl::StatusCode::kInvalidArgument);
}

// A child process writes and acknowledges summaries (each ack sent only after the call
// returned OK) until the parent kills it with SIGKILL mid-stream; every acknowledged summary
// must be in the reopened database. With `deferred`, the global summaries are committed as the
// coordinator's sink commits them (Durability::kDeferred) and reported before any Sync, as a
// watcher is shown them; Sync runs every few steps, as the acknowledgements' thread runs it.
void KilledWriterKeepsAcknowledged(const std::string& path, bool synchronous_full,
                                   int kill_after_acks, bool deferred = false) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(fds[0]);
    HistoryStore::Config config;
    config.path = path;
    config.synchronous_full = synchronous_full;
    auto store = HistoryStore::Create(config);
    if (!store.ok()) _exit(2);
    for (int64_t step = 1;; ++step) {
      if (!(*store)->AppendHost(Host("job-k", step, "h0", static_cast<float>(step))).ok()) {
        _exit(3);
      }
      v1::GlobalSummary global = Global("job-k", step, static_cast<float>(step));
      google::protobuf::RepeatedPtrField<v1::HostSummary> hosts;
      hosts.Swap(global.mutable_host_detail());
      const auto durability = deferred ? HistoryStore::Durability::kDeferred
                                       : HistoryStore::Durability::kSynced;
      if (!(*store)->Append(global, hosts, durability).ok()) _exit(4);
      if (write(fds[1], &step, sizeof(step)) != sizeof(step)) _exit(5);
      if (deferred && step % 7 == 0 && !(*store)->Sync().ok()) _exit(6);
    }
  }
  close(fds[1]);
  int64_t acked = 0;
  for (int i = 0; i < kill_after_acks; ++i) {
    int64_t step = 0;
    ASSERT_EQ(read(fds[0], &step, sizeof(step)), static_cast<ssize_t>(sizeof(step)))
        << "the writer died early";
    ASSERT_EQ(step, acked + 1);
    acked = step;
  }
  ASSERT_EQ(kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGKILL);
  close(fds[0]);

  HistoryStore::Config config;
  config.path = path;
  auto store = HistoryStore::Create(config);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_GE((*store)->LatestStep("job-k").value(), acked);
  EXPECT_GE((*store)->PersistedThroughStep("job-k", "h0").value(), acked);
  HistoryStore::ReadRequest request;
  request.job_id = "job-k";
  request.since_step = 1;
  request.limit = static_cast<int>(acked);
  auto read = (*store)->Read(request);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->size(), static_cast<size_t>(acked));
  for (int64_t i = 0; i < acked; ++i) {
    EXPECT_EQ((*read)[i].step(), i + 1);
    EXPECT_FLOAT_EQ((*read)[i].values(0).values(0), static_cast<float>(i + 1));
  }
  EXPECT_GE((*store)->ReadHostSummaries("job-k", 0).value().size(), static_cast<size_t>(acked));
}

TEST_F(HistoryStoreTest, AcknowledgedSummariesSurviveSigkillNormalSync) {
  KilledWriterKeepsAcknowledged(dir_ + "/normal.db", /*synchronous_full=*/false, 200);
}

TEST_F(HistoryStoreTest, AcknowledgedSummariesSurviveSigkillFullSync) {
  KilledWriterKeepsAcknowledged(dir_ + "/full.db", /*synchronous_full=*/true, 20);
}

// What a watcher was shown between a deferred commit and its Sync survives the process.
TEST_F(HistoryStoreTest, DeferredCommitsSurviveSigkillBeforeTheirSync) {
  KilledWriterKeepsAcknowledged(dir_ + "/deferred.db", /*synchronous_full=*/true, 60,
                                /*deferred=*/true);
}

TEST_F(HistoryStoreTest, DeferredCommitIsReadAtOnceAndSyncedOnce) {
  HistoryStore::Config config = MakeConfig();
  config.synchronous_full = true;
  Open(config);
  EXPECT_TRUE(store_->Sync().ok());  // nothing deferred yet: nothing to sync
  v1::GlobalSummary global = Global("job-1", 1, 1.0f);
  google::protobuf::RepeatedPtrField<v1::HostSummary> hosts;
  hosts.Swap(global.mutable_host_detail());
  ASSERT_TRUE(store_->Append(global, hosts, HistoryStore::Durability::kDeferred).ok());
  // Visible before any sync: what the hub's backfill/live seam relies on.
  EXPECT_EQ(store_->LatestStep("job-1").value(), 1);
  EXPECT_EQ(store_->PersistedThroughStep("job-1", "h0").value(), 1);
  ASSERT_TRUE(store_->Sync().ok());
  ASSERT_TRUE(store_->Sync().ok());  // already synced
  // Synced and deferred commits mix on one connection.
  ASSERT_TRUE(store_->Append(Global("job-1", 2, 2.0f)).ok());
  Open(config);
  EXPECT_EQ(store_->LatestStep("job-1").value(), 2);
}

TEST_F(HistoryStoreTest, DownsamplingKeepsExtremesAndAtMostNPoints) {
  Open();
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> noise(-1, 1);
  const int kSteps = 1000;
  std::vector<float> loss(kSteps + 1);
  for (int step = 1; step <= kSteps; ++step) {
    loss[step] = noise(rng);
    if (step == 377) loss[step] = 50;   // a spike
    if (step == 612) loss[step] = -50;  // a dip
    ASSERT_TRUE(store_->Append(Global("job-1", step, loss[step])).ok());
  }
  HistoryStore::SeriesRequest request;
  request.job_id = "job-1";
  request.name = "loss";
  auto all = store_->ReadSeries(request).value();
  ASSERT_EQ(all.size(), static_cast<size_t>(kSteps));

  for (int max_points : {4, 5, 50, 101, 999}) {
    request.max_points = max_points;
    auto points = store_->ReadSeries(request).value();
    ASSERT_LE(points.size(), static_cast<size_t>(max_points));
    ASSERT_GE(points.size(), 2u);
    EXPECT_EQ(points.front().step, 1);
    EXPECT_EQ(points.back().step, kSteps);
    std::set<int64_t> steps;
    for (size_t i = 0; i < points.size(); ++i) {
      if (i > 0) {
        EXPECT_LT(points[i - 1].step, points[i].step);
      }
      EXPECT_FLOAT_EQ(static_cast<float>(points[i].value), loss[points[i].step]);
      steps.insert(points[i].step);
    }
    EXPECT_TRUE(steps.count(377)) << max_points;
    EXPECT_TRUE(steps.count(612)) << max_points;
  }
  // A range, and a non-scalar element.
  request.max_points = 0;
  request.from_step = 100;
  request.to_step = 199;
  EXPECT_EQ(store_->ReadSeries(request).value().size(), 100u);
  request.name = "sink";
  request.element = 1;
  auto sink = store_->ReadSeries(request).value();
  ASSERT_EQ(sink.size(), 100u);
  EXPECT_FLOAT_EQ(static_cast<float>(sink[0].value), loss[100] * 100);

  request.max_points = 3;
  EXPECT_EQ(store_->ReadSeries(request).status().code(), absl::StatusCode::kInvalidArgument);
  request.max_points = 0;
  request.element = 2;
  EXPECT_EQ(store_->ReadSeries(request).status().code(), absl::StatusCode::kInvalidArgument);
  request.element = 0;
  request.name = "nope";
  EXPECT_EQ(store_->ReadSeries(request).status().code(), absl::StatusCode::kNotFound);
  request.name = "loss";
  request.job_id = "job-9";
  EXPECT_EQ(store_->ReadSeries(request).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(HistoryStoreTest, NanIsKeptAndCountsAsAnExtreme) {
  Open();
  for (int step = 1; step <= 100; ++step) {
    const float value = step == 40 ? std::numeric_limits<float>::quiet_NaN() : 1.0f * step;
    ASSERT_TRUE(store_->Append(Global("job-1", step, value)).ok());
  }
  HistoryStore::SeriesRequest request;
  request.job_id = "job-1";
  request.name = "loss";
  request.max_points = 10;
  auto points = store_->ReadSeries(request).value();
  bool nan_kept = false;
  for (const auto& point : points) nan_kept = nan_kept || (point.step == 40 && std::isnan(point.value));
  EXPECT_TRUE(nan_kept);
  HistoryStore::ReadRequest read;
  read.job_id = "job-1";
  read.since_step = 40;
  read.limit = 1;
  EXPECT_TRUE(std::isnan(store_->Read(read).value()[0].values(0).values(0)));
}

TEST_F(HistoryStoreTest, RetentionByStepsPerJob) {
  auto config = MakeConfig();
  config.max_steps_per_job = 10;
  Open(config);
  for (int step = 1; step <= 25; ++step) {
    ASSERT_TRUE(store_->Append(Global("job-1", step, 1.0f * step)).ok());
  }
  ASSERT_TRUE(store_->Append(Global("job-2", 1, 1)).ok());
  EXPECT_EQ(store_->Prune().value(), 15);
  EXPECT_EQ(store_->Prune().value(), 0);
  HistoryStore::ReadRequest request;
  request.job_id = "job-1";
  auto read = store_->Read(request).value();
  ASSERT_EQ(read.size(), 10u);
  EXPECT_EQ(read.front().step(), 16);
  EXPECT_EQ(read.back().step(), 25);
  EXPECT_EQ(store_->LatestStep("job-1").value(), 25);
  HistoryStore::SeriesRequest series;
  series.job_id = "job-1";
  series.name = "loss";
  EXPECT_EQ(store_->ReadSeries(series).value().size(), 10u);
  EXPECT_EQ(store_->ReadHostSummaries("job-1", 0).value().size(), 20u);  // 2 hosts x 10
  EXPECT_EQ(store_->ListJobs().value().size(), 2u);
}

TEST_F(HistoryStoreTest, RetentionByAge) {
  auto config = MakeConfig();
  config.max_age = absl::Hours(1);
  Open(config);
  for (int step = 1; step <= 5; ++step) {
    ASSERT_TRUE(store_->Append(Global("job-1", step, 1)).ok());
  }
  ASSERT_TRUE(store_->Append(Global("job-old", 1, 1)).ok());
  ASSERT_TRUE(store_->AppendHost(Host("job-old", 2, "h0", 1)).ok());
  clock_.Advance(absl::Hours(2));
  for (int step = 6; step <= 8; ++step) {
    ASSERT_TRUE(store_->Append(Global("job-1", step, 1)).ok());
  }
  EXPECT_EQ(store_->Prune().value(), 6);
  HistoryStore::ReadRequest request;
  request.job_id = "job-1";
  auto read = store_->Read(request).value();
  ASSERT_EQ(read.size(), 3u);
  EXPECT_EQ(read.front().step(), 6);
  // job-old had nothing young left: it is forgotten.
  auto jobs = store_->ListJobs().value();
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(jobs[0].job_id, "job-1");
  EXPECT_EQ(jobs[0].first_step, 6);
  EXPECT_EQ(store_->LatestStep("job-old").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(HistoryStoreTest, CreateValidates) {
  HistoryStore::Config config;
  EXPECT_EQ(HistoryStore::Create(config).status().code(), absl::StatusCode::kInvalidArgument);
  config.path = dir_ + "/missing/dir/history.db";
  EXPECT_EQ(HistoryStore::Create(config).status().code(), absl::StatusCode::kUnavailable);
  config.path = dir_ + "/history.db";
  config.checkpoint_pages = 0;
  const absl::Status no_pages = HistoryStore::Create(config).status();
  EXPECT_EQ(no_pages.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(no_pages.message(), "checkpoint_pages")) << no_pages;
}

}  // namespace
}  // namespace meshrun::telemetry
