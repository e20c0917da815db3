#include "coordinator_service/upload_stream.h"

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"
#include "rpc/tls_credentials.h"

namespace meshrun::services {
namespace {

class UploadReactor final
    : public grpc::ServerBidiReactor<v1::HostSummary, v1::UploadTelemetryAck> {
 public:
  UploadReactor(CoordinatorTelemetry* telemetry, const JobMembership* membership,
                grpc::CallbackServerContext* context, absl::StatusOr<IdentitySlots::Slot> slot)
      : telemetry_(telemetry), membership_(membership), context_(context) {
    if (!slot.ok()) {
      absl::MutexLock lock(&mu_);
      finished_ = true;
      Finish(ToGrpcStatus(slot.status()));
      return;
    }
    slot_ = std::move(*slot);
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      absl::MutexLock lock(&mu_);
      reads_done_ = true;
      FinishIfIdleLocked(grpc::Status::OK);
      return;
    }
    absl::Status caller = CheckWorkerHost(*context_, in_.host());  // a worker sends as itself
    if (caller.ok()) {  // ... and only for a job it is a member of
      caller = membership_->CheckMember(PeerIdentity(*context_), in_.job_id(), in_.incarnation());
    }
    // Routed before the summary is combined, so the commit of its step finds the route.
    if (caller.ok() && routes_.find(in_.host()) == routes_.end()) {
      routes_[in_.host()] = telemetry_->RouteAcks(
          in_.host(), [this](const std::string& job_id, int64_t step) { Ack(job_id, step); });
    }
    const std::string job_id = in_.job_id();
    // Moved: the next read parses into a cleared message.
    absl::StatusOr<std::optional<int64_t>> persisted =
        caller.ok() ? telemetry_->Accept(std::move(in_)) : caller;
    if (!persisted.ok()) {
      absl::MutexLock lock(&mu_);
      reads_done_ = true;
      FinishIfIdleLocked(ToGrpcStatus(persisted.status()));
      return;
    }
    if (*persisted) Ack(job_id, **persisted);
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) pending_.clear();  // the client is gone; its reads will end too
    WriteNextLocked();
    FinishIfIdleLocked(final_status_);
  }

  void OnDone() override {
    for (const auto& [host, route] : routes_) telemetry_->UnrouteAcks(host, route);
    delete this;
  }

 private:
  // Queues an acknowledgement; runs on a gRPC thread or on the one that committed a step.
  void Ack(const std::string& job_id, int64_t persisted_through_step) {
    absl::MutexLock lock(&mu_);
    int64_t& pending = pending_[job_id];
    pending = std::max(pending, persisted_through_step);
    WriteNextLocked();
  }

  void WriteNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || pending_.empty() || finished_) return;
    auto it = pending_.begin();
    out_.set_job_id(it->first);
    out_.set_persisted_through_step(it->second);
    pending_.erase(it);
    writing_ = true;
    StartWrite(&out_);
  }
  void FinishIfIdleLocked(grpc::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!status.ok()) final_status_ = status;
    if (finished_ || !reads_done_ || writing_ || (!pending_.empty() && final_status_.ok())) {
      return;
    }
    finished_ = true;
    Finish(final_status_);
  }

  CoordinatorTelemetry* const telemetry_;
  const JobMembership* const membership_;
  grpc::CallbackServerContext* const context_;
  IdentitySlots::Slot slot_;
  v1::HostSummary in_;
  // The ack route of each host this stream sent for (read and written by reads only).
  std::map<std::string, int64_t> routes_;
  absl::Mutex mu_;
  v1::UploadTelemetryAck out_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> pending_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status final_status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

grpc::ServerBidiReactor<v1::HostSummary, v1::UploadTelemetryAck>* StartUploadStream(
    CoordinatorTelemetry* telemetry, const JobMembership* membership,
    grpc::CallbackServerContext* context, absl::StatusOr<IdentitySlots::Slot> slot) {
  return new UploadReactor(telemetry, membership, context, std::move(slot));
}

}  // namespace meshrun::services
