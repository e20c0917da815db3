#include "coordinator/coordinator_telemetry.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/natural_order.h"
#include "common/status_macros.h"
#include "coordinator/job_table.h"
#include "coordinator/worker_registry.h"
#include "runtime/compile_target.h"

namespace meshrun::services {

std::function<absl::Status(const std::string&, const std::string&)>
CoordinatorTelemetry::RegistryFence(coordinator::WorkerRegistry* registry) {
  return [registry](const std::string& host, const std::string& incarnation) {
    absl::Status s = registry->CheckCurrent(host, incarnation);
    return absl::IsNotFound(s) ? absl::OkStatus() : s;
  };
}

absl::StatusOr<std::unique_ptr<CoordinatorTelemetry>> CoordinatorTelemetry::Create(
    Config config) {
  std::unique_ptr<CoordinatorTelemetry> t(new CoordinatorTelemetry());
  t->admit_ = std::move(config.admit);
  t->max_poll_wait_ = std::clamp(config.grace, absl::Milliseconds(10), absl::Seconds(1));
  ASSIGN_OR_RETURN(t->stragglers_, coordinator::StragglerDetector::Create({}));
  ASSIGN_OR_RETURN(t->history_, telemetry::HistoryStore::Create(
                                   {.path = config.database,
                                    .max_age = config.history_max_age,
                                    .max_steps_per_job = config.history_max_steps}));
  ASSIGN_OR_RETURN(t->hub_, telemetry::WatchHub::Create({.history = t->history_.get(),
                                                         .watcher_capacity =
                                                             config.watcher_capacity}));
  CoordinatorTelemetry* self = t.get();
  ASSIGN_OR_RETURN(
      t->combiner_,
      telemetry::StepCombiner::Create(
          {.grace = config.grace,
           .sink = [self, on_nonfinite = std::move(config.on_nonfinite)](
                       v1::GlobalSummary summary) {
             // Committed first, so a watcher never sees a step that a restart of the
             // coordinator would lose; the acknowledgements wait for the commit's fsync, which
             // comes after publishing (docs/scale.md "Durable after publishing"). The host
             // summaries are set apart for it and put back, never copied.
             google::protobuf::RepeatedPtrField<v1::HostSummary> hosts;
             hosts.Swap(summary.mutable_host_detail());
             const absl::Status appended = self->history_->Append(
                 summary, hosts, telemetry::HistoryStore::Durability::kDeferred);
             if (!appended.ok()) {
               spdlog::error("telemetry history: {}", appended.ToString());
               return;
             }
             std::vector<std::string> acked;
             acked.reserve(hosts.size());
             for (const v1::HostSummary& host : hosts) acked.push_back(host.host());
             summary.mutable_host_detail()->Swap(&hosts);
             self->synced_acks_->Run(
                 [self, job_id = summary.job_id(), step = summary.step(),
                  acked = std::move(acked)] { self->AckCommitted(job_id, step, acked); });
             self->step_times_.Add(summary);
             if (on_nonfinite) self->NoteNonFinite(summary, on_nonfinite);
             if (absl::Status s = self->hub_->Publish(std::move(summary)); !s.ok()) {
               spdlog::warn("telemetry publish: {}", s.ToString());
             }
             // The log's checkpoint after publishing, where no watcher waits for it.
             if (absl::Status s = self->history_->CheckpointIfDue(); !s.ok()) {
               spdlog::warn("telemetry history: {}", s.ToString());
             }
           }}));
  // The acknowledgements of committed steps, once the history synced them.
  t->synced_acks_ =
      std::make_unique<AfterSync>([history = t->history_.get()] { return history->Sync(); });
  RETURN_IF_ERROR(t->Resume());
  t->poller_ = std::thread([self] { self->PollLoop(); });
  return t;
}

CoordinatorTelemetry::~CoordinatorTelemetry() {
  stop_.Notify();
  if (poller_.joinable()) poller_.join();
  synced_acks_.reset();  // its last acknowledgements use the routes and the history
}

void CoordinatorTelemetry::PollLoop() {
  // Sleeps until the earliest grace deadline, so an idle coordinator wakes about once a second
  // (a 50 ms tick was 20 wake-ups a second, a share of every heartbeat's cost at scale). A step
  // opened meanwhile expires `grace` after its first summary: waking at least every
  // min(grace, 1 s) never misses one.
  while (true) {
    absl::Duration wait = max_poll_wait_;
    if (const std::optional<absl::Time> next = combiner_->NextDeadline(); next.has_value()) {
      wait = std::clamp(*next - absl::Now(), absl::Milliseconds(10), wait);
    }
    if (stop_.WaitForNotificationWithTimeout(wait)) return;
    combiner_->Poll();
  }
}

absl::Status CoordinatorTelemetry::DeclareJob(const std::string& job_id, const v1::JobSpec& spec) {
  const std::vector<v1::TelemetryDeclaration> declarations(spec.telemetry().begin(),
                                                           spec.telemetry().end());
  std::vector<std::string> series;
  for (const auto& d : declarations) series.push_back(d.name());
  RETURN_IF_ERROR(history_->RegisterJob(job_id, declarations));
  return hub_->OpenJob(job_id, std::move(series));
}

namespace {
// What a coordinator restart needs to resume collecting a job, without the programs.
v1::JobManifest CollectionSetup(const v1::JobManifest& job) {
  v1::JobManifest setup;
  setup.set_job_id(job.job_id());
  *setup.mutable_host_incarnations() = job.host_incarnations();
  *setup.mutable_mesh() = job.mesh();
  *setup.mutable_attempts() = job.attempts();  // which run's summaries are taken
  *setup.mutable_spec()->mutable_telemetry() = job.spec().telemetry();
  setup.set_compile_target(job.compile_target());  // the rate and MFU in each summary
  setup.set_step_flops_per_device(job.step_flops_per_device());
  return setup;
}
}  // namespace

absl::Status CoordinatorTelemetry::StartJob(const v1::JobManifest& job) {
  const v1::JobManifest setup = CollectionSetup(job);
  SetRun(job.job_id(), job.attempts_size(), std::nullopt);
  step_times_.StartRun(job.job_id());
  RETURN_IF_ERROR(StartCombining(setup, 0));
  std::vector<std::string> hosts;
  for (const auto& [host, incarnation] : job.host_incarnations()) hosts.push_back(host);
  stragglers_->StartJob(job.job_id(), hosts);
  return history_->SetCollecting(job.job_id(), setup.SerializeAsString());
}

absl::Status CoordinatorTelemetry::RestartJob(const v1::JobManifest& job) {
  if (!combiner_->AbandonJob(job.job_id()).ok()) {
    return StartJob(job);  // the old run never started collecting
  }
  // The steps after the restored checkpoint run again: their old values go, and watchers are
  // told before the new ones come.
  const int64_t step = job.restored_step();
  SetRun(job.job_id(), job.attempts_size(), step);
  step_times_.StartRun(job.job_id());  // the old run's combine is abandoned: none of it comes
  ASSIGN_OR_RETURN(int64_t dropped, history_->Rewind(job.job_id(), step));
  v1::JobRewind rewind;
  rewind.set_attempt(job.attempts_size() + 1);
  if (job.attempts_size() > 0) {
    const v1::JobAttempt& ended = job.attempts(job.attempts_size() - 1);
    rewind.set_cause(ended.cause());
    rewind.set_host(ended.host());
    rewind.set_steps_lost(ended.steps_lost());
  }
  if (absl::Status s = hub_->Rewind(job.job_id(), step, std::move(rewind)); !s.ok()) {
    spdlog::warn("job {}: watchers not told of the rewind: {}", job.job_id(), s.ToString());
  }
  spdlog::info("telemetry of job {} rewound to step {} ({} summaries dropped)", job.job_id(),
               step, dropped);
  const v1::JobManifest setup = CollectionSetup(job);
  RETURN_IF_ERROR(StartCombining(setup, step));
  return history_->SetCollecting(job.job_id(), setup.SerializeAsString());
}

void CoordinatorTelemetry::SetRun(const std::string& job_id, int attempt,
                                  std::optional<int64_t> rewound_to) {
  absl::MutexLock l(&steps_mu_);
  run_[job_id] = attempt;
  if (rewound_to.has_value()) {
    int64_t& latest = latest_step_[job_id];
    latest = std::min(latest, *rewound_to);
  }
}

absl::Status CoordinatorTelemetry::StartCombining(const v1::JobManifest& job,
                                                  int64_t emitted_through_step) {
  telemetry::StepCombiner::JobSetup setup{.job_id = job.job_id(),
                                          .emitted_through_step = emitted_through_step};
  // Replicas per host: the data-parallel size spread over the job's hosts; host replicas each
  // run the whole mesh.
  const int hosts = std::max(1, job.host_incarnations_size());
  const int data = job.mesh().shape_size() > 0 ? job.mesh().shape(0) : 1;
  const int per_host = job.mesh().replica_hosts_size() > 1 ? data : std::max(1, data / hosts);
  std::map<std::string, std::string, NaturalOrder> ordered(job.host_incarnations().begin(),
                                                           job.host_incarnations().end());
  for (const auto& [host, incarnation] : ordered) {
    setup.hosts.push_back({.host = host, .replica_count = per_host});
  }
  setup.declarations = {job.spec().telemetry().begin(), job.spec().telemetry().end()};
  setup.step_flops_per_device = job.step_flops_per_device();
  if (!job.compile_target().empty()) {
    if (absl::StatusOr<runtime::CompileTarget> target =
            runtime::ParseCompileTarget(job.compile_target());
        target.ok()) {
      setup.peak_flops_per_device = target->chip.peak_bf16_flops;
    }
  }
  return combiner_->StartJob(std::move(setup));
}

absl::Status CoordinatorTelemetry::Resume() {
  ASSIGN_OR_RETURN(auto collecting, history_->Collecting());
  for (const auto& [job_id, bytes] : collecting) {
    // One job that cannot be resumed must not keep the coordinator down: its history stays.
    if (absl::Status s = ResumeJob(job_id, bytes); !s.ok()) {
      spdlog::error("telemetry of job {} not resumed: {}", job_id, s.ToString());
      combiner_->FinishJob(job_id).IgnoreError();
      hub_->EndJob(job_id).IgnoreError();
      RETURN_IF_ERROR(history_->ClearCollecting(job_id));
    }
  }
  return absl::OkStatus();
}

absl::Status CoordinatorTelemetry::ResumeJob(const std::string& job_id, const std::string& bytes) {
  v1::JobManifest job;
  if (!job.ParseFromString(bytes)) return absl::DataLossError("its stored setup does not parse");
  ASSIGN_OR_RETURN(int64_t latest, history_->LatestStep(job_id));
  std::vector<std::string> series;
  for (const auto& d : job.spec().telemetry()) series.push_back(d.name());
  RETURN_IF_ERROR(hub_->OpenJob(job_id, std::move(series)));
  SetRun(job_id, job.attempts_size(), std::nullopt);
  RETURN_IF_ERROR(StartCombining(job, latest));
  // Host summaries stored past the last combined step: only a history written before steps
  // were committed whole holds them (acknowledged then, so no worker resends them).
  ASSIGN_OR_RETURN(std::vector<v1::HostSummary> pending,
                   history_->ReadHostSummaries(job_id, latest));
  for (const v1::HostSummary& summary : pending) RETURN_IF_ERROR(combiner_->Add(summary).status());
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [host, incarnation] : job.host_incarnations()) resumed_[job_id].insert(host);
  }
  spdlog::info("telemetry of job {} resumed after step {} ({} host summaries pending)", job_id,
               latest, pending.size());
  return absl::OkStatus();
}

void CoordinatorTelemetry::EndJob(const std::string& job_id) {
  {
    absl::MutexLock l(&steps_mu_);
    run_.erase(job_id);
  }
  combiner_->FinishJob(job_id).IgnoreError();  // NOT_FOUND: never started collecting
  stragglers_->EndJob(job_id);
  hub_->EndJob(job_id).IgnoreError();
  if (absl::Status s = history_->ClearCollecting(job_id); !s.ok()) {
    spdlog::warn("telemetry of job {}: {}", job_id, s.ToString());
  }
}

absl::Status CoordinatorTelemetry::ForgetJob(const std::string& job_id, int64_t job_number) {
  EndJob(job_id);
  {
    absl::MutexLock l(&steps_mu_);
    latest_step_.erase(job_id);
  }
  {
    absl::MutexLock lock(&mu_);
    resumed_.erase(job_id);
  }
  step_times_.Forget(job_id);
  return history_->ForgetJob(job_id, job_number);
}

bool CoordinatorTelemetry::HostEnded(const std::string& job_id, const std::string& host) {
  {
    absl::MutexLock lock(&mu_);
    auto it = resumed_.find(job_id);
    if (it == resumed_.end()) return false;
    it->second.erase(host);
    if (!it->second.empty()) return true;
    resumed_.erase(it);
  }
  spdlog::info("telemetry of resumed job {} ended: every host reported its end", job_id);
  EndJob(job_id);
  return true;
}

absl::StatusOr<std::vector<std::string>> CoordinatorTelemetry::KnownJobs() const {
  ASSIGN_OR_RETURN(std::vector<telemetry::HistoryStore::JobInfo> jobs, history_->ListJobs());
  std::vector<std::string> ids;
  for (const auto& job : jobs) ids.push_back(job.job_id);
  ASSIGN_OR_RETURN(const int64_t forgotten, history_->HighestForgottenJob());
  if (forgotten > 0) ids.push_back(absl::StrCat("job-", forgotten));
  return ids;
}

int64_t CoordinatorTelemetry::RouteAcks(const std::string& host, AckFn ack) {
  absl::MutexLock l(&routes_mu_);
  const int64_t id = ++next_route_;
  routes_[host] = {id, std::move(ack)};
  return id;
}

void CoordinatorTelemetry::UnrouteAcks(const std::string& host, int64_t route) {
  absl::MutexLock l(&routes_mu_);
  if (auto it = routes_.find(host); it != routes_.end() && it->second.id == route) {
    routes_.erase(it);
  }
}

void CoordinatorTelemetry::AckCommitted(const std::string& job_id, int64_t step,
                                        const std::vector<std::string>& hosts) {
  absl::MutexLock l(&routes_mu_);
  for (const std::string& host : hosts) {
    if (auto it = routes_.find(host); it != routes_.end()) it->second.ack(job_id, step);
  }
}

absl::StatusOr<std::optional<int64_t>> CoordinatorTelemetry::Accept(v1::HostSummary summary) {
  // An empty incarnation is checked too: it is no registered host's, so a zombie or a spoof
  // cannot skip the fence by leaving it out.
  if (admit_) RETURN_IF_ERROR(admit_(summary.host(), summary.incarnation()));
  bool earlier_run = false;
  {
    absl::MutexLock l(&steps_mu_);
    auto run = run_.find(summary.job_id());
    earlier_run = run != run_.end() && summary.attempt() < run->second;
  }
  if (earlier_run) {
    // An earlier run's, sent before the worker heard of the restart: acknowledged (resending
    // it is useless) but not stored; the ack covers no step of the new run, and what it covers
    // is on disk.
    RETURN_IF_ERROR(history_->Sync());
    return history_->PersistedThroughStep(summary.job_id(), summary.host());
  }
  // The combiner keeps the summary itself when it takes it: what is read after, read now.
  const std::string job_id = summary.job_id(), host = summary.host();
  const int64_t step = summary.step();
  const double seconds =
      summary.compute_seconds() > 0 ? summary.compute_seconds() : summary.step_time_seconds();
  ASSIGN_OR_RETURN(telemetry::StepCombiner::AddOutcome outcome,
                   combiner_->Add(std::move(summary)));
  if (stragglers_->Observe(job_id, host, step, seconds)) {
    const std::vector<std::string> flagged = stragglers_->Flagged(job_id);
    spdlog::warn("job {}: stragglers at step {}: [{}]", job_id, step,
                 absl::StrJoin(flagged, ", "));
  }
  {
    absl::MutexLock l(&steps_mu_);
    int64_t& latest = latest_step_[job_id];
    latest = std::max(latest, step);
  }
  switch (outcome) {
    case telemetry::StepCombiner::AddOutcome::kAccepted:
      return std::nullopt;  // acknowledged when its step is committed (AckCommitted)
    case telemetry::StepCombiner::AddOutcome::kLate:
      return history_->AppendHost(summary);  // not taken: kept for the record, step partial
    case telemetry::StepCombiner::AddOutcome::kDuplicate:
      break;
  }
  // Resending is useless: what the host has committed so far, once it is on disk. A copy of a
  // step still pending is acknowledged with the step.
  RETURN_IF_ERROR(history_->Sync());
  return history_->PersistedThroughStep(job_id, host);
}

void CoordinatorTelemetry::NoteNonFinite(
    const v1::GlobalSummary& summary,
    const std::function<void(const std::string&, int64_t, const std::string&)>& report) {
  for (const v1::TelemetryValue& value : summary.values()) {
    if (value.values_size() != 1 || std::isfinite(value.values(0))) continue;
    {
      absl::MutexLock l(&steps_mu_);
      if (!nonfinite_noted_.insert(summary.job_id()).second) return;
    }
    report(summary.job_id(), summary.step(), value.name());
    return;
  }
}

int64_t CoordinatorTelemetry::LatestStep(const std::string& job_id) const {
  absl::MutexLock l(&steps_mu_);
  auto it = latest_step_.find(job_id);
  return it == latest_step_.end() ? 0 : it->second;
}

void CoordinatorTelemetry::ShowLiveStep(v1::JobManifest* job) const {
  if (jobspec::IsFinal(job->state())) return;  // the final report's step stands
  job->set_last_step(std::max(job->last_step(), LatestStep(job->job_id())));
}

}  // namespace meshrun::services
