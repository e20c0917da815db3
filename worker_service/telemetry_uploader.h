// The worker's side of the telemetry stream: summaries are queued without blocking (the step
// loop never waits for the network), sent in order on one long-lived UploadTelemetry stream,
// and kept until the coordinator acknowledges them as persisted. While the coordinator is
// unreachable they stay queued — bounded: past `capacity` the oldest is dropped and counted —
// and everything unacknowledged is resent on reconnect (the coordinator ignores duplicates).
// A summary the coordinator refuses is dropped, and with it the rest of its job's when the
// refusal is about the job (it no longer collects telemetry, e.g. cancelled).
//
// Through a telemetry relay (UseRelay, docs/scale.md "Telemetry relays") the stream goes to the
// relay's Worker.RelayTelemetry instead, with the same acks and refusals; once a relay stream
// fails otherwise (the relay died, or lost the coordinator), the uploader sends to the
// coordinator itself until the next UseRelay.
//
// Lifetime: starts its sender thread on construction; the destructor stops it (bounded).
// Thread-safety: all methods are safe to call concurrently.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "meshrun/v1/coordinator.grpc.pb.h"
#include "meshrun/v1/worker.grpc.pb.h"

namespace meshrun::services {

class TelemetryUploader {
 public:
  struct Config {
    std::string coordinator;                         // host:port
    size_t capacity = 4096;                          // summaries kept while unacknowledged
    absl::Duration reconnect_delay = absl::Milliseconds(500);
    // security: null = the process's credentials, expecting the coordinator's identity
    // (MakeCoordinatorChannel); benchmarks pass their own.
    std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr;
  };

  explicit TelemetryUploader(Config config);
  ~TelemetryUploader();

  // Never blocks on the network.
  void Enqueue(v1::HostSummary summary);

  // Waits until every queued summary of `job_id` is acknowledged; false after `timeout`.
  bool Flush(const std::string& job_id, absl::Duration timeout);

  // Forgets the queued summaries of the job's runs before `attempt`: the job restarted from a
  // checkpoint, and the coordinator no longer takes them.
  void DropEarlierRuns(const std::string& job_id, int attempt);

  // From now on sends through the relay `host` serving at `address` (StartJobRequest's
  // telemetry_relay_*), or to the coordinator when `address` is empty. An open stream to the
  // other side ends; what it left unacknowledged is resent on the new one.
  void UseRelay(const std::string& host, const std::string& address);

  int64_t dropped() const;

 private:
  struct Entry {
    v1::HostSummary summary;
    bool sent = false;
  };
  void SendLoop();
  // One stream's life: returns when it broke or the uploader stops; true when the next stream
  // may start at once: the coordinator refused a summary (dropped here), or the stream moved
  // to or from a relay.
  bool RunStream();
  using SummaryStream = grpc::ClientReaderWriter<v1::HostSummary, v1::UploadTelemetryAck>;
  // Opens the stream to the relay when one is set, else to the coordinator; `via_relay` says
  // which.
  std::unique_ptr<SummaryStream> OpenStream(grpc::ClientContext* context, bool* via_relay);
  bool HasUnsentLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Config config_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  mutable absl::Mutex mu_;
  std::string relay_host_ ABSL_GUARDED_BY(mu_);  // empty: to the coordinator
  std::string relay_address_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<v1::Worker::Stub> relay_stub_ ABSL_GUARDED_BY(mu_);  // to relay_address_
  bool switching_ ABSL_GUARDED_BY(mu_) = false;  // UseRelay cancelled the current stream
  std::deque<Entry> queue_ ABSL_GUARDED_BY(mu_);
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_reading_ ABSL_GUARDED_BY(mu_) = false;  // the current stream's reads ended
  grpc::ClientContext* stream_context_ ABSL_GUARDED_BY(mu_) = nullptr;  // to cancel on stop
  std::thread sender_;
};

}  // namespace meshrun::services
