#include "worker_service/host_summary_proto.h"

namespace meshrun::services {

v1::HostSummary ToProto(const worker::HostStepSummary& summary) {
  v1::HostSummary out;
  out.set_job_id(summary.job_id);
  out.set_step(summary.step);
  out.set_host(summary.host);
  out.set_replica_count(summary.replica_count);
  for (const worker::TelemetryValue& v : summary.values) {
    v1::TelemetryValue* value = out.add_values();
    value->set_name(v.name);
    value->mutable_shape()->Add(v.shape.begin(), v.shape.end());
    value->mutable_values()->Add(v.values.begin(), v.values.end());
    value->set_threshold_exceeded(v.threshold_exceeded);
  }
  out.set_step_time_seconds(absl::ToDoubleSeconds(summary.step_time));
  out.set_data_wait_seconds(absl::ToDoubleSeconds(summary.data_wait));
  out.set_wall_time_unix_micros(absl::ToUnixMicros(summary.wall_time));
  out.set_synthetic_data(summary.synthetic_data);
  return out;
}

}  // namespace meshrun::services
