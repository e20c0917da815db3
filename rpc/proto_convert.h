// Conversions between wire messages and the logic libraries' plain types. Pure; thread-safe.
#pragma once

#include "coordinator/mesh_planner.h"
#include "coordinator/worker_registry.h"
#include "absl/status/statusor.h"
#include "meshrun/v1/coordinator.pb.h"
#include "worker/runtime/types.h"
#include "worker/step_loop.h"
#include "worker/runtime/identity.h"

namespace meshrun::services {

v1::RuntimeIdentity ToProto(const runtime::RuntimeIdentity& identity);
runtime::RuntimeIdentity FromProto(const v1::RuntimeIdentity& identity);

v1::DeviceInfo ToProto(const runtime::DeviceDescription& device);
runtime::DeviceDescription FromProto(const v1::DeviceInfo& device);

v1::WorkerRegistration ToProto(const coordinator::WorkerInfo& info);
coordinator::WorkerInfo FromProto(const v1::WorkerRegistration& registration);

v1::WorkerState ToProto(coordinator::WorkerState state);

v1::HostSummary ToProto(const worker::HostStepSummary& summary);

// The multislice part of a plan (num_slices, DCN / ICI shapes, host slices, each host's
// MEGASCALE_* variables in the plan's host order) into `mesh`.
void SetMultislice(const coordinator::MeshPlan& plan, v1::MeshAssignment& mesh);

// The per-device signature a program declares (its tensors' shard shapes).
// Errors: INVALID_ARGUMENT naming a tensor with an unknown dtype.
absl::StatusOr<runtime::ProgramSignature> SignatureOf(const v1::Program& program);

}  // namespace meshrun::services
