// The coordinator's registry of worker incarnations and their liveness.
//
//   Register ──> ALIVE ──(no heartbeat for `heartbeat_timeout`)──> DEAD
//                  │ └──(same host registers a new incarnation)───> DEAD
//                  └──(Deregister)──────────────────────────────> LEFT
//
// One entry per host: a host's newest incarnation. A new incarnation is a new member; the old
// one is declared DEAD and never merged back. One owner per address: the host that last
// registered it and has not left; no other host may register there while the owner is alive
// (security: two names at one address would let one worker stand in for another). Liveness is
// judged against the injected clock, so tests move time by hand.
//
// Lifetime: Create() returns an owned registry; the clock must outlive it.
// Thread-safety: all methods are safe to call concurrently.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "runtime/identity.h"

namespace meshrun::coordinator {

struct WorkerInfo {
  std::string host;
  std::string address;       // host:port of the worker's own service
  std::string incarnation;   // fresh per worker process start
  int slice_id = 0;
  int num_slices = 1;
  int worker_index = 0;
  std::vector<std::string> slice_hostnames;
  runtime::RuntimeIdentity runtime;
  std::vector<runtime::DeviceDescription> devices;
  std::vector<std::string> executable_fingerprints;
  bool insecure = false;  // the worker serves plaintext beyond loopback (--insecure)
  bool spare = false;     // kept for restarts (--spare): not in a job's first placement
  int64_t host_memory_bytes = 0;  // for in-memory checkpoints; 0: unknown
};

enum class WorkerState { kAlive, kDead, kLeft };
const char* WorkerStateName(WorkerState state);

struct WorkerEntry {
  WorkerInfo info;
  WorkerState state = WorkerState::kAlive;
  absl::Time last_heartbeat;
  std::string state_reason;  // why DEAD or LEFT
};

class WorkerRegistry {
 public:
  struct Config {
    absl::Duration heartbeat_timeout = absl::Seconds(10);
    // A DEAD or LEFT host is forgotten this long after its last heartbeat, and a replaced
    // incarnation this long after it was replaced (a registration with it is then a new
    // member); zero: never (docs/limits.md).
    absl::Duration forget_after = absl::Hours(1);
    Clock* clock = &RealClock();
  };

  // Errors: INVALID_ARGUMENT when the timeout is not positive or the clock is null.
  static absl::StatusOr<std::unique_ptr<WorkerRegistry>> Create(Config config);

  // Adds `info` as the host's current incarnation and makes its host the address's owner.
  // Errors: INVALID_ARGUMENT (host, address or incarnation empty; named), ALREADY_EXISTS
  // (this incarnation registered before: a restarted worker must bring a fresh one; or another
  // host, alive, owns the address: both named).
  absl::Status Register(const WorkerInfo& info);

  // Errors: NOT_FOUND (host unknown: register), FAILED_PRECONDITION (the incarnation is not
  // the host's current one, or was declared DEAD or LEFT: register a fresh incarnation).
  absl::Status Heartbeat(const std::string& host, const std::string& incarnation);

  // OK when `incarnation` is the host's current, ALIVE one. Errors: as Heartbeat.
  absl::Status CheckCurrent(const std::string& host, const std::string& incarnation);

  // Records that the worker now holds executable `fingerprint`. Errors: as Heartbeat.
  absl::Status AddExecutable(const std::string& host, const std::string& incarnation,
                             const std::string& fingerprint);

  // Marks the incarnation LEFT. Errors: as Heartbeat.
  absl::Status Deregister(const std::string& host, const std::string& incarnation);

  // Declares DEAD every ALIVE worker whose last heartbeat is older than the timeout and
  // returns the entries declared dead since the last call (timed out or replaced by a new
  // incarnation), each once, so their jobs can be failed.
  std::vector<WorkerEntry> ExpireOverdue();

  // Every host's current entry (forgotten hosts are not listed), by slice and then host name
  // in natural order (w-2 before w-10). Expires overdue workers first.
  std::vector<WorkerEntry> List();

  // (host, address) of each ALIVE worker, by host: what the liveness sweep prunes per-worker
  // state with, without List's copy and sort of every entry. Expires overdue workers first.
  std::vector<std::pair<std::string, std::string>> AliveAddresses();

  absl::Duration heartbeat_timeout() const { return config_.heartbeat_timeout; }
  absl::Duration heartbeat_interval() const { return config_.heartbeat_timeout / 2; }

 private:
  explicit WorkerRegistry(Config config) : config_(config) {}
  absl::StatusOr<WorkerEntry*> FindCurrent(const std::string& host,
                                           const std::string& incarnation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Declares overdue workers DEAD and queues them for ExpireOverdue. Every method that reads
  // liveness calls it, or ExpireHostIfOverdueLocked for the one host it reads (Heartbeat and
  // CheckCurrent, called per host: a full scan there costs O(hosts) per call), so the queue is
  // what guarantees each death is reported exactly once.
  void ExpireOverdueLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ExpireHostIfOverdueLocked(const std::string& host) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ExpireIfOverdueLocked(WorkerEntry& entry, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Config config_;
  absl::Mutex mu_;
  std::map<std::string, WorkerEntry> by_host_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> incarnation_host_ ABSL_GUARDED_BY(mu_);  // every one seen
  std::map<std::string, std::string> address_owner_ ABSL_GUARDED_BY(mu_);     // address -> host
  // Incarnations declared DEAD (timed out or replaced), not yet reported by ExpireOverdue.
  std::vector<WorkerEntry> newly_dead_ ABSL_GUARDED_BY(mu_);
  // Replaced incarnations, oldest first, with when: forgotten after Config::forget_after.
  std::deque<std::pair<absl::Time, std::string>> replaced_ ABSL_GUARDED_BY(mu_);
  // Forgets DEAD/LEFT hosts and replaced incarnations past Config::forget_after.
  void ForgetLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops `host`'s ownership of `address`, if it holds it.
  void ReleaseAddressLocked(const std::string& address, const std::string& host)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
};

}  // namespace meshrun::coordinator
