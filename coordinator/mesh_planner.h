// The SPMD mesh planner: from a mesh request (dp / ep / tp, 0 = auto) and the eligible hosts,
// the mesh's axis names, shape and device assignment. Also the runtime-pinning filter that
// decides which hosts are eligible for a job at all.
//
// Mesh rule (DESIGN.md, from the seeds):
//   TP=1 EP=1 -> ("data",)            shape (dp)
//   TP>1 EP=1 -> ("data","model")     shape (dp, tp)
//   TP=1 EP>1 -> ("data","expert")    shape (dp, ep)
//   TP>1 EP>1 -> ("data","expert","model")  shape (dp, ep, tp)
// The device assignment lists global device ids in mesh order (row-major over the shape, the
// last axis fastest). Hosts are ordered by (slice_id, worker_index, host) and each host's chips
// are ordered along its ICI topology (see below), then the hosts' lists are concatenated; so
// `data` is outermost (across hosts) and `model` innermost: every model group of `tp` chips
// lies inside one host (tp must divide the chips of a host) on consecutive ICI-adjacent chips.
//
// Chip order inside a host, from DeviceDescription::coords when every device of the host has
// them and they form a full box (e.g. v6e-8: 2x4; one host of v6e-16: 2x2):
//   - a 2xW grid with an even tp >= 4 dividing 2W: blocks of tp/2 columns, each walked as a
//     ring (row 0 left to right, row 1 right to left): every model group is a closed ICI ring;
//   - any other box: a boustrophedon (snake) walk, so consecutive chips are adjacent.
// Without usable coords (CPU devices, partial coords) chips follow local id order.
//
// Automatic sizes (0 in the request):
//   ep = 0 -> 1 (expert parallelism is a property of the model, never invented);
//   tp = 0 -> 1 when dp is also auto, else what remains: devices / (dp * ep);
//   dp = 0 -> devices / (ep * tp).
// All zero is therefore pure data parallelism over every device. A mesh always spans every
// device of every host it is given; to run on fewer hosts, pass fewer hosts.
//
// Multislice (hosts declaring num_slices > 1, coordinator/multislice.h): `data` is split into
// a DCN part, the number of slices, outermost, and an ICI part inside each slice (MaxText's
// dcn_data_parallelism x ici_data_parallelism); expert and model groups must lie within one
// slice (ep*tp divides a slice's devices). The plan records the split and the MEGASCALE_*
// settings of every host. Hosts sort by (slice, worker index, host name in natural order).
//
// Thread-safety: free functions on values; safe to call concurrently.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/worker_registry.h"
#include "runtime/identity.h"
#include "runtime/megascale.h"

namespace meshrun::coordinator {

// Mesh sizes; 0 means "auto" for that axis (see the rules above).
struct MeshRequest {
  int dp = 0;
  int ep = 0;
  int tp = 0;
};

struct MeshPlan {
  int dp = 1;
  int ep = 1;
  int tp = 1;
  std::vector<std::string> axis_names;   // by the mesh rule
  std::vector<int64_t> shape;            // one size per axis name
  std::vector<int32_t> device_ids;       // global ids in mesh order; size = dp*ep*tp
  std::vector<std::string> device_hosts;  // host of each entry of device_ids
  std::vector<std::string> hosts;        // hosts in data-axis order
  runtime::RuntimeIdentity runtime;      // shared by every host
  // Host replicas (PlanCpuJob with replicas > 1): the hosts, in data order, that each run the
  // whole mesh on their own devices; device_ids are then one host's and device_hosts is empty.
  std::vector<std::string> replica_hosts;
  // Multislice (num_slices > 1; all empty otherwise): per axis of `shape`, the part across
  // slices (DCN: num_slices on data, 1 elsewhere) and within one slice (ICI); shape is their
  // product. host_slices: each planned host's slice; megascale: what libtpu gets on each host.
  int num_slices = 1;
  std::vector<int64_t> dcn_shape;
  std::vector<int64_t> ici_shape;
  std::map<std::string, int> host_slices;
  std::map<std::string, runtime::MegascaleConfig> megascale;

  // "data=2 x model=8 on 2 hosts (tpu ...)".
  std::string ToString() const;
};

// The axis names the mesh rule gives for these sizes (each >= 1).
std::vector<std::string> MeshAxisNames(int ep, int tp);

// Plans the mesh of `request` over all devices of `hosts` (eligible hosts: their runtimes
// must already match, see PinRuntime). Deterministic: the same hosts in any order give the
// same plan.
// Errors:
//   INVALID_ARGUMENT: a negative size; a host without a name, two hosts with one name, or a
//     global device id that appears twice.
//   FAILED_PRECONDITION (the message says what would fit): no hosts; a host without devices;
//     hosts with different device counts (each named with its count); hosts with different
//     runtimes (each named with its version); tp larger than the chips of one host or not
//     dividing them; dp*ep*tp larger than, smaller than, or not dividing the device count;
//     inconsistent slices (see GroupSlices); an expert x model group that would span slices.
absl::StatusOr<MeshPlan> PlanMesh(const MeshRequest& request, std::vector<WorkerInfo> hosts);

// A CPU job's hosts and mesh. XLA's CPU client only sees its own process's devices, so a CPU
// mesh never spans hosts: the job takes the first `replicas` hosts of `eligible` (in order)
// that are not `busy` and on whose devices `request` plans; with replicas > 1 each of them
// runs that mesh on its own devices, data-parallel across hosts (docs/multihost_cpu.md).
// Multislice CPU hosts (each host its own "slice", e.g. tests): the replicas are spread evenly,
// replicas / num_slices from each slice, and the plan says which slice each host is in.
// Errors: INVALID_ARGUMENT (replicas < 1); FAILED_PRECONDITION (inconsistent slices, or
// replicas not a multiple of the slice count); UNAVAILABLE (enough hosts fit but some are busy:
// retry later); FAILED_PRECONDITION (fewer than `replicas` hosts fit the mesh; every host
// passed over is named with why).
absl::StatusOr<MeshPlan> PlanCpuJob(const MeshRequest& request, int replicas,
                                    const std::vector<WorkerInfo>& eligible,
                                    const std::set<std::string>& busy);

// Indexes into `devices` (one host's) in ICI order for model groups of `tp` chips (rules
// above). Exposed for tests and for `meshrun workers`.
std::vector<size_t> IciChipOrder(const std::vector<runtime::DeviceDescription>& devices, int tp);

struct HostExclusion {
  std::string host;
  std::string reason;  // "runtime cpu 0.81 (PJRT 0.67, plugin 1a2b3c4d) differs from ..."
};

struct PinResult {
  runtime::RuntimeIdentity pin;           // the pin applied (the chosen one when none given)
  std::vector<WorkerInfo> eligible;       // sorted by (slice_id, worker_index, host)
  std::vector<HostExclusion> excluded;    // same order
};

// Splits `hosts` into those whose runtime equals `pin` and the others, with a reason per
// excluded host. An empty `pin` takes the runtime of the first host, in deterministic order,
// that has a runtime loaded and devices. Hosts with no runtime loaded or no devices are always
// excluded. Never fails: with no usable host, `eligible` is empty and `pin` is as given.
PinResult PinRuntime(std::vector<WorkerInfo> hosts, const runtime::RuntimeIdentity& pin);

}  // namespace meshrun::coordinator
