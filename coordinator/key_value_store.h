// The rendezvous store: keys, directories and named barriers that back the PJRT client's
// key-value callbacks (multi-host TPU clients exchange topology through it).
//
// Waiting calls are asynchronous — a waiter is a callback run when its key is set, its barrier
// completes, or its deadline passes — so an RPC handler never blocks a server thread. A timer
// thread owned by the store fires deadlines; it uses real time (deadlines are absolute
// absl::Time values).
//
// Lifetime: Create() returns an owned store; destroying it (or CancelWaiters) fails every
// pending waiter with CANCELLED. Thread-safety: all methods are safe to call concurrently; callbacks run on the
// calling thread of Set/WaitAtBarrier or on the timer thread, never under the store's lock.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace meshrun::coordinator {

class KeyValueStore {
 public:
  // Quotas (docs/limits.md). A key's namespace is its first path component ("job-7/x/y" ->
  // "job-7"): one job's keys, when keys are named after jobs as meshrun's are.
  struct Config {
    int64_t max_key_bytes = 1024;
    int64_t max_value_bytes = 1 << 20;
    int64_t max_keys = 100000;
    int64_t max_total_bytes = int64_t{256} << 20;  // keys plus values
    int64_t max_keys_per_namespace = 10000;
    int64_t max_bytes_per_namespace = int64_t{64} << 20;
    int64_t max_barriers = 10000;       // live barriers
    int64_t max_barrier_tasks = 4096;   // tasks of one barrier
    int64_t max_waiters = 10000;        // pending GetAsync waiters
    // A barrier is collected this long after it completed, or after its last arrival when it
    // never completes and nobody waits on it; a later arrival starts it over.
    absl::Duration barrier_ttl = absl::Minutes(10);
  };
  using GetCallback = std::function<void(absl::StatusOr<std::string>)>;
  using BarrierCallback = std::function<void(absl::Status)>;

  // Errors: INVALID_ARGUMENT for non-positive limits.
  static absl::StatusOr<std::unique_ptr<KeyValueStore>> Create(Config config);
  ~KeyValueStore();

  // Fails every pending and future waiter with CANCELLED (a draining server calls it so no
  // call waits past the drain). Values stay readable. Idempotent.
  void CancelWaiters();

  // Errors: INVALID_ARGUMENT (empty key, key ending in "/", key or value over its limit),
  // ALREADY_EXISTS (key set and !allow_overwrite), RESOURCE_EXHAUSTED (a key or byte quota of
  // the store or of the key's namespace is full; named).
  absl::Status Set(const std::string& key, std::string value, bool allow_overwrite);

  // Calls `done` with the value once the key is set, or DEADLINE_EXCEEDED naming the key.
  // Errors via `done`: INVALID_ARGUMENT (empty key), DEADLINE_EXCEEDED, CANCELLED (shutdown),
  // RESOURCE_EXHAUSTED (max_waiters calls already wait).
  void GetAsync(const std::string& key, absl::Time deadline, GetCallback done);

  // Errors: NOT_FOUND naming the key.
  absl::StatusOr<std::string> TryGet(const std::string& key);

  // Every key under `directory` + "/" with its value, sorted by key.
  std::vector<std::pair<std::string, std::string>> List(const std::string& directory);

  // Deletes a key, or a whole directory when `key` ends in "/".
  // Errors: INVALID_ARGUMENT (empty), NOT_FOUND (nothing matched).
  absl::Status Delete(const std::string& key);

  // Arrives at barrier `barrier_id` as `task`; `done` runs once every task in `tasks` has
  // arrived (OK) or at the deadline with DEADLINE_EXCEEDED naming the missing tasks. Every
  // caller of one barrier must pass the same task set. A barrier that completed stays
  // complete: late arrivals pass at once.
  // Errors via `done`: INVALID_ARGUMENT (empty id, task not in tasks, task set differs from
  // the first caller's, id or task names over max_key_bytes, over max_barrier_tasks tasks),
  // RESOURCE_EXHAUSTED (max_barriers live barriers), DEADLINE_EXCEEDED, CANCELLED (shutdown).
  void WaitAtBarrier(const std::string& barrier_id, const std::string& task,
                     const std::vector<std::string>& tasks, absl::Time deadline,
                     BarrierCallback done);

  // What the store holds now (tests, the soak, /metrics).
  struct Stats {
    int64_t keys = 0;
    int64_t bytes = 0;
    int64_t barriers = 0;
    int64_t waiters = 0;
  };
  Stats stats();

  // Blocking forms for callers that own their thread (tests, local tools).
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout);
  absl::Status WaitAtBarrierBlocking(const std::string& barrier_id, const std::string& task,
                                     const std::vector<std::string>& tasks,
                                     absl::Duration timeout);

 private:
  struct GetWaiter {
    std::string key;
    absl::Time deadline;
    GetCallback done;
  };
  struct Barrier {
    std::set<std::string> tasks;
    std::set<std::string> arrived;
    bool complete = false;
    absl::Time touched;  // last arrival, or completion
    std::vector<std::pair<absl::Time, BarrierCallback>> waiters;
  };
  struct Usage {
    int64_t keys = 0;
    int64_t bytes = 0;
  };

  explicit KeyValueStore(Config config);
  void TimerLoop();
  bool TimerHasWorkLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return shutting_down_ || waiter_added_;
  }
  // Checks the quotas for setting `key` (new or replacing `old_bytes`) to `bytes` bytes.
  absl::Status CheckQuotaLocked(const std::string& key, bool exists, int64_t old_bytes,
                                int64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AccountLocked(const std::string& key, int64_t keys, int64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CollectBarriersLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Config config_;
  absl::Mutex mu_;
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
  std::multimap<std::string, GetWaiter> get_waiters_ ABSL_GUARDED_BY(mu_);  // by key
  std::map<std::string, Barrier> barriers_ ABSL_GUARDED_BY(mu_);
  Usage total_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Usage> namespaces_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  bool waiter_added_ ABSL_GUARDED_BY(mu_) = false;  // wakes TimerLoop to poll for its deadline
  std::thread timer_;
};

}  // namespace meshrun::coordinator
