// What one host's StartJob carries of its job's manifest (issue 30). The job table's manifest
// grows with the hosts a job spans (an incarnation, runtime version, slice and megascale
// settings per host; the hosts of each earlier run) and with its history (checkpoint records,
// stragglers, goodput), but a worker reads only its own entries and the job's shared parts:
// job_id, spec, mesh, program_fingerprints, data_receipt, memory_restore, the count of earlier
// runs, and its own host_incarnations entry (worker_service/worker_job_start.cc,
// worker_checkpoints.cc). Sending each host the whole manifest made a launch's bytes grow as
// N²; this keeps the per-host part constant. For the same reason a mesh that spans hosts is
// sent as that host's devices and its ring predecessor's only, each with its mesh position
// (MeshAssignment.partitions): what the worker's PartitionsOf and RingPredecessor read
// (jobspec/memory_tier.h). Host replicas (CPU) get their mesh as it is.
//
// Lifetime: holds a copy of what it needs of the job. Thread-safety: ForHost is const and may
// be called concurrently.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "meshrun/v1/job.pb.h"

namespace meshrun::coordinator {

// Telemetry relays (docs/scale.md, "Telemetry relays"): `hosts` (a job's, in mesh order) in
// groups of `group_hosts`, each group's first host relaying the group's summaries, its own
// included (one stream a group reaches the coordinator). Returns host -> its relay; empty when
// the job has no more than `group_hosts` hosts or `group_hosts` is 0 (every host uploads its
// own). Pure.
std::map<std::string, std::string> AssignTelemetryRelays(const std::vector<std::string>& hosts,
                                                         int group_hosts);

class StartJobManifests {
 public:
  explicit StartJobManifests(const v1::JobManifest& job);

  // The manifest `host` gets: the shared parts plus its own entries.
  v1::JobManifest ForHost(const std::string& host) const;
  // `host`'s ring predecessor (jobspec::RingPredecessor on the whole mesh), worked out once
  // for every host; empty when the mesh does not span hosts or names no such host.
  std::string RingPredecessorOf(const std::string& host) const;

 private:
  v1::JobManifest shared_;  // the job less every per-host entry and its history
  google::protobuf::Map<std::string, std::string> incarnations_;
  google::protobuf::Map<std::string, std::string> runtime_versions_;
  google::protobuf::Map<std::string, int32_t> slices_;
  std::map<std::string, v1::HostEnvironment> megascale_;
  v1::MeshAssignment devices_;  // the mesh's device lists, when the mesh spans hosts
  std::map<std::string, std::vector<int>> positions_;  // host -> its mesh positions, in order
  std::map<std::string, std::string> predecessor_;     // host -> its ring predecessor
};

}  // namespace meshrun::coordinator
