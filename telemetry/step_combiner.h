// The coordinator's step combiner: collects each job's per-host summaries of a logging step
// and turns them into one global summary per step.
//
// A job is started with its hosts (name and replica count; the list order is the host index
// that COMBINE_LAST and host_detail follow) and its telemetry declarations (name, shape,
// combine). Each HostSummary is validated against them, then kept until its step is
// emittable:
//   * complete: every host of the job has reported that step, or
//   * expired: `grace` (measured on the injected clock from the first host summary of that
//     step) has passed; it is emitted with partial=true and the missing hosts named, combined
//     over the hosts that did report (a mean is weighted by their replica counts only).
// Steps are emitted in increasing step order per job: an emittable step waits for every
// earlier pending step of its job to become emittable too (a complete step 20 waits while
// step 10 is still within its grace). Once a step is emitted, a summary for it (or for any
// earlier step) is ignored: kDuplicate when that host already reported it or a later step
// (hosts send in step order), kLate otherwise (it missed the grace; the step stays partial).
// A summary resent for a pending step by a host that already reported it (a reconnecting
// worker replaying its buffer) is ignored too: the first copy wins.
//
// An emitted GlobalSummary carries: values in declaration order (declared shape, combined
// values, threshold_exceeded = OR over the reporting hosts), step_time_seconds and
// data_wait_seconds = max over the reporting hosts, wall_time_unix_micros = max over them,
// synthetic_data = OR over them, partial/missing_hosts (host order), and host_detail = every
// reporting host's summary in host order. Readers strip host_detail unless asked for it (see
// HistoryStore::Read, WatchHub).
//
// Delivery: emitted summaries go to Config::sink, one call at a time (never concurrently, even
// across jobs), in increasing step order per job, without any combiner lock held. The thread
// that delivers is whichever Add/Poll/FinishJob call queued steps while no other thread was
// delivering, so an Add that completes a step on an idle combiner returns after its sink ran;
// a call that finds another thread delivering only queues and returns (it never waits). The sink
// must therefore not assume it runs on the caller's thread; it may call back into the
// combiner (such calls queue and return). Intended sink: HistoryStore::Append, then
// WatchHub::Publish.
//
// Restart: StartJob's `emitted_through_step` (HistoryStore::LatestStep) makes steps already
// in history count as emitted; feeding back HistoryStore::ReadHostSummaries rebuilds the
// pending steps (their grace restarts).
//
// Bounded memory: at most `max_pending_steps` steps per job are held; a summary that opens one
// more forces the oldest pending step out (as partial, naming its missing hosts).
//
// Lifetime: Create() returns an owned combiner; the clock must outlive it.
// Thread-safety: every method is safe to call concurrently.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "meshrun/v1/telemetry.pb.h"
#include "telemetry/combine.h"

namespace meshrun::telemetry {

class StepCombiner {
 public:
  struct Config {
    // How long a step waits for its missing hosts, from its first host summary.
    absl::Duration grace = absl::Seconds(5);
    // Steps held per job before the oldest is forced out as partial.
    int max_pending_steps = 1024;
    Clock* clock = &RealClock();
    // Receives every emitted summary (see "Delivery" above). Required.
    std::function<void(v1::GlobalSummary)> sink;
  };

  struct Host {
    std::string host;
    int replica_count = 1;
  };

  struct JobSetup {
    std::string job_id;
    std::vector<Host> hosts;  // order = host index
    std::vector<v1::TelemetryDeclaration> declarations;
    // Steps <= this count as already emitted (restart from history); 0 for a new job.
    int64_t emitted_through_step = 0;
    // The compiler's FLOPs of one step per device and the chip's peak FLOP/s (0: unknown):
    // each summary then carries tflops_per_device and, with a peak, mfu.
    double step_flops_per_device = 0;
    double peak_flops_per_device = 0;
  };

  enum class AddOutcome {
    kAccepted,   // kept for its step (and maybe completed it)
    kDuplicate,  // this host already reported this step; ignored
    kLate,       // the step was already emitted (partial) without this host; ignored
  };

  // Errors: INVALID_ARGUMENT when the sink or clock is null, grace is negative or
  // max_pending_steps < 1.
  static absl::StatusOr<std::unique_ptr<StepCombiner>> Create(Config config);

  ~StepCombiner();
  StepCombiner(const StepCombiner&) = delete;
  StepCombiner& operator=(const StepCombiner&) = delete;

  // Starts collecting for a job.
  // Errors: INVALID_ARGUMENT naming the field (empty job_id; no hosts; empty or repeated host;
  // replica_count < 1; a declaration with an empty or repeated name, a negative dimension or
  // COMBINE_UNSPECIFIED; emitted_through_step < 0), ALREADY_EXISTS (job already started).
  absl::Status StartJob(JobSetup setup);

  // Takes one host's summary of one step; may deliver summaries that became emittable.
  // Errors (the combiner's state is unchanged): NOT_FOUND (job not started; the wire contract
  // of UploadTelemetry), INVALID_ARGUMENT naming the field: step < 1, unknown host,
  // replica_count differing from the job's (0 means "as declared"), a series that is not
  // declared or appears twice, a declared series missing, a shape or value count that differs
  // from the declaration, a negative or non-finite step_time_seconds or data_wait_seconds.
  // The summary is moved from only when it is kept (kAccepted); otherwise it is left as it was.
  absl::StatusOr<AddOutcome> Add(v1::HostSummary&& summary);
  absl::StatusOr<AddOutcome> Add(const v1::HostSummary& summary) {
    return Add(v1::HostSummary(summary));
  }

  // Emits every step whose grace has passed (and the complete steps queued behind them).
  // Call when NextDeadline() is reached, or periodically.
  void Poll();

  // The earliest grace deadline among pending steps of all jobs; nullopt when none pend.
  std::optional<absl::Time> NextDeadline() const;

  // Emits every pending step of the job now (partial where hosts are missing) and forgets the
  // job; later summaries for it are NOT_FOUND. Errors: NOT_FOUND (job not started).
  absl::Status FinishJob(const std::string& job_id);

  // Forgets the job and drops its pending steps without emitting them (a run that ended in a
  // restart: its unfinished steps run again). Returns the highest step emitted.
  // Errors: NOT_FOUND (job not started).
  absl::StatusOr<int64_t> AbandonJob(const std::string& job_id);

  // The highest step emitted (queued for the sink) for the job, or emitted_through_step.
  // Errors: NOT_FOUND.
  absl::StatusOr<int64_t> LastEmittedStep(const std::string& job_id) const;

  // Steps currently held for the job. Errors: NOT_FOUND.
  absl::StatusOr<int> PendingSteps(const std::string& job_id) const;

 private:
  struct Series {
    std::string name;
    std::vector<int64_t> shape;
    int64_t elements = 1;
    Combine combine = Combine::kMean;
  };
  struct PendingStep {
    absl::Time deadline;
    std::map<int, v1::HostSummary> by_host;  // host index -> summary
  };
  struct Job {
    std::vector<Host> hosts;
    std::map<std::string, int> host_index;
    std::vector<Series> series;
    std::map<std::string, int> series_index;
    int64_t emitted_through = 0;
    double step_flops_per_device = 0;
    double peak_flops_per_device = 0;
    std::vector<int64_t> last_reported;      // by host index: highest step it sent
    std::map<int64_t, PendingStep> pending;  // by step
  };

  explicit StepCombiner(Config config) : config_(std::move(config)) {}

  absl::Status Validate(const Job& job, const v1::HostSummary& summary) const;
  // Moves emittable steps of `job` to the outbox, in order; `force` emits all pending.
  void CollectLocked(const std::string& job_id, Job& job, absl::Time now, bool force)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EmitLocked(const std::string& job_id, Job& job, int64_t step, PendingStep& pending)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the caller, which holds mu_ since it queued its steps, now delivers the outbox:
  // claimed in the same critical section, so another thread (the grace poller) cannot take
  // over the steps an Add emitted and leave them undelivered when Add returns.
  bool ClaimDeliveryLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Delivers the outbox until it is empty; only after ClaimDeliveryLocked returned true.
  void DeliverClaimed() ABSL_LOCKS_EXCLUDED(mu_);

  const Config config_;
  mutable absl::Mutex mu_;
  std::map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::GlobalSummary> outbox_ ABSL_GUARDED_BY(mu_);
  bool delivering_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace meshrun::telemetry
