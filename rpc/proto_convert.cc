#include "rpc/proto_convert.h"

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

}  // namespace meshrun::services
