// Turns an exported program bundle (examples/<model>/<variant>/job.json, written by
// examples/export_examples.py) into the JobSpec a client submits: programs with their
// declared signatures, the telemetry the bundle declares, and the bundle's data (or the data
// BundleOptions::data names).
// Used by `meshrun submit` and tests. Thread-safe (no shared state).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "meshrun/v1/job.pb.h"

namespace meshrun::services {

struct BundleOptions {
  int64_t steps = 100;
  int64_t telemetry_cadence = 10;
  // Overrides the bundle's data: "" keeps it (data.example_bundle), "synthetic" asks for seeded
  // random tokens by name, anything else is a token shard glob (made absolute).
  std::string data;
  // Overrides the bundle's mesh.host_replicas (CPU hosts running the mesh each) when > 0.
  int host_replicas = 0;
};

// Errors: NOT_FOUND (a bundle file missing, named), INVALID_ARGUMENT (malformed bundle, the
// field named; steps or cadence < 1).
absl::StatusOr<v1::JobSpec> JobSpecFromBundle(const std::string& job_json_path,
                                              const BundleOptions& options);

}  // namespace meshrun::services
