// The coordinator's HTTP port on 127.0.0.1:0 with a real worker registered: the dashboard's
// files, strictly valid Prometheus text, JSON, and bad requests that get 400/404 and leave the
// server serving.
#include <httplib.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "absl/synchronization/mutex.h"
#include "coordinator_service/coordinator_server.h"
#include "coordinator/coordinator_telemetry.h"
#include "worker_service/worker_server.h"
#include "telemetry/prometheus.h"
#include "testing/telemetry_job.h"

namespace meshrun::services {
namespace {

std::string TestDir(const std::string& name) {
  return ::testing::TempDir() + "/http_server_test/" + name;
}

class HttpServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string web = TestDir("web");
    std::filesystem::create_directories(web);
    std::ofstream(web + "/index.html") << "<title>meshrun dashboard</title>\n";
    auto coordinator = CoordinatorServer::Start({.listen = "127.0.0.1:0",
                                                 .state_dir = TestDir("coordinator"),
                                                 .http_listen = "127.0.0.1:0",
                                                 .web_root = web});
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = std::move(*coordinator);
    ASSERT_GT(coordinator_->http_port(), 0);
    auto worker = WorkerServer::Start(
        {.listen = "127.0.0.1:0",
         .coordinator = "127.0.0.1:" + std::to_string(coordinator_->port()),
         .identity = {.host = "host-a"},
         .state_dir = TestDir("host-a")});
    ASSERT_TRUE(worker.ok()) << worker.status();
    worker_ = std::move(*worker);
    client_ = std::make_unique<httplib::Client>("127.0.0.1", coordinator_->http_port());
    client_->set_read_timeout(10);
    // Bounded wait for the registration.
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    while (absl::Now() < give_up && !absl::StrContains(Get("/api/workers").body, "host-a")) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  struct Answer {
    int status = 0;
    std::string body;
    std::string content_type;
  };
  Answer Get(const std::string& path) {
    httplib::Result result = client_->Get(path);
    if (!result) return {};
    return {result->status, result->body, result->get_header_value("Content-Type")};
  }

  std::unique_ptr<CoordinatorServer> coordinator_;
  std::unique_ptr<WorkerServer> worker_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(HttpServerTest, ServesTheDashboardJsonAndStrictPrometheusText) {
  Answer page = Get("/");
  EXPECT_EQ(page.status, 200);
  EXPECT_TRUE(absl::StrContains(page.body, "meshrun dashboard"));

  Answer workers = Get("/api/workers");
  EXPECT_EQ(workers.status, 200);
  EXPECT_TRUE(absl::StrContains(workers.body, "\"host\":\"host-a\"")) << workers.body;
  EXPECT_TRUE(absl::StrContains(workers.body, "WORKER_STATE_ALIVE")) << workers.body;
  EXPECT_EQ(Get("/api/jobs").status, 200);

  Answer metrics = Get("/metrics");
  ASSERT_EQ(metrics.status, 200);
  EXPECT_TRUE(absl::StartsWith(metrics.content_type, "text/plain; version=0.0.4"))
      << metrics.content_type;
  absl::Status valid = telemetry::CheckExposition(metrics.body);
  EXPECT_TRUE(valid.ok()) << valid << "\n" << metrics.body;
  EXPECT_TRUE(absl::StrContains(metrics.body, "meshrun_worker_up{host=\"host-a\"} 1\n"))
      << metrics.body;
  EXPECT_TRUE(absl::StrContains(metrics.body, "meshrun_jobs{state=\"running\"} 0\n"));
  EXPECT_TRUE(absl::StrContains(metrics.body, "meshrun_build_info{version="));
}

TEST_F(HttpServerTest, BadRequestsNameTheProblemAndLeaveTheServerServing) {
  struct Case {
    std::string path;
    int status;
    std::string names;
  };
  const Case cases[] = {
      {"/no/such/page", 404, "/no/such/page"},
      {"/api/job", 400, "\\\"id\\\""},
      {"/api/job?id=a&id=b", 400, "given twice"},
      {"/api/job?id=job-404", 404, "job-404"},
      {"/metrics?verbose=1", 400, "verbose"},
      {"/api/memory?host=ghost", 404, "ghost"},
      {"/api/series?job=nope", 404, "nope"},
      {"/api/watch?job=nope", 404, "nope"},
      {"/api/watch?job=nope&since_step=minus", 400, "since_step"},
      {"/api/watch", 400, "job"},
  };
  for (const Case& c : cases) {
    Answer answer = Get(c.path);
    EXPECT_EQ(answer.status, c.status) << c.path << ": " << answer.body;
    EXPECT_TRUE(absl::StrContains(answer.body, c.names)) << c.path << ": " << answer.body;
    EXPECT_TRUE(absl::StartsWith(answer.body, "{\"error\":")) << answer.body;
  }
  EXPECT_NE(Get("/../../etc/passwd").status, 200);
  httplib::Result post = client_->Post("/metrics", "x", "text/plain");
  ASSERT_TRUE(post);
  EXPECT_NE(post->status, 200);
  // Unharmed: still answering, and the gRPC side too.
  EXPECT_EQ(Get("/metrics").status, 200);
  EXPECT_EQ(Get("/").status, 200);
}

// The event stream over a real hub and history: resume after Last-Event-ID, live summaries,
// the end of the job, and the stream limit that keeps the other paths served.
TEST(DashboardStreamTest, ResumesGoesLiveEndsAndLimitsStreams) {
  const std::string dir = TestDir("stream");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto telemetry = CoordinatorTelemetry::Create({.database = dir + "/telemetry.db"});
  ASSERT_TRUE(telemetry.ok()) << telemetry.status();
  // The stream needs only the handler's telemetry.
  CoordinatorRpcHandler handler(nullptr, nullptr, nullptr, nullptr, telemetry->get());
  auto api = DashboardApi::Create({.handler = &handler, .history = &(*telemetry)->history()});
  ASSERT_TRUE(api.ok()) << api.status();
  auto http = HttpServer::Start({.listen = "127.0.0.1:0", .api = api->get(), .max_streams = 1});
  ASSERT_TRUE(http.ok()) << http.status();

  ASSERT_TRUE(testing::StartLossJob(**telemetry, "job-a").ok());
  auto send = [&](int step) {  // EXPECT, not ASSERT: it also runs while a reader thread does
    EXPECT_TRUE(testing::SendLoss(**telemetry, "job-a", step, 10.0f / step).ok());
  };
  for (int step = 1; step <= 3; ++step) send(step);

  absl::Mutex mu;
  std::string events;
  const int port = (*http)->port();
  std::thread reader([&] {
    httplib::Client client("127.0.0.1", port);
    client.set_read_timeout(20);
    client.Get("/api/watch?job=job-a", {{"Last-Event-ID", "1"}},
               [&](const char* data, size_t size) {
                 absl::MutexLock lock(&mu);
                 events.append(data, size);
                 return true;
               });
  });
  auto wait_for = [&](const std::string& text) {
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    while (absl::Now() < give_up) {
      {
        absl::MutexLock lock(&mu);
        if (absl::StrContains(events, text)) return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  };
  EXPECT_TRUE(wait_for("id: 3\n"));  // no ASSERT while a reader thread runs
  {
    absl::MutexLock lock(&mu);
    EXPECT_FALSE(absl::StrContains(events, "id: 1\n")) << events;
    EXPECT_TRUE(absl::StrContains(events, "id: 2\nevent: summary\ndata: {")) << events;
  }

  // One stream is the limit here: a second is refused, and the JSON paths still answer.
  httplib::Client client("127.0.0.1", port);
  httplib::Result refused = client.Get("/api/watch?job=job-a");
  EXPECT_TRUE(refused && refused->status == 503 &&
              absl::StrContains(refused->body, "event streams"));
  httplib::Result series = client.Get("/api/series?job=job-a");
  EXPECT_TRUE(series && absl::StrContains(series->body, "\"name\":\"loss\""));

  send(4);  // live
  EXPECT_TRUE(wait_for("id: 4\n"));
  (*telemetry)->EndJob("job-a");
  EXPECT_TRUE(wait_for("event: end\ndata: {\"status\":\"OK\""));
  reader.join();

  // The stream's slot is free again (the server releases it just after the client saw the
  // end, so allow it a moment); a finished job replays its history and ends.
  httplib::Result replay = client.Get("/api/watch?job=job-a&since_step=3");
  for (int i = 0; i < 100 && replay && replay->status == 503; ++i) {
    absl::SleepFor(absl::Milliseconds(20));
    replay = client.Get("/api/watch?job=job-a&since_step=3");
  }
  ASSERT_TRUE(replay);
  EXPECT_EQ(replay->status, 200);
  EXPECT_TRUE(absl::StrContains(replay->body, "id: 3\n")) << replay->body;
  EXPECT_TRUE(absl::StrContains(replay->body, "id: 4\n")) << replay->body;
  EXPECT_FALSE(absl::StrContains(replay->body, "id: 2\n")) << replay->body;

  // Stopping the server ends an open stream of a live job promptly.
  ASSERT_TRUE(testing::StartLossJob(**telemetry, "job-b").ok());
  {
    absl::MutexLock lock(&mu);
    events.clear();
  }
  std::thread idle([&] {
    httplib::Client waiting("127.0.0.1", port);
    waiting.set_read_timeout(30);
    waiting.Get("/api/watch?job=job-b", [&](const char* data, size_t size) {
      absl::MutexLock lock(&mu);
      events.append(data, size);
      return true;
    });
  });
  EXPECT_TRUE(wait_for("retry: 2000\n"));
  const absl::Time stop_start = absl::Now();
  (*http)->Stop();
  idle.join();
  EXPECT_LT(absl::Now() - stop_start, absl::Seconds(3));
}

}  // namespace
}  // namespace meshrun::services
