// Fan-out of live global summaries to watchers (WatchTelemetry), with backfill from history.
//
// A watcher subscribes to a job from `since_step`. It first reads the job's history (lazily, in
// batches of `backfill_batch`, on the consumer's TryPop/Pop), then continues with live
// summaries, with no gap and no duplicate at the seam:
//   * Subscribe registers the watcher for live summaries under the hub lock, before any history
//     is read; from then on every Publish queues into it;
//   * every published summary was committed to the HistoryStore before Publish (the caller's
//     obligation), so a history read that starts after registration sees every summary
//     published before it;
//   * the watcher delivers history from its next wanted step; it switches to its live queue when
//     a history read returns less than a full batch (history exhausted) or reaches the step of
//     the oldest queued live summary; queued live summaries below its next wanted step (already
//     delivered from history) are dropped.
//
// Flow control: each watcher queues at most `watcher_capacity` live summaries. Publish never
// waits for a watcher: when a watcher's queue is full, the watcher is closed at once (its queue
// freed) with RESOURCE_EXHAUSTED whose message names the step to resume from — the first step
// it did not deliver — also available as resume_step(). Subscribing again with since_step =
// resume_step() loses nothing (those summaries are in history).
//
// Retention: steps that HistoryStore::Prune removed before a watcher read them are skipped
// (the watcher continues from the oldest kept step).
//
// End of stream: EndJob(job), or Watcher::Close(), ends the watcher with OK after it has
// delivered what it owes: for EndJob, the rest of the history and every summary published
// before the end; for Close, what is already queued (a watcher still reading history stops at
// once). A job that is not open in the hub (finished, or from before a restart) can still be
// watched: its history is delivered, then OK.
//
// Rewind: when a job restarts from a checkpoint, Rewind(job, step) queues a rewind event; a
// watcher that delivered steps after `step` delivers the event and then those steps again, as
// the new run publishes them.
//
// Names and detail: a watcher asking for `names` gets only those series in each summary (and
// in host_detail); host_detail is kept only when asked for. Watchers without a names filter
// share one immutable copy of each published summary (one with, one without host_detail), and
// its serialized bytes (PopResult::serialized): serialized once, whatever the watcher count.
//
// Wake-ups: Publish and EndJob only queue items and mark watchers; the notify callbacks of
// watchers waiting after kEmpty run on the hub's own notifier thread, so a publisher's cost
// does not grow with what the callbacks do (e.g. start a gRPC write per watcher). Publish
// hands them over a few at a time as it goes, so the first writes start while it queues.
//
// Lifetime: the HistoryStore given in Config must outlive the hub and every Watcher. Watchers
// are shared: the hub holds them weakly, so dropping the last reference unsubscribes. When the
// hub is destroyed, open watchers end with UNAVAILABLE; the destructor runs the notify
// callbacks still due before it returns.
// Thread-safety: every method of WatchHub and Watcher is safe to call concurrently; a watcher's
// items are delivered once each even with several consumers, but in order only to one.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "meshrun/v1/telemetry.pb.h"
#include "telemetry/history_store.h"

namespace meshrun::telemetry {

class WatchHub;

class Watcher {
 public:
  enum class Kind {
    kItem,   // `summary` holds the next summary
    kEmpty,  // nothing now; the notify callback will run when something arrives
    kEnd,    // the stream is over; `status` says why (OK = end of stream)
  };
  struct PopResult {
    Kind kind = Kind::kEmpty;
    std::shared_ptr<const v1::GlobalSummary> summary;  // kItem only; may be shared, never mutated
    absl::Status status;
    // kItem of a watcher without a names filter: `summary` in its wire form, serialized once
    // when published and shared by every such watcher (a server writes these bytes as they
    // are). Null otherwise (history rows, filtered summaries): serialize `summary`.
    std::shared_ptr<const std::string> serialized;
  };

  ~Watcher();
  Watcher(const Watcher&) = delete;
  Watcher& operator=(const Watcher&) = delete;

  // Never waits for a publisher; may read one batch from history (bounded work) while the
  // watcher is backfilling. After kEnd every call returns kEnd with the same status.
  PopResult TryPop();

  // Waits up to `timeout` (real time) for an item or the end; kEmpty on timeout.
  PopResult Pop(absl::Duration timeout);

  // Sets the callback run when an item or the end becomes available after a TryPop returned
  // kEmpty: once per kEmpty, on the hub's notifier thread (on the caller's for Close), with no
  // hub or queue lock held. It must be quick and must not block (it delays other watchers'
  // wake-ups) — e.g. start the one gRPC write in flight by calling TryPop — and must not call
  // SetNotify. Set it before the first TryPop (right after Subscribe), or a wake-up may be
  // lost. SetNotify waits for a running callback to return, so after SetNotify(nullptr) the old
  // callback is not running and never runs again (a reactor calls it in OnDone before it is
  // destroyed).
  void SetNotify(std::function<void()> notify);

  // Ends the watcher with OK once it has delivered what is already queued.
  void Close();

  // The first step this watcher has not delivered: since_step, then the last delivered + 1.
  int64_t resume_step() const;
  const std::string& job_id() const { return job_id_; }

 private:
  friend class WatchHub;
  enum class Mode { kBackfill, kLive };
  // A published summary and its serialized form, both shared and immutable.
  struct Shared {
    std::shared_ptr<const v1::GlobalSummary> summary;
    std::shared_ptr<const std::string> serialized;
  };

  Watcher(HistoryStore* history, std::string job_id, int64_t since_step,
          std::vector<std::string> names, bool host_detail, size_t capacity, size_t batch);

  // Called by the hub with its lock held. Each returns true when it made something available
  // to a consumer waiting after kEmpty: the hub then has Notify() called, without its lock.
  // `full` is the published summary, `no_detail` the same without host_detail. Push sets
  // `*closed` when the watcher takes no more (closed, ended, aborted before this push): the hub
  // then forgets it. One lock per delivery, closed or not.
  bool Push(const Shared& full, const Shared& no_detail, bool* closed);
  // The job rewound to event.summary->step(): drops the queued summaries after it and, when
  // this watcher delivered steps after it, queues the event next (see WatchHub::Rewind).
  bool Rewind(const Shared& event);
  // No more live items: drain (history, then the queue) and end with `status` (OK for EndJob).
  bool End(absl::Status status);
  // Ends at once with `status` (an error), dropping what is queued.
  bool Abort(absl::Status status);
  // Runs the notify callback, if any. Called with no lock held.
  void Notify() ABSL_LOCKS_EXCLUDED(mu_, notify_mu_);
  // True when the watcher takes no more live items.
  bool closed() const;

  // Applies this watcher's names filter and host_detail choice.
  void Shape(v1::GlobalSummary& summary) const;
  // In live mode: the next live item (not yet filtered by names), the end, or kEmpty (armed).
  PopResult TakeLiveLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Filters a live item by names (a copy; shared items are never changed).
  PopResult ShapeLive(PopResult result) const;
  void AbortLocked(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool FireLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool NotArmed() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !armed_; }

  HistoryStore* const history_;
  const std::string job_id_;
  const std::vector<std::string> names_;
  const std::set<std::string> name_set_;
  const bool host_detail_;
  const size_t capacity_;
  const size_t batch_;

  absl::Mutex pop_mu_ ABSL_ACQUIRED_BEFORE(mu_);  // serializes consumers (history reads)
  mutable absl::Mutex mu_;
  Mode mode_ ABSL_GUARDED_BY(mu_) = Mode::kBackfill;
  int64_t next_step_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::GlobalSummary> backfill_ ABSL_GUARDED_BY(mu_);
  // Without a names filter, already shaped (the variant with or without host_detail).
  std::deque<Shared> live_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;        // no more live items will come
  absl::Status end_status_ ABSL_GUARDED_BY(mu_);   // when ended_: how it ends after draining
  bool final_ ABSL_GUARDED_BY(mu_) = false;        // over: TryPop returns kEnd(final_status_)
  absl::Status final_status_ ABSL_GUARDED_BY(mu_);
  bool armed_ ABSL_GUARDED_BY(mu_) = false;        // a TryPop returned kEmpty
  uint64_t rewinds_ ABSL_GUARDED_BY(mu_) = 0;      // Rewind calls so far
  absl::Mutex notify_mu_;                          // held while the callback runs
  std::function<void()> notify_ ABSL_GUARDED_BY(notify_mu_);
};

class WatchHub {
 public:
  struct Config {
    HistoryStore* history = nullptr;  // required; must outlive the hub and its watchers
    size_t watcher_capacity = 256;    // live summaries queued per watcher
    size_t backfill_batch = 64;       // history rows read per backfill step
  };

  struct SubscribeRequest {
    std::string job_id;
    int64_t since_step = 0;          // 0 = from the oldest kept step
    std::vector<std::string> names;  // empty = every series
    bool host_detail = false;
    bool history_only = false;       // deliver the history, then end (no live summaries)
  };

  // Errors: INVALID_ARGUMENT (history null, capacity or batch 0).
  static absl::StatusOr<std::unique_ptr<WatchHub>> Create(Config config);
  ~WatchHub();
  WatchHub(const WatchHub&) = delete;
  WatchHub& operator=(const WatchHub&) = delete;

  // Opens a job for live summaries with its series names (validates watchers' names before
  // the first summary). Errors: INVALID_ARGUMENT (empty job_id), ALREADY_EXISTS (open).
  absl::Status OpenJob(const std::string& job_id, std::vector<std::string> series);

  // Queues a committed summary to the job's watchers; never blocks on them. Steps must
  // increase per job. Errors: FAILED_PRECONDITION (job not open), INVALID_ARGUMENT (step not
  // above the last published one, named). Taken by value: its host_detail moves into the
  // shared copy, and the copy without it is made without copying a host summary.
  absl::Status Publish(v1::GlobalSummary summary);

  // The job restarted from its checkpoint of `step` (the caller dropped the history after it,
  // HistoryStore::Rewind): each watcher that delivered steps after `step` gets a rewind event (a
  // summary with `rewind` set, step = `step`, no values) and then those steps again; the next
  // Publish may be any step above `step`. Errors: FAILED_PRECONDITION (job not open).
  absl::Status Rewind(const std::string& job_id, int64_t step, v1::JobRewind rewind);

  // Ends the job's watchers with OK after they drain; later Publish is FAILED_PRECONDITION.
  // Errors: NOT_FOUND (job not open).
  absl::Status EndJob(const std::string& job_id);

  // Errors: NOT_FOUND (job neither open nor in history; a name that is not a series of the
  // job, named), INVALID_ARGUMENT (since_step < 0, or beyond the latest step + 1 — the message
  // names the latest), plus HistoryStore errors.
  absl::StatusOr<std::shared_ptr<Watcher>> Subscribe(const SubscribeRequest& request);

  // Watchers currently registered for the job's live summaries (closed ones excluded).
  int WatcherCount(const std::string& job_id) const;

  // Waits until every notify callback due from calls that returned before this one has run.
  // Not from a notify callback (it would wait for itself).
  void FlushNotifications() ABSL_LOCKS_EXCLUDED(wake_mu_);

 private:
  struct Job {
    std::set<std::string> series;
    int64_t last_published = 0;
    std::vector<std::weak_ptr<Watcher>> watchers;
  };

  explicit WatchHub(Config config) : config_(config) {}

  // Publish hands the notifier this many watchers at a time, as it queues to them.
  static constexpr size_t kWakeChunk = 32;

  // Has the notifier thread run these watchers' callbacks.
  void Wake(std::vector<std::shared_ptr<Watcher>> watchers) ABSL_LOCKS_EXCLUDED(wake_mu_);
  void NotifyLoop() ABSL_LOCKS_EXCLUDED(wake_mu_);

  const Config config_;
  mutable absl::Mutex mu_;
  std::map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);

  absl::Mutex wake_mu_ ABSL_ACQUIRED_AFTER(mu_);  // Publish wakes with mu_ held
  std::vector<std::shared_ptr<Watcher>> wake_ ABSL_GUARDED_BY(wake_mu_);  // to notify, in order
  uint64_t queued_ ABSL_GUARDED_BY(wake_mu_) = 0;    // wake-ups queued so far
  uint64_t notified_ ABSL_GUARDED_BY(wake_mu_) = 0;  // wake-ups whose callback has run
  bool stop_ ABSL_GUARDED_BY(wake_mu_) = false;      // the destructor's: drain, then exit
  std::thread notifier_;
};

}  // namespace meshrun::telemetry
