#include "services/watch_stream.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"
#include "meshrun/v1/coordinator.pb.h"

namespace meshrun::services {
namespace {

// The summary as one slice: the shared serialized bytes (kept alive by the slice), or this
// watcher's own serialization of a shaped copy or history row.
grpc::ByteBuffer ToByteBuffer(const telemetry::Watcher::PopResult& item) {
  if (item.serialized != nullptr) {
    auto* keep = new std::shared_ptr<const std::string>(item.serialized);
    grpc::Slice slice(const_cast<char*>((*keep)->data()), (*keep)->size(),
                      [](void* p) { delete static_cast<std::shared_ptr<const std::string>*>(p); },
                      keep);
    return grpc::ByteBuffer(&slice, 1);
  }
  std::string bytes = item.summary->SerializeAsString();
  grpc::Slice slice(std::move(bytes));
  return grpc::ByteBuffer(&slice, 1);
}

// A dashboard's watch, one write in flight. Once the queue ran empty, the hub's notifier
// thread wakes the reactor when more arrive; otherwise each OnWriteDone pulls the next on
// gRPC's own threads.
class WatchStream final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  WatchStream(std::shared_ptr<telemetry::Watcher> watcher, StreamSlots::Slot slot)
      : watcher_(std::move(watcher)), slot_(std::move(slot)) {
    watcher_->SetNotify([this] { Pump(); });
    Pump();
  }

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) return FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "watcher gone"));
    }
    Pump();
  }
  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    if (!writing_) FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "watcher cancelled"));
  }
  void OnDone() override {
    watcher_->SetNotify(nullptr);  // after this the hub never calls Pump again
    delete this;
  }

 private:
  void Pump() {
    grpc::ByteBuffer* write = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (writing_ || finished_) return;
      if (cancelled_) return FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
      telemetry::Watcher::PopResult next = watcher_->TryPop();
      switch (next.kind) {
        case telemetry::Watcher::Kind::kItem:
          out_ = ToByteBuffer(next);
          writing_ = true;
          write = &out_;
          break;
        case telemetry::Watcher::Kind::kEmpty:
          return;
        case telemetry::Watcher::Kind::kEnd:
          return FinishLocked(ToGrpcStatus(next.status));
      }
    }
    // Outside mu_ (gRPC takes its own locks): while writing_, nothing else touches out_ or
    // finishes the stream until OnWriteDone.
    StartWrite(write);
  }
  void FinishLocked(grpc::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    Finish(status);
  }

  std::shared_ptr<telemetry::Watcher> watcher_;
  StreamSlots::Slot slot_;  // limits: counts this stream against --max_watch_streams
  absl::Mutex mu_;
  grpc::ByteBuffer out_ ABSL_GUARDED_BY(mu_);  // the write in flight
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

// A reactor that only reports a refusal.
class Refusal final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  explicit Refusal(const absl::Status& status) { Finish(ToGrpcStatus(status)); }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* StartWatchStream(
    telemetry::WatchHub& hub, const grpc::ByteBuffer& request,
    absl::StatusOr<StreamSlots::Slot> slot) {
  if (!slot.ok()) return new Refusal(slot.status());
  v1::WatchTelemetryRequest parsed;
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (request.Dump(&slices).ok()) {
    for (const grpc::Slice& s : slices) {
      bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
  }
  absl::StatusOr<std::shared_ptr<telemetry::Watcher>> watcher =
      !parsed.ParseFromString(bytes)
          ? absl::InvalidArgumentError("WatchTelemetryRequest does not parse")
      : parsed.job_id().empty()
          ? absl::InvalidArgumentError("job_id is empty")
          : hub.Subscribe({.job_id = parsed.job_id(),
                           .since_step = parsed.since_step(),
                           .names = {parsed.names().begin(), parsed.names().end()},
                           .host_detail = parsed.host_detail(),
                           .history_only = parsed.history_only()});
  if (!watcher.ok()) return new Refusal(watcher.status());
  return new WatchStream(std::move(*watcher), std::move(*slot));
}

}  // namespace meshrun::services
