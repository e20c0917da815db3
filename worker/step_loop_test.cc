// The step loop against the real CPU PJRT plugin (8 devices) and the example jobs of examples/:
// reference losses through the on-device telemetry reduction, the transfer discipline of
// logging and non-logging steps, cancel, step failures, prefetch, and the metrics registry.
#include "worker/step_loop.h"

#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "worker/memory_checkpoints.h"
#include "worker/metrics.h"
#include "runtime/backends.h"
#include "runtime/compile_options.h"
#include "bundle/example_job.h"

namespace meshrun::worker {
namespace {

using runtime::DeviceBuffer;
using runtime::DType;
using runtime::ExampleJob;
using runtime::Executable;
using runtime::HostArray;
using runtime::Runtime;
using telemetry::Combine;

// ---- shared fixture: one 8-device CPU runtime and the compiled example jobs ----

struct CompiledJob {
  ExampleJob job;
  std::shared_ptr<const Executable> init;
  std::shared_ptr<const Executable> step;
  std::shared_ptr<const Executable> grad;   // compile mode B jobs
  std::shared_ptr<const Executable> apply;
};

class StepLoopTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    plugin_ = new std::string(runtime::DefaultPjrtPluginPath());
    struct stat st;
    if (stat(plugin_->c_str(), &st) != 0) return;
    static runtime::RuntimeRegistry registry;
    if (registry.kinds().empty()) {
      ASSERT_TRUE(runtime::RegisterRuntimes(registry).ok());
    }
    auto created = registry.Create(
        "pjrt", runtime::RuntimeConfig{.plugin_path = *plugin_, .cpu_device_count = 8});
    ASSERT_TRUE(created.ok()) << created.status();
    runtime_ = created->release();
    jobs_ = new std::map<std::string, CompiledJob>();
  }
  static void TearDownTestSuite() {
    delete jobs_;
    jobs_ = nullptr;
    delete runtime_;
    runtime_ = nullptr;
    delete plugin_;
  }
  void SetUp() override {
    if (runtime_ == nullptr) {
      GTEST_SKIP() << "PJRT CPU plugin missing: " << *plugin_ << " (run scripts/fetch_pjrt.sh)";
    }
  }

  // examples/<name>/job.json, compiled once per suite.
  static const CompiledJob& Job(const std::string& name) {
    auto it = jobs_->find(name);
    if (it != jobs_->end()) return it->second;
    auto job = runtime::LoadExampleJob(std::string(MESHRUN_SOURCE_DIR) + "/examples/" + name +
                                       "/job.json");
    EXPECT_TRUE(job.ok()) << job.status();
    CompiledJob out{*job, nullptr, nullptr};
    auto options = runtime::BuildCompileOptions(runtime::SpmdCompileOptions(job->device_ids));
    EXPECT_TRUE(options.ok()) << options.status();
    auto compile = [&](const runtime::ExampleProgram& program) {
      auto executable = runtime_->Compile({program.code, "mlir", *options, program.Signature()});
      EXPECT_TRUE(executable.ok()) << executable.status();
      return std::shared_ptr<const Executable>(std::move(*executable));
    };
    out.init = compile(job->init);
    if (job->mode_b()) {
      out.grad = compile(job->grad);
      out.apply = compile(job->apply);
    } else {
      out.step = compile(job->step);
    }
    return jobs_->emplace(name, std::move(out)).first->second;
  }

  // The job's run spec with the three scalar metrics declared as telemetry (mean).
  static RunSpec SpecFor(const ExampleJob& job, int64_t steps, int64_t cadence) {
    RunSpec spec{.job_id = "job-" + job.name,
                 .host = "host-0",
                 .num_state = job.num_state,
                 .seed = job.seed,
                 .mesh_axes = job.mesh_axes,
                 .mesh_shape = job.mesh_shape,
                 .device_ids = job.device_ids,
                 .telemetry_cadence = cadence,
                 .steps = steps,
                 .replica_count = static_cast<int>(job.mesh_shape[0]),
                 .synthetic_data = false};
    for (const auto& a : job.data_arrays) spec.batch_sharding.push_back(a.sharding);
    for (const char* name : {"metrics.loss", "metrics.grad_norm", "metrics.accuracy"}) {
      const int index = job.OutputIndex(name);
      spec.telemetry.push_back({.name = name,
                                .combine = Combine::kMean,
                                .sharding = job.step.outputs[index].sharding});
    }
    return spec;
  }

  static std::string* plugin_;
  static Runtime* runtime_;
  static std::map<std::string, CompiledJob>* jobs_;
};

std::string* StepLoopTest::plugin_ = nullptr;
Runtime* StepLoopTest::runtime_ = nullptr;
std::map<std::string, CompiledJob>* StepLoopTest::jobs_ = nullptr;

// Cycles through an example job's batches; can fail, mis-shape or slow down a given step.
class JobBatches : public BatchSource {
 public:
  struct Options {
    int64_t fail_at = 0;       // Next() for this step returns an error
    int64_t misshape_at = 0;   // this step's batch.x has the wrong global shape
    absl::Duration delay;      // each Next() sleeps this long
    std::function<void(absl::Time, absl::Time)> on_delay;  // each sleep's start and end
  };
  JobBatches(const ExampleJob& job, Options options) : job_(job), options_(options) {}

  absl::StatusOr<std::vector<HostArray>> Next() override {
    const int64_t step = ++calls_;
    if (options_.delay > absl::ZeroDuration()) {
      const absl::Time start = absl::Now();
      absl::SleepFor(options_.delay);
      if (options_.on_delay) options_.on_delay(start, absl::Now());
    }
    if (step == options_.fail_at) return absl::UnavailableError("data shard 3 is unreadable");
    std::vector<HostArray> batch = job_.batches[(step - 1) % job_.batches.size()];
    if (step == options_.misshape_at) {
      HostArray& x = batch.back();  // batch.x f32[32,16] -> f32[16,32]
      std::swap(x.shape.dims[0], x.shape.dims[1]);
    }
    return batch;
  }
  int64_t calls() const { return calls_; }

 private:
  const ExampleJob& job_;
  Options options_;
  std::atomic<int64_t> calls_{0};
};

// What a sink would enqueue, plus the runtime's device-to-host count when each arrived.
struct Collected {
  absl::Mutex mu;
  std::vector<HostStepSummary> summaries ABSL_GUARDED_BY(mu);
  std::vector<int64_t> device_to_host ABSL_GUARDED_BY(mu);
  std::vector<LoopResult> done ABSL_GUARDED_BY(mu);
};

StepLoop::Config LoopConfig(Runtime* runtime, const CompiledJob& job, RunSpec spec,
                            std::unique_ptr<BatchSource> batches, Collected* collected) {
  StepLoop::Config config{.runtime = runtime,
                          .init = job.init,
                          .step = job.step,
                          .spec = std::move(spec),
                          .batches = std::move(batches)};
  config.sink = [collected, runtime](HostStepSummary summary) {
    const int64_t d2h = runtime->counters().device_to_host.count;
    absl::MutexLock l(&collected->mu);
    collected->summaries.push_back(std::move(summary));
    collected->device_to_host.push_back(d2h);
  };
  config.on_done = [collected](const LoopResult& result) {
    absl::MutexLock l(&collected->mu);
    collected->done.push_back(result);
  };
  return config;
}

// Runs the job to the end, or until a Cancel() from the sink of step `cancel_at` (0: none)
// ends it; the summaries go to `collected`.
LoopResult RunCancellingAt(Runtime* runtime, const CompiledJob& job, RunSpec spec,
                           int64_t cancel_at, Collected* collected) {
  StepLoop* raw = nullptr;
  StepLoop::Config config =
      LoopConfig(runtime, job, std::move(spec),
                 std::make_unique<JobBatches>(job.job, JobBatches::Options{}), collected);
  config.sink = [&raw, cancel_at, collected](HostStepSummary summary) {
    if (summary.step == cancel_at) raw->Cancel();
    absl::MutexLock l(&collected->mu);
    collected->summaries.push_back(std::move(summary));
  };
  auto loop = StepLoop::Create(std::move(config));
  EXPECT_TRUE(loop.ok()) << loop.status();
  if (!loop.ok()) return {LoopOutcome::kFailed, loop.status()};
  raw = loop->get();
  EXPECT_TRUE((*loop)->Start().ok());
  const LoopResult result = (*loop)->Wait();
  (*loop)->Stop();
  return result;
}

float Relative(float got, float want) { return std::fabs(got - want) / std::fabs(want); }

// ---- reference losses through the loop ----

class ReferenceLoss : public StepLoopTest, public testing::WithParamInterface<std::string> {};

TEST_P(ReferenceLoss, LossesAtCadenceOneMatchJax) {
  const CompiledJob& job = Job(GetParam());
  ASSERT_NE(job.step, nullptr);
  Collected collected;
  const int64_t d2h_before = runtime_->counters().device_to_host.count;
  Metrics metrics;
  StepLoop::Config config = LoopConfig(runtime_, job, SpecFor(job.job, 20, 1),
                                       std::make_unique<JobBatches>(job.job, JobBatches::Options{}),
                                       &collected);
  config.metrics = &metrics;
  auto loop = StepLoop::Create(std::move(config));
  ASSERT_TRUE(loop.ok()) << loop.status();
  const absl::Time start = absl::Now();
  ASSERT_TRUE((*loop)->Start().ok());
  const LoopResult result = (*loop)->Wait();
  const absl::Duration elapsed = absl::Now() - start;
  EXPECT_EQ(result.outcome, LoopOutcome::kSucceeded) << result.error;
  EXPECT_EQ(result.last_completed_step, 20);

  absl::MutexLock l(&collected.mu);
  ASSERT_EQ(collected.summaries.size(), 20u);
  float worst = 0;
  for (int s = 1; s <= 20; ++s) {
    const HostStepSummary& summary = collected.summaries[s - 1];
    EXPECT_EQ(summary.step, s);
    EXPECT_EQ(summary.job_id, "job-" + GetParam());
    EXPECT_EQ(summary.host, "host-0");
    EXPECT_EQ(summary.replica_count, job.job.mesh_shape[0]);
    EXPECT_FALSE(summary.synthetic_data);
    EXPECT_GT(summary.step_time, absl::ZeroDuration());
    EXPECT_GE(summary.data_wait, absl::ZeroDuration());
    EXPECT_LE(summary.data_wait, summary.step_time);
    EXPECT_GT(summary.wall_time, absl::UnixEpoch());
    ASSERT_EQ(summary.values.size(), 3u);
    EXPECT_EQ(summary.values[0].name, "metrics.loss");
    EXPECT_TRUE(summary.values[0].shape.empty());
    ASSERT_EQ(summary.values[0].values.size(), 1u);
    const float loss = summary.values[0].values[0];
    worst = std::max(worst, Relative(loss, job.job.reference_loss[s - 1]));
    EXPECT_LE(Relative(loss, job.job.reference_loss[s - 1]), 1e-5f)
        << "step " << s << ": loop " << loss << ", JAX " << job.job.reference_loss[s - 1];
    EXPECT_LE(Relative(summary.values[1].values[0], job.job.reference_grad_norm[s - 1]), 1e-5f)
        << "grad norm at step " << s;
    EXPECT_FALSE(summary.values[0].threshold_exceeded);
    // Exactly one device-to-host transfer per logging step, nothing else.
    EXPECT_EQ(collected.device_to_host[s - 1], d2h_before + s);
  }
  ASSERT_EQ(collected.done.size(), 1u);
  EXPECT_EQ(collected.done[0].outcome, LoopOutcome::kSucceeded);

  // Metrics: 1 init + 20 steps + 20 reductions executed; D seeds + 20 x D x 2 batch shards up.
  const int64_t devices = static_cast<int64_t>(job.job.device_ids.size());
  EXPECT_EQ(metrics.Get(kSteps).count, 20);
  EXPECT_EQ(metrics.Get(kTelemetryReads).count, 20);
  EXPECT_EQ(metrics.Get(kExecuteTime).count, 41);
  EXPECT_EQ(metrics.Get(kCompileTime).count, 1);  // the reduction program
  EXPECT_EQ(metrics.Get(kTransferToDeviceBytes).count, devices + 20 * devices * 2);
  EXPECT_EQ(metrics.Get(kTransferFromDeviceBytes).count, 20);
  EXPECT_EQ(metrics.Get(kTransferFromDeviceBytes).total, 20 * 3 * 4);  // one f32[3] each
  EXPECT_EQ(metrics.Get(kStepTime).count, 20);
  std::printf("%s: 20 steps in %s, max relative loss difference %.3g\n%s", GetParam().c_str(),
              absl::FormatDuration(elapsed).c_str(), worst,
              MetricsReport(metrics.Snapshot()).c_str());
}

INSTANTIATE_TEST_SUITE_P(Mlp, ReferenceLoss,
                         testing::Values("mlp_classifier/dp1", "mlp_classifier/dp8",
                                         "mlp_classifier/dp4_tp2"),
                         [](const testing::TestParamInfo<std::string>& info) {
                           return info.param.substr(info.param.find('/') + 1);
                         });

// ---- transfer discipline ----

TEST_F(StepLoopTest, ThousandStepsAtCadenceHundredReadTelemetryTenTimes) {
  const CompiledJob& job = Job("mlp_classifier/dp1");
  ASSERT_NE(job.step, nullptr);
  Collected collected;
  const runtime::RuntimeCounters before = runtime_->counters();
  auto loop = StepLoop::Create(LoopConfig(
      runtime_, job, SpecFor(job.job, 1000, 100),
      std::make_unique<JobBatches>(job.job, JobBatches::Options{}), &collected));
  ASSERT_TRUE(loop.ok()) << loop.status();
  const absl::Time start = absl::Now();
  ASSERT_TRUE((*loop)->Start().ok());
  const LoopResult result = (*loop)->Wait();
  const absl::Duration elapsed = absl::Now() - start;
  EXPECT_EQ(result.outcome, LoopOutcome::kSucceeded) << result.error;
  EXPECT_EQ(result.last_completed_step, 1000);
  const runtime::RuntimeCounters after = runtime_->counters();
  EXPECT_EQ(after.device_to_host.count - before.device_to_host.count, 10);
  EXPECT_EQ(after.device_to_host.bytes - before.device_to_host.bytes, 10 * 3 * 4);
  EXPECT_EQ(after.host_to_device.count - before.host_to_device.count, 1 + 1000 * 2);
  absl::MutexLock l(&collected.mu);
  ASSERT_EQ(collected.summaries.size(), 10u);
  for (int k = 0; k < 10; ++k) {
    EXPECT_EQ(collected.summaries[k].step, 100 * (k + 1));
    // Between two logging steps (99 non-logging steps) nothing came to the host.
    EXPECT_EQ(collected.device_to_host[k], before.device_to_host.count + k + 1);
    EXPECT_TRUE(std::isfinite(collected.summaries[k].values[0].values[0]));
  }
  std::printf("1000 steps (10 logging) in %s\n", absl::FormatDuration(elapsed).c_str());
}

TEST_F(StepLoopTest, ThresholdsBecomeFlags) {
  const CompiledJob& job = Job("mlp_classifier/dp8");
  ASSERT_NE(job.step, nullptr);
  RunSpec spec = SpecFor(job.job, 4, 2);
  // Losses start near 2.1 and fall: a 1e9 threshold never trips, a 0 threshold always does.
  spec.telemetry[0].threshold = 1e9;
  spec.telemetry[1].threshold = 0.0;
  Collected collected;
  auto loop = StepLoop::Create(LoopConfig(runtime_, job, spec,
                                          std::make_unique<JobBatches>(job.job,
                                                                       JobBatches::Options{}),
                                          &collected));
  ASSERT_TRUE(loop.ok()) << loop.status();
  EXPECT_TRUE(absl::StrContains((*loop)->telemetry_program(), "stablehlo.compare LE"));
  ASSERT_TRUE((*loop)->Start().ok());
  EXPECT_EQ((*loop)->Wait().outcome, LoopOutcome::kSucceeded);
  absl::MutexLock l(&collected.mu);
  ASSERT_EQ(collected.summaries.size(), 2u);
  for (const HostStepSummary& summary : collected.summaries) {
    EXPECT_FALSE(summary.values[0].threshold_exceeded);
    EXPECT_TRUE(summary.values[1].threshold_exceeded);
    EXPECT_FALSE(summary.values[2].threshold_exceeded);  // no threshold declared
  }
}

// ---- cancel, stop, failures ----

// Step 50's telemetry is read while step 51 runs (logging steps pipeline), so a cancel from its
// sink ends the loop after step 51, which completes and is reported as the last step.
TEST_F(StepLoopTest, CancelFromTheSinkEndsTheLoopAfterTheStepInFlight) {
  const CompiledJob& job = Job("mlp_classifier/dp1");
  ASSERT_NE(job.step, nullptr);
  Collected collected;
  const LoopResult result =
      RunCancellingAt(runtime_, job, SpecFor(job.job, 1000, 10), 50, &collected);
  EXPECT_EQ(result.outcome, LoopOutcome::kCancelled);
  EXPECT_EQ(result.last_completed_step, 51);
  EXPECT_TRUE(result.error.ok());
  absl::MutexLock l(&collected.mu);
  EXPECT_EQ(collected.summaries.size(), 5u);
  ASSERT_EQ(collected.done.size(), 1u);
  EXPECT_EQ(collected.done[0].outcome, LoopOutcome::kCancelled);
  EXPECT_EQ(collected.done[0].last_completed_step, 51);
}

// A job-wide checkpoint: the loop saves at exactly the step asked for (on disk and, with a stop
// after it, in memory), then stops; a step it has passed or one outside the run is refused.
TEST_F(StepLoopTest, CheckpointAtATargetStepThenStop) {
  const CompiledJob& job = Job("mlp_classifier/dp1");
  ASSERT_NE(job.step, nullptr);
  Collected collected;
  StepLoop* raw = nullptr;
  std::vector<absl::Status> answers;
  std::vector<int64_t> saved;  // loop thread only, read after Wait
  StepLoop::Config config =
      LoopConfig(runtime_, job, SpecFor(job.job, 1000, 10),
                 std::make_unique<JobBatches>(job.job, JobBatches::Options{}), &collected);
  config.checkpoint = [&saved](int64_t step, const StepLoop::DeviceBuffers&,
                               const std::vector<int64_t>&, int64_t) { saved.push_back(step); };
  std::vector<int64_t> in_memory;  // loop thread only, read after Wait
  config.memory_checkpoint_every = 10;
  config.memory_checkpoint = [&in_memory](int64_t step, const StepLoop::DeviceBuffers&,
                                          const std::vector<int64_t>&, int64_t) {
    in_memory.push_back(step);
  };
  config.sink = [&](HostStepSummary summary) {
    if (summary.step == 10) answers.push_back(raw->RequestCheckpointAt(9, true));
    if (summary.step == 20) {
      answers.push_back(raw->RequestCheckpointAt(0, true));
      answers.push_back(raw->RequestCheckpointAt(1001, true));
      answers.push_back(raw->RequestCheckpointAt(33, false));
      answers.push_back(raw->RequestCheckpointAt(35, true));  // replaces 33
    }
  };
  auto loop = StepLoop::Create(std::move(config));
  ASSERT_TRUE(loop.ok()) << loop.status();
  raw = loop->get();
  ASSERT_TRUE((*loop)->Start().ok());
  const LoopResult result = (*loop)->Wait();
  (*loop)->Stop();
  EXPECT_EQ(result.outcome, LoopOutcome::kCancelled);
  EXPECT_EQ(result.last_completed_step, 35);
  EXPECT_EQ(saved, std::vector<int64_t>{35});
  // The step a preemption stops at is kept in memory too: the restart reads it from there.
  EXPECT_EQ(in_memory, (std::vector<int64_t>{10, 20, 30, 35}));
  ASSERT_EQ(answers.size(), 5u);
  EXPECT_TRUE(absl::IsFailedPrecondition(answers[0])) << answers[0];
  EXPECT_TRUE(absl::StrContains(answers[0].message(), "past it")) << answers[0];
  EXPECT_TRUE(absl::IsInvalidArgument(answers[1])) << answers[1];
  EXPECT_TRUE(absl::IsInvalidArgument(answers[2])) << answers[2];
  EXPECT_TRUE(answers[3].ok() && answers[4].ok()) << answers[3] << answers[4];
}

// In-memory checkpoints (worker/memory_checkpoints.h): taken every 10th step but the last, each
// block once, and a run restored from one computes the same losses as the run that took it.
TEST_F(StepLoopTest, ARunRestoredFromAMemoryCheckpointRepeatsTheLossesExactly) {
  const CompiledJob& job = Job("mlp_classifier/dp4_tp2");
  ASSERT_NE(job.step, nullptr);
  StateLayout layout{.mesh_axes = job.job.mesh_axes, .mesh_shape = job.job.mesh_shape};
  int64_t distinct_bytes = 0;  // each array's distinct blocks: tp-split arrays count whole
  for (int i = 0; i < job.job.num_state; ++i) {
    const runtime::ExampleArray& input = job.job.step.inputs[i];
    v1::TensorSpec& spec = layout.state.emplace_back();
    spec.set_name(input.global.name);
    spec.set_dtype(std::string(runtime::DTypeName(input.global.shape.dtype)));
    for (int64_t n : input.global.shape.dims) spec.add_shape(n);
    for (const std::string& axis : input.sharding) spec.add_sharding(axis);
    distinct_bytes += input.global.shape.ByteSize();
  }
  MemoryCheckpointStore store;
  std::vector<int64_t> taken;
  auto run = [&](int64_t restore_step, Collected& collected) {
    StepLoop::Config config =
        LoopConfig(runtime_, job, SpecFor(job.job, 30, 1),
                   std::make_unique<JobBatches>(job.job, JobBatches::Options{}), &collected);
    config.memory_checkpoint_every = 10;
    config.memory_checkpoint = [&](int64_t step, const StepLoop::DeviceBuffers& state,
                                   const std::vector<int64_t>& partitions, int64_t position) {
      auto snapshot = TakeSnapshot(*runtime_, layout, "j", step, position, state, partitions,
                                   nullptr);
      ASSERT_TRUE(snapshot.ok()) << snapshot.status();
      taken.push_back(step);
      store.Put(*std::move(snapshot));
    };
    if (restore_step > 0) {
      std::shared_ptr<const MemorySnapshot> snapshot = store.Get("j", restore_step);
      EXPECT_NE(snapshot, nullptr);
      EXPECT_TRUE(config.batches->Skip(snapshot->data_position).ok());
      config.spec.first_step = restore_step + 1;
      config.restore_state = [&, snapshot](const std::vector<int>& devices,
                                           const std::vector<int64_t>& partitions) {
        return RestoreSnapshot(*runtime_, layout, {snapshot}, devices, partitions, nullptr);
      };
    }
    auto loop = StepLoop::Create(std::move(config));
    ASSERT_TRUE(loop.ok()) << loop.status();
    ASSERT_TRUE((*loop)->Start().ok());
    EXPECT_EQ((*loop)->Wait().outcome, LoopOutcome::kSucceeded);
    (*loop)->Stop();
  };
  Collected first, restored;
  run(0, first);
  EXPECT_EQ(taken, (std::vector<int64_t>{10, 20}));  // not after the last step
  ASSERT_NE(store.Get("j", 20), nullptr);
  EXPECT_EQ(store.Get("j", 20)->data_position, 20);
  EXPECT_EQ(store.Get("j", 20)->Bytes(), distinct_bytes);  // 8 devices, each block once
  run(10, restored);  // takes 20 again: the old run's 20 is dropped, 10 kept
  EXPECT_EQ(taken, (std::vector<int64_t>{10, 20, 20}));
  absl::MutexLock a(&first.mu), b(&restored.mu);
  ASSERT_EQ(first.summaries.size(), 30u);
  ASSERT_EQ(restored.summaries.size(), 20u);
  for (size_t i = 0; i < 20; ++i) {
    EXPECT_EQ(restored.summaries[i].step, first.summaries[i + 10].step);
    EXPECT_EQ(restored.summaries[i].values[0].values, first.summaries[i + 10].values[0].values)
        << "step " << restored.summaries[i].step;
  }
  // A snapshot of another mesh does not restore: the block it needs is named.
  StateLayout other = layout;
  other.mesh_shape = {8, 1};
  auto refused = RestoreSnapshot(*runtime_, other, {store.Get("j", 20)}, {0}, {0}, nullptr);
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.status())) << refused.status();
}

TEST(MemoryCheckpointStore, KeepsTheNewestTwoOfTheLastJob) {
  MemoryCheckpointStore store;
  auto snapshot = [](const std::string& job, int64_t step) {
    auto s = std::make_shared<MemorySnapshot>();
    s->job_id = job;
    s->step = step;
    s->blocks["w"]["0"] = runtime::HostArray{{runtime::DType::kF32, {2}}, std::string(8, 'x')};
    return s;
  };
  for (int64_t step : {10, 20, 30}) store.Put(snapshot("a", step));
  EXPECT_EQ(store.Get("a", 10), nullptr);
  ASSERT_NE(store.Get("a", 30), nullptr);
  EXPECT_EQ(store.Held().front()->step, 30);
  EXPECT_EQ(store.Bytes(), 16);
  store.Put(snapshot("a", 20));  // a restarted run: 30 was the ended run's, 10 is gone
  EXPECT_EQ(store.Get("a", 30), nullptr);
  EXPECT_NE(store.Get("a", 20), nullptr);
  store.Put(snapshot("b", 10));  // another job: the last one's copies go
  EXPECT_EQ(store.Held().size(), 1u);
  store.Drop("b");
  EXPECT_EQ(store.Bytes(), 0);
}

TEST(MemoryCheckpointStore, KeepsARingPeersCopiesBesideItsOwn) {
  MemoryCheckpointStore store;
  auto snapshot = [](int64_t step, const std::string& of_host, const std::string& key) {
    auto s = std::make_shared<MemorySnapshot>();
    s->job_id = "j";
    s->step = step;
    s->of_host = of_host;
    s->blocks["w"][key] = runtime::HostArray{{runtime::DType::kF32, {2}}, std::string(8, 'x')};
    return s;
  };
  for (int64_t step : {10, 20, 30}) {
    store.Put(snapshot(step, "", "0"));
    store.Put(snapshot(step, "host-a", "1"));  // the predecessor's blocks
  }
  EXPECT_EQ(store.Held().size(), 4u);  // the newest two of each kind
  EXPECT_EQ(store.Get("j", 30)->of_host, "");
  const auto copies = store.Copies("j", 30);
  ASSERT_EQ(copies.size(), 2u);
  EXPECT_EQ(copies[0]->of_host, "");  // its own first
  EXPECT_EQ(copies[1]->of_host, "host-a");
  EXPECT_TRUE(store.Copies("j", 10).empty());
  // The blocks a host needs are named like the copies' keys: w f32[4] split over data=2.
  v1::TensorSpec w;
  w.set_name("w");
  w.set_dtype("f32");
  w.add_shape(4);
  w.add_sharding("data");
  const StateLayout layout{.state = {w}, .mesh_axes = {"data"}, .mesh_shape = {2}};
  auto needed = BlocksNeeded(layout, {1});  // the predecessor's partition
  ASSERT_TRUE(needed.ok()) << needed.status();
  using Refs = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(*needed, (Refs{{"w", "1"}}));
  EXPECT_EQ(*BlocksNeeded(layout, {0, 1}), (Refs{{"w", "0"}, {"w", "1"}}));
  store.Put(snapshot(20, "", "0"));  // a restarted run: its own 30 goes, the peer's stays
  EXPECT_EQ(store.Get("j", 30), nullptr);
  EXPECT_EQ(store.Copies("j", 30).size(), 1u);
}

TEST_F(StepLoopTest, StopFromAnotherThreadEndsARunningLoop) {
  const CompiledJob& job = Job("mlp_classifier/dp1");
  ASSERT_NE(job.step, nullptr);
  Collected collected;
  auto batches = std::make_unique<JobBatches>(job.job, JobBatches::Options{});
  JobBatches* source = batches.get();
  auto loop = StepLoop::Create(LoopConfig(runtime_, job, SpecFor(job.job, 1'000'000, 1000),
                                          std::move(batches), &collected));
  ASSERT_TRUE(loop.ok()) << loop.status();
  ASSERT_TRUE((*loop)->Start().ok());
  while ((*loop)->last_completed_step() < 20) absl::SleepFor(absl::Milliseconds(1));
  (*loop)->Stop();  // cancel + join
  const std::optional<LoopResult> result = (*loop)->result();
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(result->outcome, LoopOutcome::kCancelled);
  EXPECT_GE(result->last_completed_step, 20);
  EXPECT_LT(result->last_completed_step, 1'000'000);
  // At most the batch of the step after the last completed one was fetched.
  EXPECT_LE(source->calls(), result->last_completed_step + 1);
  absl::MutexLock l(&collected.mu);
  ASSERT_EQ(collected.done.size(), 1u);
  EXPECT_EQ(collected.done[0].last_completed_step, result->last_completed_step);
}

TEST_F(StepLoopTest, BatchSourceErrorFailsItsStep) {
  const CompiledJob& job = Job("mlp_classifier/dp8");
  ASSERT_NE(job.step, nullptr);
  Collected collected;
  auto loop = StepLoop::Create(LoopConfig(
      runtime_, job, SpecFor(job.job, 40, 5),
      std::make_unique<JobBatches>(job.job, JobBatches::Options{.fail_at = 17}), &collected));
  ASSERT_TRUE(loop.ok()) << loop.status();
  ASSERT_TRUE((*loop)->Start().ok());
  const LoopResult result = (*loop)->Wait();
  EXPECT_EQ(result.outcome, LoopOutcome::kFailed);
  EXPECT_EQ(result.last_completed_step, 16);
  EXPECT_EQ(result.error.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(result.error.message(), "step 17: data shard 3 is unreadable");
  absl::MutexLock l(&collected.mu);
  EXPECT_EQ(collected.summaries.size(), 3u);  // steps 5, 10, 15
}

TEST_F(StepLoopTest, WrongShapedBatchFailsItsStep) {
  const CompiledJob& job = Job("mlp_classifier/dp8");
  ASSERT_NE(job.step, nullptr);
  Collected collected;
  auto loop = StepLoop::Create(LoopConfig(
      runtime_, job, SpecFor(job.job, 10, 1),
      std::make_unique<JobBatches>(job.job, JobBatches::Options{.misshape_at = 6}), &collected));
  ASSERT_TRUE(loop.ok()) << loop.status();
  ASSERT_TRUE((*loop)->Start().ok());
  const LoopResult result = (*loop)->Wait();
  EXPECT_EQ(result.outcome, LoopOutcome::kFailed);
  EXPECT_EQ(result.last_completed_step, 5);
  EXPECT_EQ(result.error.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(result.error.message(), "step 6: batch array 'batch.x'"))
      << result.error;
  EXPECT_TRUE(absl::StrContains(result.error.message(), "f32[16,32]")) << result.error;
}

TEST_F(StepLoopTest, CreateRefusesBadSpecs) {
  const CompiledJob& job = Job("mlp_classifier/dp1");
  ASSERT_NE(job.step, nullptr);
  auto make = [&](RunSpec spec) {
    return StepLoop::Create(
        {.runtime = runtime_,
         .init = job.init,
         .step = job.step,
         .spec = std::move(spec),
         .batches = std::make_unique<JobBatches>(job.job, JobBatches::Options{})});
  };
  RunSpec spec = SpecFor(job.job, 10, 0);
  auto status = make(spec).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(status.message(), "telemetry_cadence")) << status;

  spec = SpecFor(job.job, 10, 1);
  spec.telemetry.push_back({.name = "metrics.nope"});
  status = make(spec).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(status.message(), "'metrics.nope' is not an output")) << status;

  spec = SpecFor(job.job, 10, 1);
  spec.num_state -= 1;
  EXPECT_EQ(make(spec).status().code(), absl::StatusCode::kInvalidArgument);

  spec = SpecFor(job.job, 10, 1);
  spec.batch_sharding.pop_back();
  EXPECT_EQ(make(spec).status().code(), absl::StatusCode::kInvalidArgument);

  spec = SpecFor(job.job, 10, 1);
  spec.device_ids = {5};
  EXPECT_EQ(make(spec).status().code(), absl::StatusCode::kInvalidArgument);

  spec = SpecFor(job.job, 0, 1);
  EXPECT_EQ(make(spec).status().code(), absl::StatusCode::kInvalidArgument);

  auto loop = make(SpecFor(job.job, 1, 1));
  ASSERT_TRUE(loop.ok()) << loop.status();
  ASSERT_TRUE((*loop)->Start().ok());
  EXPECT_EQ((*loop)->Start().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*loop)->Wait().outcome, LoopOutcome::kSucceeded);
}

// ---- prefetch ----

// Forwards to a real runtime; counts ToDevice calls as they are issued and lets a hook run
// after the step program's Execute finished but before its outputs are returned to the loop.
class TracingRuntime final : public Runtime {
 public:
  explicit TracingRuntime(Runtime* real) : real_(real) {}
  const runtime::RuntimeIdentity& identity() const override { return real_->identity(); }
  const std::vector<runtime::DeviceDescription>& devices() const override {
    return real_->devices();
  }
  const std::vector<runtime::DeviceDescription>& addressable_devices() const override {
    return real_->addressable_devices();
  }
  absl::StatusOr<std::unique_ptr<Executable>> Compile(
      const runtime::ProgramSource& program) override {
    return real_->Compile(program);
  }
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> ToDevice(const HostArray& array,
                                                         int device_index) override {
    ++to_device_calls;
    return real_->ToDevice(array, device_index);
  }
  absl::StatusOr<HostArray> ToHost(const DeviceBuffer& buffer) override {
    launches_at_read.push_back(step_launches.load());  // the loop thread reads telemetry
    return real_->ToHost(buffer);
  }
  absl::StatusOr<std::vector<std::vector<std::unique_ptr<DeviceBuffer>>>> Execute(
      const Executable& executable, absl::Span<const std::vector<DeviceBuffer*>> args,
      const runtime::ExecuteOptions& options) override {
    if (&executable == step && before_step) before_step();
    auto outputs = real_->Execute(executable, args, options);
    if (&executable == step && after_step) after_step();
    return outputs;
  }
  // The default Launch: Execute above, complete at return. Counts the step's launches.
  absl::StatusOr<runtime::LaunchedExecution> Launch(
      const Executable& executable, absl::Span<const std::vector<DeviceBuffer*>> args,
      const runtime::ExecuteOptions& options) override {
    if (&executable == step) ++step_launches;
    return Runtime::Launch(executable, args, options);
  }
  absl::StatusOr<runtime::MemoryStats> GetMemoryStats(absl::string_view name) override {
    return real_->GetMemoryStats(name);
  }
  runtime::RuntimeCounters counters() const override { return real_->counters(); }

  const Executable* step = nullptr;
  std::function<void()> before_step, after_step;
  std::atomic<int64_t> to_device_calls{0};
  std::atomic<int64_t> step_launches{0};
  std::vector<int64_t> launches_at_read;  // step launches when each ToHost began

 private:
  Runtime* real_;
};

TEST_F(StepLoopTest, NextBatchUploadIsIssuedBeforeTheStepsOutputsAreAwaited) {
  const CompiledJob& job = Job("mlp_classifier/dp1");
  ASSERT_NE(job.step, nullptr);
  TracingRuntime tracing(runtime_);
  tracing.step = job.step.get();
  constexpr int kSteps = 6;
  int steps_seen = 0;
  std::vector<bool> overlapped;
  // dp1: 1 seed upload, then 2 arrays per batch. When step k's Execute has finished, batch
  // k+1's first upload must already have been issued (waited for up to 2 s: without prefetch
  // it would never come while the loop thread is still inside Execute).
  tracing.after_step = [&] {
    const int k = ++steps_seen;
    if (k == kSteps) return;
    const int64_t want = 1 + 2 * k + 1;
    const absl::Time deadline = absl::Now() + absl::Seconds(2);
    while (tracing.to_device_calls.load() < want && absl::Now() < deadline) {
      absl::SleepFor(absl::Microseconds(100));
    }
    overlapped.push_back(tracing.to_device_calls.load() >= want);
  };
  Collected collected;
  auto loop = StepLoop::Create(LoopConfig(
      &tracing, job, SpecFor(job.job, kSteps, kSteps),
      std::make_unique<JobBatches>(job.job, JobBatches::Options{}), &collected));
  ASSERT_TRUE(loop.ok()) << loop.status();
  ASSERT_TRUE((*loop)->Start().ok());
  EXPECT_EQ((*loop)->Wait().outcome, LoopOutcome::kSucceeded);
  ASSERT_EQ(overlapped.size(), static_cast<size_t>(kSteps - 1));
  for (int k = 0; k < kSteps - 1; ++k) EXPECT_TRUE(overlapped[k]) << "step " << k + 1;
}

// At cadence 1 a logging step does not stall the pipeline: step s+1 is launched before step s's
// telemetry is read, and every summary still reaches the sink, in order. A cancel from step 3's
// sink ends the run after step 4, whose summary is delivered too.
TEST_F(StepLoopTest, LoggingStepsLaunchTheNextStepBeforeTheirTelemetryIsRead) {
  const CompiledJob& job = Job("mlp_classifier/dp8");
  ASSERT_NE(job.step, nullptr);
  for (const int64_t cancel_at : {int64_t{0}, int64_t{3}}) {
    SCOPED_TRACE(cancel_at == 0 ? "full run" : "cancelled from step 3's sink");
    constexpr int64_t kSteps = 6;
    TracingRuntime tracing(runtime_);
    tracing.step = job.step.get();
    Collected collected;
    const LoopResult result =
        RunCancellingAt(&tracing, job, SpecFor(job.job, kSteps, 1), cancel_at, &collected);
    const int64_t last = cancel_at == 0 ? kSteps : cancel_at + 1;
    EXPECT_EQ(result.outcome, cancel_at == 0 ? LoopOutcome::kSucceeded : LoopOutcome::kCancelled)
        << result.error;
    EXPECT_EQ(result.last_completed_step, last);
    // One telemetry read per step; step s's read began after step s+1's launch (the last
    // step's, and a cancelled run's last, after no further launch).
    std::vector<int64_t> want;
    for (int64_t s = 1; s <= last; ++s) want.push_back(s < last ? s + 1 : last);
    EXPECT_EQ(tracing.launches_at_read, want);
    absl::MutexLock l(&collected.mu);
    ASSERT_EQ(collected.summaries.size(), static_cast<size_t>(last));
    for (int64_t s = 1; s <= last; ++s) EXPECT_EQ(collected.summaries[s - 1].step, s);
  }
}

TEST_F(StepLoopTest, SlowBatchesOverlapSlowSteps) {
  const CompiledJob& job = Job("mlp_classifier/dp1");
  ASSERT_NE(job.step, nullptr);
  constexpr int kSteps = 8;
  constexpr absl::Duration kDelay = absl::Milliseconds(40);
  // Overlap is checked on the recorded intervals, not on wall time, which a loaded machine
  // stretches: a batch's preparation must run while a step is running.
  struct Interval {
    absl::Time start, end;
  };
  absl::Mutex mu;
  std::vector<Interval> batch_times, step_times;
  TracingRuntime tracing(runtime_);
  tracing.step = job.step.get();
  absl::Time step_start;  // the loop thread's: steps run one at a time in Execute
  tracing.before_step = [&] { step_start = absl::Now(); };
  tracing.after_step = [&] {
    absl::SleepFor(kDelay);
    absl::MutexLock lock(&mu);
    step_times.push_back({step_start, absl::Now()});
  };
  JobBatches::Options options{.delay = kDelay, .on_delay = [&](absl::Time start, absl::Time end) {
                                absl::MutexLock lock(&mu);
                                batch_times.push_back({start, end});
                              }};
  Collected collected;
  auto loop = StepLoop::Create(
      LoopConfig(&tracing, job, SpecFor(job.job, kSteps, kSteps),
                 std::make_unique<JobBatches>(job.job, options), &collected));
  ASSERT_TRUE(loop.ok()) << loop.status();
  ASSERT_TRUE((*loop)->Start().ok());
  EXPECT_EQ((*loop)->Wait().outcome, LoopOutcome::kSucceeded);
  absl::MutexLock lock(&mu);
  ASSERT_EQ(step_times.size(), kSteps);
  int overlapped = 0;
  for (const Interval& batch : batch_times) {
    overlapped += absl::c_any_of(step_times, [&](const Interval& step) {
      return batch.start < step.end && step.start < batch.end;
    });
  }
  // Every batch but the first (prepared while init runs) is prepared during a step.
  EXPECT_GE(overlapped, kSteps - 1) << "of " << batch_times.size() << " batches";
}

TEST_F(StepLoopTest, StepsWaitingForSlowBatchesReportTheWait) {
  const CompiledJob& job = Job("mlp_classifier/dp1");
  ASSERT_NE(job.step, nullptr);
  constexpr int kSteps = 8;
  constexpr absl::Duration kDelay = absl::Milliseconds(60);  // far above the ~2 ms step
  Collected collected;
  auto loop = StepLoop::Create(LoopConfig(
      runtime_, job, SpecFor(job.job, kSteps, 1),
      std::make_unique<JobBatches>(job.job, JobBatches::Options{.delay = kDelay}), &collected));
  ASSERT_TRUE(loop.ok()) << loop.status();
  ASSERT_TRUE((*loop)->Start().ok());
  EXPECT_EQ((*loop)->Wait().outcome, LoopOutcome::kSucceeded);
  absl::MutexLock l(&collected.mu);
  ASSERT_EQ(collected.summaries.size(), static_cast<size_t>(kSteps));
  absl::Duration waited;
  for (const HostStepSummary& summary : collected.summaries) {
    EXPECT_LE(summary.data_wait, summary.step_time) << "step " << summary.step;
    waited += summary.data_wait;
  }
  // Each batch after the first is asked for one step ahead, so the loop waits about
  // kDelay minus a step each time: at least one batch's delay over the run, even when loaded.
  EXPECT_GE(waited, kDelay) << "waited " << waited;
}

// ---- the reduction program across devices ----

HostArray Bf16(std::vector<int64_t> dims, const std::vector<float>& values) {
  std::vector<uint16_t> bits;
  for (float v : values) {
    uint32_t u;
    std::memcpy(&u, &v, sizeof(u));
    bits.push_back(static_cast<uint16_t>(u >> 16));  // exact for these small values
  }
  return HostArray::From<uint16_t>(DType::kBF16, std::move(dims), bits);
}

TEST_F(StepLoopTest, ReducerCombinesDistinctShardsAcrossLocalDevices) {
  // Mesh data=4 x model=2 over devices 0..7; partition p = (data p/2, model p%2).
  std::vector<int> devices;
  std::vector<int64_t> partitions;
  for (int p = 0; p < 8; ++p) {
    devices.push_back(p);
    partitions.push_back(p);
  }
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<TelemetryReducer::Series> series = {
      // Replicated: every device holds 3; `sum` must not multiply it by the device count.
      {"replicated_sum", {DType::kF32, {}}, Combine::kSum, 2.5, {}},
      // Split over data: the 4 distinct shards are on partitions 0, 2, 4, 6.
      {"data_mean", {DType::kF32, {2}}, Combine::kMean, 100.0, {"data"}},
      // Split over model: distinct shards on partitions 0 and 1.
      {"model_max", {DType::kS32, {3}}, Combine::kMax, std::nullopt, {"model"}},
      {"data_min", {DType::kF32, {1}}, Combine::kMin, std::nullopt, {"data"}},
      // Split over both: `last` is partition 7's.
      {"both_last", {DType::kBF16, {2, 2}}, Combine::kLast, std::nullopt, {"data", "model"}},
      {"nan_flag", {DType::kF32, {}}, Combine::kMean, 1.0, {}},
  };
  Metrics metrics;
  auto reducer = TelemetryReducer::Create({.runtime = runtime_,
                                           .device_indices = devices,
                                           .partitions = partitions,
                                           .mesh_axes = {"data", "model"},
                                           .mesh_shape = {4, 2},
                                           .series = series,
                                           .metrics = &metrics});
  ASSERT_TRUE(reducer.ok()) << reducer.status();
  EXPECT_EQ((*reducer)->num_replicas(), 8);
  EXPECT_EQ((*reducer)->output_elements(), 1 + 2 + 3 + 1 + 4 + 1 + 3);  // values + 3 flags
  EXPECT_TRUE(absl::StrContains((*reducer)->program(), "stablehlo.all_gather"));

  std::vector<std::vector<std::unique_ptr<DeviceBuffer>>> owned(8);
  std::vector<std::vector<DeviceBuffer*>> args(8);
  for (int p = 0; p < 8; ++p) {
    const float f = static_cast<float>(p);
    const std::vector<HostArray> values = {
        HostArray::From<float>(DType::kF32, {}, {3.0f}),
        HostArray::From<float>(DType::kF32, {2}, {f, 10 * f}),
        HostArray::From<int32_t>(DType::kS32, {3}, {p, -p, 7}),
        HostArray::From<float>(DType::kF32, {1}, {5.0f - f}),
        Bf16({2, 2}, {f, f + 1, f + 2, f + 3}),
        HostArray::From<float>(DType::kF32, {}, {p == 0 ? nan : 0.0f}),
    };
    for (const HostArray& v : values) {
      auto buffer = runtime_->ToDevice(v, p);
      ASSERT_TRUE(buffer.ok()) << buffer.status();
      args[p].push_back(buffer->get());
      owned[p].push_back(std::move(*buffer));
    }
  }
  const int64_t d2h_before = runtime_->counters().device_to_host.count;
  auto reduced = (*reducer)->Reduce(args);
  ASSERT_TRUE(reduced.ok()) << reduced.status() << "\n" << (*reducer)->program();
  EXPECT_EQ(runtime_->counters().device_to_host.count - d2h_before, 1);
  const std::vector<TelemetryValue>& v = *reduced;
  ASSERT_EQ(v.size(), series.size());
  EXPECT_EQ(v[0].values, (std::vector<float>{3.0f}));
  EXPECT_TRUE(v[0].threshold_exceeded);  // 3 > 2.5
  EXPECT_EQ(v[1].values, (std::vector<float>{3.0f, 30.0f}));  // mean of p = 0, 2, 4, 6
  EXPECT_FALSE(v[1].threshold_exceeded);
  EXPECT_EQ(v[2].values, (std::vector<float>{1.0f, 0.0f, 7.0f}));  // max over p = 0, 1
  EXPECT_EQ(v[3].values, (std::vector<float>{-1.0f}));             // min of 5 - p, p = 0..6 even
  EXPECT_EQ(v[4].values, (std::vector<float>{7.0f, 8.0f, 9.0f, 10.0f}));
  EXPECT_EQ(v[4].shape, (std::vector<int64_t>{2, 2}));
  EXPECT_TRUE(std::isnan(v[5].values[0]));  // replicated: device 0's copy
  EXPECT_TRUE(v[5].threshold_exceeded);     // NaN is not <= 1
  EXPECT_EQ(metrics.Get(kTransferFromDeviceBytes).total, 15 * 4);

  // Only replicated series: no collective, one device.
  auto single = TelemetryReducer::Create({.runtime = runtime_,
                                          .device_indices = devices,
                                          .partitions = partitions,
                                          .mesh_axes = {"data", "model"},
                                          .mesh_shape = {4, 2},
                                          .series = {series[0]}});
  ASSERT_TRUE(single.ok()) << single.status();
  EXPECT_EQ((*single)->num_replicas(), 1);
  EXPECT_FALSE(absl::StrContains((*single)->program(), "all_gather"));
  std::vector<std::vector<DeviceBuffer*>> first_only(8);
  for (int p = 0; p < 8; ++p) first_only[p] = {args[p][0]};
  auto one = (*single)->Reduce(first_only);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ((*one)[0].values, (std::vector<float>{3.0f}));

  // Bad declarations.
  auto bad = TelemetryReducer::Create({.runtime = runtime_,
                                       .device_indices = devices,
                                       .partitions = partitions,
                                       .mesh_axes = {"data", "model"},
                                       .mesh_shape = {4, 2},
                                       .series = {{"x", {DType::kF32, {2}}, Combine::kSum,
                                                   std::nullopt, {"expert"}}}});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "unknown mesh axis 'expert'"));
}

// ---- metrics registry ----

TEST(MetricsTest, TimersBytesAndCountersSnapshotAndReport) {
  Metrics metrics;
  metrics.AddTime(kExecuteTime, absl::Milliseconds(3));
  metrics.AddTime(kExecuteTime, absl::Milliseconds(1));
  metrics.AddBytes(kTransferToDeviceBytes, 1024);
  metrics.AddBytes(kTransferToDeviceBytes, 2048);
  metrics.Increment(kSteps);
  metrics.Increment(kSteps, 4);
  metrics.Increment(kExecuteTime);  // a different kind under a taken name is kept apart

  const MetricValue execute = metrics.Get(kExecuteTime);
  EXPECT_EQ(execute.kind, MetricKind::kTimer);
  EXPECT_EQ(execute.count, 2);
  EXPECT_DOUBLE_EQ(execute.total, 0.004);
  EXPECT_DOUBLE_EQ(execute.min, 0.001);
  EXPECT_DOUBLE_EQ(execute.max, 0.003);
  EXPECT_EQ(execute.unit(), "seconds");
  const MetricValue bytes = metrics.Get(kTransferToDeviceBytes);
  EXPECT_EQ(bytes.count, 2);
  EXPECT_EQ(bytes.total, 3072);
  EXPECT_EQ(bytes.unit(), "bytes");
  EXPECT_EQ(metrics.Get(kSteps).count, 5);
  EXPECT_EQ(metrics.Get("ExecuteTime.counter").count, 1);
  EXPECT_EQ(metrics.Get(kCacheHits).count, 0);

  const std::vector<MetricValue> snapshot = metrics.Snapshot();
  ASSERT_EQ(snapshot.size(), 4u);
  EXPECT_EQ(snapshot[0].name, "ExecuteTime");
  EXPECT_EQ(snapshot[3].name, "TransferToDeviceBytes");
  const std::string report = MetricsReport(snapshot);
  EXPECT_TRUE(absl::StrContains(report, "Metric: ExecuteTime\n  TotalSamples: 2\n"
                                        "  Accumulator: 4ms\n"))
      << report;
  EXPECT_TRUE(absl::StrContains(report, "Counter: Steps\n  Value: 5\n")) << report;
  EXPECT_TRUE(absl::StrContains(report, "Accumulator: 3.00KB")) << report;

  // Concurrent recording loses nothing.
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) metrics.Increment(kCacheHits);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(metrics.Get(kCacheHits).count, 4000);
}

// ---- compile mode B: grad micro-steps with on-device accumulation, then apply ----

// An MoE job's spec: loss, grad norm and the [layers, experts] expert load, all from apply.
RunSpec ModeBSpec(const ExampleJob& job, int64_t steps, int64_t cadence) {
  RunSpec spec{.job_id = "job-" + job.name,
               .host = "host-0",
               .num_state = job.num_state,
               .grad_accumulation = job.grad_accumulation,
               .num_grad_acc = static_cast<int>(job.apply.inputs.size()) - job.num_state,
               .seed = job.seed,
               .mesh_axes = job.mesh_axes,
               .mesh_shape = job.mesh_shape,
               .device_ids = job.device_ids,
               .telemetry_cadence = cadence,
               .steps = steps,
               .replica_count = static_cast<int>(job.mesh_shape[0])};
  for (const auto& a : job.data_arrays) spec.batch_sharding.push_back(a.sharding);
  for (const char* name : {"metrics.loss", "metrics.grad_norm", "metrics.expert_load"}) {
    spec.telemetry.push_back({.name = name, .combine = Combine::kMean});
  }
  return spec;
}

StepLoop::Config ModeBConfig(Runtime* runtime, const CompiledJob& job, RunSpec spec,
                             std::unique_ptr<BatchSource> batches, Collected* collected) {
  StepLoop::Config config = LoopConfig(runtime, job, std::move(spec), std::move(batches),
                                       collected);
  config.step = nullptr;
  config.grad = job.grad;
  config.apply = job.apply;
  return config;
}

class ModeBReferenceLoss : public StepLoopTest, public testing::WithParamInterface<std::string> {};

TEST_P(ModeBReferenceLoss, LossesOfGradAndApplyMatchJax) {
  const CompiledJob& job = Job(GetParam());
  ASSERT_NE(job.grad, nullptr);
  ASSERT_NE(job.apply, nullptr);
  ASSERT_EQ(job.job.grad_accumulation, 2);
  ASSERT_EQ(job.job.reference_loss.size(), 20u);
  Collected collected;
  Metrics metrics;
  const runtime::RuntimeCounters before = runtime_->counters();
  StepLoop::Config config =
      ModeBConfig(runtime_, job, ModeBSpec(job.job, 20, 1),
                  std::make_unique<JobBatches>(job.job, JobBatches::Options{}), &collected);
  config.metrics = &metrics;
  int hook_calls = 0;
  config.reduce_gradients = [&](StepLoop::DeviceBuffers& grad_acc) {
    ++hook_calls;
    EXPECT_EQ(grad_acc.size(), job.job.device_ids.size());
    EXPECT_EQ(grad_acc[0].size(), job.job.apply.inputs.size() - job.job.num_state);
    return absl::OkStatus();
  };
  auto loop = StepLoop::Create(std::move(config));
  ASSERT_TRUE(loop.ok()) << loop.status();
  const absl::Time start = absl::Now();
  ASSERT_TRUE((*loop)->Start().ok());
  const LoopResult result = (*loop)->Wait();
  const absl::Duration elapsed = absl::Now() - start;
  EXPECT_EQ(result.outcome, LoopOutcome::kSucceeded) << result.error;
  EXPECT_EQ(result.last_completed_step, 20);
  EXPECT_EQ(hook_calls, 20);

  absl::MutexLock l(&collected.mu);
  ASSERT_EQ(collected.summaries.size(), 20u);
  float worst = 0;
  for (int s = 1; s <= 20; ++s) {
    const HostStepSummary& summary = collected.summaries[s - 1];
    EXPECT_EQ(summary.step, s);
    ASSERT_EQ(summary.values.size(), 3u);
    const float loss = summary.values[0].values[0];
    worst = std::max(worst, Relative(loss, job.job.reference_loss[s - 1]));
    EXPECT_LE(Relative(loss, job.job.reference_loss[s - 1]), 1e-5f)
        << "step " << s << ": loop " << loss << ", JAX " << job.job.reference_loss[s - 1];
    EXPECT_LE(Relative(summary.values[1].values[0], job.job.reference_grad_norm[s - 1]), 1e-5f)
        << "grad norm at step " << s;
    // Expert load: per layer, fractions of the routed slots that sum to 1.
    ASSERT_EQ(summary.values[2].shape, (std::vector<int64_t>{4, 4}));
    for (int layer = 0; layer < 4; ++layer) {
      float sum = 0;
      for (int e = 0; e < 4; ++e) sum += summary.values[2].values[layer * 4 + e];
      EXPECT_NEAR(sum, 1.0f, 1e-4f) << "step " << s << " layer " << layer;
    }
    // One device-to-host transfer per logging step: the micro-steps read nothing.
    EXPECT_EQ(collected.device_to_host[s - 1], before.device_to_host.count + s);
  }
  EXPECT_LT(job.job.reference_loss.back(), 0.7f * job.job.reference_loss.front());  // it trains
  // Up: D seeds, D x accumulators of zeros once, then one batch shard per device per micro-step.
  const int64_t devices = static_cast<int64_t>(job.job.device_ids.size());
  const int64_t accumulators = static_cast<int64_t>(job.job.apply.inputs.size()) - job.job.num_state;
  EXPECT_EQ(runtime_->counters().host_to_device.count - before.host_to_device.count,
            devices + devices * accumulators + 40 * devices);
  // 1 init + 40 grad + 20 apply + 20 reductions.
  EXPECT_EQ(metrics.Get(kExecuteTime).count, 81);
  EXPECT_EQ(metrics.Get(kSteps).count, 20);
  std::printf("%s: 20 steps (40 grad micro-steps + 20 apply) in %s, max relative loss "
              "difference %.3g\n",
              GetParam().c_str(), absl::FormatDuration(elapsed).c_str(), worst);
}

INSTANTIATE_TEST_SUITE_P(Moe, ModeBReferenceLoss,
                         testing::Values("transformer_moe/dp1", "transformer_moe/dp8"),
                         [](const testing::TestParamInfo<std::string>& info) {
                           return info.param.substr(info.param.find('/') + 1);
                         });

// Cancels the loop when the micro-batch with this 1-based index is fetched.
class CancellingBatches final : public BatchSource {
 public:
  CancellingBatches(const ExampleJob& job, int64_t cancel_at, StepLoop** loop)
      : inner_(job, {}), cancel_at_(cancel_at), loop_(loop) {}
  absl::StatusOr<std::vector<HostArray>> Next() override {
    if (++calls_ == cancel_at_) (*loop_)->Cancel();
    return inner_.Next();
  }

 private:
  JobBatches inner_;
  int64_t cancel_at_;
  int64_t calls_ = 0;
  StepLoop** loop_;
};

TEST_F(StepLoopTest, ModeBCancelIsHonouredBetweenMicroSteps) {
  const CompiledJob& job = Job("transformer_moe/dp1");
  ASSERT_NE(job.grad, nullptr);
  Collected collected;
  Metrics metrics;
  StepLoop* raw = nullptr;
  // Micro-batch 8 is step 4's second: its fetch cancels while step 4's first micro-step runs
  // (or before it), so step 4's second grad never executes.
  StepLoop::Config config =
      ModeBConfig(runtime_, job, ModeBSpec(job.job, 10, 1000),
                  std::make_unique<CancellingBatches>(job.job, 8, &raw), &collected);
  config.metrics = &metrics;
  auto loop = StepLoop::Create(std::move(config));
  ASSERT_TRUE(loop.ok()) << loop.status();
  raw = loop->get();
  ASSERT_TRUE((*loop)->Start().ok());
  const LoopResult result = (*loop)->Wait();
  EXPECT_EQ(result.outcome, LoopOutcome::kCancelled) << result.error;
  EXPECT_EQ(result.last_completed_step, 3);
  // 1 init + 3 x (2 grad + 1 apply) + step 4's first grad; no telemetry at cadence 1000.
  EXPECT_EQ(metrics.Get(kExecuteTime).count, 1 + 3 * 3 + 1);
}

TEST_F(StepLoopTest, ModeBFailuresNameStepMicroStepAndProgram) {
  const CompiledJob& job = Job("transformer_moe/dp1");
  ASSERT_NE(job.grad, nullptr);
  {
    // Micro-batch 4 (step 2, micro-step 2) has the wrong shape.
    Collected collected;
    auto loop = StepLoop::Create(ModeBConfig(
        runtime_, job, ModeBSpec(job.job, 5, 1),
        std::make_unique<JobBatches>(job.job, JobBatches::Options{.misshape_at = 4}),
        &collected));
    ASSERT_TRUE(loop.ok()) << loop.status();
    ASSERT_TRUE((*loop)->Start().ok());
    const LoopResult result = (*loop)->Wait();
    EXPECT_EQ(result.outcome, LoopOutcome::kFailed);
    EXPECT_EQ(result.last_completed_step, 1);
    EXPECT_TRUE(absl::StartsWith(result.error.message(),
                                 "step 2, micro-step 2: batch array 'batch.tokens'"))
        << result.error;
  }
  {
    // The gradient hook (where a cross-host all-reduce goes) fails at step 3.
    Collected collected;
    StepLoop::Config config =
        ModeBConfig(runtime_, job, ModeBSpec(job.job, 5, 1),
                    std::make_unique<JobBatches>(job.job, JobBatches::Options{}), &collected);
    int calls = 0;
    config.reduce_gradients = [&calls](StepLoop::DeviceBuffers&) {
      return ++calls == 3 ? absl::UnavailableError("peer host-1 left the all-reduce")
                          : absl::OkStatus();
    };
    auto loop = StepLoop::Create(std::move(config));
    ASSERT_TRUE(loop.ok()) << loop.status();
    ASSERT_TRUE((*loop)->Start().ok());
    const LoopResult result = (*loop)->Wait();
    EXPECT_EQ(result.outcome, LoopOutcome::kFailed);
    EXPECT_EQ(result.last_completed_step, 2);
    EXPECT_EQ(result.error.code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(result.error.message(),
              "step 3: gradient reduction: peer host-1 left the all-reduce");
  }
  {
    // A hook that hands apply a wrong-shaped accumulator: the plugin refuses apply.
    Collected collected;
    StepLoop::Config config =
        ModeBConfig(runtime_, job, ModeBSpec(job.job, 5, 1),
                    std::make_unique<JobBatches>(job.job, JobBatches::Options{}), &collected);
    config.reduce_gradients = [this](StepLoop::DeviceBuffers& grad_acc) -> absl::Status {
      HostArray wrong = HostArray::From<float>(DType::kF32, {3}, {1, 2, 3});
      ASSIGN_OR_RETURN(grad_acc[0][0], runtime_->ToDevice(wrong, 0));
      return absl::OkStatus();
    };
    auto loop = StepLoop::Create(std::move(config));
    ASSERT_TRUE(loop.ok()) << loop.status();
    ASSERT_TRUE((*loop)->Start().ok());
    const LoopResult result = (*loop)->Wait();
    EXPECT_EQ(result.outcome, LoopOutcome::kFailed);
    EXPECT_EQ(result.last_completed_step, 0);
    EXPECT_TRUE(absl::StartsWith(result.error.message(), "step 1 (apply): ")) << result.error;
  }
}

TEST_F(StepLoopTest, ModeBCreateRefusesBadSpecs) {
  const CompiledJob& moe = Job("transformer_moe/dp1");
  const CompiledJob& dense = Job("mlp_classifier/dp1");
  ASSERT_NE(moe.grad, nullptr);
  auto make = [&](RunSpec spec, std::shared_ptr<const Executable> step) {
    StepLoop::Config config = ModeBConfig(
        runtime_, moe, std::move(spec),
        std::make_unique<JobBatches>(moe.job, JobBatches::Options{}), nullptr);
    config.sink = nullptr;
    config.on_done = nullptr;
    config.step = std::move(step);
    return StepLoop::Create(std::move(config)).status();
  };
  absl::Status status = make(ModeBSpec(moe.job, 5, 1), dense.step);
  EXPECT_TRUE(absl::StrContains(status.message(), "no step executable")) << status;
  RunSpec spec = ModeBSpec(moe.job, 5, 1);
  spec.grad_accumulation = 0;
  status = make(spec, nullptr);
  EXPECT_TRUE(absl::StrContains(status.message(), "grad_accumulation >= 1")) << status;
  spec = ModeBSpec(moe.job, 5, 1);
  spec.num_grad_acc -= 1;
  status = make(spec, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(status.message(), "accumulator")) << status;
  EXPECT_TRUE(make(ModeBSpec(moe.job, 5, 1), nullptr).ok());
}

}  // namespace
}  // namespace meshrun::worker
