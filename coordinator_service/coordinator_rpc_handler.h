// The Coordinator service's calls as plain methods over the coordinator's logic: what
// coordinator_server.cc adapts to gRPC and dashboard_api.cc serves as JSON.
#pragma once

#include <atomic>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "coordinator/coordinator_telemetry.h"
#include "coordinator/job_table.h"
#include "coordinator/key_value_store.h"
#include "coordinator/worker_registry.h"
#include "coordinator_service/coordinator_limits.h"
#include "coordinator_service/job_launcher.h"
#include "coordinator_service/job_membership.h"
#include "meshrun/v1/coordinator.pb.h"

namespace meshrun::services {

// A manifest as clients and the history see it: without the program bytes that were submitted.
v1::JobManifest WithoutPrograms(v1::JobManifest job);

// Maps Coordinator RPCs onto the logic classes; no gRPC types beyond the messages, so the
// gRPC adapter (coordinator_server.cc) and the HTTP API (dashboard_api.cc) answer alike.
//
// Lifetime: borrows the registry, key-value store, job table, launcher and telemetry, which
// must outlive it; CoordinatorServer owns all of them and builds the handler last.
// Thread-safety: every method may be called concurrently from any thread.
// Errors: each call returns what its RPC answers: INVALID_ARGUMENT naming a
// missing or malformed field; NOT_FOUND for an unknown job, worker or key; UNAVAILABLE while
// draining; FAILED_PRECONDITION from a stale incarnation or a job in the wrong state;
// RESOURCE_EXHAUSTED from a quota; the logic classes' errors unchanged. A failed call changes
// nothing.
class CoordinatorRpcHandler {
 public:
  CoordinatorRpcHandler(coordinator::WorkerRegistry* registry, coordinator::KeyValueStore* kv,
                        coordinator::JobTable* jobs, JobLauncher* launcher,
                        CoordinatorTelemetry* telemetry)
      : registry_(registry), kv_(kv), jobs_(jobs), launcher_(launcher), telemetry_(telemetry) {}

  CoordinatorTelemetry& telemetry() { return *telemetry_; }
  // security: which worker may touch which job's state.
  const JobMembership& membership() const { return membership_; }

  // Once set, registrations are refused with UNAVAILABLE.
  void SetDraining() { draining_ = true; }

  absl::Status GetSupportedVersions(const v1::GetSupportedVersionsRequest& request,
                                    v1::SupportedVersions* response);
  absl::Status RegisterWorker(const v1::RegisterWorkerRequest& request,
                              v1::RegisterWorkerResponse* response);
  absl::Status Heartbeat(const v1::HeartbeatRequest& request, v1::HeartbeatResponse* response);
  absl::Status DeregisterWorker(const v1::DeregisterWorkerRequest& request,
                                v1::DeregisterWorkerResponse* response);
  absl::Status ListWorkers(const v1::ListWorkersRequest& request,
                           v1::ListWorkersResponse* response);

  // `client` as ClientKey names the caller (rate limits); empty: not limited.
  absl::Status SubmitJob(const v1::SubmitJobRequest& request, v1::SubmitJobResponse* response,
                         const std::string& client = "");
  void SetAdmission(SubmitAdmission* admission) { admission_ = admission; }
  absl::Status GetJob(const v1::GetJobRequest& request, v1::JobManifest* response);
  absl::Status ListJobs(const v1::ListJobsRequest& request, v1::ListJobsResponse* response);
  absl::Status CancelJob(const v1::CancelJobRequest& request, v1::CancelJobResponse*);
  absl::Status ReportJobProgress(const v1::ReportJobProgressRequest& request,
                                 v1::ReportJobProgressResponse*);
  absl::Status ReportCheckpoint(const v1::ReportCheckpointRequest& request,
                                v1::ReportCheckpointResponse*) {
    return launcher_->ReportCheckpoint(request);
  }
  absl::Status CheckpointJob(const v1::CheckpointJobRequest& request,
                             v1::CheckpointJobResponse* response) {
    if (request.job_id().empty()) return absl::InvalidArgumentError("job_id is empty");
    ASSIGN_OR_RETURN(const int64_t step, launcher_->CheckpointNow(request.job_id()));
    response->set_step(step);
    return absl::OkStatus();
  }
  absl::Status PreemptJob(const v1::PreemptJobRequest& request, v1::PreemptJobResponse* response) {
    ASSIGN_OR_RETURN(const int64_t step, launcher_->Preempt(request));
    response->set_step(step);
    return absl::OkStatus();
  }

  // Ask the workers (bounded by a 5 s deadline each); the server runs these (and every call
  // that waits on disk or workers) off gRPC's callback threads (unary_reactor.h).
  absl::Status GetMetrics(const v1::GetMetricsRequest& request, v1::GetMetricsResponse* response);
  absl::Status GetDeviceMemory(const v1::GetDeviceMemoryRequest& request,
                               v1::GetDeviceMemoryResponse* response);
  // Relays Worker.Drain to the alive worker of request.host. Errors: INVALID_ARGUMENT (no
  // host), NOT_FOUND / FAILED_PRECONDITION (no alive worker of that name), the worker's.
  absl::Status DrainWorker(const v1::DrainWorkerRequest& request, v1::DrainWorkerResponse*);

  absl::Status KeyValueSet(const v1::KeyValueSetRequest& request, v1::KeyValueSetResponse*);
  absl::Status KeyValueTryGet(const v1::KeyValueGetRequest& request,
                              v1::KeyValueGetResponse* response);
  absl::Status KeyValueList(const v1::KeyValueListRequest& request,
                            v1::KeyValueListResponse* response);
  absl::Status KeyValueDelete(const v1::KeyValueDeleteRequest& request,
                              v1::KeyValueDeleteResponse*);
  // Waiting calls answer through `done`, on another thread, without holding a server thread.
  // Timeouts are capped at kMaxWait so a forgotten waiter cannot live forever.
  void KeyValueGet(const v1::KeyValueGetRequest& request,
                   std::function<void(absl::StatusOr<std::string>)> done);
  void WaitAtBarrier(const v1::WaitAtBarrierRequest& request,
                     std::function<void(absl::Status)> done);
  static constexpr absl::Duration kMaxWait = absl::Minutes(30);

 private:
  coordinator::WorkerRegistry* const registry_;
  coordinator::KeyValueStore* const kv_;
  coordinator::JobTable* const jobs_;
  JobLauncher* const launcher_;
  CoordinatorTelemetry* const telemetry_;
  const JobMembership membership_{registry_, jobs_};
  std::atomic<bool> draining_{false};
  SubmitAdmission* admission_ = nullptr;  // limits: rate, paths, program store; may be null
};

}  // namespace meshrun::services
