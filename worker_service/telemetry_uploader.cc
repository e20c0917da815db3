#include "worker_service/telemetry_uploader.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "absl/time/clock.h"
#include "rpc/server_support.h"

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

void TelemetryUploader::UseRelay(const std::string& host, const std::string& address) {
  absl::MutexLock lock(&mu_);
  if (address == relay_address_ && host == relay_host_) return;
  relay_host_ = host;
  relay_address_ = address;
  relay_stub_.reset();
  if (!address.empty()) {
    relay_stub_ = v1::Worker::NewStub(config_.credentials != nullptr
                                          ? grpc::CreateChannel(address, config_.credentials)
                                          : MakeWorkerChannel(address, host));
  }
  if (stream_context_ != nullptr) {
    switching_ = true;
    stream_context_->TryCancel();
  }
}

std::unique_ptr<TelemetryUploader::SummaryStream> TelemetryUploader::OpenStream(
    grpc::ClientContext* context, bool* via_relay) {
  absl::MutexLock lock(&mu_);
  *via_relay = relay_stub_ != nullptr;
  return *via_relay ? relay_stub_->RelayTelemetry(context) : stub_->UploadTelemetry(context);
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
    const bool refused = RunStream();
    absl::MutexLock lock(&mu_);
    for (Entry& e : queue_) e.sent = false;  // resend what was not acknowledged
    if (refused) continue;  // the coordinator is there: no reason to wait
    auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
    mu_.AwaitWithTimeout(absl::Condition(&stopping), config_.reconnect_delay);
  }
}

bool TelemetryUploader::RunStream() {
  grpc::ClientContext context;
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return false;
    stream_context_ = &context;
  }
  bool via_relay = false;
  std::unique_ptr<SummaryStream> stream = OpenStream(&context, &via_relay);
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
  // Cancel only to stop: a stream the server ended (its reads done) or that failed a write has
  // its status already, and a cancel would turn a refusal into CANCELLED, so the refused
  // summary would be resent, refused again, forever, holding back every later summary.
  {
    absl::MutexLock lock(&mu_);
    if (stop_) context.TryCancel();
  }
  reader.join();
  grpc::Status status = stream->Finish();
  absl::MutexLock lock(&mu_);
  stream_context_ = nullptr;
  stop_reading_ = false;
  if (switching_) {  // UseRelay: on to the new side at once
    switching_ = false;
    return true;
  }
  // A relay's stream cancelled by the relay (it is stopping) falls back below, as a failure.
  if (stop_ || (status.error_code() == grpc::StatusCode::CANCELLED && !via_relay)) return false;
  const bool refused = status.error_code() == grpc::StatusCode::INVALID_ARGUMENT ||
                       status.error_code() == grpc::StatusCode::NOT_FOUND ||
                       status.error_code() == grpc::StatusCode::FAILED_PRECONDITION;
  if (refused) {
    // The coordinator handles summaries in order, so the refused one is the oldest sent and
    // unacknowledged: resending it would be refused forever. NOT_FOUND and FAILED_PRECONDITION
    // refuse its job (no longer collecting, e.g. cancelled, or this incarnation fenced): the
    // job's later summaries would be refused one reconnect at a time, holding back other jobs'.
    auto it = std::find_if(queue_.begin(), queue_.end(), [](const Entry& e) { return e.sent; });
    if (it != queue_.end()) {
      const std::string job_id = it->summary.job_id();
      const bool whole_job = status.error_code() != grpc::StatusCode::INVALID_ARGUMENT;
      spdlog::warn("telemetry of job {} step {} refused: {}{}", job_id, it->summary.step(),
                   status.error_message(), whole_job ? " (dropping the job's queued summaries)" : "");
      const size_t before = queue_.size();
      if (whole_job) {
        queue_.erase(std::remove_if(queue_.begin(), queue_.end(),
                                    [&](const Entry& e) { return e.summary.job_id() == job_id; }),
                     queue_.end());
      } else {
        queue_.erase(it);
      }
      dropped_ += static_cast<int64_t>(before - queue_.size());
      return true;
    }
    return false;
  }
  if (via_relay && relay_stub_ != nullptr) {
    spdlog::warn("telemetry relay {} at {} failed: {} (uploading to the coordinator instead)",
                 relay_host_, relay_address_, status.error_message());
    relay_stub_.reset();
    relay_host_.clear();  // the next job's UseRelay tries it again
    relay_address_.clear();
    return true;
  }
  spdlog::warn("telemetry stream to {} ended: {} (reconnecting)", config_.coordinator,
               status.error_message());
  return false;
}

}  // namespace meshrun::services
