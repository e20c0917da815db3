#include "coordinator_service/relay_stream.h"

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

class RelayReactor final
    : public grpc::ServerBidiReactor<v1::HostSummaryBatch, v1::UploadTelemetryAckBatch> {
 public:
  RelayReactor(CoordinatorTelemetry* telemetry, const JobMembership* membership,
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
      FinishIfIdleLocked();
      return;
    }
    const std::optional<Identity> caller = PeerIdentity(*context_);
    for (v1::HostSummary& summary : *in_.mutable_summaries()) {
      const std::string host = summary.host(), job_id = summary.job_id();  // it moves on
      absl::Status allowed =
          membership_->CheckRelayed(caller, job_id, host, summary.incarnation());
      // Routed before the summary is combined, so the commit of its step finds the route.
      if (allowed.ok() && routes_.find(host) == routes_.end()) {
        routes_[host] = telemetry_->RouteAcks(
            host, [this, host](const std::string& job, int64_t step) { Ack(host, job, step); });
      }
      absl::StatusOr<std::optional<int64_t>> persisted =
          allowed.ok() ? telemetry_->Accept(std::move(summary)) : allowed;
      if (!persisted.ok()) {
        Refuse(host, job_id, persisted.status());
      } else if (*persisted) {
        Ack(host, job_id, **persisted);
      }
    }
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) next_.Clear();  // the relay is gone; its reads will end too
    WriteNextLocked();
    FinishIfIdleLocked();
  }

  void OnDone() override {
    for (const auto& [host, route] : routes_) telemetry_->UnrouteAcks(host, route);
    delete this;
  }

 private:
  // Queues an acknowledgement; runs on a gRPC thread or on the one that committed a step. A
  // host acknowledged twice before the next write gets both acks (the relay keeps the newer).
  void Ack(const std::string& host, const std::string& job_id, int64_t persisted_through_step) {
    absl::MutexLock lock(&mu_);
    v1::UploadTelemetryAck* ack = next_.add_acks();  // a cleared one, reused: no allocation
    ack->set_host(host);
    ack->set_job_id(job_id);
    ack->set_persisted_through_step(persisted_through_step);
    WriteNextLocked();
  }
  void Refuse(const std::string& host, const std::string& job_id, const absl::Status& status) {
    absl::MutexLock lock(&mu_);
    v1::UploadTelemetryAck* refusal = next_.add_acks();
    refusal->set_host(host);
    refusal->set_job_id(job_id);
    refusal->set_error_code(static_cast<int32_t>(status.code()));
    refusal->set_error_message(std::string(status.message()));
    WriteNextLocked();
  }

  // Everything due goes in one write, in the order it came due.
  void WriteNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || finished_ || next_.acks().empty()) return;
    out_.Swap(&next_);
    next_.Clear();  // keeps the written batch's messages for the next acks
    writing_ = true;
    StartWrite(&out_);
  }
  void FinishIfIdleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_ || !reads_done_ || writing_ || !next_.acks().empty()) return;
    finished_ = true;
    Finish(grpc::Status::OK);
  }

  CoordinatorTelemetry* const telemetry_;
  const JobMembership* const membership_;
  grpc::CallbackServerContext* const context_;
  IdentitySlots::Slot slot_;
  v1::HostSummaryBatch in_;
  // The ack route of each host this stream relayed for (read and written by reads only).
  std::map<std::string, int64_t> routes_;
  absl::Mutex mu_;
  v1::UploadTelemetryAckBatch out_ ABSL_GUARDED_BY(mu_);   // the write in flight
  v1::UploadTelemetryAckBatch next_ ABSL_GUARDED_BY(mu_);  // due since it started
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

grpc::ServerBidiReactor<v1::HostSummaryBatch, v1::UploadTelemetryAckBatch>* StartRelayStream(
    CoordinatorTelemetry* telemetry, const JobMembership* membership,
    grpc::CallbackServerContext* context, absl::StatusOr<IdentitySlots::Slot> slot) {
  return new RelayReactor(telemetry, membership, context, std::move(slot));
}

}  // namespace meshrun::services
