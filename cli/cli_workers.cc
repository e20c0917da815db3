#include "cli/cli_workers.h"

#include <cstdio>
#include <optional>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "cli/cli_common.h"
#include "common/grpc_status.h"
#include "jobspec/job_states.h"
#include "rpc/binary_setup.h"
#include "rpc/proto_convert.h"
#include "rpc/server_support.h"
#include "runtime/identity.h"

ABSL_DECLARE_FLAG(absl::Duration, wait);
ABSL_FLAG(int, expect, 0,
          "workers: wait (up to --wait) until at least this many listed workers are ALIVE");
ABSL_FLAG(std::string, job, "",
          "workers: explain exclusions against this job's runtime pin (default: the pin a "
          "job without one would get)");
ABSL_FLAG(std::string, state, "", "workers: only workers in this state: alive, dead or left");
ABSL_FLAG(int, slice, -1, "workers: only the workers of this slice (-1: every slice)");
ABSL_FLAG(std::string, on_job, "", "workers: only the hosts this job's mesh places it on");
ABSL_FLAG(int, page_size, 0,
          "workers: list at most this many, then print the --page_token of the next page "
          "(0: all of them)");
ABSL_FLAG(std::string, page_token, "", "workers: the page to list, as the previous page named it");

namespace meshrun::services {
namespace {

v1::ListWorkersRequest RequestFromFlags() {
  v1::ListWorkersRequest request;
  request.set_job_id(absl::GetFlag(FLAGS_job));
  if (const std::string state = absl::GetFlag(FLAGS_state); !state.empty()) {
    std::optional<v1::WorkerState> parsed = jobspec::ParseWorkerState(state);
    if (!parsed) {
      ExitWithError(absl::StrCat("--state=", state, " is not alive, dead or left"), kExitUsage);
    }
    request.set_state(*parsed);
  }
  if (absl::GetFlag(FLAGS_slice) >= 0) request.set_slice_id(absl::GetFlag(FLAGS_slice));
  request.set_on_job_id(absl::GetFlag(FLAGS_on_job));
  if (absl::GetFlag(FLAGS_page_size) < 0) {
    ExitWithError("--page_size is negative; pass 0 to list every worker", kExitUsage);
  }
  request.set_page_size(absl::GetFlag(FLAGS_page_size));
  request.set_page_token(absl::GetFlag(FLAGS_page_token));
  return request;
}

// ALIVE workers among all the matches, every page's.
int AliveMatches(const v1::ListWorkersResponse& response) {
  int alive = 0;
  for (const v1::SliceWorkers& slice : response.slices()) alive += slice.alive();
  return alive;
}

void PrintTable(const v1::ListWorkersResponse& workers) {
  std::printf("%-20s %-6s %-22s %-36s %-7s %-9s %s\n", "HOST", "STATE", "ADDRESS", "RUNTIME",
              "DEVICES", "HEARTBEAT", "NOTE");
  const int64_t now_micros = absl::ToUnixMicros(absl::Now());
  for (const v1::WorkerStatus& w : workers.workers()) {
    const auto& reg = w.registration();
    const runtime::RuntimeIdentity identity = FromProto(reg.runtime());
    std::vector<std::string> notes;
    if (!w.state_reason().empty()) notes.push_back(w.state_reason());
    if (!w.exclusion_reason().empty()) notes.push_back("excluded: " + w.exclusion_reason());
    if (reg.insecure()) notes.push_back("PLAINTEXT beyond loopback (--insecure)");
    if (reg.spare()) notes.push_back("spare");
    const std::string note = absl::StrJoin(notes, "; ");
    std::printf("%-20s %-6s %-22s %-36s %-7d %-9s %s\n", reg.host().c_str(),
                jobspec::WorkerStateName(w.state()), reg.address().c_str(),
                runtime::ToString(identity).c_str(), reg.devices_size(),
                absl::StrFormat("%.1fs ago",
                                (now_micros - w.last_heartbeat_unix_micros()) / 1e6).c_str(),
                note.c_str());
  }
  // A fleet of many slices, or one page of many: the whole by slice, then the way on.
  if (workers.slices_size() > 1 || !workers.next_page_token().empty()) {
    std::printf("\n%-6s %-6s %-6s %-6s %s\n", "SLICE", "ALIVE", "DEAD", "LEFT", "DEVICES");
    for (const v1::SliceWorkers& slice : workers.slices()) {
      std::printf("%-6d %-6d %-6d %-6d %d\n", slice.slice_id(), slice.alive(), slice.dead(),
                  slice.left(), slice.alive_devices());
    }
  }
  if (!workers.next_page_token().empty()) {
    std::printf("\n%d of %d listed; the next page: --page_token=%s\n", workers.workers_size(),
                workers.total_matches(), workers.next_page_token().c_str());
  }
}

}  // namespace

int Workers(const std::vector<std::string>& args) {
  if (args.size() != 2) {
    ExitWithError("usage: meshrun workers [--state=alive|dead|left] [--slice=N] [--on_job=ID] "
                  "[--page_size=N] [--page_token=T] [--expect=N]",
                  kExitUsage);
  }
  const v1::ListWorkersRequest request = RequestFromFlags();
  auto stub = CoordinatorStub();
  const int expect = absl::GetFlag(FLAGS_expect);
  const absl::Time give_up = absl::Now() + absl::GetFlag(FLAGS_wait);
  v1::ListWorkersResponse workers;
  while (true) {
    workers.Clear();
    auto context = ContextWithTimeout(absl::GetFlag(FLAGS_timeout));
    const grpc::Status status = stub->ListWorkers(context.get(), request, &workers);
    if (status.ok() && (expect <= 0 || AliveMatches(workers) >= expect)) break;
    // A coordinator still starting is waited for (with --expect); a refusal is not.
    const bool retry = expect > 0 && absl::Now() < give_up &&
                       (status.ok() || status.error_code() == grpc::StatusCode::UNAVAILABLE);
    if (!retry) {
      CheckCall(status, absl::StrCat("cannot list workers of coordinator ",
                                     absl::GetFlag(FLAGS_coordinator)));
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  if (workers.coordinator_insecure()) {
    std::fprintf(JsonOutput() ? stderr : stdout,  // JSON output stays parseable
                 "WARNING: the coordinator serves PLAINTEXT beyond loopback (--insecure): "
                 "anyone who reaches it can run code on the workers; see docs/security.md\n");
  }
  if (JsonOutput()) {
    PrintJson(workers);
  } else {
    PrintTable(workers);
  }
  if (expect > 0 && AliveMatches(workers) < expect) {
    ExitWithError(absl::StrCat("only ", AliveMatches(workers), " of ", expect,
                               " expected workers are ALIVE after ",
                               absl::FormatDuration(absl::GetFlag(FLAGS_wait))),
                  1);
  }
  return 0;
}

}  // namespace meshrun::services
