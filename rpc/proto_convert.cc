#include "services/proto_convert.h"

#include "absl/strings/str_cat.h"

namespace meshrun::services {

v1::RuntimeIdentity ToProto(const runtime::RuntimeIdentity& identity) {
  v1::RuntimeIdentity out;
  out.set_platform_name(identity.platform_name);
  out.set_platform_version(identity.platform_version);
  out.set_pjrt_api_major(identity.pjrt_api_major);
  out.set_pjrt_api_minor(identity.pjrt_api_minor);
  out.set_plugin_sha256(identity.plugin_sha256);
  return out;
}

runtime::RuntimeIdentity FromProto(const v1::RuntimeIdentity& identity) {
  return runtime::RuntimeIdentity{.platform_name = identity.platform_name(),
                                  .platform_version = identity.platform_version(),
                                  .pjrt_api_major = identity.pjrt_api_major(),
                                  .pjrt_api_minor = identity.pjrt_api_minor(),
                                  .plugin_sha256 = identity.plugin_sha256()};
}

v1::DeviceInfo ToProto(const runtime::DeviceDescription& device) {
  v1::DeviceInfo out;
  out.set_global_id(device.global_id);
  out.set_local_id(device.local_id);
  out.set_process_index(device.process_index);
  out.set_kind(device.kind);
  out.set_runtime_name(device.runtime_name);
  out.mutable_coords()->Add(device.coords.begin(), device.coords.end());
  out.mutable_attributes()->insert(device.attributes.begin(), device.attributes.end());
  return out;
}

runtime::DeviceDescription FromProto(const v1::DeviceInfo& device) {
  return runtime::DeviceDescription{
      .global_id = device.global_id(),
      .local_id = device.local_id(),
      .process_index = device.process_index(),
      .kind = device.kind(),
      .runtime_name = device.runtime_name(),
      .coords = {device.coords().begin(), device.coords().end()},
      .attributes = {device.attributes().begin(), device.attributes().end()}};
}

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
      .insecure = registration.insecure()};
  for (const auto& device : registration.devices()) info.devices.push_back(FromProto(device));
  return info;
}

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

absl::StatusOr<runtime::ProgramSignature> SignatureOf(const v1::Program& program) {
  runtime::ProgramSignature signature;
  for (auto [tensors, out] : {std::pair{&program.inputs(), &signature.inputs},
                              std::pair{&program.outputs(), &signature.outputs}}) {
    for (const v1::TensorSpec& t : *tensors) {
      absl::StatusOr<runtime::DType> dtype = runtime::ParseDType(t.dtype());
      if (!dtype.ok()) return dtype.status();
      out->push_back({t.name(), {*dtype, {t.shard_shape().begin(), t.shard_shape().end()}}});
    }
  }
  return signature;
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
