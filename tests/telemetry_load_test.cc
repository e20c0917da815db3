// Load on the coordinator's telemetry path over loopback: 500 watchers of one job while one
// host streams 100 summaries/s for 60 s (MESHRUN_LOAD_SECONDS overrides the duration) through
// the worker's own uploader (TelemetryUploader -> UploadTelemetry) into a real CoordinatorServer.
// Asserts that nothing is lost: every watcher that keeps up (is not dropped for overflowing its
// queue) receives every step once, in order; one that falls behind (a machine busy with other
// work cannot always deliver 50,000 summaries/s) is told exactly where to resume — the step
// after its last — and a watch resumed from there gets every remaining step. Asserts that the
// process's memory (VmRSS: the coordinator, and the watchers' clients whose buffers are reserved
// before the baseline) grows less than 64 MiB after warm-up. Reports p50/p99 latency from the host's send
// to the watcher's receive. The job is started on the coordinator's telemetry directly (there
// is no worker); everything else goes through the RPCs.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "coordinator_service/coordinator_server.h"
#include "rpc/server_support.h"
#include "worker_service/telemetry_uploader.h"
#include "tests/watch_fleet.h"

namespace meshrun::services {
namespace {

constexpr int kWatchers = 500;
constexpr int kRate = 100;  // summaries per second

// This process's resident set, in KiB.
int64_t RssKib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    int64_t kib = 0;
    if (line.rfind("VmRSS:", 0) == 0 && absl::SimpleAtoi(line.substr(6, line.size() - 9), &kib)) {
      return kib;
    }
  }
  return -1;
}

int LoadSeconds() {
  int seconds = 60;
  const char* env = std::getenv("MESHRUN_LOAD_SECONDS");
  if (env != nullptr && (!absl::SimpleAtoi(env, &seconds) || seconds < 5)) {
    ADD_FAILURE() << "MESHRUN_LOAD_SECONDS=" << env << " is not a number of seconds >= 5";
    seconds = 60;
  }
  return seconds;
}

v1::HostSummary Summary(const std::string& job, const std::string& host, int64_t step) {
  v1::HostSummary s;
  s.set_job_id(job);
  s.set_host(host);
  s.set_replica_count(1);
  test_support::FillValues(s, step);
  return s;
}

TEST(TelemetryLoadTest, FiveHundredWatchersKeepUpAtOneHundredSummariesPerSecond) {
  const int seconds = LoadSeconds();
  const int64_t total = int64_t{kRate} * seconds;
  const std::string dir = ::testing::TempDir() + "/telemetry_load_test";
  std::filesystem::remove_all(dir);
  auto server = CoordinatorServer::Start({.listen = "127.0.0.1:0", .state_dir = dir});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = absl::StrCat("127.0.0.1:", (*server)->port());

  // The job as the launcher would start it: one host, three series.
  const std::string job = "load-1", host = "load-host";
  v1::JobManifest manifest;
  manifest.set_job_id(job);
  (*manifest.mutable_host_incarnations())[host] = "incarnation-1";
  manifest.mutable_mesh()->add_shape(1);
  for (auto [name, dims] : {std::pair{"loss", 0}, {"grad_norm", 0}, {"sink_mass", 2}}) {
    v1::TelemetryDeclaration* d = manifest.mutable_spec()->add_telemetry();
    d->set_name(name);
    d->set_combine(v1::COMBINE_MEAN);
    if (dims == 2) {
      d->add_shape(6);
      d->add_shape(4);
    }
  }
  CoordinatorTelemetry& telemetry = (*server)->telemetry();
  ASSERT_TRUE(telemetry.DeclareJob(job, manifest.spec()).ok());
  ASSERT_TRUE(telemetry.StartJob(manifest).ok());

  v1::WatchTelemetryRequest request;
  request.set_job_id(job);
  request.set_since_step(1);
  test_support::WatchFleet fleet({.address = address,
                                  .watchers = kWatchers,
                                  .channels = 4,
                                  .request = request,
                                  .expected_summaries = static_cast<size_t>(total)});
  fleet.Start();
  const absl::Time subscribe_deadline = absl::Now() + absl::Seconds(60);
  while (telemetry.hub().WatcherCount(job) < kWatchers && absl::Now() < subscribe_deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(telemetry.hub().WatcherCount(job), kWatchers);

  const int64_t rss_start = RssKib();
  int64_t rss_warm = 0, rss_peak = 0;
  // On a machine busy with other work, ingest and delivery fall behind the 100/s; the waits
  // below give them time to catch up (the latency figures then say so) — nothing may be lost.
  {
    TelemetryUploader uploader({.coordinator = address});
    const absl::Time start = absl::Now();
    for (int64_t step = 1; step <= total; ++step) {
      absl::SleepFor(start + (step - 1) * absl::Seconds(1) / kRate - absl::Now());
      uploader.Enqueue(Summary(job, host, step));
      if (step % kRate == 0) {  // once a second
        const int64_t rss = RssKib();
        // Baseline after the first sixth, when queues and buffers have reached steady state.
        if (rss_warm == 0 && step >= total / 6) rss_warm = rss;
        rss_peak = std::max(rss_peak, rss);
      }
    }
    ASSERT_TRUE(uploader.Flush(job, absl::Seconds(std::max(60, 2 * seconds))))
        << "summaries not acknowledged";
    EXPECT_EQ(uploader.dropped(), 0);
  }
  // Acknowledged is committed, not yet published: wait until the last step is (a watch from
  // past the newest published step is refused).
  const absl::Time publish_deadline = absl::Now() + absl::Seconds(std::max(60, 2 * seconds));
  while (!telemetry.hub().Subscribe({.job_id = job, .since_step = total + 1, .history_only = true})
              .ok()) {
    ASSERT_LT(absl::Now(), publish_deadline) << "step " << total << " never published";
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(fleet.AwaitReceived(total, absl::Seconds(std::max(60, 2 * seconds))))
      << "watchers behind: the slowest has " << fleet.MinReceived() << " of " << total;
  telemetry.EndJob(job);  // ends every stream with OK once drained
  ASSERT_TRUE(fleet.AwaitDone(absl::Seconds(60)));

  // A watcher either kept up and got every step once, in order, or fell behind and was told
  // exactly where to resume: right after the last step it received. Nothing is lost silently.
  int kept_up = 0, told = 0;
  int64_t worst_resume = 0;  // the earliest step a watcher that fell behind must resume from
  for (const auto& reader : fleet.readers()) {
    EXPECT_EQ(reader->breaks, 0) << "a watcher saw a gap, duplicate or reordering";
    if (reader->status.ok()) {
      EXPECT_EQ(reader->received.load(), total);
      EXPECT_EQ(reader->last_step, total);
      ++kept_up;
    } else {
      EXPECT_EQ(reader->status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
          << reader->status.error_message();
      EXPECT_NE(reader->status.error_message().find(
                    absl::StrCat("since_step=", reader->last_step + 1)),
                std::string::npos)
          << reader->status.error_message();
      ++told;
      const int64_t resume = reader->last_step + 1;
      worst_resume = worst_resume == 0 ? resume : std::min(worst_resume, resume);
    }
  }
  // ... and resuming from there over the RPC loses nothing (the rest comes from history).
  if (worst_resume > 0) {
    auto stub = v1::Coordinator::NewStub(MakeChannel(address));
    v1::WatchTelemetryRequest resume;
    resume.set_job_id(job);
    resume.set_since_step(worst_resume);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    auto stream = stub->WatchTelemetry(&context, resume);
    v1::GlobalSummary summary;
    int64_t next = worst_resume;
    while (stream->Read(&summary)) {
      ASSERT_EQ(summary.step(), next) << "resumed watch has a gap or duplicate";
      ++next;
    }
    EXPECT_TRUE(stream->Finish().ok());
    EXPECT_EQ(next, total + 1) << "resumed from step " << worst_resume;
  }
  const double growth_mib = (rss_peak - rss_warm) / 1024.0;
  std::printf("load: %d watchers, %d summaries/s for %d s: %d got every step, %d fell behind "
              "and were told where to resume, %lld deliveries\n",
              kWatchers, kRate, seconds, kept_up, told,
              static_cast<long long>(fleet.TotalReceived()));
  std::printf("load: delivery latency p50 %.2f ms, p99 %.2f ms, max %.2f ms\n",
              fleet.LatencyPercentile(50) / 1e3, fleet.LatencyPercentile(99) / 1e3,
              fleet.LatencyPercentile(100) / 1e3);
  std::printf("load: VmRSS %.1f MiB at start, %.1f MiB after warm-up, peak %.1f MiB (+%.1f MiB)\n",
              rss_start / 1024.0, rss_warm / 1024.0, rss_peak / 1024.0, growth_mib);
  // Bounded: no growth with the number of summaries once the queues and buffers are warm.
  EXPECT_LT(growth_mib, 64.0) << "memory grew with the summaries streamed";
  server->reset();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace meshrun::services
