// A job's states by name, and which of them end it: the vocabulary the coordinator's job table,
// the CLI and the dashboard share. Pure; thread-safe.
#pragma once

#include "meshrun/v1/job.pb.h"

namespace meshrun::jobspec {

// "PENDING", "RUNNING", ...; "UNSPECIFIED" for a value outside the enum.
const char* JobStateName(v1::JobState state);
// SUCCEEDED, FAILED and CANCELLED end a job; no transition leaves them.
bool IsFinal(v1::JobState state);

}  // namespace meshrun::jobspec
