// The client-side bundle reader: a bundle directory (job.json + StableHLO programs + optional
// data, as meshrun.export or examples/export_examples.py write it) as the typed JobBundle
// (proto/meshrun/v1/bundle.proto), and as the JobSpec a client submits. `meshrun submit` and
// the examples' test loader (bundle/example_job.h) read bundles through it. A bundle
// needs only what a run needs: `reference` and `compile_options_jax` are optional test data.
// Thread-safe (no shared state). No gRPC.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "meshrun/v1/bundle.pb.h"
#include "meshrun/v1/job.pb.h"

namespace meshrun {
class PathRoots;
}  // namespace meshrun

namespace meshrun::client {

// A bundle directory's job.json; any other path as it is.
std::string BundleJsonPath(const std::string& bundle);

// Parses `bundle` (its job.json, or the directory holding it) as a JobBundle: proto3 JSON, strict (an unknown field is an error
// naming it), a null sharding entry read as "" (not split). Checks what every bundle needs:
// name, mesh (axes are roles data/model/expert, one size each), programs.init, and either
// programs.step or programs.grad + programs.apply with grad_accumulation >= 1.
// Errors: NOT_FOUND (the file), INVALID_ARGUMENT (malformed; the message names the field).
absl::StatusOr<v1::JobBundle> ReadJobBundle(const std::string& bundle);

// The directory holding a job.json; bundle file names are relative to it.
std::string BundleDir(const std::string& job_json_path);

// `file` of the bundle at `job_json_path`, read whole. `field` names it in errors. With
// `roots` (a server reading a client's bundle), the file, joined to the bundle's directory
// with ".." and symlinks resolved, must lie under one of them.
// Errors: NOT_FOUND naming the field and path; INVALID_ARGUMENT (not a regular file, too
// large; outside `roots`: "<job.json>: <field> \"<path>\" is outside the directories this
// server reads (<roots>)...", PathRoots::Resolve).
absl::StatusOr<std::string> ReadBundleFile(const std::string& job_json_path,
                                           const std::string& file, const std::string& field,
                                           const PathRoots* roots = nullptr);

struct BundleOptions {
  int64_t steps = 100;
  int64_t telemetry_cadence = 10;
  // Overrides the bundle's data: "" keeps it (data.example_bundle), "synthetic" asks for seeded
  // random tokens by name, one existing file that does not start with the token shard magic
  // is an array-batch file (data.array_file, meshrun.data.write_arrays), anything else a token
  // shard glob. Paths are made absolute.
  std::string data;
  // Overrides the bundle's mesh.host_replicas (CPU hosts running the mesh each) when > 0.
  int host_replicas = 0;
};

// The JobSpec of a bundle (its job.json or directory): its programs with their signatures, telemetry, sparse contract,
// mesh and data. Errors: ReadJobBundle's, NOT_FOUND (a program file), INVALID_ARGUMENT (steps
// or cadence < 1, an unknown combine).
absl::StatusOr<v1::JobSpec> JobSpecFromBundle(const std::string& bundle,
                                              const BundleOptions& options);

}  // namespace meshrun::client
