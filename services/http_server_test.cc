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
#include "services/coordinator_server.h"
#include "services/worker_server.h"
#include "telemetry/prometheus.h"

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
  EXPECT_TRUE(absl::StrContains(metrics.body, "# TYPE meshrun_worker_events_total counter\n"));
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

}  // namespace
}  // namespace meshrun::services
