#include "jobspec/job_states.h"

#include "absl/strings/match.h"

namespace meshrun::jobspec {

const char* JobStateName(v1::JobState state) {
  switch (state) {
    case v1::JOB_STATE_PENDING: return "PENDING";
    case v1::JOB_STATE_ASSIGNED: return "ASSIGNED";
    case v1::JOB_STATE_LOADING: return "LOADING";
    case v1::JOB_STATE_RUNNING: return "RUNNING";
    case v1::JOB_STATE_SUCCEEDED: return "SUCCEEDED";
    case v1::JOB_STATE_FAILED: return "FAILED";
    case v1::JOB_STATE_CANCELLED: return "CANCELLED";
    default: return "UNSPECIFIED";
  }
}

bool IsFinal(v1::JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

const char* WorkerStateName(v1::WorkerState state) {
  switch (state) {
    case v1::WORKER_STATE_ALIVE: return "ALIVE";
    case v1::WORKER_STATE_DEAD: return "DEAD";
    case v1::WORKER_STATE_LEFT: return "LEFT";
    default: return "UNKNOWN";
  }
}

std::optional<v1::WorkerState> ParseWorkerState(absl::string_view name) {
  for (v1::WorkerState state :
       {v1::WORKER_STATE_ALIVE, v1::WORKER_STATE_DEAD, v1::WORKER_STATE_LEFT}) {
    if (absl::EqualsIgnoreCase(name, WorkerStateName(state))) return state;
  }
  return std::nullopt;
}

}  // namespace meshrun::jobspec
