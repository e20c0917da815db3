// Which worker may touch which job's shared state (docs/security.md, "Job membership"): with
// TLS on, telemetry uploads, progress and checkpoint reports, key-value calls and barriers are
// accepted from a worker only for a job it is a member of, with the incarnation the job runs
// on, and only while that incarnation is the host's current one. The certificate already ties
// the worker to its host (CheckWorkerHost); this ties the host to the job.
//
// Key-value namespaces (keys, List directories and barrier ids):
//   collectives/<job id>/...  gloo's rendezvous of that job: members of <job id> only;
//   pjrt/...                  the PJRT client's own rendezvous (made once per worker process,
//                             before it joins any job): any worker of the cluster;
//   anything else             refused.
//
// Callers without an identity (no TLS) or with a non-worker identity are not checked here: the
// access policy (security_policy.h) already limits these RPCs to the worker identity.
//
// Lifetime: the registry and job table must outlive the JobMembership.
// Thread-safety: safe from any thread (the registry and job table are).
#pragma once

#include <optional>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/job_table.h"
#include "coordinator/worker_registry.h"
#include "rpc/security_policy.h"

namespace meshrun::services {

// The job a key-value key (or List directory, or barrier id) belongs to: "" for the shared
// pjrt/ namespace. Errors: PERMISSION_DENIED naming the key and the namespaces workers may use.
absl::StatusOr<std::string> JobOfKey(const std::string& key);

class JobMembership {
 public:
  JobMembership(coordinator::WorkerRegistry* registry, coordinator::JobTable* jobs)
      : registry_(registry), jobs_(jobs) {}

  // OK when `caller` is not a worker identity, or when its host is a member of `job_id` with
  // the job's incarnation, that incarnation is the host's current (not DEAD or LEFT) one, and
  // `incarnation` (when not empty) is that one too. A job the table does not know passes (the
  // handler answers NOT_FOUND). Errors: PERMISSION_DENIED naming the host, job and why.
  absl::Status CheckMember(const std::optional<Identity>& caller, const std::string& job_id,
                           const std::string& incarnation) const;

  // scale: OK when `caller` may forward `host`'s summary of `job_id` (Coordinator.
  // RelayTelemetry): it is not a worker identity, or it is the host's relay the job names
  // (JobManifest.telemetry_relays) and `host` passes CheckMember as if it called itself.
  // Errors: PERMISSION_DENIED naming the caller, the host, the job and its relay.
  absl::Status CheckRelayed(const std::optional<Identity>& caller, const std::string& job_id,
                            const std::string& host, const std::string& incarnation) const;

  // OK when a worker `caller` may use `key` (see the namespaces above); unknown jobs are
  // refused here. Errors: PERMISSION_DENIED naming the key, host and why.
  absl::Status CheckKey(const std::optional<Identity>& caller, const std::string& key) const;

 private:
  // `what` names the refused action; it is built only for a refusal (a check that passes,
  // once per telemetry summary under TLS, builds no message).
  absl::Status Check(const Identity& worker, const std::string& job_id,
                     const std::string& incarnation, bool unknown_job_passes,
                     absl::FunctionRef<std::string()> what) const;

  coordinator::WorkerRegistry* const registry_;
  coordinator::JobTable* const jobs_;
};

}  // namespace meshrun::services
