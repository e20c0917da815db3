// Conversions between wire messages and the coordinator's registry and plan types. Pure;
// thread-safe.
#pragma once

#include "coordinator/mesh_planner.h"
#include "coordinator/worker_registry.h"
#include "meshrun/v1/coordinator.pb.h"

namespace meshrun::services {

v1::WorkerRegistration ToProto(const coordinator::WorkerInfo& info);
coordinator::WorkerInfo FromProto(const v1::WorkerRegistration& registration);

v1::WorkerState ToProto(coordinator::WorkerState state);

// The multislice part of a plan (num_slices, DCN / ICI shapes, host slices, each host's
// MEGASCALE_* variables in the plan's host order) into `mesh`.
void SetMultislice(const coordinator::MeshPlan& plan, v1::MeshAssignment& mesh);

}  // namespace meshrun::services
