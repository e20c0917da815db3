// The worker's step loop: runs one job's compiled training steps on this host's devices, on a
// thread of its own, with no network at all (no RPC per step).
//
//   init(seed) -> state on device
//   for s = 1..steps:  take batch s (uploaded while step s-1 ran; batch s+1's upload is issued
//                      before step s is launched), launch it with the state donated, keep the
//                      state outputs on device; on a logging step reduce the telemetry outputs on
//                      device and read ONE fixed-shape f32 vector to the host.
//
// Mode A steps are pipelined two deep: step s is launched on the state step s-1 is still
// computing (the runtime orders them), and only then does the loop wait for step s-1, so the
// devices do not idle while the host prepares a step. Logging steps pipeline too: step s's
// telemetry outputs are not inputs of step s+1, so they are reduced and read after step s+1 was
// launched, while it computes. A step after which a checkpoint is due (or requested, or the stop
// after one) and the last step are waited for before the next launch, so a checkpoint sees the
// state of exactly that step. (A telemetry output that is also a state output is read before the
// next launch, since that step takes it.)
// Cancel semantics: a Cancel() (or RequestCheckpoint) from the sink of step s may find step s+1
// already launched, as under JAX's asynchronous dispatch: step s+1 then completes, its telemetry
// (if a logging step) reaches the sink after step s's, and the loop ends with s+1 as its last
// completed step. Nothing completed is dropped: every completed logging step's summary reaches
// the sink, in step order, and LoopResult::last_completed_step is the last step that actually
// completed. A checkpoint asked for from step s's sink is taken after step s+1.
// A failure is reported for the step that failed; a step launched after it is waited for and
// discarded. last_completed_step() counts steps known to be complete.
//
// Compile mode B (an MoE job, Config::grad and Config::apply instead of Config::step):
//   init(seed) -> state; the gradient accumulators are uploaded as zeros ONCE, after init
//   for s = 1..steps:  for m = 1..grad_accumulation: grad(state, grad_acc, micro-batch m) ->
//                      grad_acc (accumulators donated, so accumulation happens on device; each
//                      micro-step takes its own batch from the BatchSource, prefetched the same
//                      way); then Config::reduce_gradients if given (the point where a cross-host
//                      all-reduce of grad_acc plugs in); then apply(state, grad_acc) -> (state,
//                      grad_acc zeroed, metrics), state and accumulators donated. apply returns
//                      the accumulators zeroed on device, ready for the next step: no upload of
//                      zeros per step. Telemetry comes from apply's outputs (the exporter's grad
//                      sums each micro-step's loss into an accumulator; apply divides by the
//                      micro-step count, so metrics.loss is the mean over the step's micro-batches).
//   Cancel is honoured between micro-steps too; a failure names step, micro-step and program:
//   "step 3, micro-step 2 (grad): <message>", "step 3 (apply): <message>".
//
// Telemetry is reduced on device by a TelemetryReducer (worker/telemetry_reducer.h); the
// loop copies one f32 vector from one device with a single ToHost, on logging steps only.
//
// Thread-safety: StepLoop's public methods are safe to call concurrently from any thread.
// Callbacks (sink, on_done) run on the loop's thread.
// Lifetime: the Runtime and Metrics given in Config must outlive the StepLoop; executables are
// shared and kept alive by the loop. The destructor stops the loop (Stop()).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "telemetry/cadence.h"
#include "telemetry/combine.h"
#include "worker/metrics.h"
#include "runtime/runtime.h"
#include "worker/telemetry_reducer.h"

namespace meshrun::worker {

// Where a job's batches come from. Next() returns the GLOBAL arrays of the next step's batch
// (mode B: the next micro-step's), in the step's (grad's) batch-input order; the loop shards them
// per local device. Only the blocks of this host's partitions are uploaded, so a source may leave
// the other hosts' rows zero (worker/batch_sources.h fills only the host's data-parallel slice).
// Thread-safety: the loop calls Next() from its prefetch thread only, once per step (mode B: per
// micro-step), in order, never concurrently. Next() should not block indefinitely: Stop() waits
// for a call in progress.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // Errors: any; the loop fails the step the batch was for with "step <s>: <message>".
  virtual absl::StatusOr<std::vector<runtime::HostArray>> Next() = 0;
  // Positions the source as if Next() had been called `consumed` times, so that a job resumed
  // from a checkpoint takes the batches the uninterrupted run would have. The default calls
  // Next() that many times; sources that can seek override it.
  // Errors: Next()'s.
  virtual absl::Status Skip(int64_t consumed);
};

// One declared telemetry output of the step program.
struct TelemetryOutput {
  std::string name;    // the series name, e.g. "loss"
  std::string output;  // the step output it reads, e.g. "metrics.loss"; "" = the one named `name`
  telemetry::Combine combine = telemetry::Combine::kMean;
  std::optional<double> threshold;    // a flag is raised when a value is not <= threshold
  std::vector<std::string> sharding;  // mesh axis per output dimension; empty = replicated
};

// What a logging step does when a scalar telemetry value (the loss, the grad norm) is NaN or
// infinite (meshrun.v1.NonFinitePolicy). The values checked are the ones the logging step
// already reduced on device and read to the host: the check adds no transfer and no sync.
enum class NonFinitePolicy {
  kFail,    // the summary goes out, then the loop ends kFailed (LoopResult::nonfinite)
  kWarn,    // a warning is logged; the loop goes on
  kIgnore,  // nothing is checked
};

// What the loop runs. All indices refer to the step program's per-device inputs/outputs; in
// mode B to grad's inputs (state, grad_acc, batch) and apply's outputs (state, grad_acc, metrics).
struct RunSpec {
  std::string job_id;
  std::string host;
  int num_state = 0;   // step inputs/outputs [0, num_state) are the state, donated each step
  // Mode B only: micro-steps per step (>= 1), and how many arrays the accumulator has: grad's
  // inputs [num_state, num_state + num_grad_acc) and outputs [0, num_grad_acc); apply's inputs
  // and outputs [num_state, num_state + num_grad_acc).
  int grad_accumulation = 0;
  int num_grad_acc = 0;
  uint64_t seed = 0;   // the init program's single scalar input (its declared integer dtype)
  std::vector<std::string> mesh_axes;  // ("data",), ("data","model"), ...
  std::vector<int64_t> mesh_shape;
  // Global device id of each mesh partition, in partition order. Empty: the step executable's
  // devices are partitions 0..n-1 in order (a single-host job).
  std::vector<int64_t> device_ids;
  // The mesh partition of each device_ids entry when device_ids names only some devices (the
  // mesh a host's StartJob carries: MeshAssignment.partitions). Empty: device_ids[p] is
  // partition p's.
  std::vector<int64_t> device_partitions;
  // Per batch input (step inputs num_state..end; mode B: grad inputs num_state + num_grad_acc..
  // end): mesh axis per dimension, "" = not split.
  std::vector<std::vector<std::string>> batch_sharding;
  std::vector<TelemetryOutput> telemetry;
  int64_t telemetry_cadence = 1;  // a logging step every N steps (telemetry/cadence.h)
  int64_t steps = 0;
  int replica_count = 1;          // data-parallel replicas on this host (weights the global mean)
  bool synthetic_data = false;    // marked in every summary
  NonFinitePolicy on_nonfinite = NonFinitePolicy::kFail;
  // The first step to run: 1, or 1 + the step of the checkpoint a resumed job starts from
  // (Config::restore_state). steps + 1 runs nothing.
  int64_t first_step = 1;
};

// One host's summary of one logging step (meshrun.v1.HostSummary).
struct HostStepSummary {
  std::string job_id;
  int64_t step = 0;
  std::string host;
  int replica_count = 1;
  std::vector<TelemetryValue> values;  // in RunSpec::telemetry order
  // Wall time of this step: from the loop starting it (waiting for its batch included) until
  // its outputs were ready; the telemetry reduction is not included.
  absl::Duration step_time;
  absl::Duration data_wait;  // part of step_time: waiting for the step's batch on device
  absl::Time wall_time;  // when the summary was made (Config::clock)
  bool synthetic_data = false;
};

enum class LoopOutcome { kSucceeded, kFailed, kCancelled };
std::string LoopOutcomeName(LoopOutcome outcome);  // "SUCCEEDED", "FAILED", "CANCELLED"

struct LoopResult {
  LoopOutcome outcome = LoopOutcome::kSucceeded;
  absl::Status error;  // set when kFailed: "step <s>: <plugin message>" (or "init: ...", see mode B)
  int64_t last_completed_step = 0;  // 0: no step completed
  bool restore_failed = false;      // kFailed while restoring the checkpoint (restore_state)
  // kFailed by NonFinitePolicy::kFail: error names the step and the series.
  bool nonfinite = false;
};

class StepLoop {
 public:
  // Must enqueue and return: it runs on the loop thread between steps, so any time it takes is
  // training time. The loop records its duration under "TelemetrySinkTime" and logs a warning
  // when one call exceeds Config::slow_sink_warning. Callbacks must not call Wait(); Stop() from
  // a callback only cancels.
  using SummarySink = std::function<void(HostStepSummary)>;
  using DoneCallback = std::function<void(const LoopResult&)>;
  // [device (in the program's device order)][array]
  using DeviceBuffers = std::vector<std::vector<std::unique_ptr<runtime::DeviceBuffer>>>;
  // Mode B: runs on the loop thread after a step's last grad micro-step, before apply, with the
  // accumulators [device][grad_acc array]; it may replace the buffers (same shapes). An error
  // fails the step ("step <s>: gradient reduction: <message>").
  using GradientHook = std::function<absl::Status(DeviceBuffers& grad_acc)>;
  // Resume: makes the state [device][state input] on `device_indices` (the step's devices,
  // running mesh partitions `partitions`) instead of running init.
  using RestoreState = std::function<absl::StatusOr<DeviceBuffers>(
      const std::vector<int>& device_indices, const std::vector<int64_t>& partitions)>;
  // Checkpoints: runs on the loop thread after step `step` completed (see Config::checkpoint_every)
  // with the state [device][state input], the step's devices' mesh partitions, and the batches
  // the source has handed out so far (mode B: micro-batches). It must copy what it keeps before
  // it returns, since the next step donates the state; the loop records the time it takes as
  // CheckpointBlockingTime. It reports its own errors: the loop goes on regardless.
  using CheckpointHook = std::function<void(int64_t step, const DeviceBuffers& state,
                                            const std::vector<int64_t>& partitions,
                                            int64_t data_position)>;

  struct Config {
    runtime::Runtime* runtime = nullptr;  // borrowed; must outlive the loop
    std::shared_ptr<const runtime::Executable> init;
    std::shared_ptr<const runtime::Executable> step;  // needs its signature when telemetry is declared
    // Compile mode B instead of `step` (see the file comment); apply needs its signature when
    // telemetry is declared.
    std::shared_ptr<const runtime::Executable> grad;
    std::shared_ptr<const runtime::Executable> apply;
    GradientHook reduce_gradients;  // mode B, may be empty
    RestoreState restore_state;     // may be empty: run init
    CheckpointHook checkpoint;      // may be empty: no checkpoints
    // A checkpoint after every N-th step and after the last one; 0 = only when requested.
    int64_t checkpoint_every = 0;
    // In-memory checkpoints (worker/memory_checkpoints.h): after every N-th step but the last,
    // and after the step a preemption saves (then stops at), before `checkpoint` on a step that
    // has both; 0 or an empty hook = none. In mode B also when the gradient reduction fails (a
    // host replica lost mid-step): the state is then still the last completed step's, so the
    // restart re-runs nothing.
    CheckpointHook memory_checkpoint;
    int64_t memory_checkpoint_every = 0;
    RunSpec spec;
    std::unique_ptr<BatchSource> batches;
    SummarySink sink;       // may be empty
    DoneCallback on_done;   // called exactly once, on the loop thread, when the loop ends
    Metrics* metrics = nullptr;  // borrowed; null: the loop keeps its own
    Clock* clock = &RealClock();
    absl::Duration slow_sink_warning = absl::Milliseconds(5);
  };

  // Validates the spec against the executables and compiles the telemetry reducer.
  // Errors: INVALID_ARGUMENT (missing runtime/executables/batch source; steps or replica_count
  // < 1; telemetry_cadence < 1 (telemetry/cadence.h); num_state not matching init's outputs or
  // larger than the step's; init and step on different devices; mesh axes/shape/device ids
  // inconsistent; batch_sharding not matching the step's inputs; a telemetry output the step
  // does not return, or declared without a step signature; mode B: grad or apply missing or
  // given with step, grad_accumulation or num_grad_acc < 1, grad's and apply's accumulator
  // shapes differing); the reducer's compile errors.
  static absl::StatusOr<std::unique_ptr<StepLoop>> Create(Config config);
  ~StepLoop();

  // Starts the loop thread. Errors: FAILED_PRECONDITION when already started.
  absl::Status Start();
  // Asks the loop to end; returns at once. Honoured before init and between steps (the steps in
  // flight, up to two in mode A, complete; mode B: also between micro-steps): the outcome is
  // kCancelled with the last completed step.
  void Cancel();
  // Asks for a checkpoint after the step in flight (or the next one to start); with `then_stop`
  // the loop ends cancelled right after it (a preempted host loses no step). Without
  // Config::checkpoint only `then_stop` has an effect (a plain Cancel). Returns at once.
  void RequestCheckpoint(bool then_stop = false);
  // Asks for a checkpoint after exactly step `step` (a job-wide checkpoint: every host saves the
  // same step, docs/checkpoints.md); with `then_stop` the loop ends cancelled right after it. A
  // later target replaces an earlier one. Errors: INVALID_ARGUMENT (step < 1 or beyond the
  // run's steps), FAILED_PRECONDITION (the loop is past that step already: its state is gone).
  absl::Status RequestCheckpointAt(int64_t step, bool then_stop);
  // Cancel(), then waits until the loop thread (and its prefetch thread) ended. Idempotent.
  void Stop();
  // Blocks until the loop ended (Start must have been called, else returns at once with an
  // error result FAILED_PRECONDITION).
  LoopResult Wait();
  // The result once the loop ended.
  std::optional<LoopResult> result() const;
  int64_t last_completed_step() const;
  // The metrics the loop records into (the shared registry when one was given).
  std::vector<MetricValue> MetricsSnapshot() const;
  // The reducer's program (empty when no telemetry is declared); for inspection.
  std::string telemetry_program() const;

 private:
  StepLoop(Config config, telemetry::Cadence cadence);
  void Run();
  absl::Status RunSteps();
  absl::Status RunModeBSteps();
  // Mode B: uploads the zero accumulators once, after init.
  absl::Status ZeroAccumulators();
  absl::Status Initialize();
  // A mode A step launched and not yet known to be complete.
  struct InFlight {
    int64_t step = 0;
    absl::Time start;     // the loop began the step (waiting for its batch included)
    absl::Time launched;
    absl::Duration data_wait;  // in TakeBatch
    DeviceBuffers outputs;  // the state outputs move to state_ once the next step takes them
    DeviceBuffers batch;    // kept until the step completed
    std::unique_ptr<runtime::ExecutionEvent> done;
  };
  // Waits for `step`, then records it (StepDone) and counts it completed.
  absl::Status CompleteStep(InFlight& step);
  // What follows step `s`: its checkpoint, and the stop after it.
  struct AfterStep {
    bool checkpoint = false;  // run the checkpoint hook on step s's state
    bool memory = false;      // run the memory checkpoint hook on it
    bool stop = false;        // then end the loop cancelled
  };
  // Decides, once per step and for good, what follows step `s` (consuming a RequestCheckpoint,
  // or a RequestCheckpointAt(s)): once it returns, a checkpoint of step `s` can no longer be
  // asked for, since its state goes on to step s+1.
  AfterStep DecideAfterStep(int64_t s);
  // After step `s` completed and its state is in state_: does what DecideAfterStep decided.
  void FinishStep(int64_t s, AfterStep after);
  // The memory_checkpoint of step `s`, whose state state_ still holds, unless taken already.
  void KeepStateInMemory(int64_t s);
  // Calls memory_checkpoint with state_ as step `s`'s, timed.
  void TakeMemoryCheckpoint(int64_t s);
  // The batches consumed through step `s` (mode B: micro-batches): its data position.
  int64_t BatchesThrough(int64_t s) const;
  // After step `s`'s program ran (from `start`, launched at `launched`, having waited
  // `data_wait` for its batches): records its metrics and, on a logging step, emits its
  // telemetry. A telemetry error still counts the step completed.
  absl::Status StepDone(int64_t s, absl::Time start, absl::Time launched,
                        absl::Duration data_wait, const DeviceBuffers& outputs);
  absl::Status EmitTelemetry(int64_t step, absl::Duration step_time, absl::Duration data_wait,
                             const DeviceBuffers& outputs);
  // Applies spec.on_nonfinite to a logging step's reduced values: FAILED_PRECONDITION naming
  // the step and the series under kFail (setting nonfinite_failed_), else OK.
  absl::Status CheckFinite(int64_t step, const std::vector<TelemetryValue>& values);
  // The prefetch thread: uploads the batch of each requested step.
  void PrefetchMain();
  absl::StatusOr<DeviceBuffers> FetchBatch();
  void RequestBatch(int64_t step);
  // Waits for batch `step` (mode B: the micro-batch's 1-based index over the run); CANCELLED
  // when the loop is cancelled while waiting.
  absl::StatusOr<DeviceBuffers> TakeBatch(int64_t step);
  bool cancelled() const;
  bool PrefetchWork() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  bool BatchReadyOrCancelled() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  bool ResultReady() const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  Config config_;
  Metrics own_metrics_;
  Metrics* metrics_;
  telemetry::Cadence cadence_;
  std::vector<int> devices_;          // the step's devices
  std::vector<int64_t> partitions_;   // mesh partition of each
  std::vector<int> telemetry_index_;  // step output index of each telemetry series
  // Mode A: a telemetry series is a state output, which the next step takes (donated), so a
  // logging step must be read before the next launch.
  bool telemetry_reads_state_ = false;
  std::vector<int> donate_;           // mode B: apply's
  std::vector<int> grad_donate_;      // mode B: grad's accumulator inputs
  const runtime::Executable* batch_program_ = nullptr;  // step (mode B: grad)
  int batch_offset_ = 0;              // its first batch input
  std::unique_ptr<TelemetryReducer> reducer_;
  DeviceBuffers state_;  // [device][state input]; loop thread only
  DeviceBuffers grad_acc_;  // mode B: [device][accumulator]; loop thread only
  bool restore_failed_ = false;  // loop thread only
  bool nonfinite_failed_ = false;  // loop thread only
  bool nonfinite_warned_ = false;  // loop thread only: kWarn logs the first occurrence only

  mutable absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  std::thread::id loop_thread_id_ ABSL_GUARDED_BY(mu_);
  bool cancel_ ABSL_GUARDED_BY(mu_) = false;
  bool checkpoint_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_after_checkpoint_ ABSL_GUARDED_BY(mu_) = false;
  int64_t checkpoint_at_ ABSL_GUARDED_BY(mu_) = 0;  // RequestCheckpointAt's step; 0 = none
  bool stop_at_target_ ABSL_GUARDED_BY(mu_) = false;
  int64_t checked_through_ ABSL_GUARDED_BY(mu_) = 0;  // the last step a checkpoint was decided for
  bool prefetch_shutdown_ ABSL_GUARDED_BY(mu_) = false;
  int64_t prefetch_request_ ABSL_GUARDED_BY(mu_) = 0;  // step to fetch; 0 = none
  int64_t prefetch_ready_step_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<absl::StatusOr<DeviceBuffers>> prefetched_ ABSL_GUARDED_BY(mu_);
  int64_t last_completed_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<LoopResult> result_ ABSL_GUARDED_BY(mu_);

  absl::Mutex join_mu_;  // serializes Stop() callers
  std::thread thread_;
  std::thread prefetch_thread_;
};

}  // namespace meshrun::worker
