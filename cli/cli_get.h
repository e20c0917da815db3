// `meshrun get`'s readable summary of a job manifest (the full manifest is --output=json).
// Pure functions; thread-safe.
#pragma once

#include <string>

#include "meshrun/v1/job.pb.h"

namespace meshrun::services {

// Lines "field: value": job and name, state (with the error and failed host), steps, mesh and
// hosts, runtime, compile mode and cache, data and its receipt, goodput, checkpoints.
// Absent parts are left out.
std::string JobSummaryText(const v1::JobManifest& job);

}  // namespace meshrun::services
