#include "coordinator/start_job_manifest.h"

namespace meshrun::coordinator {

StartJobManifests::StartJobManifests(const v1::JobManifest& job) : shared_(job) {
  incarnations_.swap(*shared_.mutable_host_incarnations());
  runtime_versions_.swap(*shared_.mutable_host_runtime_versions());
  v1::MeshAssignment& mesh = *shared_.mutable_mesh();
  slices_.swap(*mesh.mutable_host_slices());
  for (v1::HostEnvironment& environment : *mesh.mutable_megascale()) {
    megascale_[environment.host()] = std::move(environment);
  }
  mesh.clear_megascale();
  // The run history: a worker needs only the count of earlier runs (its attempt number).
  for (v1::JobAttempt& attempt : *shared_.mutable_attempts()) attempt.Clear();
  shared_.clear_checkpoints();
  shared_.clear_straggler_hosts();
  shared_.clear_goodput();
  shared_.clear_state_entered_unix_micros();
}

v1::JobManifest StartJobManifests::ForHost(const std::string& host) const {
  v1::JobManifest out = shared_;
  if (auto it = incarnations_.find(host); it != incarnations_.end()) {
    (*out.mutable_host_incarnations())[host] = it->second;
  }
  if (auto it = runtime_versions_.find(host); it != runtime_versions_.end()) {
    (*out.mutable_host_runtime_versions())[host] = it->second;
  }
  if (auto it = slices_.find(host); it != slices_.end()) {
    (*out.mutable_mesh()->mutable_host_slices())[host] = it->second;
  }
  if (auto it = megascale_.find(host); it != megascale_.end()) {
    *out.mutable_mesh()->add_megascale() = it->second;
  }
  return out;
}

}  // namespace meshrun::coordinator
