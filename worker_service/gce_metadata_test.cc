#include "worker_service/gce_metadata.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"

namespace meshrun::services {
namespace {

// A fake GCE metadata server on 127.0.0.1: answers only with the Metadata-Flavor header.
class FakeMetadataServer {
 public:
  explicit FakeMetadataServer(std::map<std::string, std::string> attributes)
      : attributes_(std::move(attributes)) {
    server_.Get(R"(/computeMetadata/v1/instance/attributes/(.*))",
                [this](const httplib::Request& req, httplib::Response& res) {
                  ++requests_;
                  if (req.get_header_value("Metadata-Flavor") != "Google") {
                    res.status = 403;
                    return;
                  }
                  auto it = attributes_.find(req.matches[1]);
                  if (it == attributes_.end()) {
                    res.status = 404;
                    return;
                  }
                  res.set_content(it->second, "text/plain");
                });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    for (int i = 0; i < 500 && !server_.is_running(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ~FakeMetadataServer() {
    server_.stop();
    thread_.join();
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  int requests() const { return requests_; }

 private:
  std::map<std::string, std::string> attributes_;
  httplib::Server server_;
  int port_ = 0;
  std::atomic<int> requests_{0};
  std::thread thread_;
};

worker::EnvLookup NoEnvironment() {
  return [](const std::string&) -> std::optional<std::string> { return std::nullopt; };
}

TEST(GceMetadataTest, AV6e16HostFindsItsPlaceWithoutEnvironmentVariables) {
  FakeMetadataServer server({
      {"agent-worker-number", "2"},
      {"worker-network-endpoints",
       "unused:unused:10.0.0.5,unused:unused:10.0.0.6,unused:unused:10.0.0.7,"
       "unused:unused:10.0.0.8"},
      {"accelerator-type", "v6e-16"},
      {"tpu-env", "ACCELERATOR_TYPE: 'v6e-16'\nMEGASCALE_NUM_SLICES: '2'\n"
                  "MEGASCALE_SLICE_ID: '1'\nWORKER_ID: '2'\n"},
  });
  worker::EnvLookup env = WithTpuMetadata(
      NoEnvironment(), GceMetadataFetch(server.address(), absl::Seconds(5)));
  absl::StatusOr<worker::HostIdentity> id = worker::ResolveHostIdentity({}, env);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->worker_index, 2);
  EXPECT_EQ(id->host, "10.0.0.7");
  EXPECT_EQ(id->slice_hostnames,
            (std::vector<std::string>{"10.0.0.5", "10.0.0.6", "10.0.0.7", "10.0.0.8"}));
  EXPECT_EQ(id->slice_id, 1);
  EXPECT_EQ(id->num_slices, 2);
  EXPECT_EQ(env("TPU_ACCELERATOR_TYPE"), "v6e-16");
  const int requests = server.requests();
  worker::ResolveHostIdentity({}, env).IgnoreError();
  EXPECT_EQ(server.requests(), requests) << "each attribute is fetched once";
}

TEST(GceMetadataTest, EnvironmentWinsAndMissingAttributesCountAsUnset) {
  FakeMetadataServer server(std::map<std::string, std::string>{{"agent-worker-number", "3"}});
  worker::EnvLookup env = WithTpuMetadata(
      [](const std::string& name) -> std::optional<std::string> {
        if (name == "TPU_WORKER_ID") return "1";
        return std::nullopt;
      },
      GceMetadataFetch(server.address(), absl::Seconds(5)));
  EXPECT_EQ(env("TPU_WORKER_ID"), "1");
  EXPECT_EQ(env("TPU_WORKER_HOSTNAMES"), std::nullopt);
  EXPECT_EQ(env("MEGASCALE_NUM_SLICES"), std::nullopt);
  EXPECT_EQ(env("HOME"), std::nullopt) << "only TPU variables come from the metadata server";
}

TEST(GceMetadataTest, ErrorsNameTheServer) {
  FakeMetadataServer server(std::map<std::string, std::string>{});
  absl::StatusOr<std::string> missing =
      GceMetadataFetch(server.address(), absl::Seconds(5))("agent-worker-number");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  // Nothing listens on port 1 of loopback.
  absl::StatusOr<std::string> down =
      GceMetadataFetch("127.0.0.1:1", absl::Seconds(2))("agent-worker-number");
  EXPECT_EQ(down.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(down.status().message().find("127.0.0.1:1"), std::string::npos);
  worker::EnvLookup env = WithTpuMetadata(NoEnvironment(), GceMetadataFetch("127.0.0.1:1", absl::Seconds(2)));
  absl::StatusOr<worker::HostIdentity> id = worker::ResolveHostIdentity({.host = "h"}, env);
  ASSERT_TRUE(id.ok()) << "an unreachable server leaves the flags' identity";
  EXPECT_EQ(id->worker_index, 0);
}

}  // namespace
}  // namespace meshrun::services
