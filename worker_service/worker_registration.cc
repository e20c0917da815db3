// WorkerServer's side of membership: registering with the coordinator (its identity, devices
// and cached executables), heartbeats with job progress on a StreamHeartbeats stream, and what
// a refusal means (fenced: a fresh incarnation; forgotten: register again). Split from
// worker_server.cc, which keeps the RPC surface, draining and the job's end.
#include "worker_service/worker_server.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <fstream>
#include <string>

#include "absl/random/random.h"
#include "absl/strings/str_format.h"
#include "common/grpc_status.h"
#include "common/protocol.h"
#include "common/status_macros.h"
#include "rpc/channel_health.h"
#include "rpc/proto_convert.h"
#include "rpc/server_support.h"

namespace meshrun::services {
namespace {

// MemAvailable from /proc/meminfo, bytes; 0 when it cannot be read.
int64_t AvailableHostMemory() {
  std::ifstream meminfo("/proc/meminfo");
  std::string name;
  int64_t kib = 0;
  std::string unit;
  while (meminfo >> name >> kib >> unit) {
    if (name == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

}  // namespace

std::string WorkerServer::FreshIncarnation() {
  absl::BitGen gen;
  return absl::StrFormat("%016x%016x", absl::Uniform<uint64_t>(gen),
                         absl::Uniform<uint64_t>(gen));
}

absl::Status WorkerServer::Register() {
  v1::RegisterWorkerRequest request;
  v1::WorkerRegistration* registration = request.mutable_registration();
  registration->mutable_protocol()->set_version(kProtocolVersion);
  registration->set_host(config_.identity.host);
  registration->set_address(advertise_address_);
  registration->set_slice_id(config_.identity.slice_id);
  registration->set_num_slices(config_.identity.num_slices);
  registration->set_worker_index(config_.identity.worker_index);
  for (const std::string& name : config_.identity.slice_hostnames) {
    registration->add_slice_hostnames(name);
  }
  registration->set_incarnation(incarnation());
  registration->set_insecure(ServingInsecurely());
  registration->set_spare(config_.spare);
  registration->set_host_memory_bytes(config_.memory_checkpoint_bytes > 0
                                          ? config_.memory_checkpoint_bytes
                                          : AvailableHostMemory());
  if (runtime_ != nullptr) {
    *registration->mutable_runtime() = ToProto(runtime_->identity());
    for (const auto& device : runtime_->addressable_devices()) {
      *registration->add_devices() = ToProto(device);
    }
  }
  for (const std::string& fp : executables_->Fingerprints()) {
    registration->add_executable_fingerprints(fp);
  }
  v1::RegisterWorkerResponse response;
  auto context = ContextWithTimeout(config_.rpc_timeout);
  RETURN_IF_ERROR(FromGrpcStatus(coordinator_->RegisterWorker(context.get(), request, &response)));
  heartbeat_interval_millis_ = std::max<int64_t>(1, response.heartbeat_interval_millis());
  return absl::OkStatus();
}

absl::Status WorkerServer::Heartbeat() {
  v1::HeartbeatRequest request;
  request.set_host(config_.identity.host);
  request.set_incarnation(incarnation());
  {
    absl::MutexLock lock(&job_mu_);
    if (job_ != nullptr && !job_->loop->result().has_value()) {  // progress, for hang detection
      request.set_job_id(job_->job_id);
      request.set_last_completed_step(job_->loop->last_completed_step());
      request.set_phase(in_allreduce_ ? kPhaseGradientAllReduce : "compute");
    }
  }
  if (!unary_heartbeats_) {
    absl::Status status = heartbeats_->Beat(request);
    if (!absl::IsUnimplemented(status)) return status;
    spdlog::warn("the coordinator has no heartbeat stream ({}); heartbeating by call",
                 status.ToString());
    unary_heartbeats_ = true;
  }
  v1::HeartbeatResponse response;
  auto context = ContextWithTimeout(config_.rpc_timeout);
  return FromGrpcStatus(coordinator_->Heartbeat(context.get(), request, &response));
}

absl::Duration WorkerServer::UntilNextBeat() const {
  const absl::Duration interval = absl::Milliseconds(heartbeat_interval_millis_.load());
  const absl::Time now = absl::Now();
  return HeartbeatTick(now + interval, interval) - now;
}

void WorkerServer::RegistrationLoop() {
  absl::Duration backoff = absl::Milliseconds(100);
  int failures = 0;
  while (!stop_loop_.HasBeenNotified()) {
    absl::Duration wait;
    if (!registered_) {
      absl::Status status = Register();
      if (status.ok()) {
        registered_ = true;
        failures = 0;
        backoff = absl::Milliseconds(100);
        spdlog::info("registered with coordinator {} as incarnation {}", config_.coordinator,
                     incarnation());
        wait = UntilNextBeat();
      } else {
        // Log the first failure and then every tenth, so a long outage does not flood logs.
        if (failures++ % 10 == 0) {
          spdlog::warn("cannot register with coordinator {}: {} (retrying)", config_.coordinator,
                       status.ToString());
        }
        if (status.code() == absl::StatusCode::kAlreadyExists) {
          absl::MutexLock lock(&mu_);
          incarnation_ = FreshIncarnation();
        }
        wait = backoff;
        backoff = std::min(backoff * 2, absl::Seconds(5));
      }
    } else {
      absl::Status status = Heartbeat();
      if (absl::IsFailedPrecondition(status)) {
        // Declared dead (fenced): whatever this incarnation ran is no longer ours to finish.
        // (NOT_FOUND is a restarted coordinator, which resumes the running job: keep it.)
        absl::MutexLock lock(&job_mu_);
        if (job_ != nullptr && !job_->loop->result().has_value()) {
          spdlog::warn("declared dead by the coordinator; stopping job {}", job_->job_id);
          job_->loop->Cancel();
        }
      }
      if (absl::IsNotFound(status)) {
        spdlog::warn("coordinator forgot this worker ({}); registering again", status.ToString());
        registered_ = false;
      } else if (absl::IsFailedPrecondition(status)) {
        absl::MutexLock lock(&mu_);
        incarnation_ = FreshIncarnation();
        spdlog::warn("{}; registering as fresh incarnation {}", status.ToString(), incarnation_);
        registered_ = false;
      } else if (!status.ok()) {
        spdlog::warn("heartbeat failed: {}", status.ToString());
      }
      wait = registered_ ? UntilNextBeat() : absl::ZeroDuration();
    }
    if (registered_ && !unary_heartbeats_) {
      heartbeats_->Wait(wait);  // wakes early when the stream ends: a refusal is acted on at once
    } else {
      stop_loop_.WaitForNotificationWithTimeout(wait);
    }
  }
}

}  // namespace meshrun::services
