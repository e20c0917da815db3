#include "coordinator_service/registry_proto.h"

#include "rpc/proto_convert.h"

namespace meshrun::services {

v1::WorkerRegistration ToProto(const coordinator::WorkerInfo& info) {
  v1::WorkerRegistration out;
  out.set_host(info.host);
  out.set_address(info.address);
  out.set_incarnation(info.incarnation);
  out.set_slice_id(info.slice_id);
  out.set_num_slices(info.num_slices);
  out.set_worker_index(info.worker_index);
  for (const std::string& name : info.slice_hostnames) out.add_slice_hostnames(name);
  *out.mutable_runtime() = ToProto(info.runtime);
  for (const auto& device : info.devices) *out.add_devices() = ToProto(device);
  for (const std::string& fp : info.executable_fingerprints) out.add_executable_fingerprints(fp);
  out.set_insecure(info.insecure);
  out.set_spare(info.spare);
  out.set_host_memory_bytes(info.host_memory_bytes);
  return out;
}

coordinator::WorkerInfo FromProto(const v1::WorkerRegistration& registration) {
  coordinator::WorkerInfo info{
      .host = registration.host(),
      .address = registration.address(),
      .incarnation = registration.incarnation(),
      .slice_id = registration.slice_id(),
      .num_slices = registration.num_slices(),
      .worker_index = registration.worker_index(),
      .slice_hostnames = {registration.slice_hostnames().begin(),
                          registration.slice_hostnames().end()},
      .runtime = FromProto(registration.runtime()),
      .devices = {},
      .executable_fingerprints = {registration.executable_fingerprints().begin(),
                                  registration.executable_fingerprints().end()},
      .insecure = registration.insecure(),
      .spare = registration.spare(),
      .host_memory_bytes = registration.host_memory_bytes()};
  for (const auto& device : registration.devices()) info.devices.push_back(FromProto(device));
  return info;
}

v1::WorkerState ToProto(coordinator::WorkerState state) {
  switch (state) {
    case coordinator::WorkerState::kAlive: return v1::WORKER_STATE_ALIVE;
    case coordinator::WorkerState::kDead: return v1::WORKER_STATE_DEAD;
    case coordinator::WorkerState::kLeft: return v1::WORKER_STATE_LEFT;
  }
  return v1::WORKER_STATE_UNSPECIFIED;
}

void SetMultislice(const coordinator::MeshPlan& plan, v1::MeshAssignment& mesh) {
  mesh.set_num_slices(plan.num_slices);
  for (int64_t size : plan.dcn_shape) mesh.add_dcn_shape(static_cast<int32_t>(size));
  for (int64_t size : plan.ici_shape) mesh.add_ici_shape(static_cast<int32_t>(size));
  for (const auto& [host, slice] : plan.host_slices) (*mesh.mutable_host_slices())[host] = slice;
  for (const std::string& host : plan.hosts) {
    auto it = plan.megascale.find(host);
    if (it == plan.megascale.end()) continue;
    v1::HostEnvironment* env = mesh.add_megascale();
    env->set_host(host);
    for (const auto& [name, value] : runtime::MegascaleEnvironment(it->second)) {
      env->add_variables(absl::StrCat(name, "=", value));
    }
  }
}

}  // namespace meshrun::services
