#include "worker_service/heartbeat_sender.h"

#include <string>
#include <utility>

#include "common/grpc_status.h"

namespace meshrun::services {

// One StreamHeartbeats call. Its beats ask for no ack; a read is kept in flight to see the call
// end (and takes any ack an older coordinator sends), so while `read_ended` is false gRPC has not run OnDone and a write may still be started.
class HeartbeatSender::Stream final
    : public grpc::ClientBidiReactor<v1::HeartbeatRequest, v1::HeartbeatResponse> {
 public:
  Stream(HeartbeatSender* owner, std::string incarnation)
      : incarnation(std::move(incarnation)), owner_(owner) {}

  void OnReadDone(bool ok) override {
    if (ok) {
      StartRead(&ack_);
    } else {
      owner_->ReadEnded(this);
    }
  }
  void OnWriteDone(bool) override { owner_->WriteDone(this); }
  void OnDone(const grpc::Status& status) override {
    owner_->Done(this, FromGrpcStatus(status));
    delete this;
  }
  void Open(v1::Coordinator::Stub* stub) {
    stub->async()->StreamHeartbeats(&context, this);
    StartRead(&ack_);
    StartCall();
  }

  grpc::ClientContext context;
  const std::string incarnation;
  // Guarded by the owner's mu_.
  v1::HeartbeatRequest writing;                 // the beat of the write in flight
  std::optional<v1::HeartbeatRequest> waiting;  // the beat to write after it
  bool write_in_flight = false;
  bool read_ended = false;

 private:
  HeartbeatSender* const owner_;
  v1::HeartbeatResponse ack_;
};

HeartbeatSender::~HeartbeatSender() {
  Stop();
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* live) { return *live == 0; }, &live_streams_));
}

absl::Status HeartbeatSender::Beat(const v1::HeartbeatRequest& beat) {
  absl::MutexLock lock(&mu_);
  if (stopped_) return absl::CancelledError("heartbeats stopped");
  if (ended_.has_value()) {
    const absl::Status ended = *std::move(ended_);
    ended_.reset();
    return ended.ok() ? absl::UnavailableError("the coordinator closed the heartbeat stream")
                      : ended;
  }
  if (open_ != nullptr && open_->incarnation != beat.incarnation()) {
    open_->context.TryCancel();  // a stale incarnation's stream; its end is not reported
    open_ = nullptr;
  }
  if (open_ == nullptr) {
    open_ = new Stream(this, beat.incarnation());
    ++live_streams_;
    open_->Open(stub_);
  }
  open_->waiting = beat;
  WriteNextLocked(*open_);
  return absl::OkStatus();
}

void HeartbeatSender::WriteNextLocked(Stream& stream) {
  if (stream.write_in_flight || stream.read_ended || !stream.waiting.has_value()) return;
  stream.writing = *std::move(stream.waiting);
  stream.waiting.reset();
  stream.write_in_flight = true;
  stream.StartWrite(&stream.writing);  // its OnWriteDone runs on a gRPC thread, never inline
}

void HeartbeatSender::ReadEnded(Stream* stream) {
  absl::MutexLock lock(&mu_);
  stream->read_ended = true;
}

void HeartbeatSender::WriteDone(Stream* stream) {
  absl::MutexLock lock(&mu_);
  stream->write_in_flight = false;
  WriteNextLocked(*stream);
}

void HeartbeatSender::Done(Stream* stream, absl::Status status) {
  absl::MutexLock lock(&mu_);
  if (stream == open_) {
    open_ = nullptr;
    ended_ = std::move(status);
  }
  --live_streams_;
}

void HeartbeatSender::Wait(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopped_ || ended_.has_value();
  };
  mu_.AwaitWithTimeout(absl::Condition(&woken), timeout);
}

void HeartbeatSender::Stop() {
  absl::MutexLock lock(&mu_);
  stopped_ = true;
  if (open_ != nullptr) open_->context.TryCancel();
}

}  // namespace meshrun::services
