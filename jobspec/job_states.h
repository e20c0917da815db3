// A job's and a worker's states by name, and which job states end it: the vocabulary the
// coordinator's job table, the CLI and the dashboard share. Pure; thread-safe.
#pragma once

#include <optional>

#include "absl/strings/string_view.h"
#include "meshrun/v1/coordinator.pb.h"
#include "meshrun/v1/job.pb.h"

namespace meshrun::jobspec {

// "PENDING", "RUNNING", ...; "UNSPECIFIED" for a value outside the enum.
const char* JobStateName(v1::JobState state);
// SUCCEEDED, FAILED and CANCELLED end a job; no transition leaves them.
bool IsFinal(v1::JobState state);

// "ALIVE", "DEAD", "LEFT"; "UNKNOWN" for a value outside them.
const char* WorkerStateName(v1::WorkerState state);
// A worker-state filter as users type it ("alive", "dead" or "left", any case); nullopt for
// anything else. Callers name the field in their refusal: "give alive, dead or left".
std::optional<v1::WorkerState> ParseWorkerState(absl::string_view name);

}  // namespace meshrun::jobspec
