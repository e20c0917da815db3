#include "worker_service/telemetry_relay.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/grpc_status.h"
#include "rpc/tls_credentials.h"

namespace meshrun::services {

// One member's stream: its summaries go to the relay's queue; the coordinator's acks for its
// host come back through Ack (one write in flight, newer acks of a job replacing queued ones),
// and End finishes it with the coordinator's refusal or the relay's loss of its stream.
class TelemetryRelay::Member final
    : public grpc::ServerBidiReactor<v1::HostSummary, v1::UploadTelemetryAck> {
 public:
  Member(TelemetryRelay* relay, grpc::CallbackServerContext* context)
      : relay_(relay), context_(context) {
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      absl::MutexLock lock(&mu_);
      reads_done_ = true;
      FinishIfIdleLocked();
      return;
    }
    absl::Status allowed = CheckWorkerHost(*context_, in_.host());  // a worker sends as itself
    if (allowed.ok() && !host_.empty() && in_.host() != host_) {
      allowed = absl::InvalidArgumentError(absl::StrCat(
          "host: this stream carries host ", host_, "'s summaries; open a stream per host"));
    }
    if (!allowed.ok()) {
      End(allowed);
      return;
    }
    host_ = in_.host();
    if (relay_->Forward(this, in_)) Resume();
  }
  // Reads the next summary, unless the stream is ending; the relay calls it (its lock held)
  // once its queue has room again.
  void Resume() {
    absl::MutexLock lock(&mu_);
    if (!ending_) StartRead(&in_);
  }
  // The member went away, or the server is shutting down: a paused stream has no read in
  // flight to see it.
  void OnCancel() override { End(absl::CancelledError("the stream was cancelled")); }

  void Ack(const std::string& job_id, int64_t persisted_through_step) {
    absl::MutexLock lock(&mu_);
    if (ending_) return;
    int64_t& pending = pending_[job_id];
    pending = std::max(pending, persisted_through_step);
    WriteNextLocked();
  }
  // Ends the stream with `status`; acks still owed are not sent (the member resends those
  // summaries on its next stream).
  void End(const absl::Status& status) {
    absl::MutexLock lock(&mu_);
    if (ending_) return;
    ending_ = true;
    final_status_ = ToGrpcStatus(status);
    pending_.clear();
    if (!writing_) FinishLocked();
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) pending_.clear();  // the member is gone; its reads end too
    if (ending_) {
      FinishLocked();
      return;
    }
    WriteNextLocked();
    FinishIfIdleLocked();
  }

  void OnDone() override {
    relay_->Unregister(this);
    delete this;
  }

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
  // The member closed its side: end once the acks owed are written.
  void FinishIfIdleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (reads_done_ && !writing_ && pending_.empty()) FinishLocked();
  }
  void FinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    Finish(final_status_);
  }

  TelemetryRelay* const relay_;
  grpc::CallbackServerContext* const context_;
  v1::HostSummary in_;
  std::string host_;  // the host this stream carries (reads only)
  absl::Mutex mu_;
  v1::UploadTelemetryAck out_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> pending_ ABSL_GUARDED_BY(mu_);  // job -> step to ack
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool ending_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status final_status_ ABSL_GUARDED_BY(mu_);
};

// The relay's RelayTelemetry stream to the coordinator; deletes itself once it ended.
class TelemetryRelay::Upstream final
    : public grpc::ClientBidiReactor<v1::HostSummaryBatch, v1::UploadTelemetryAckBatch> {
 public:
  Upstream(TelemetryRelay* relay, v1::Coordinator::Stub& stub) : relay_(relay) {
    stub.async()->RelayTelemetry(&context_, this);
    StartRead(&acks_);
    StartCall();
  }
  // Writes `batch` (taken); one write at a time, as the relay calls it.
  void Write(v1::HostSummaryBatch* batch) {
    batch_.Swap(batch);
    StartWrite(&batch_);
  }
  void Cancel() { context_.TryCancel(); }

  void OnWriteDone(bool ok) override { relay_->Written(ok); }
  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows with the stream's status
    relay_->Dispatch(acks_);
    StartRead(&acks_);
  }
  void OnDone(const grpc::Status& status) override {
    relay_->UpstreamEnded(this, status);
    delete this;
  }

 private:
  TelemetryRelay* const relay_;
  grpc::ClientContext context_;
  v1::HostSummaryBatch batch_;  // the write in flight
  v1::UploadTelemetryAckBatch acks_;
};

TelemetryRelay::TelemetryRelay(Config config)
    : config_(std::move(config)), stub_(v1::Coordinator::NewStub(config_.coordinator)) {}

TelemetryRelay::~TelemetryRelay() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
  if (upstream_ != nullptr) upstream_->Cancel();
  // A server's Shutdown may return before its reactors' OnDone ran: theirs call Unregister.
  auto ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return upstream_ == nullptr && live_members_ == 0;
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&ended), absl::Seconds(10))) {
    spdlog::error("the telemetry relay's streams did not end within 10s");
  }
}

grpc::ServerBidiReactor<v1::HostSummary, v1::UploadTelemetryAck>* TelemetryRelay::Serve(
    grpc::CallbackServerContext* context) {
  absl::MutexLock lock(&mu_);
  ++live_members_;
  return new Member(this, context);
}

TelemetryRelay::Figures TelemetryRelay::figures() const {
  absl::MutexLock lock(&mu_);
  return figures_;
}

bool TelemetryRelay::Forward(Member* member, const v1::HostSummary& summary) {
  absl::MutexLock lock(&mu_);
  if (stopping_) {
    member->End(absl::UnavailableError("the telemetry relay is stopping; upload to the "
                                       "coordinator"));
    return false;
  }
  members_[summary.host()] = member;
  if (upstream_ == nullptr) upstream_ = new Upstream(this, *stub_);
  *queued_.add_summaries() = summary;
  WriteNextLocked();
  if (static_cast<size_t>(queued_.summaries_size()) < config_.capacity) return true;
  paused_.push_back(member);
  return false;
}

void TelemetryRelay::WriteNextLocked() {
  if (writing_ || upstream_ == nullptr || queued_.summaries().empty()) return;
  writing_ = true;
  ++figures_.batches;
  figures_.summaries += queued_.summaries_size();
  upstream_->Write(&queued_);
  queued_.Clear();  // holds the batch written before this one
}

void TelemetryRelay::Unregister(Member* member) {
  absl::MutexLock lock(&mu_);
  --live_members_;
  for (auto it = members_.begin(); it != members_.end();) {
    it = it->second == member ? members_.erase(it) : std::next(it);
  }
  paused_.erase(std::remove(paused_.begin(), paused_.end(), member), paused_.end());
}

void TelemetryRelay::Written(bool ok) {
  absl::MutexLock lock(&mu_);
  writing_ = false;
  if (!ok) return;  // the stream ended: UpstreamEnded follows
  WriteNextLocked();
  if (static_cast<size_t>(queued_.summaries_size()) >= config_.capacity) return;
  for (Member* member : paused_) member->Resume();
  paused_.clear();
}

void TelemetryRelay::Dispatch(const v1::UploadTelemetryAckBatch& acks) {
  absl::MutexLock lock(&mu_);
  for (const v1::UploadTelemetryAck& ack : acks.acks()) {
    auto it = members_.find(ack.host());
    if (it == members_.end()) continue;  // its stream ended: it resends on its next one
    if (ack.error_code() == 0) {
      it->second->Ack(ack.job_id(), ack.persisted_through_step());
      continue;
    }
    it->second->End(absl::Status(static_cast<absl::StatusCode>(ack.error_code()),
                                 ack.error_message()));
    members_.erase(it);
  }
}

void TelemetryRelay::UpstreamEnded(Upstream* upstream, const grpc::Status& status) {
  absl::MutexLock lock(&mu_);
  if (upstream_ != upstream) return;
  upstream_ = nullptr;
  writing_ = false;
  queued_.Clear();  // unacknowledged: the members resend it
  if (!stopping_) {
    spdlog::warn("telemetry relay: the stream to the coordinator ended ({}); its {} member "
                 "streams end, and their hosts upload to the coordinator",
                 status.error_message(), members_.size());
  }
  const absl::Status lost = absl::UnavailableError(absl::StrCat(
      "the telemetry relay lost its stream to the coordinator (", status.error_message(),
      "); upload to the coordinator"));
  for (auto& [host, member] : members_) member->End(lost);
  for (Member* member : paused_) member->End(lost);  // paused, yet replaced by a newer stream
  members_.clear();
  paused_.clear();
}

}  // namespace meshrun::services
