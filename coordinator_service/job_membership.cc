#include "coordinator_service/job_membership.h"

#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "rpc/refusal_log.h"

namespace meshrun::services {
namespace {

bool IsWorker(const std::optional<Identity>& caller) {
  return caller.has_value() && caller->role == Role::kWorker;
}

absl::Status Refuse(const Identity& worker, const std::string& what, const std::string& why) {
  const std::string message =
      absl::StrCat("worker \"", worker.name, "\" may not ", what, ": ", why);
  RefusalLog::Process().Record(CallerName(worker), "permission_denied not_a_job_member",
                               absl::StrCat("refused: ", message, " (from ", worker.peer, ")"));
  return absl::PermissionDeniedError(message);
}

}  // namespace

absl::StatusOr<std::string> JobOfKey(const std::string& key) {
  std::vector<std::string> parts = absl::StrSplit(key, '/');
  if (parts.size() >= 2 && parts[0] == "collectives" && !parts[1].empty()) return parts[1];
  if (parts.size() >= 2 && parts[0] == "pjrt" && !parts[1].empty()) return std::string();
  return absl::PermissionDeniedError(absl::StrCat(
      "key-value key \"", key, "\" is outside the namespaces workers may use: "
      "collectives/<job id>/... (members of that job) and pjrt/... (the PJRT client's "
      "rendezvous)"));
}

absl::Status JobMembership::CheckMember(const std::optional<Identity>& caller,
                                        const std::string& job_id,
                                        const std::string& incarnation) const {
  if (!IsWorker(caller)) return absl::OkStatus();
  return Check(*caller, job_id, incarnation, /*unknown_job_passes=*/true,
               [&] { return absl::StrCat("report for job ", job_id); });
}

absl::Status JobMembership::CheckRelayed(const std::optional<Identity>& caller,
                                         const std::string& job_id, const std::string& host,
                                         const std::string& incarnation) const {
  if (!IsWorker(caller)) return absl::OkStatus();
  absl::StatusOr<std::string> relay = jobs_->TelemetryRelayOf(job_id, host);
  if (!relay.ok()) return absl::OkStatus();  // unknown job: Accept answers NOT_FOUND
  if (*relay != caller->name) {
    return Refuse(*caller, absl::StrCat("relay host ", host, "'s telemetry of job ", job_id),
                  relay->empty() ? std::string("the job names no relay for that host; it "
                                               "uploads its own")
                                 : absl::StrCat("the job names ", *relay, " as its relay"));
  }
  Identity member = *caller;
  member.name = host;
  return Check(member, job_id, incarnation, /*unknown_job_passes=*/true, [&] {
    return absl::StrCat("have its telemetry of job ", job_id, " relayed by ", caller->name);
  });
}

absl::Status JobMembership::CheckKey(const std::optional<Identity>& caller,
                                     const std::string& key) const {
  if (!IsWorker(caller)) return absl::OkStatus();
  absl::StatusOr<std::string> job = JobOfKey(key);
  if (!job.ok()) return Refuse(*caller, "use this key", std::string(job.status().message()));
  if (job->empty()) return absl::OkStatus();  // pjrt/: any worker of the cluster
  return Check(*caller, *job, "", /*unknown_job_passes=*/false,
               [&] { return absl::StrCat("use key-value key \"", key, "\""); });
}

absl::Status JobMembership::Check(const Identity& worker, const std::string& job_id,
                                  const std::string& incarnation, bool unknown_job_passes,
                                  absl::FunctionRef<std::string()> what) const {
  // One host's entry per call (every telemetry summary under TLS); the whole map only to name
  // the members in a refusal.
  absl::StatusOr<std::optional<std::string>> member = jobs_->HostIncarnation(job_id, worker.name);
  if (!member.ok()) {
    if (unknown_job_passes && absl::IsNotFound(member.status())) return absl::OkStatus();
    return Refuse(worker, what(), std::string(member.status().message()));
  }
  if (!member->has_value()) {
    std::vector<std::string> hosts;
    if (auto members = jobs_->HostIncarnations(job_id); members.ok()) {
      for (const auto& [host, unused] : *members) hosts.push_back(host);
    }
    return Refuse(worker, what(),
                  absl::StrCat("it is not a member of job ", job_id, " (members: ",
                               hosts.empty() ? "none yet" : absl::StrJoin(hosts, ", "), ")"));
  }
  const std::string& job_incarnation = **member;
  if (!incarnation.empty() && incarnation != job_incarnation) {
    return Refuse(worker, what(),
                  absl::StrCat("incarnation ", incarnation, " is not the one job ", job_id,
                               " runs on (", job_incarnation, ")"));
  }
  // NOT_FOUND: the host has not registered since a coordinator restart; it still is the job's.
  if (absl::Status current = registry_->CheckCurrent(worker.name, job_incarnation);
      !current.ok() && !absl::IsNotFound(current)) {
    return Refuse(worker, what(),
                  absl::StrCat("the incarnation job ", job_id, " runs on is no longer current (",
                               current.message(), ")"));
  }
  return absl::OkStatus();
}

}  // namespace meshrun::services
