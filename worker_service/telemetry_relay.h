// A telemetry relay (docs/scale.md, "Telemetry relays"): the hosts of its group, its own host
// included, upload their summaries here (Worker.RelayTelemetry) as they would to the
// coordinator, and it forwards them on one Coordinator.RelayTelemetry stream in batches:
// whatever arrived while the last write was in flight goes in the next, so a step's summaries
// travel together with no timer.
// At a thousand hosts this turns the coordinator's message per host summary into one per group.
//
// It stores nothing. Each member's acks are the coordinator's, sent after its commit and routed
// back by host; a refusal of a host's summary ends that host's stream with the coordinator's
// error, as UploadTelemetry would have. When the coordinator stream ends, every member's
// stream ends with UNAVAILABLE (members then upload to the coordinator themselves, resending
// what is unacknowledged); the next member stream opens a new one. Past `capacity` queued
// summaries, members' reads pause until a write drains them.
//
// Lifetime: starts its forwarder thread on construction. The owner's server must be shut down
// before the relay is destroyed; the destructor waits (bounded) for every member stream's end,
// cancels the coordinator stream and joins the thread.
// Thread-safety: Serve may be called from any gRPC thread; figures() from any thread.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "meshrun/v1/coordinator.grpc.pb.h"

namespace meshrun::services {

class TelemetryRelay {
 public:
  struct Config {
    std::shared_ptr<grpc::Channel> coordinator;  // the worker's channel to the coordinator
    size_t capacity = 4096;  // summaries queued for the coordinator before members pause
  };
  struct Figures {
    int64_t summaries = 0;  // forwarded to the coordinator
    int64_t batches = 0;    // the writes that carried them
  };

  explicit TelemetryRelay(Config config);
  ~TelemetryRelay();
  TelemetryRelay(const TelemetryRelay&) = delete;
  TelemetryRelay& operator=(const TelemetryRelay&) = delete;

  // One member's RelayTelemetry stream.
  grpc::ServerBidiReactor<v1::HostSummary, v1::UploadTelemetryAck>* Serve(
      grpc::CallbackServerContext* context);

  // Ends every member stream with UNAVAILABLE (its host then uploads to the coordinator), and
  // each one opened after at its first summary; the coordinator stream ends. For a worker's
  // drain: member streams last as long as their jobs. Idempotent.
  void Stop();

  Figures figures() const;

 private:
  class Member;
  // Queues a member's summary for the coordinator. Returns false when the queue is full: the
  // member reads on once Resume is called.
  bool Forward(Member* member, const v1::HostSummary& summary);
  void Unregister(Member* member);
  // The forwarder thread: opens the coordinator stream when summaries are queued and, when it
  // ends, ends every member's stream.
  void ForwardLoop();
  // One coordinator stream: writes what is queued, a batch at a time, until it breaks or the
  // relay stops; acks are read on a thread of its own (Dispatch).
  grpc::Status RunUpstream();
  void Dispatch(const v1::UploadTelemetryAckBatch& acks);

  const Config config_;
  const std::unique_ptr<v1::Coordinator::Stub> stub_;
  mutable absl::Mutex mu_;
  grpc::ClientContext* upstream_ ABSL_GUARDED_BY(mu_) = nullptr;  // to cancel on stop
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  v1::HostSummaryBatch queued_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Member*> members_ ABSL_GUARDED_BY(mu_);  // by host: its newest stream
  std::vector<Member*> paused_ ABSL_GUARDED_BY(mu_);
  int64_t live_members_ ABSL_GUARDED_BY(mu_) = 0;  // served, not yet done
  Figures figures_ ABSL_GUARDED_BY(mu_);
  std::thread forwarder_;
};

}  // namespace meshrun::services
