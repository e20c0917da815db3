// Many stand-in TPU hosts in one process, for scale tests and benches (issue 30): each fake
// host registers with a real coordinator over gRPC as a v6e host of `devices_per_host` chips,
// heartbeats on the interval the coordinator asks for (on a StreamHeartbeats stream of its own,
// or by a Heartbeat call per beat with Config::unary_heartbeats), serves the Worker calls a
// launch makes (GetStatus, CompileProgram, LoadExecutable, StartJob, StopJob) and, once started,
// uploads one HostSummary per step on its own UploadTelemetry stream, as a worker does, or, when
// StartJob names a telemetry relay, to that host's relay, the product's TelemetryRelay.
// Nothing runs: a compile answers with `executable_bytes` of seeded bytes, a step is a timer.
//
// One gRPC server serves every host (a listening port each; the caller's :authority names the
// host), and every client call is asynchronous, so the fleet needs a handful of threads
// whatever its size. It records what a scale test asks about: StartJob bytes per host, each
// heartbeat's round trip, the coordinator's refusals.
//
// Lifetime: Start() registers the hosts; the destructor deregisters them and stops the server.
// Thread-safety: the public methods may be called from any thread, UploadStep from one at a
// time.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "meshrun/v1/coordinator.grpc.pb.h"
#include "meshrun/v1/worker.grpc.pb.h"

namespace meshrun::test_support {

class FakeFleet {
 public:
  struct Config {
    std::string coordinator;      // host:port, plaintext
    int hosts = 16;
    int devices_per_host = 4;     // a v6e host's chips
    int64_t executable_bytes = 64 << 10;  // what CompileProgram answers with
    int channels = 8;             // connections the hosts' calls to the coordinator share
    // Heartbeat by a Heartbeat call per beat (what workers did before StreamHeartbeats), not on
    // one stream per host: the baseline the scale bench compares against.
    bool unary_heartbeats = false;
  };
  // What the fleet saw, read with Figures().
  struct Figures {
    int64_t start_job_calls = 0;
    int64_t start_job_bytes = 0;        // serialized StartJobRequests, all hosts
    int64_t start_job_max_bytes = 0;    // the largest one host received
    int64_t heartbeats = 0;             // answered (written, on a stream, when not timed)
    int64_t heartbeat_errors = 0;       // refused or failed (a host the coordinator forgot)
    absl::Duration worst_heartbeat;     // longest round trip since ResetHeartbeatFigures
    int64_t summaries_refused = 0;      // upload streams the coordinator ended with an error
    std::string last_error;             // the latest of those errors, for a failing test
  };

  explicit FakeFleet(Config config);
  ~FakeFleet();
  FakeFleet(const FakeFleet&) = delete;
  FakeFleet& operator=(const FakeFleet&) = delete;

  // Starts the hosts' server and registers every host, one call after another (so the caller
  // can time registration); heartbeats start once all are registered.
  // Errors: the first registration refused, naming the host.
  absl::Status Start();

  // True once every host has received StartJob for `job_id`, within `timeout`.
  bool AwaitStarted(const std::string& job_id, absl::Duration timeout) const;

  // Uploads step `step` of `job_id` from every started host (values for each series the job
  // declared, 1/step in the declared shape). Returns when all are queued, not sent. Called
  // from one thread at a time.
  void UploadStep(const std::string& job_id, int64_t step);

  Figures GetFigures() const;
  void ResetHeartbeatFigures();
  // Whether stream beats ask for an ack and time its round trip (the default), or go out as a
  // worker's do, unanswered: what a beat costs a coordinator that times none.
  void TimeHeartbeats(bool timed) { time_heartbeats_ = timed; }
  // What the coordinator asked for at registration; valid after Start.
  absl::Duration heartbeat_interval() const { return heartbeat_interval_; }

 private:
  class WorkerService;
  class UploadStream;
  class HeartbeatStream;
  struct Host;
  void HeartbeatLoop();
  // Counts one beat's answer: acknowledged after `took`, or refused with `error`.
  void RecordHeartbeat(absl::Duration took, const grpc::Status& error);
  size_t ChannelOf(int host) const;
  v1::Coordinator::Stub& StubFor(int host);

  const Config config_;
  std::vector<std::unique_ptr<Host>> hosts_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<v1::Coordinator::Stub>> stubs_;  // one on each channel
  // To the relays StartJob named, by address (UploadStep's thread only).
  std::map<std::string, std::unique_ptr<v1::Worker::Stub>> relay_stubs_;
  std::unique_ptr<WorkerService> service_;
  std::unique_ptr<grpc::Server> server_;
  absl::Duration heartbeat_interval_ = absl::Seconds(1);
  std::atomic<bool> stop_{false};
  std::thread heartbeats_;
  mutable absl::Mutex mu_;
  Figures figures_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> beats_in_flight_{0};
  std::atomic<bool> time_heartbeats_{true};
};

}  // namespace meshrun::test_support
