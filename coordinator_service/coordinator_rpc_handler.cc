// CoordinatorRpcHandler: the coordinator's unary RPCs (workers, jobs, metrics, key-value store,
// barriers), independent of gRPC's streaming reactors, which stay in coordinator_server.cc.
#include "coordinator_service/coordinator_rpc_handler.h"

#include <spdlog/spdlog.h>
#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <thread>
#include <utility>
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "checkpoint/store.h"
#include "common/background_tasks.h"
#include "common/grpc_status.h"
#include "common/natural_order.h"
#include "common/protocol.h"
#include "common/status_macros.h"
#include "coordinator/goodput.h"
#include "jobspec/job_validation.h"
#include "coordinator/mesh_planner.h"
#include "runtime/runtime_setup.h"
#include "coordinator_service/registry_proto.h"
#include "rpc/proto_convert.h"
#include "rpc/server_support.h"
#include "rpc/unary_reactor.h"

namespace meshrun::services {

absl::Status CoordinatorRpcHandler::GetSupportedVersions(const v1::GetSupportedVersionsRequest&,
                                                         v1::SupportedVersions* response) {
  response->set_min_version(kProtocolMinVersion);
  response->set_max_version(kProtocolMaxVersion);
  return absl::OkStatus();
}

absl::Status CoordinatorRpcHandler::RegisterWorker(const v1::RegisterWorkerRequest& request,
                                                   v1::RegisterWorkerResponse* response) {
  if (!request.has_registration()) {
    return absl::InvalidArgumentError("registration is missing");
  }
  RETURN_IF_ERROR(CheckProtocolVersion(request.registration().protocol().version()));
  if (draining_) return absl::UnavailableError("coordinator is draining; register elsewhere");
  coordinator::WorkerInfo info = FromProto(request.registration());
  RETURN_IF_ERROR(registry_->Register(info));
  spdlog::info("worker {} registered (incarnation {}, address {}, runtime {}, {} devices)",
               info.host, info.incarnation, info.address, runtime::ToString(info.runtime),
               info.devices.size());
  // Heartbeats carry job progress: with hang detection on, 4 reports per hang timeout.
  absl::Duration interval = registry_->heartbeat_interval();
  if (launcher_->hang_timeout() > absl::ZeroDuration()) {
    interval = std::min(interval, launcher_->hang_timeout() / 4);
  }
  response->set_heartbeat_interval_millis(absl::ToInt64Milliseconds(interval));
  response->set_heartbeat_timeout_millis(absl::ToInt64Milliseconds(registry_->heartbeat_timeout()));
  return absl::OkStatus();
}

absl::Status CoordinatorRpcHandler::Heartbeat(const v1::HeartbeatRequest& request,
                                              v1::HeartbeatResponse*) {
  if (request.host().empty()) return absl::InvalidArgumentError("host is empty");
  RETURN_IF_ERROR(registry_->Heartbeat(request.host(), request.incarnation()));
  if (!request.job_id().empty()) {
    launcher_->ReportProgress(request.host(), request.job_id(), request.last_completed_step(),
                              request.phase());
  }
  return absl::OkStatus();
}

absl::Status CoordinatorRpcHandler::DeregisterWorker(const v1::DeregisterWorkerRequest& request,
                                                     v1::DeregisterWorkerResponse*) {
  if (request.host().empty()) return absl::InvalidArgumentError("host is empty");
  RETURN_IF_ERROR(registry_->Deregister(request.host(), request.incarnation()));
  spdlog::info("worker {} left (incarnation {})", request.host(), request.incarnation());
  return absl::OkStatus();
}

namespace {

// A ListWorkers page token: the last worker of the page, as "<slice>/<host>" (the order List
// gives: by slice, then host name in natural order).
std::string WorkerPageToken(const coordinator::WorkerEntry& last) {
  return absl::StrCat(last.info.slice_id, "/", last.info.host);
}

// Whether `entry` comes after the worker `token` names, in List's order.
absl::StatusOr<std::function<bool(const coordinator::WorkerEntry&)>> AfterPageToken(
    const std::string& token) {
  const size_t slash = token.find('/');
  int slice = 0;
  if (slash == std::string::npos || !absl::SimpleAtoi(token.substr(0, slash), &slice)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page_token \"", token, "\" is not one this coordinator gave; pass the previous page's "
        "next_page_token, or none for the first page"));
  }
  return [slice, host = token.substr(slash + 1)](const coordinator::WorkerEntry& entry) {
    if (entry.info.slice_id != slice) return entry.info.slice_id > slice;
    return NaturalLess(host, entry.info.host);
  };
}

}  // namespace

absl::Status CoordinatorRpcHandler::ListWorkers(const v1::ListWorkersRequest& request,
                                                v1::ListWorkersResponse* response) {
  if (request.page_size() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page_size ", request.page_size(), " is negative; pass 0 for every worker at once"));
  }
  if (!v1::WorkerState_IsValid(request.state())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "state ", request.state(), " is no WorkerState; pass ALIVE, DEAD, LEFT or UNSPECIFIED"));
  }
  runtime::RuntimeIdentity pin;
  if (!request.job_id().empty()) {
    ASSIGN_OR_RETURN(v1::JobManifest job, jobs_->Get(request.job_id()));
    pin = FromProto(job.has_runtime() ? job.runtime() : job.spec().runtime_pin());
  }
  std::set<std::string> on_job;  // the hosts on_job_id's mesh places it on
  if (!request.on_job_id().empty()) {
    ASSIGN_OR_RETURN(v1::JobManifest job, jobs_->Get(request.on_job_id()));
    on_job.insert(job.mesh().device_hosts().begin(), job.mesh().device_hosts().end());
    on_job.insert(job.mesh().replica_hosts().begin(), job.mesh().replica_hosts().end());
  }
  std::function<bool(const coordinator::WorkerEntry&)> after_token;
  if (!request.page_token().empty()) {
    ASSIGN_OR_RETURN(after_token, AfterPageToken(request.page_token()));
  }
  const std::vector<coordinator::WorkerEntry> entries = registry_->List();
  std::vector<coordinator::WorkerInfo> alive;
  for (const coordinator::WorkerEntry& entry : entries) {
    if (entry.state == coordinator::WorkerState::kAlive) alive.push_back(entry.info);
  }
  std::map<std::string, std::string> excluded;  // host -> why the pin leaves it out
  for (const coordinator::HostExclusion& e : coordinator::PinRuntime(alive, pin).excluded) {
    excluded[e.host] = e.reason;
  }
  std::map<int, v1::SliceWorkers> slices;
  int matches = 0;
  const coordinator::WorkerEntry* last_listed = nullptr;
  for (const coordinator::WorkerEntry& entry : entries) {
    if (request.state() != v1::WORKER_STATE_UNSPECIFIED && ToProto(entry.state) != request.state()) {
      continue;
    }
    if (request.has_slice_id() && entry.info.slice_id != request.slice_id()) continue;
    if (!request.on_job_id().empty() && !on_job.contains(entry.info.host)) continue;
    ++matches;
    v1::SliceWorkers& slice = slices[entry.info.slice_id];
    slice.set_slice_id(entry.info.slice_id);
    switch (entry.state) {
      case coordinator::WorkerState::kAlive:
        slice.set_alive(slice.alive() + 1);
        slice.set_alive_devices(slice.alive_devices() + entry.info.devices.size());
        break;
      case coordinator::WorkerState::kDead: slice.set_dead(slice.dead() + 1); break;
      case coordinator::WorkerState::kLeft: slice.set_left(slice.left() + 1); break;
    }
    if (after_token && !after_token(entry)) continue;  // on an earlier page
    if (request.page_size() > 0 && response->workers_size() == request.page_size()) {
      response->set_next_page_token(WorkerPageToken(*last_listed));
      continue;
    }
    v1::WorkerStatus* status = response->add_workers();
    *status->mutable_registration() = ToProto(entry.info);
    status->set_state(ToProto(entry.state));
    status->set_last_heartbeat_unix_micros(absl::ToUnixMicros(entry.last_heartbeat));
    status->set_state_reason(entry.state_reason);
    auto reason = excluded.find(entry.info.host);
    if (reason != excluded.end()) status->set_exclusion_reason(reason->second);
    last_listed = &entry;
  }
  response->set_total_matches(matches);
  for (auto& [id, slice] : slices) *response->add_slices() = std::move(slice);
  return absl::OkStatus();
}

v1::JobManifest WithoutPrograms(v1::JobManifest job) {
  for (v1::Program& program : *job.mutable_spec()->mutable_programs()) {
    program.clear_stablehlo();
  }
  return job;
}

absl::Status CoordinatorRpcHandler::SubmitJob(const v1::SubmitJobRequest& request,
                                              v1::SubmitJobResponse* response,
                                              const std::string& client) {
  if (draining_) return absl::UnavailableError("coordinator is draining; submit elsewhere");
  // limits: the rate, and no path outside --data_root is opened below.
  if (admission_ != nullptr) RETURN_IF_ERROR(admission_->Admit(client, request.spec()));
  RETURN_IF_ERROR(jobspec::ValidateJobSpec(request.spec()));
  ASSIGN_OR_RETURN(v1::DataReceipt receipt,
                   jobspec::ReadDataReceipt(request.spec(), admission_ != nullptr
                                                                ? &admission_->roots()
                                                                : nullptr));
  ASSIGN_OR_RETURN(const int64_t restored_step, jobspec::RestoredStep(request.spec()));
  // limits: program bytes go to the program store, the job table keeps the spec without them.
  std::map<std::string, std::string> programs;
  if (admission_ != nullptr) {
    ASSIGN_OR_RETURN(programs, admission_->programs()->Write(request.spec()));
  }
  response->set_job_id(jobs_->Add(admission_ != nullptr
                                      ? coordinator::ProgramStore::Stripped(request.spec())
                                      : request.spec()));
  if (admission_ != nullptr) admission_->programs()->Bind(response->job_id(), std::move(programs));
  if (receipt.unchecked_layout()) {
    response->add_warnings(absl::StrCat(
        "data.array_file ", request.spec().data().array_file(),
        " has no header, so its arrays' names, dtypes and shapes were not checked against the "
        "program's batch inputs (a file written before typed array files): write it again with "
        "meshrun.data.write_arrays"));
  }
  if (const std::string& resume = request.spec().resume_from();
      !resume.empty() && !checkpoint::IsVerified(resume)) {
    response->add_warnings(absl::StrCat(
        "resume_from ", resume, " is an Orbax checkpoint (not verified): it has no meshrun "
        "manifest, so its chunks are restored without sha256 checks and the data position "
        "starts from the first batch"));
  }
  for (const std::string& warning : response->warnings()) {
    spdlog::warn("job {}: {}", response->job_id(), warning);
  }
  RETURN_IF_ERROR(jobs_->Update(response->job_id(), [&](v1::JobManifest& m) {
    *m.mutable_data_receipt() = std::move(receipt);
    m.set_restored_step(restored_step);
  }));
  if (!request.spec().telemetry().empty()) {
    RETURN_IF_ERROR(telemetry_->DeclareJob(response->job_id(), request.spec()));
  }
  spdlog::info("job {} ({}) submitted: {} steps", response->job_id(), request.spec().name(),
               request.spec().steps());
  launcher_->Launch(response->job_id());
  return absl::OkStatus();
}

absl::Status CoordinatorRpcHandler::GetJob(const v1::GetJobRequest& request,
                                           v1::JobManifest* response) {
  if (request.job_id().empty()) return absl::InvalidArgumentError("job_id is empty");
  ASSIGN_OR_RETURN(v1::JobManifest job, jobs_->Get(request.job_id()));
  *response = WithoutPrograms(std::move(job));
  if (telemetry_ != nullptr) {
    for (const std::string& host : telemetry_->Stragglers(request.job_id())) {
      response->add_straggler_hosts(host);
    }
  }
  telemetry_->ShowLiveStep(response);  // sdk: a running job's current step
  coordinator::FillGoodput(telemetry_->step_times(), absl::Now(), response);
  return absl::OkStatus();
}

absl::Status CoordinatorRpcHandler::ListJobs(const v1::ListJobsRequest&,
                                             v1::ListJobsResponse* response) {
  for (v1::JobManifest& job : jobs_->List()) {
    v1::JobManifest* listed = response->add_jobs();
    *listed = WithoutPrograms(job);
    if (telemetry_ == nullptr) continue;
    for (const std::string& host : telemetry_->Stragglers(job.job_id())) {
      listed->add_straggler_hosts(host);
    }
    telemetry_->ShowLiveStep(listed);  // sdk: a running job's current step
    coordinator::FillGoodput(telemetry_->step_times(), absl::Now(), listed);
  }
  return absl::OkStatus();
}

absl::Status CoordinatorRpcHandler::CancelJob(const v1::CancelJobRequest& request,
                                              v1::CancelJobResponse*) {
  if (request.job_id().empty()) return absl::InvalidArgumentError("job_id is empty");
  return launcher_->Cancel(request.job_id());
}

absl::Status CoordinatorRpcHandler::ReportJobProgress(const v1::ReportJobProgressRequest& request,
                                                      v1::ReportJobProgressResponse*) {
  if (request.job_id().empty() || request.host().empty()) {
    return absl::InvalidArgumentError("job_id and host must be set");
  }
  absl::Status status = launcher_->Report(request);
  // A job from before a coordinator restart: its telemetry was resumed and ends with its hosts.
  if (absl::IsNotFound(status) && jobspec::IsFinal(request.state())) {
    telemetry_->HostEnded(request.job_id(), request.host());
  }
  return status;
}

namespace {
// The address of an ALIVE host, or NOT_FOUND / UNAVAILABLE naming it.
absl::StatusOr<std::string> AliveAddress(coordinator::WorkerRegistry& registry,
                                         const std::string& host) {
  for (const coordinator::WorkerEntry& entry : registry.List()) {
    if (entry.info.host != host) continue;
    if (entry.state != coordinator::WorkerState::kAlive) {
      return absl::UnavailableError(absl::StrCat("host ", host, " is ",
                                                 coordinator::WorkerStateName(entry.state)));
    }
    return entry.info.address;
  }
  return absl::NotFoundError(absl::StrCat("host ", host, " is not registered"));
}
}  // namespace

absl::Status CoordinatorRpcHandler::GetMetrics(const v1::GetMetricsRequest& request,
                                               v1::GetMetricsResponse* response) {
  std::vector<std::pair<std::string, std::string>> hosts;  // host, address
  if (!request.host().empty()) {
    ASSIGN_OR_RETURN(std::string address, AliveAddress(*registry_, request.host()));
    hosts.emplace_back(request.host(), address);
  } else {
    for (const coordinator::WorkerEntry& entry : registry_->List()) {
      if (entry.state == coordinator::WorkerState::kAlive) {
        hosts.emplace_back(entry.info.host, entry.info.address);
      }
    }
  }
  // Every host at once, so one hung worker costs a scrape its 5 s deadline, not 5 s per host.
  std::vector<v1::WorkerStatusReport> statuses(hosts.size());
  std::vector<grpc::Status> rpcs(hosts.size());
  RunConcurrently(hosts.size(), [&](size_t i) {
    auto context = ContextWithTimeout(absl::Seconds(5));
    rpcs[i] = launcher_->channels()
                  .At(hosts[i].first, hosts[i].second)
                  ->GetStatus(context.get(), v1::GetStatusRequest(), &statuses[i]);
  });
  for (size_t i = 0; i < hosts.size(); ++i) {
    if (!rpcs[i].ok()) {
      if (!request.host().empty()) return FromGrpcStatus(rpcs[i]);
      continue;  // a host that just died is not the caller's problem in a cluster view
    }
    v1::HostMetrics* metrics = response->add_hosts();
    metrics->set_host(hosts[i].first);
    *metrics->mutable_metrics() = statuses[i].metrics();
  }
  return absl::OkStatus();
}

absl::Status CoordinatorRpcHandler::GetDeviceMemory(const v1::GetDeviceMemoryRequest& request,
                                                    v1::GetDeviceMemoryResponse* response) {
  if (request.host().empty()) return absl::InvalidArgumentError("host is empty; name a worker");
  ASSIGN_OR_RETURN(std::string address, AliveAddress(*registry_, request.host()));
  v1::WorkerDeviceMemoryRequest ask;
  ask.set_runtime_name(request.runtime_name());
  v1::WorkerDeviceMemoryResponse answer;
  auto context = ContextWithTimeout(absl::Seconds(5));
  RETURN_IF_ERROR(FromGrpcStatus(launcher_->channels()
                                     .At(request.host(), address)
                                     ->GetDeviceMemory(context.get(), ask, &answer)));
  *response->mutable_devices() = answer.devices();
  return absl::OkStatus();
}

absl::Status CoordinatorRpcHandler::DrainWorker(const v1::DrainWorkerRequest& request,
                                                v1::DrainWorkerResponse*) {
  if (request.host().empty()) return absl::InvalidArgumentError("host is empty; name a worker");
  ASSIGN_OR_RETURN(std::string address, AliveAddress(*registry_, request.host()));
  v1::DrainResponse answer;
  auto context = ContextWithTimeout(absl::Seconds(5));
  RETURN_IF_ERROR(FromGrpcStatus(launcher_->channels()
                                     .At(request.host(), address)
                                     ->Drain(context.get(), v1::DrainRequest(), &answer)));
  spdlog::info("worker {} asked to drain", request.host());
  return absl::OkStatus();
}

absl::Status CoordinatorRpcHandler::KeyValueSet(const v1::KeyValueSetRequest& request,
                                                v1::KeyValueSetResponse*) {
  return kv_->Set(request.key(), request.value(), request.allow_overwrite());
}

absl::Status CoordinatorRpcHandler::KeyValueTryGet(const v1::KeyValueGetRequest& request,
                                                   v1::KeyValueGetResponse* response) {
  ASSIGN_OR_RETURN(*response->mutable_value(), kv_->TryGet(request.key()));
  return absl::OkStatus();
}

absl::Status CoordinatorRpcHandler::KeyValueList(const v1::KeyValueListRequest& request,
                                                 v1::KeyValueListResponse* response) {
  if (request.directory().empty()) return absl::InvalidArgumentError("directory is empty");
  for (auto& [key, value] : kv_->List(request.directory())) {
    v1::KeyValueEntry* entry = response->add_entries();
    entry->set_key(key);
    entry->set_value(value);
  }
  return absl::OkStatus();
}

absl::Status CoordinatorRpcHandler::KeyValueDelete(const v1::KeyValueDeleteRequest& request,
                                                   v1::KeyValueDeleteResponse*) {
  return kv_->Delete(request.key());
}

namespace {
absl::StatusOr<absl::Duration> WaitTimeout(int64_t millis, const char* field) {
  if (millis < 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, " is negative; give milliseconds >= 0"));
  }
  return std::min(absl::Milliseconds(millis), CoordinatorRpcHandler::kMaxWait);
}
}  // namespace

void CoordinatorRpcHandler::KeyValueGet(const v1::KeyValueGetRequest& request,
                                        std::function<void(absl::StatusOr<std::string>)> done) {
  absl::StatusOr<absl::Duration> timeout = WaitTimeout(request.timeout_millis(), "timeout_millis");
  if (!timeout.ok()) return done(timeout.status());
  kv_->GetAsync(request.key(), absl::Now() + *timeout, std::move(done));
}

void CoordinatorRpcHandler::WaitAtBarrier(const v1::WaitAtBarrierRequest& request,
                                          std::function<void(absl::Status)> done) {
  absl::StatusOr<absl::Duration> timeout = WaitTimeout(request.timeout_millis(), "timeout_millis");
  if (!timeout.ok()) return done(timeout.status());
  kv_->WaitAtBarrier(request.barrier_id(), request.task(),
                     {request.tasks().begin(), request.tasks().end()}, absl::Now() + *timeout,
                     std::move(done));
}

}  // namespace meshrun::services
