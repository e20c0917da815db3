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

TelemetryRelay::TelemetryRelay(Config config)
    : config_(std::move(config)), stub_(v1::Coordinator::NewStub(config_.coordinator)) {
  forwarder_ = std::thread([this] { ForwardLoop(); });
}

void TelemetryRelay::Stop() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
  if (upstream_ != nullptr) upstream_->TryCancel();
  const absl::Status stopping =
      absl::UnavailableError("the telemetry relay is stopping; upload to the coordinator");
  for (auto& [host, member] : members_) member->End(stopping);
  for (Member* member : paused_) member->End(stopping);
  members_.clear();
  paused_.clear();
}

TelemetryRelay::~TelemetryRelay() {
  Stop();
  {
    absl::MutexLock lock(&mu_);
    // A server's Shutdown may return before its reactors' OnDone ran: theirs call Unregister.
    auto ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return live_members_ == 0; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&ended), absl::Seconds(10))) {
      spdlog::error("the telemetry relay's member streams did not end within 10s");
    }
  }
  forwarder_.join();
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
  *queued_.add_summaries() = summary;
  if (static_cast<size_t>(queued_.summaries_size()) < config_.capacity) return true;
  paused_.push_back(member);
  return false;
}

void TelemetryRelay::Unregister(Member* member) {
  absl::MutexLock lock(&mu_);
  --live_members_;
  for (auto it = members_.begin(); it != members_.end();) {
    it = it->second == member ? members_.erase(it) : std::next(it);
  }
  paused_.erase(std::remove(paused_.begin(), paused_.end(), member), paused_.end());
}

// The coordinator stream runs on the relay's own threads with gRPC's blocking API, so the
// stream and its channel are released here, never on one of gRPC's callback threads.
void TelemetryRelay::ForwardLoop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto due = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !queued_.summaries().empty();
      };
      mu_.Await(absl::Condition(&due));
      if (stopping_) return;
    }
    const grpc::Status status = RunUpstream();
    absl::MutexLock lock(&mu_);
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
}

grpc::Status TelemetryRelay::RunUpstream() {
  grpc::ClientContext context;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return grpc::Status(grpc::StatusCode::CANCELLED, "the relay is stopping");
    upstream_ = &context;
  }
  std::unique_ptr<grpc::ClientReaderWriter<v1::HostSummaryBatch, v1::UploadTelemetryAckBatch>>
      stream = stub_->RelayTelemetry(&context);
  bool reads_ended = false;  // guarded by mu_
  std::thread reader([&] {
    v1::UploadTelemetryAckBatch acks;
    while (stream->Read(&acks)) Dispatch(acks);
    absl::MutexLock lock(&mu_);
    reads_ended = true;  // wakes the writer below
  });
  v1::HostSummaryBatch batch;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto due = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || reads_ended || !queued_.summaries().empty();
      };
      mu_.Await(absl::Condition(&due));
      if (stopping_ || reads_ended) break;
      batch.Swap(&queued_);
      queued_.Clear();  // keeps the last batch's messages for the next summaries
      ++figures_.batches;
      figures_.summaries += batch.summaries_size();
      // The queue has room again: paused members read on.
      for (Member* member : paused_) member->Resume();
      paused_.clear();
    }
    if (!stream->Write(batch)) break;
  }
  stream->WritesDone();
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) context.TryCancel();
  }
  reader.join();
  const grpc::Status status = stream->Finish();
  absl::MutexLock lock(&mu_);
  upstream_ = nullptr;
  return status;
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

}  // namespace meshrun::services
