#include "jobspec/job_states.h"

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

}  // namespace meshrun::jobspec
