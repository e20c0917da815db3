#include "coordinator/start_job_manifest.h"

#include <algorithm>

#include "jobspec/memory_tier.h"

namespace meshrun::coordinator {

std::map<std::string, std::string> AssignTelemetryRelays(const std::vector<std::string>& hosts,
                                                         int group_hosts) {
  std::map<std::string, std::string> relay_of;
  if (group_hosts <= 0 || hosts.size() <= static_cast<size_t>(group_hosts)) return relay_of;
  for (size_t i = 0; i < hosts.size(); ++i) {
    relay_of[hosts[i]] = hosts[i - i % static_cast<size_t>(group_hosts)];
  }
  return relay_of;
}

StartJobManifests::StartJobManifests(const v1::JobManifest& job) : shared_(job) {
  incarnations_.swap(*shared_.mutable_host_incarnations());
  runtime_versions_.swap(*shared_.mutable_host_runtime_versions());
  v1::MeshAssignment& mesh = *shared_.mutable_mesh();
  slices_.swap(*mesh.mutable_host_slices());
  for (v1::HostEnvironment& environment : *mesh.mutable_megascale()) {
    megascale_[environment.host()] = std::move(environment);
  }
  mesh.clear_megascale();
  const std::vector<std::string> ring = jobspec::RingHosts(mesh);
  if (!ring.empty()) {
    for (int p = 0; p < mesh.device_hosts_size(); ++p) positions_[mesh.device_hosts(p)].push_back(p);
    for (size_t r = 0; r < ring.size(); ++r) {
      predecessor_[ring[r]] = ring[r == 0 ? ring.size() - 1 : r - 1];
    }
    devices_.mutable_device_ids()->Swap(mesh.mutable_device_ids());
    devices_.mutable_device_hosts()->Swap(mesh.mutable_device_hosts());
  }
  // The run history: a worker needs only the count of earlier runs (its attempt number).
  for (v1::JobAttempt& attempt : *shared_.mutable_attempts()) attempt.Clear();
  shared_.clear_checkpoints();
  shared_.clear_straggler_hosts();
  shared_.clear_goodput();
  shared_.clear_state_entered_unix_micros();
  shared_.clear_telemetry_relays();  // StartJobRequest names the host's own relay
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
  if (auto own = positions_.find(host); own != positions_.end()) {
    std::vector<int> positions = own->second;
    const std::vector<int>& peer = positions_.at(predecessor_.at(host));
    positions.insert(positions.end(), peer.begin(), peer.end());
    std::sort(positions.begin(), positions.end());  // mesh order, as RingHosts reads it
    v1::MeshAssignment& mesh = *out.mutable_mesh();
    for (int p : positions) {
      mesh.add_device_ids(devices_.device_ids(p));
      mesh.add_device_hosts(devices_.device_hosts(p));
      mesh.add_partitions(p);
    }
  }
  return out;
}

std::string StartJobManifests::RingPredecessorOf(const std::string& host) const {
  auto it = predecessor_.find(host);
  return it == predecessor_.end() ? "" : it->second;
}

}  // namespace meshrun::coordinator
