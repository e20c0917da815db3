#include "coordinator_service/heartbeat_stream.h"

#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "rpc/tls_credentials.h"

namespace meshrun::services {

// One worker's stream, driven by Run's thread alone. A read and a write may be in flight at
// once, never two of either; the call is deleted once it finished and nothing is in flight.
class HeartbeatStreams::Call {
 public:
  enum class Op { kAccept, kRead, kWrite, kFinish };
  struct Tag {
    Call* call;
    Op op;
  };

  // Asks for the next worker's stream; HeartbeatStreams::RequestNext only, its queue open.
  explicit Call(HeartbeatStreams* owner) : owner_(owner) {
    ++in_flight_;
    owner_->request_(&context_, &stream_, owner_->queue_, &accept_);
  }

  // Handles one completed operation; false when the call is done and may be deleted.
  bool Proceed(Op op, bool ok) {
    --in_flight_;
    switch (op) {
      case Op::kAccept:
        if (!ok) return false;  // the server shuts down
        owner_->RequestNext();  // the next worker's stream
        Accepted();
        break;
      case Op::kRead:
        if (!ok) {
          FinishWhenIdle(grpc::Status::OK);  // the worker closed its side, or went away
        } else if (absl::Status judged = Judge(); !judged.ok()) {
          FinishWhenIdle(ToGrpcStatus(judged));
        } else {
          if (beat_.ack()) {
            ++acks_owed_;
            WriteAck();
          }
          Read();
        }
        break;
      case Op::kWrite:
        writing_ = false;
        if (!ok) acks_owed_ = 0;  // the worker is gone; its read ends too
        WriteAck();
        if (ending_.has_value() && !writing_) Finish();
        break;
      case Op::kFinish:
        break;
    }
    // Once the queue is shut down no operation starts (StartOp): a call is done when none
    // is in flight, finished or not.
    return in_flight_ > 0 || (!finished_ && !owner_->QueueShutDown());
  }

 private:
  void Accepted() {
    absl::StatusOr<IdentitySlots::Slot> slot = owner_->slots_->Acquire(PeerIdentity(context_));
    if (!slot.ok()) {
      FinishWhenIdle(ToGrpcStatus(slot.status()));
      return;
    }
    slot_ = std::move(*slot);
    Read();
  }
  absl::Status Judge() {
    if (host_.empty()) {  // the first beat names the stream's member, so the certificate is
      RETURN_IF_ERROR(CheckWorkerHost(context_, beat_.host()));  // checked once
      host_ = beat_.host();
      incarnation_ = beat_.incarnation();
    } else if (beat_.host() != host_ || beat_.incarnation() != incarnation_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "this heartbeat stream is host ", host_, " incarnation ", incarnation_,
          "'s, but a beat names host ", beat_.host(), " incarnation ", beat_.incarnation(),
          "; open a new stream for a new incarnation"));
    }
    return owner_->handler_->Heartbeat(beat_, nullptr);
  }
  void Read() {
    if (owner_->StartOp([&] { stream_.Read(&beat_, &read_); })) ++in_flight_;
  }
  void WriteAck() {
    if (writing_ || acks_owed_ == 0 || ending_.has_value()) return;
    if (!owner_->StartOp([&] { stream_.Write(ack_, &write_); })) return;
    --acks_owed_;
    writing_ = true;
    ++in_flight_;
  }
  // Ends the stream with `status` once no write is in flight (gRPC allows one at a time).
  void FinishWhenIdle(grpc::Status status) {
    ending_ = std::move(status);
    if (!writing_) Finish();
  }
  void Finish() {
    if (finished_) return;
    finished_ = true;
    if (owner_->StartOp([&] { stream_.Finish(*ending_, &finish_); })) ++in_flight_;
  }

  HeartbeatStreams* const owner_;
  grpc::ServerContext context_;
  Stream stream_{&context_};
  Tag accept_{this, Op::kAccept}, read_{this, Op::kRead}, write_{this, Op::kWrite},
      finish_{this, Op::kFinish};
  IdentitySlots::Slot slot_;
  v1::HeartbeatRequest beat_;
  const v1::HeartbeatResponse ack_;
  std::string host_;         // of the first beat
  std::string incarnation_;  // of the first beat
  int in_flight_ = 0;
  int64_t acks_owed_ = 0;
  bool writing_ = false;
  std::optional<grpc::Status> ending_;  // how the stream ends, once it is to
  bool finished_ = false;
};

void HeartbeatStreams::RequestNext() {
  absl::MutexLock lock(&mu_);
  if (!queue_shut_down_) new Call(this);
}

bool HeartbeatStreams::StartOp(const std::function<void()>& start) {
  absl::MutexLock lock(&mu_);
  if (queue_shut_down_) return false;
  start();
  return true;
}

bool HeartbeatStreams::QueueShutDown() const {
  absl::MutexLock lock(&mu_);
  return queue_shut_down_;
}

void HeartbeatStreams::ShutdownQueue() {
  absl::MutexLock lock(&mu_);
  queue_shut_down_ = true;
  queue_->Shutdown();
}

void HeartbeatStreams::Run() {
  RequestNext();
  void* tag = nullptr;
  bool ok = false;
  while (queue_->Next(&tag, &ok)) {
    auto* done = static_cast<Call::Tag*>(tag);
    if (!done->call->Proceed(done->op, ok)) delete done->call;
  }
}

}  // namespace meshrun::services
