#include "worker/step_loop.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"
#include "runtime/compile_options.h"
#include "worker/step_loop_internal.h"

namespace meshrun::worker {

using runtime::DeviceBuffer;
using runtime::DType;
using runtime::HostArray;

std::string LoopOutcomeName(LoopOutcome outcome) {
  switch (outcome) {
    case LoopOutcome::kSucceeded: return "SUCCEEDED";
    case LoopOutcome::kFailed: return "FAILED";
    case LoopOutcome::kCancelled: return "CANCELLED";
  }
  return "?";
}

absl::Status BatchSource::Skip(int64_t consumed) {
  for (int64_t i = 0; i < consumed; ++i) RETURN_IF_ERROR(Next().status());
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<StepLoop>> StepLoop::Create(Config config) {
  const bool mode_b = config.grad != nullptr || config.apply != nullptr;
  RETURN_IF_ERROR(CheckConfigComplete(config, mode_b));
  const RunSpec& spec = config.spec;
  ASSIGN_OR_RETURN(telemetry::Cadence cadence, telemetry::Cadence::Create(spec.telemetry_cadence));
  RETURN_IF_ERROR(CheckStepRange(spec));
  RETURN_IF_ERROR(CheckPrograms(config, mode_b));
  // The program that ends a step (state and telemetry out), and the one that takes the batches.
  const runtime::Executable& step = mode_b ? *config.apply : *config.step;
  const runtime::Executable& batch_program = mode_b ? *config.grad : *config.step;
  const int batch_offset = spec.num_state + (mode_b ? spec.num_grad_acc : 0);
  const std::vector<int>& devices = step.device_indices();
  ASSIGN_OR_RETURN(std::vector<int64_t> partitions,
                   PartitionsOf(spec, devices, config.runtime->addressable_devices()));
  RETURN_IF_ERROR(CheckBatchInputs(spec, batch_program, batch_offset, mode_b));
  ASSIGN_OR_RETURN(TelemetryOutputs telemetry, TelemetryOutputsOf(spec, step));

  auto loop = std::unique_ptr<StepLoop>(new StepLoop(std::move(config), cadence));
  loop->devices_ = devices;
  loop->partitions_ = partitions;
  loop->telemetry_reads_state_ = absl::c_any_of(
      telemetry.index, [&](int index) { return index < loop->config_.spec.num_state; });
  loop->telemetry_index_ = std::move(telemetry.index);
  const RunSpec& run = loop->config_.spec;
  const int num_acc = mode_b ? run.num_grad_acc : 0;
  for (int i = 0; i < run.num_state + num_acc; ++i) loop->donate_.push_back(i);
  for (int i = 0; i < num_acc; ++i) loop->grad_donate_.push_back(run.num_state + i);
  loop->batch_program_ = &batch_program;
  loop->batch_offset_ = batch_offset;
  if (!telemetry.series.empty()) {
    ASSIGN_OR_RETURN(loop->reducer_,
                     TelemetryReducer::Create({.runtime = loop->config_.runtime,
                                               .device_indices = devices,
                                               .partitions = partitions,
                                               .mesh_axes = loop->config_.spec.mesh_axes,
                                               .mesh_shape = loop->config_.spec.mesh_shape,
                                               .series = std::move(telemetry.series),
                                               .metrics = loop->metrics_,
                                               .clock = loop->config_.clock}));
  }
  return loop;
}

StepLoop::StepLoop(Config config, telemetry::Cadence cadence)
    : config_(std::move(config)),
      metrics_(config_.metrics != nullptr ? config_.metrics : &own_metrics_),
      cadence_(cadence) {}

StepLoop::~StepLoop() { Stop(); }

absl::Status StepLoop::Start() {
  {
    absl::MutexLock l(&mu_);
    if (started_) return absl::FailedPreconditionError("the step loop was already started");
    started_ = true;
    last_completed_ = config_.spec.first_step - 1;
  }
  absl::MutexLock join(&join_mu_);
  prefetch_thread_ = std::thread([this] { PrefetchMain(); });
  thread_ = std::thread([this] { Run(); });
  return absl::OkStatus();
}

void StepLoop::Cancel() {
  absl::MutexLock l(&mu_);
  cancel_ = true;
}

void StepLoop::Stop() {
  {
    absl::MutexLock l(&mu_);
    cancel_ = true;
    if (std::this_thread::get_id() == loop_thread_id_) return;  // from a callback: cancel only
  }
  absl::MutexLock join(&join_mu_);
  if (thread_.joinable()) thread_.join();
}

bool StepLoop::ResultReady() const { return result_.has_value(); }

LoopResult StepLoop::Wait() {
  absl::MutexLock l(&mu_);
  if (!started_) {
    return {LoopOutcome::kFailed, absl::FailedPreconditionError("the step loop was not started"),
            0};
  }
  mu_.Await(absl::Condition(this, &StepLoop::ResultReady));
  return *result_;
}

std::optional<LoopResult> StepLoop::result() const {
  absl::MutexLock l(&mu_);
  return result_;
}

int64_t StepLoop::last_completed_step() const {
  absl::MutexLock l(&mu_);
  return last_completed_;
}

std::vector<MetricValue> StepLoop::MetricsSnapshot() const { return metrics_->Snapshot(); }

std::string StepLoop::telemetry_program() const {
  return reducer_ == nullptr ? std::string() : reducer_->program();
}

bool StepLoop::cancelled() const {
  absl::MutexLock l(&mu_);
  return cancel_;
}

void StepLoop::Run() {
  {
    absl::MutexLock l(&mu_);
    loop_thread_id_ = std::this_thread::get_id();
  }
  const absl::Status status = config_.grad != nullptr ? RunModeBSteps() : RunSteps();
  {
    absl::MutexLock l(&mu_);
    prefetch_shutdown_ = true;
  }
  prefetch_thread_.join();
  LoopResult result;
  {
    absl::MutexLock l(&mu_);
    prefetched_.reset();
    result.last_completed_step = last_completed_;
  }
  state_.clear();  // the job's device memory is released before anyone hears it ended
  grad_acc_.clear();
  if (status.ok()) {
    result.outcome = LoopOutcome::kSucceeded;
  } else if (absl::IsCancelled(status) && cancelled()) {
    result.outcome = LoopOutcome::kCancelled;
  } else {
    result.outcome = LoopOutcome::kFailed;
    result.error = status;
    result.restore_failed = restore_failed_;
    result.nonfinite = nonfinite_failed_;
  }
  if (result.outcome == LoopOutcome::kFailed) {
    spdlog::error("job {} on {}: {}", config_.spec.job_id, config_.spec.host,
                  result.error.ToString());
  }
  if (config_.on_done) config_.on_done(result);
  absl::MutexLock l(&mu_);
  result_ = std::move(result);
}

absl::Status StepLoop::Initialize() {
  if (config_.restore_state) {
    const absl::Time start = config_.clock->Now();
    absl::StatusOr<DeviceBuffers> restored = config_.restore_state(devices_, partitions_);
    if (!restored.ok()) {
      restore_failed_ = true;
      return PrefixStatus(restored.status(), "restoring the checkpoint: ");
    }
    state_ = *std::move(restored);
    metrics_->AddTime(kTransferToDeviceTime, config_.clock->Now() - start);
    if (state_.size() != devices_.size()) {
      return absl::InternalError("the restored state does not cover the step's devices");
    }
    return absl::OkStatus();
  }
  const runtime::Executable& init = *config_.init;
  HostArray seed;
  bool takes_seed = true;
  DType seed_type = DType::kU32;
  if (init.signature().has_value()) {
    takes_seed = !init.signature()->inputs.empty();
    if (takes_seed) seed_type = init.signature()->inputs[0].shape.dtype;
  }
  if (seed_type == DType::kU32 || seed_type == DType::kS32) {
    seed = HostArray::From<uint32_t>(seed_type, {}, {static_cast<uint32_t>(config_.spec.seed)});
  } else {
    seed = HostArray::From<uint64_t>(seed_type, {}, {config_.spec.seed});
  }
  std::vector<std::unique_ptr<DeviceBuffer>> seeds;
  std::vector<std::vector<DeviceBuffer*>> args(devices_.size());
  for (size_t d = 0; d < devices_.size() && takes_seed; ++d) {
    const absl::Time start = config_.clock->Now();
    ASSIGN_OR_RETURN(std::unique_ptr<DeviceBuffer> buffer,
                     config_.runtime->ToDevice(seed, devices_[d]));
    metrics_->AddTime(kTransferToDeviceTime, config_.clock->Now() - start);
    metrics_->AddBytes(kTransferToDeviceBytes, seed.shape.ByteSize());
    args[d].push_back(buffer.get());
    seeds.push_back(std::move(buffer));
  }
  const absl::Time start = config_.clock->Now();
  ASSIGN_OR_RETURN(state_, config_.runtime->Execute(init, args, {}));
  metrics_->AddTime(kExecuteTime, config_.clock->Now() - start);
  return absl::OkStatus();
}

absl::Status StepLoop::RunSteps() {
  const int64_t steps = config_.spec.steps;
  const runtime::Executable& step = *config_.step;
  const int num_state = config_.spec.num_state;
  if (cancelled()) return absl::CancelledError("cancelled before init");
  const int64_t first = config_.spec.first_step;
  if (first <= steps) RequestBatch(first);  // the first batch uploads while init runs
  if (absl::Status status = Initialize(); !status.ok()) return PrefixStatus(status, "init: ");
  std::optional<InFlight> pending;  // the step before this one, when not yet waited for
  auto complete_pending = [&]() -> absl::Status {
    if (!pending.has_value()) return absl::OkStatus();
    absl::Status status = CompleteStep(*pending);
    pending.reset();
    return status;
  };
  for (int64_t s = first; s <= steps; ++s) {
    if (cancelled()) {
      RETURN_IF_ERROR(complete_pending());
      return absl::CancelledError(absl::StrCat("cancelled before step ", s));
    }
    const absl::Time start = config_.clock->Now();
    absl::StatusOr<DeviceBuffers> batch = TakeBatch(s);
    const absl::Duration data_wait = config_.clock->Now() - start;
    if (!batch.ok()) {
      RETURN_IF_ERROR(complete_pending());
      if (absl::IsCancelled(batch.status()) && cancelled()) return batch.status();
      return PrefixStatus(batch.status(), absl::StrCat("step ", s, ": "));
    }
    // Issue the next batch's upload before this step is launched, so that it overlaps it.
    if (s < steps) RequestBatch(s + 1);
    std::vector<std::vector<DeviceBuffer*>> args(devices_.size());
    for (size_t d = 0; d < devices_.size(); ++d) {
      args[d].reserve(num_state + (*batch)[d].size());
      for (int i = 0; i < num_state; ++i) args[d].push_back(state_[d][i].get());
      for (const auto& buffer : (*batch)[d]) args[d].push_back(buffer.get());
    }
    const absl::Time launched = config_.clock->Now();
    absl::StatusOr<runtime::LaunchedExecution> launch =
        config_.runtime->Launch(step, args, {.donate_inputs = donate_});
    if (!launch.ok()) {
      RETURN_IF_ERROR(complete_pending());
      return PrefixStatus(launch.status(), absl::StrCat("step ", s, ": "));
    }
    InFlight current{.step = s,
                     .start = start,
                     .launched = launched,
                     .data_wait = data_wait,
                     .outputs = std::move(launch->outputs),
                     .batch = *std::move(batch),
                     .done = std::move(launch->done)};
    // Step s-1 is waited for only now that step s is queued behind it.
    if (absl::Status status = complete_pending(); !status.ok()) {
      current.done->Await().IgnoreError();  // it ran on the failed step's state
      return status;
    }
    // Step s is waited for before the next launch only when its state must be exactly step
    // s's (a checkpoint, the end); a logging step's telemetry is read after step s+1 launched.
    const AfterStep after = DecideAfterStep(s);
    const bool drain = after.checkpoint || after.memory || after.stop || s == steps ||
                       (telemetry_reads_state_ && cadence_.IsLoggingStep(s));
    if (drain) RETURN_IF_ERROR(CompleteStep(current));
    for (size_t d = 0; d < devices_.size(); ++d) {
      for (int i = 0; i < num_state; ++i) state_[d][i] = std::move(current.outputs[d][i]);
    }
    if (drain) {
      FinishStep(s, after);
    } else {
      pending = std::move(current);
    }
  }
  return complete_pending();
}

absl::Status StepLoop::CompleteStep(InFlight& step) {
  if (absl::Status status = step.done->Await(); !status.ok()) {
    return PrefixStatus(status, absl::StrCat("step ", step.step, ": "));
  }
  step.batch.clear();
  RETURN_IF_ERROR(StepDone(step.step, step.start, step.launched, step.data_wait, step.outputs));
  absl::MutexLock l(&mu_);
  last_completed_ = step.step;
  return absl::OkStatus();
}

StepLoop::AfterStep StepLoop::DecideAfterStep(int64_t s) {
  const bool scheduled = s == config_.spec.steps ||
                         (config_.checkpoint_every > 0 && s % config_.checkpoint_every == 0);
  absl::MutexLock l(&mu_);
  checked_through_ = s;
  const bool at_target = checkpoint_at_ == s;
  AfterStep after{
      .checkpoint = config_.checkpoint && (scheduled || checkpoint_requested_ || at_target),
      .stop = stop_after_checkpoint_ || (at_target && stop_at_target_)};
  // A preemption's step is kept in memory too: the restart that follows reads it from there.
  after.memory = config_.memory_checkpoint && config_.memory_checkpoint_every > 0 &&
                 s != config_.spec.steps &&
                 (s % config_.memory_checkpoint_every == 0 || (after.stop && after.checkpoint));
  checkpoint_requested_ = false;
  if (at_target) checkpoint_at_ = 0;
  return after;
}

int64_t StepLoop::BatchesThrough(int64_t s) const {
  return s * (config_.grad != nullptr ? config_.spec.grad_accumulation : 1);
}

void StepLoop::FinishStep(int64_t s, AfterStep after) {
  if (after.memory) TakeMemoryCheckpoint(s);
  if (after.checkpoint) {
    const absl::Time start = config_.clock->Now();
    config_.checkpoint(s, state_, partitions_, BatchesThrough(s));
    metrics_->AddTime(kCheckpointBlockingTime, config_.clock->Now() - start);
  }
  if (after.stop) Cancel();
}

void StepLoop::KeepStateInMemory(int64_t s) {
  const int64_t every = config_.memory_checkpoint_every;
  if (!config_.memory_checkpoint || every <= 0 || s < 1) return;
  if (s % every == 0 && s >= config_.spec.first_step) return;  // FinishStep took it
  TakeMemoryCheckpoint(s);
}

void StepLoop::TakeMemoryCheckpoint(int64_t s) {
  const absl::Time start = config_.clock->Now();
  config_.memory_checkpoint(s, state_, partitions_, BatchesThrough(s));
  metrics_->AddTime(kMemoryCheckpointTime, config_.clock->Now() - start);
}

void StepLoop::RequestCheckpoint(bool then_stop) {
  absl::MutexLock l(&mu_);
  checkpoint_requested_ = true;
  stop_after_checkpoint_ = stop_after_checkpoint_ || then_stop;
}

absl::Status StepLoop::RequestCheckpointAt(int64_t step, bool then_stop) {
  if (step < 1 || step > config_.spec.steps) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint step ", step, " is outside the run's steps 1..", config_.spec.steps));
  }
  absl::MutexLock l(&mu_);
  // Steps before the first one of a resumed run were never this loop's to save.
  const int64_t passed = std::max(checked_through_, config_.spec.first_step - 1);
  if (step <= passed) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot checkpoint step ", step, ": this host is past it (step ", passed, " done)"));
  }
  checkpoint_at_ = step;
  stop_at_target_ = stop_at_target_ || then_stop;
  return absl::OkStatus();
}

absl::Status StepLoop::StepDone(int64_t s, absl::Time start, absl::Time launched,
                                absl::Duration data_wait, const DeviceBuffers& outputs) {
  const absl::Time done = config_.clock->Now();
  metrics_->AddTime(kExecuteTime, done - launched);
  metrics_->AddTime(kStepTime, done - start);
  metrics_->AddTime(kDataWaitTime, data_wait);
  metrics_->Increment(kSteps);
  if (!cadence_.IsLoggingStep(s)) return absl::OkStatus();
  // Reads the telemetry before the state moves on; nothing is donated in between.
  absl::Status status = EmitTelemetry(s, done - start, data_wait, outputs);
  if (status.ok() || nonfinite_failed_) return status;
  absl::MutexLock l(&mu_);
  last_completed_ = s;  // the step itself completed
  return PrefixStatus(status, absl::StrCat("step ", s, ": telemetry: "));
}

absl::Status StepLoop::EmitTelemetry(int64_t step, absl::Duration step_time,
                                     absl::Duration data_wait, const DeviceBuffers& outputs) {
  HostStepSummary summary{.job_id = config_.spec.job_id,
                          .step = step,
                          .host = config_.spec.host,
                          .replica_count = config_.spec.replica_count,
                          .step_time = step_time,
                          .data_wait = data_wait,
                          .synthetic_data = config_.spec.synthetic_data};
  if (reducer_ != nullptr) {
    std::vector<std::vector<DeviceBuffer*>> per_device(devices_.size());
    for (size_t d = 0; d < devices_.size(); ++d) {
      for (int index : telemetry_index_) per_device[d].push_back(outputs[d][index].get());
    }
    const absl::Time start = config_.clock->Now();
    ASSIGN_OR_RETURN(summary.values, reducer_->Reduce(per_device));
    metrics_->AddTime(kTelemetryReduceTime, config_.clock->Now() - start);
    metrics_->Increment(kTelemetryReads);
  }
  summary.wall_time = config_.clock->Now();
  // The summary goes out either way: the user sees the value that stopped the job.
  const absl::Status finite = CheckFinite(step, summary.values);
  if (config_.sink) {
    const absl::Time start = config_.clock->Now();
    config_.sink(std::move(summary));
    const absl::Duration elapsed = config_.clock->Now() - start;
    metrics_->AddTime(kTelemetrySinkTime, elapsed);
    if (elapsed > config_.slow_sink_warning) {
      spdlog::warn("job {}: the telemetry sink took {} at step {}; it must enqueue and return",
                   config_.spec.job_id, absl::FormatDuration(elapsed), step);
    }
  }
  return finite;
}

absl::Status StepLoop::CheckFinite(int64_t step, const std::vector<TelemetryValue>& values) {
  if (config_.spec.on_nonfinite == NonFinitePolicy::kIgnore) return absl::OkStatus();
  for (const TelemetryValue& value : values) {
    if (value.values.size() != 1 || std::isfinite(value.values[0])) continue;  // scalars only
    const std::string what = absl::StrCat("step ", step, ": series \"", value.name, "\" is ",
                                          std::isnan(value.values[0]) ? "NaN" : "infinite");
    if (config_.spec.on_nonfinite == NonFinitePolicy::kFail) {
      nonfinite_failed_ = true;
      return absl::FailedPreconditionError(absl::StrCat(
          what, " (on_nonfinite=fail; the job's checkpoints are kept: resume from one with a "
          "lower learning rate or other data, or submit with --on_nonfinite=warn)"));
    }
    if (!nonfinite_warned_) {
      nonfinite_warned_ = true;
      spdlog::warn("job {} on {}: {} (on_nonfinite=warn: the job goes on; later ones are not "
                   "logged)", config_.spec.job_id, config_.spec.host, what);
    }
    return absl::OkStatus();
  }
  return absl::OkStatus();
}

}  // namespace meshrun::worker
