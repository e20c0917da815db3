#include "services/coordinator_telemetry.h"

#include <spdlog/spdlog.h>

#include <map>

#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace meshrun::services {

absl::StatusOr<std::unique_ptr<CoordinatorTelemetry>> CoordinatorTelemetry::Create(
    Config config) {
  std::unique_ptr<CoordinatorTelemetry> t(new CoordinatorTelemetry());
  ASSIGN_OR_RETURN(t->history_, telemetry::HistoryStore::Create({.path = config.database}));
  ASSIGN_OR_RETURN(t->hub_, telemetry::WatchHub::Create({.history = t->history_.get(),
                                                         .watcher_capacity =
                                                             config.watcher_capacity}));
  CoordinatorTelemetry* self = t.get();
  ASSIGN_OR_RETURN(
      t->combiner_,
      telemetry::StepCombiner::Create(
          {.grace = config.grace, .sink = [self](v1::GlobalSummary summary) {
             // Committed first, so a watcher never sees a step that a restart would lose.
             if (absl::Status s = self->history_->Append(summary); !s.ok()) {
               spdlog::error("telemetry history: {}", s.ToString());
               return;
             }
             if (absl::Status s = self->hub_->Publish(summary); !s.ok()) {
               spdlog::warn("telemetry publish: {}", s.ToString());
             }
           }}));
  t->poller_ = std::thread([self] { self->PollLoop(); });
  return t;
}

CoordinatorTelemetry::~CoordinatorTelemetry() {
  stop_.Notify();
  if (poller_.joinable()) poller_.join();
}

void CoordinatorTelemetry::PollLoop() {
  // Grace deadlines are seconds long; a 50 ms tick keeps partial steps timely and cheap.
  while (!stop_.WaitForNotificationWithTimeout(absl::Milliseconds(50))) combiner_->Poll();
}

absl::Status CoordinatorTelemetry::DeclareJob(const std::string& job_id, const v1::JobSpec& spec) {
  const std::vector<v1::TelemetryDeclaration> declarations(spec.telemetry().begin(),
                                                           spec.telemetry().end());
  std::vector<std::string> series;
  for (const auto& d : declarations) series.push_back(d.name());
  RETURN_IF_ERROR(history_->RegisterJob(job_id, declarations));
  return hub_->OpenJob(job_id, std::move(series));
}

absl::Status CoordinatorTelemetry::StartJob(const v1::JobManifest& job) {
  telemetry::StepCombiner::JobSetup setup{.job_id = job.job_id()};
  // Replicas per host: the data-parallel size spread over the job's hosts.
  const int hosts = std::max(1, job.host_incarnations_size());
  const int data = job.mesh().shape_size() > 0 ? job.mesh().shape(0) : 1;
  std::map<std::string, std::string> ordered(job.host_incarnations().begin(),
                                             job.host_incarnations().end());
  for (const auto& [host, incarnation] : ordered) {
    setup.hosts.push_back({.host = host, .replica_count = std::max(1, data / hosts)});
  }
  setup.declarations = {job.spec().telemetry().begin(), job.spec().telemetry().end()};
  return combiner_->StartJob(std::move(setup));
}

void CoordinatorTelemetry::EndJob(const std::string& job_id) {
  combiner_->FinishJob(job_id).IgnoreError();  // NOT_FOUND: never started collecting
  hub_->EndJob(job_id).IgnoreError();
}

absl::StatusOr<int64_t> CoordinatorTelemetry::Accept(const v1::HostSummary& summary) {
  ASSIGN_OR_RETURN(telemetry::StepCombiner::AddOutcome outcome, combiner_->Add(summary));
  (void)outcome;  // duplicates and late summaries are acknowledged too: resending is useless
  return history_->AppendHost(summary);
}

}  // namespace meshrun::services
