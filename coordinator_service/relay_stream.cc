#include "coordinator_service/relay_stream.h"

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

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
    for (const v1::HostSummary& summary : in_.summaries()) {
      const std::string& host = summary.host();
      absl::Status allowed =
          membership_->CheckRelayed(caller, summary.job_id(), host, summary.incarnation());
      // Routed before the summary is combined, so the commit of its step finds the route.
      if (allowed.ok() && routes_.find(host) == routes_.end()) {
        routes_[host] = telemetry_->RouteAcks(
            host, [this, host](const std::string& job_id, int64_t step) {
              Ack(host, job_id, step);
            });
      }
      absl::StatusOr<std::optional<int64_t>> persisted =
          allowed.ok() ? telemetry_->Accept(summary) : allowed;
      if (!persisted.ok()) {
        Refuse(summary, persisted.status());
      } else if (*persisted) {
        Ack(host, summary.job_id(), **persisted);
      }
    }
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) {  // the relay is gone; its reads will end too
      pending_.clear();
      refusals_.clear();
    }
    WriteNextLocked();
    FinishIfIdleLocked();
  }

  void OnDone() override {
    for (const auto& [host, route] : routes_) telemetry_->UnrouteAcks(host, route);
    delete this;
  }

 private:
  // Queues an acknowledgement; runs on a gRPC thread or on the one that committed a step.
  void Ack(const std::string& host, const std::string& job_id, int64_t persisted_through_step) {
    absl::MutexLock lock(&mu_);
    int64_t& pending = pending_[{host, job_id}];
    pending = std::max(pending, persisted_through_step);
    WriteNextLocked();
  }
  void Refuse(const v1::HostSummary& summary, const absl::Status& status) {
    v1::UploadTelemetryAck refusal;
    refusal.set_host(summary.host());
    refusal.set_job_id(summary.job_id());
    refusal.set_error_code(static_cast<int32_t>(status.code()));
    refusal.set_error_message(std::string(status.message()));
    absl::MutexLock lock(&mu_);
    refusals_.push_back(std::move(refusal));
    WriteNextLocked();
  }

  // Everything due goes in one write: acks first, then refusals (a host's refusal comes
  // after the acks of its earlier summaries).
  void WriteNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || finished_ || (pending_.empty() && refusals_.empty())) return;
    out_.Clear();
    for (const auto& [key, step] : pending_) {
      v1::UploadTelemetryAck* ack = out_.add_acks();
      ack->set_host(key.first);
      ack->set_job_id(key.second);
      ack->set_persisted_through_step(step);
    }
    for (v1::UploadTelemetryAck& refusal : refusals_) *out_.add_acks() = std::move(refusal);
    pending_.clear();
    refusals_.clear();
    writing_ = true;
    StartWrite(&out_);
  }
  void FinishIfIdleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_ || !reads_done_ || writing_ || !pending_.empty() || !refusals_.empty()) return;
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
  v1::UploadTelemetryAckBatch out_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, std::string>, int64_t> pending_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::UploadTelemetryAck> refusals_ ABSL_GUARDED_BY(mu_);
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
