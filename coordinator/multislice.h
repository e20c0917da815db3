// Multislice: hosts grouped by TPU slice, for the mesh planner (coordinator/mesh_planner.h).
//
// A multislice job runs one SPMD program over several TPU slices joined by the data-center
// network (DCN). Following MaxText's dcn_* / ici_* parallelism convention, every mesh axis is
// the product of a DCN part (across slices) and an ICI part (within a slice); meshrun puts the
// whole DCN part on `data`, outermost: data index d lies in slice d / ici_data. Axis names stay
// those of the mesh rule, so a program exported for ("data", "model") runs unchanged; the split
// is recorded beside the mesh (MeshPlan::dcn_shape / ici_shape). libtpu joins the slices from
// the MEGASCALE_* environment (runtime/megascale.h), which the plan states per host.
//
// Thread-safety: pure functions.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/worker_registry.h"
#include "runtime/megascale.h"

namespace meshrun::coordinator {

struct SliceLayout {
  int num_slices = 1;
  // By slice id: the slice's hosts in (worker_index, natural host name) order.
  std::vector<std::vector<std::string>> hosts;
};

// Groups `hosts` by slice. When no host declares more than one slice, the layout is one slice
// holding every host and nothing is checked. Otherwise every host must agree on the slice
// count and have a slice id below it, and every slice must have a host.
// With `equal_sizes` (one SPMD program over the slices) every slice must also hold the same
// number of hosts, and no two hosts of a slice may claim one worker index.
// Errors: FAILED_PRECONDITION naming the hosts and what to change.
absl::StatusOr<SliceLayout> GroupSlices(const std::vector<WorkerInfo>& hosts, bool equal_sizes);

// The MEGASCALE_* settings of each host of `hosts` (all in `layout`): the coordinator is the
// host part of the address of slice 0's first host, on runtime::kDefaultMegascalePort.
std::map<std::string, runtime::MegascaleConfig> MegascaleByHost(
    const SliceLayout& layout, const std::vector<WorkerInfo>& hosts);

}  // namespace meshrun::coordinator
