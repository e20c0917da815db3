#include "coordinator_service/upload_stream.h"

#include <map>
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
    absl::StatusOr<int64_t> persisted = caller.ok() ? telemetry_->Accept(in_) : caller;
    absl::MutexLock lock(&mu_);
    if (!persisted.ok()) {
      reads_done_ = true;
      FinishIfIdleLocked(ToGrpcStatus(persisted.status()));
      return;
    }
    pending_[in_.job_id()] = *persisted;
    WriteNextLocked();
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) pending_.clear();  // the client is gone; its reads will end too
    WriteNextLocked();
    FinishIfIdleLocked(final_status_);
  }

  void OnDone() override { delete this; }

 private:
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
