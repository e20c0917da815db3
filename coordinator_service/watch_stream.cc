#include "coordinator_service/watch_stream.h"

#include <cstdint>
#include <memory>
#include <optional>
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

// Appends `item` to a GlobalSummaryBatch in its wire form: field 1 (length-delimited), the
// length as a varint, then the summary's bytes (the shared ones when the hub has them).
void AppendToBatch(const telemetry::Watcher::PopResult& item, std::string& batch) {
  std::string own;
  if (item.serialized == nullptr) own = item.summary->SerializeAsString();
  const std::string& bytes = item.serialized != nullptr ? *item.serialized : own;
  batch.push_back(static_cast<char>((1 << 3) | 2));
  uint64_t size = bytes.size();
  for (; size >= 0x80; size >>= 7) batch.push_back(static_cast<char>((size & 0x7f) | 0x80));
  batch.push_back(static_cast<char>(size));
  batch.append(bytes);
}

size_t SerializedSize(const telemetry::Watcher::PopResult& item) {
  return item.serialized != nullptr ? item.serialized->size() : item.summary->ByteSizeLong();
}

// A dashboard's watch, one write in flight. Once the queue ran empty, the hub's notifier
// thread wakes the reactor when more arrive; otherwise each OnWriteDone pulls the next on
// gRPC's own threads. With WatchFraming::kBatches a write takes what is queued, up to the
// batch limits.
class WatchStream final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  WatchStream(std::shared_ptr<telemetry::Watcher> watcher, IdentitySlots::Slot slot,
              WatchFraming framing, TokenRecheck recheck)
      : watcher_(std::move(watcher)),
        slot_(std::move(slot)),
        framing_(framing),
        recheck_(std::move(recheck)) {
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
    {
      absl::MutexLock lock(&mu_);
      if (writing_ || finished_) return;
      if (cancelled_) return FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
      // A revoked token ends the stream before it delivers anything more.
      if (absl::Status still = recheck_.Check(); !still.ok()) {
        return FinishLocked(ToGrpcStatus(still));
      }
      std::optional<absl::Status> end;
      const bool write =
          framing_ == WatchFraming::kBatches ? TakeBatchLocked(end) : TakeOneLocked(end);
      if (!write) {
        if (end.has_value()) FinishLocked(ToGrpcStatus(*end));
        return;
      }
      writing_ = true;
    }
    // Outside mu_ (gRPC takes its own locks): while writing_, nothing else touches out_ or
    // finishes the stream until OnWriteDone.
    StartWrite(&out_);
  }

  // Each returns true with the next write in out_, or false: nothing now (the hub wakes us)
  // or, with `end` set, the stream is over.
  bool TakeOneLocked(std::optional<absl::Status>& end) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    telemetry::Watcher::PopResult next = watcher_->TryPop();
    if (next.kind == telemetry::Watcher::Kind::kEnd) end = next.status;
    if (next.kind != telemetry::Watcher::Kind::kItem) return false;
    out_ = ToByteBuffer(next);
    return true;
  }
  bool TakeBatchLocked(std::optional<absl::Status>& end) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::string batch;
    int count = 0;
    if (held_.has_value()) {
      AppendToBatch(*held_, batch);
      held_.reset();
      ++count;
    }
    while (count < kMaxBatchSummaries) {
      telemetry::Watcher::PopResult next = watcher_->TryPop();
      // The end after some items waits for the next Pump: TryPop keeps returning it.
      if (next.kind == telemetry::Watcher::Kind::kEnd && count == 0) end = next.status;
      if (next.kind != telemetry::Watcher::Kind::kItem) break;
      if (count > 0 && batch.size() + SerializedSize(next) > kMaxBatchBytes) {
        held_ = std::move(next);  // opens the next batch
        break;
      }
      AppendToBatch(next, batch);
      ++count;
    }
    if (count == 0) return false;
    grpc::Slice slice(std::move(batch));
    out_ = grpc::ByteBuffer(&slice, 1);
    return true;
  }

  void FinishLocked(grpc::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    Finish(status);
  }

  // The hub reads history 64 rows at a time: a batch costs at most two reads.
  static constexpr int kMaxBatchSummaries = 64;
  // Well under gRPC's default 4 MiB receive limit; a larger summary still goes, alone.
  static constexpr size_t kMaxBatchBytes = 1 << 20;

  std::shared_ptr<telemetry::Watcher> watcher_;
  IdentitySlots::Slot slot_;  // limits: counts this stream against --max_watch_streams
  const WatchFraming framing_;
  TokenRecheck recheck_;  // the caller's bearer token, re-checked before each write
  absl::Mutex mu_;
  grpc::ByteBuffer out_ ABSL_GUARDED_BY(mu_);  // the write in flight
  // Popped but past the batch's size: the first summary of the next batch.
  std::optional<telemetry::Watcher::PopResult> held_ ABSL_GUARDED_BY(mu_);
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
    absl::StatusOr<IdentitySlots::Slot> slot, WatchFraming framing, TokenRecheck recheck) {
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
  return new WatchStream(std::move(*watcher), std::move(*slot), framing, std::move(recheck));
}

}  // namespace meshrun::services
