#include "services/telemetry_uploader.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "absl/time/clock.h"
#include "services/server_support.h"

namespace meshrun::services {

TelemetryUploader::TelemetryUploader(Config config)
    : config_(std::move(config)), stub_(v1::Coordinator::NewStub(
          config_.credentials != nullptr
              ? grpc::CreateChannel(config_.coordinator, config_.credentials)
              : MakeCoordinatorChannel(config_.coordinator))) {
  sender_ = std::thread([this] { SendLoop(); });
}

TelemetryUploader::~TelemetryUploader() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    if (stream_context_ != nullptr) stream_context_->TryCancel();
  }
  sender_.join();
}

void TelemetryUploader::Enqueue(v1::HostSummary summary) {
  absl::MutexLock lock(&mu_);
  if (queue_.size() >= config_.capacity) {
    queue_.pop_front();
    if (dropped_++ % 100 == 0) {
      spdlog::warn("telemetry queue full ({} summaries): dropping the oldest ({} so far)",
                   config_.capacity, dropped_);
    }
  }
  queue_.push_back({std::move(summary), false});
}

void TelemetryUploader::DropEarlierRuns(const std::string& job_id, int attempt) {
  absl::MutexLock lock(&mu_);
  queue_.erase(std::remove_if(queue_.begin(), queue_.end(),
                              [&](const Entry& e) {
                                return e.summary.job_id() == job_id &&
                                       e.summary.attempt() < attempt;
                              }),
               queue_.end());
}

int64_t TelemetryUploader::dropped() const {
  absl::MutexLock lock(&mu_);
  return dropped_;
}

bool TelemetryUploader::HasUnsentLocked() const {
  return std::any_of(queue_.begin(), queue_.end(), [](const Entry& e) { return !e.sent; });
}

bool TelemetryUploader::Flush(const std::string& job_id, absl::Duration timeout) {
  auto acknowledged = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || std::none_of(queue_.begin(), queue_.end(), [&](const Entry& e) {
             return e.summary.job_id() == job_id;
           });
  };
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&acknowledged), timeout) && !stop_;
}

void TelemetryUploader::SendLoop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || HasUnsentLocked();
      };
      mu_.Await(absl::Condition(&ready));
      if (stop_) return;
    }
    RunStream();
    absl::MutexLock lock(&mu_);
    for (Entry& e : queue_) e.sent = false;  // resend what was not acknowledged
    auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
    mu_.AwaitWithTimeout(absl::Condition(&stopping), config_.reconnect_delay);
  }
}

void TelemetryUploader::RunStream() {
  grpc::ClientContext context;
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return;
    stream_context_ = &context;
  }
  auto stream = stub_->UploadTelemetry(&context);
  // Acks arrive on their own thread: each drops the job's summaries up to the persisted step.
  std::thread reader([&] {
    v1::UploadTelemetryAck ack;
    while (stream->Read(&ack)) {
      absl::MutexLock lock(&mu_);
      queue_.erase(std::remove_if(queue_.begin(), queue_.end(),
                                  [&](const Entry& e) {
                                    return e.sent && e.summary.job_id() == ack.job_id() &&
                                           e.summary.step() <= ack.persisted_through_step();
                                  }),
                   queue_.end());
    }
    absl::MutexLock lock(&mu_);
    stop_reading_ = true;
  });
  while (true) {
    v1::HostSummary next;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || stop_reading_ || HasUnsentLocked();
      };
      mu_.Await(absl::Condition(&ready));
      if (stop_ || stop_reading_) break;
      auto it = std::find_if(queue_.begin(), queue_.end(), [](const Entry& e) { return !e.sent; });
      it->sent = true;
      next = it->summary;
    }
    if (!stream->Write(next)) break;
  }
  stream->WritesDone();
  context.TryCancel();
  reader.join();
  grpc::Status status = stream->Finish();
  absl::MutexLock lock(&mu_);
  stream_context_ = nullptr;
  stop_reading_ = false;
  if (stop_ || status.error_code() == grpc::StatusCode::CANCELLED) return;
  const bool refused = status.error_code() == grpc::StatusCode::INVALID_ARGUMENT ||
                       status.error_code() == grpc::StatusCode::NOT_FOUND ||
                       status.error_code() == grpc::StatusCode::FAILED_PRECONDITION;
  if (refused) {
    // The coordinator handles summaries in order, so the refused one is the oldest sent and
    // unacknowledged: resending it would be refused forever.
    auto it = std::find_if(queue_.begin(), queue_.end(), [](const Entry& e) { return e.sent; });
    if (it != queue_.end()) {
      spdlog::warn("telemetry of job {} step {} refused: {}", it->summary.job_id(),
                   it->summary.step(), status.error_message());
      queue_.erase(it);
      ++dropped_;
    }
    return;
  }
  spdlog::warn("telemetry stream to {} ended: {} (reconnecting)", config_.coordinator,
               status.error_message());
}

}  // namespace meshrun::services
