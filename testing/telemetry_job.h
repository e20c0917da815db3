// A job declared straight on the coordinator's telemetry path, with no workers: one series
// "loss" (combine mean) from one host "h0", for tests of watch streams and the dashboard.
// Header-only; tests only.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "coordinator/coordinator_telemetry.h"
#include "meshrun/v1/coordinator.pb.h"

namespace meshrun::testing {

// Declares and starts `job_id`. Errors: CoordinatorTelemetry::DeclareJob's and StartJob's.
inline absl::Status StartLossJob(services::CoordinatorTelemetry& telemetry,
                                 const std::string& job_id) {
  v1::JobManifest job;
  job.set_job_id(job_id);
  v1::TelemetryDeclaration* loss = job.mutable_spec()->add_telemetry();
  loss->set_name("loss");
  loss->set_combine(v1::COMBINE_MEAN);
  job.mutable_mesh()->add_shape(1);
  (*job.mutable_host_incarnations())["h0"] = "i0";
  if (absl::Status s = telemetry.DeclareJob(job_id, job.spec()); !s.ok()) return s;
  return telemetry.StartJob(job);
}

// h0's summary of `step`: loss = `loss`, which is then the step's global summary.
// Errors: CoordinatorTelemetry::Accept's.
inline absl::Status SendLoss(services::CoordinatorTelemetry& telemetry, const std::string& job_id,
                             int64_t step, float loss) {
  v1::HostSummary summary;
  summary.set_job_id(job_id);
  summary.set_step(step);
  summary.set_host("h0");
  summary.set_replica_count(1);
  v1::TelemetryValue* value = summary.add_values();
  value->set_name("loss");
  value->add_values(loss);
  return telemetry.Accept(summary).status();
}

}  // namespace meshrun::testing
