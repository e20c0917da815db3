// The worker's StepLoop vs a bare loop of runtime Execute calls on the same compiled executables,
// in the same run, on the CPU PJRT plugin (8 devices); and the step time with telemetry off vs
// at cadence 1 and cadence 100.
//
// Job (choice): the default is mlp_classifier/dp8 (~1.6 ms/step here), not transformer_lm/dp8
// (~120-160 ms/step): on this shared 2-core machine a transformer run of 100 steps (the least
// that gives cadence 100 one logging step) takes ~15 s and its time swings by tens of percent
// between runs, so ~2 minutes buy only two noisy rounds. The MLP gets 15 interleaved rounds of
// 1000 steps in under 2 minutes, and is the stricter test: any per-step cost of the loop or of
// telemetry is a far larger fraction of a 1.6 ms step. `--job transformer_lm/dp8 --steps 100 --rounds 2` runs
// the transformer.
//
// Configurations (each timed over the same steps; rounds interleave them, rotating the order):
//   bare      init, then for each step: Execute(step, state + batch, donate state), keep the
//             state outputs on device, drop the rest. Its batches are uploaded once before the
//             timed steps (one set of device buffers per batch of the job, cycled), so it does
//             LESS work per step than the loop, which shards and uploads each step's batch on its
//             prefetch thread (overlapped with the previous step). A strict baseline: the loop's
//             data feed counts as overhead.
//   loop_off  StepLoop, no telemetry declared, no logging step (no device-to-host transfer).
//   loop_c1   StepLoop, every metrics.* output of the step as telemetry (mean), cadence 1.
//   loop_c100 StepLoop, the same telemetry at cadence 100.
// Timed span: from the start of step 1 (the loop asks its BatchSource for batch 2 as step 1
// begins, after init) until the loop's on_done (after it joined its prefetch thread and released
// the state: a little more than the steps); for bare, from before step 1 until step N's
// outputs are ready. Init and the reducer's compile are outside it. Wall time is what the ratios
// use; process CPU time (all threads) is printed alongside, as it is less sensitive to other
// processes on the machine.
//
// Prints absolute ms/step, then as its last lines (higher is better), each the median over
// rounds of the ratio within a round:
//   ratio loop_vs_bare_execute <bare time / loop_c100 time>
//   ratio telemetry_cadence1   <loop_off time / loop_c1 time>
//   ratio telemetry_cadence100 <loop_off time / loop_c100 time>
// (with --configs, only the ratios whose two configurations ran).
//
// Usage: meshrun_step_loop_bench [--job mlp_classifier/dp8|transformer_lm/dp8] [--steps N]
//                                [--rounds R] [--configs bare,loop_off,loop_c1,loop_c100]
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "bench/bench_support.h"
#include "common/mutex_checks.h"
#include "runtime/backends.h"
#include "runtime/pjrt/pjrt_runtime.h"
#include "runtime/compile_options.h"
#include "bundle/example_job.h"
#include "runtime/shard.h"
#include "worker/step_loop.h"

namespace {

using meshrun::bench::Fail;
using meshrun::bench::Median;

using namespace meshrun;
using runtime::DeviceBuffer;
using runtime::Executable;
using runtime::ExampleJob;
using runtime::HostArray;
using runtime::Runtime;

// Wall and process CPU time (all threads), in nanoseconds.
struct Stamp {
  int64_t wall_ns = 0;
  int64_t cpu_ns = 0;
  static Stamp Now() {
    timespec wall, cpu;
    clock_gettime(CLOCK_MONOTONIC, &wall);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu);
    return {wall.tv_sec * 1000000000LL + wall.tv_nsec, cpu.tv_sec * 1000000000LL + cpu.tv_nsec};
  }
};

// Milliseconds per step between two stamps.
struct PerStep {
  double wall_ms = 0;
  double cpu_ms = 0;
  double reduce_ms = 0;  // loop with telemetry: mean on-device reduce + read per logging step
  static PerStep Between(const Stamp& a, const Stamp& b, int64_t steps) {
    return {(b.wall_ns - a.wall_ns) * 1e-6 / static_cast<double>(steps),
            (b.cpu_ns - a.cpu_ns) * 1e-6 / static_cast<double>(steps)};
  }
};

// Cycles through the job's batches; records when batch 2 is asked for (= step 1 begins).
class CyclingBatches : public worker::BatchSource {
 public:
  CyclingBatches(const ExampleJob& job, Stamp* step1_start)
      : job_(job), step1_start_(step1_start) {}
  absl::StatusOr<std::vector<HostArray>> Next() override {
    const int64_t call = ++calls_;
    if (call == 2) *step1_start_ = Stamp::Now();  // read after Wait(): the loop joined this thread
    return job_.batches[(call - 1) % job_.batches.size()];
  }

 private:
  const ExampleJob& job_;
  Stamp* step1_start_;
  int64_t calls_ = 0;
};

struct Bench {
  Runtime* runtime;
  const ExampleJob& job;
  std::shared_ptr<const Executable> init;
  std::shared_ptr<const Executable> step;
  // [batch][device][array], uploaded once for the bare loop.
  std::vector<std::vector<std::vector<std::unique_ptr<DeviceBuffer>>>> batches;
  std::vector<std::string> telemetry_names;

  absl::Status UploadBatches() {
    const std::vector<int>& devices = step->device_indices();
    for (const std::vector<HostArray>& batch : job.batches) {
      std::vector<std::vector<std::unique_ptr<DeviceBuffer>>> per_device(devices.size());
      for (size_t p = 0; p < devices.size(); ++p) {
        for (size_t a = 0; a < batch.size(); ++a) {
          absl::StatusOr<HostArray> shard =
              runtime::ShardOf(batch[a], job.data_arrays[a].sharding, job.mesh_axes,
                               job.mesh_shape, static_cast<int>(p));
          if (!shard.ok()) return shard.status();
          absl::StatusOr<std::unique_ptr<DeviceBuffer>> buffer =
              runtime->ToDevice(*shard, devices[p]);
          if (!buffer.ok()) return buffer.status();
          per_device[p].push_back(std::move(*buffer));
        }
      }
      batches.push_back(std::move(per_device));
    }
    return absl::OkStatus();
  }

  // Milliseconds per step of the bare loop over `steps` steps.
  absl::StatusOr<PerStep> RunBare(int64_t steps) {
    const std::vector<int>& devices = init->device_indices();
    std::vector<std::unique_ptr<DeviceBuffer>> seeds;
    std::vector<std::vector<DeviceBuffer*>> init_args;
    for (int device : devices) {
      absl::StatusOr<std::unique_ptr<DeviceBuffer>> seed = runtime->ToDevice(
          HostArray::From<uint32_t>(runtime::DType::kU32, {}, {job.seed}), device);
      if (!seed.ok()) return seed.status();
      init_args.push_back({seed->get()});
      seeds.push_back(std::move(*seed));
    }
    auto state = runtime->Execute(*init, init_args, {});
    if (!state.ok()) return state.status();
    std::vector<int> donate;
    for (int i = 0; i < job.num_state; ++i) donate.push_back(i);
    const Stamp start = Stamp::Now();
    for (int64_t s = 1; s <= steps; ++s) {
      const auto& batch = batches[(s - 1) % batches.size()];
      std::vector<std::vector<DeviceBuffer*>> args(state->size());
      for (size_t d = 0; d < state->size(); ++d) {
        for (int i = 0; i < job.num_state; ++i) args[d].push_back((*state)[d][i].get());
        for (const auto& buffer : batch[d]) args[d].push_back(buffer.get());
      }
      auto outputs = runtime->Execute(*step, args, {.donate_inputs = donate});
      if (!outputs.ok()) return outputs.status();
      for (size_t d = 0; d < outputs->size(); ++d) {
        (*outputs)[d].resize(job.num_state);
        (*state)[d] = std::move((*outputs)[d]);
      }
    }
    return PerStep::Between(start, Stamp::Now(), steps);
  }

  // Milliseconds per step of a StepLoop run; cadence 0 = no telemetry declared.
  absl::StatusOr<PerStep> RunLoop(int64_t steps, int64_t cadence, int64_t* summaries_out) {
    worker::RunSpec spec{.job_id = "bench",
                         .host = "host-0",
                         .num_state = job.num_state,
                         .seed = job.seed,
                         .mesh_axes = job.mesh_axes,
                         .mesh_shape = job.mesh_shape,
                         .device_ids = job.device_ids,
                         .telemetry_cadence = cadence > 0 ? cadence : steps + 1,  // off: no logging step
                         .steps = steps,
                         .replica_count = static_cast<int>(job.mesh_shape[0])};
    for (const auto& a : job.data_arrays) spec.batch_sharding.push_back(a.sharding);
    if (cadence > 0) {
      for (const std::string& name : telemetry_names) {
        spec.telemetry.push_back({.name = name,
                                  .combine = telemetry::Combine::kMean,
                                  .sharding = job.step.outputs[job.OutputIndex(name)].sharding});
      }
    }
    Stamp step1_start, done;
    absl::Mutex mu;
    std::vector<worker::HostStepSummary> summaries;
    worker::StepLoop::Config config{.runtime = runtime,
                                    .init = init,
                                    .step = step,
                                    .spec = std::move(spec),
                                    .batches = std::make_unique<CyclingBatches>(job, &step1_start)};
    if (cadence > 0) {
      config.sink = [&](worker::HostStepSummary summary) {  // enqueue and return
        absl::MutexLock l(&mu);
        summaries.push_back(std::move(summary));
      };
    }
    config.on_done = [&](const worker::LoopResult&) { done = Stamp::Now(); };
    auto loop = worker::StepLoop::Create(std::move(config));
    if (!loop.ok()) return loop.status();
    if (absl::Status s = (*loop)->Start(); !s.ok()) return s;
    const worker::LoopResult result = (*loop)->Wait();
    if (result.outcome != worker::LoopOutcome::kSucceeded) return result.error;
    PerStep per_step = PerStep::Between(step1_start, done, steps);
    for (const worker::MetricValue& m : (*loop)->MetricsSnapshot()) {
      if (m.name == worker::kTelemetryReduceTime && m.count > 0) {
        per_step.reduce_ms = m.total * 1e3 / static_cast<double>(m.count);
      }
    }
    {
      absl::MutexLock l(&mu);
      *summaries_out = static_cast<int64_t>(summaries.size());
    }
    return per_step;
  }
};

}  // namespace

int main(int argc, char** argv) {
  meshrun::ConfigureMutexDeadlockDetection();
  std::string job_name = "mlp_classifier/dp8";
  // 1000 steps and 15 rounds (about 100 s): shorter runs leave round-to-round noise of a few
  // percent on this 2-core machine, more than the 1% the cadence-100 target resolves.
  int64_t steps = 1000;  // cadence 100: ten logging steps per run
  int rounds = 15;
  std::vector<std::string> configs = {"bare", "loop_off", "loop_c1", "loop_c100"};
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--job") == 0 && i + 1 < argc) {
      job_name = argv[++i];
    } else if (std::strcmp(argv[i], "--steps") == 0 && i + 1 < argc) {
      steps = std::atoll(argv[++i]);
    } else if (std::strcmp(argv[i], "--configs") == 0 && i + 1 < argc) {
      configs = absl::StrSplit(argv[++i], ',');
    } else if (std::strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) {
      rounds = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--job mlp_classifier/dp8|transformer_lm/dp8] [--steps N] "
                   "[--rounds R] [--configs bare,loop_off,loop_c1,loop_c100]\n", argv[0]);
      return 2;
    }
  }
  if (steps < 2 || rounds < 1) {  // the loop's timing starts when it asks for batch 2
    std::fprintf(stderr, "step_loop_bench: --steps must be >= 2 and --rounds >= 1\n");
    return 2;
  }
  for (const std::string& name : configs) {
    if (name != "bare" && name != "loop_off" && name != "loop_c1" && name != "loop_c100") {
      std::fprintf(stderr, "step_loop_bench: unknown configuration '%s'\n", name.c_str());
      return 2;
    }
  }

  auto rt = runtime::PjrtRuntime::Create(
      {.plugin_path = runtime::DefaultPjrtPluginPath(), .cpu_device_count = 8});
  if (!rt.ok()) return Fail("start runtime", rt.status());
  auto job = runtime::LoadExampleJob(std::string(MESHRUN_SOURCE_DIR) + "/examples/" + job_name +
                                     "/job.json");
  if (!job.ok()) return Fail("load job", job.status());
  auto options = runtime::BuildCompileOptions(runtime::SpmdCompileOptions(job->device_ids));
  if (!options.ok()) return Fail("compile options", options.status());
  auto init = (*rt)->Compile({job->init.code, "mlir", *options, job->init.Signature()});
  if (!init.ok()) return Fail("compile init", init.status());
  auto step = (*rt)->Compile({job->step.code, "mlir", *options, job->step.Signature()});
  if (!step.ok()) return Fail("compile step", step.status());

  Bench bench{.runtime = rt->get(), .job = *job, .init = std::move(*init), .step = std::move(*step)};
  for (const auto& output : job->step.outputs) {
    if (output.global.name.rfind("metrics.", 0) == 0) bench.telemetry_names.push_back(output.global.name);
  }
  if (absl::Status s = bench.UploadBatches(); !s.ok()) return Fail("upload batches", s);
  std::string names;
  for (const std::string& n : bench.telemetry_names) names += (names.empty() ? "" : ", ") + n;
  std::printf("job %s on %zu CPU devices; %lld steps per run, %d rounds; telemetry: %s\n",
              job->name.c_str(), (*rt)->addressable_devices().size(),
              static_cast<long long>(steps), rounds, names.c_str());
  std::printf("bare: batches pre-uploaded to device once (strict baseline); loop: shards and "
              "uploads every step's batch on its prefetch thread\n");

  auto run = [&](const std::string& name, int64_t n, int64_t* summaries) -> absl::StatusOr<PerStep> {
    *summaries = 0;
    if (name == "bare") return bench.RunBare(n);
    if (name == "loop_off") return bench.RunLoop(n, 0, summaries);
    if (name == "loop_c1") return bench.RunLoop(n, 1, summaries);
    return bench.RunLoop(n, 100, summaries);
  };
  // Warm-up: every configuration once, a few steps.
  for (const std::string& name : configs) {
    int64_t summaries;
    if (auto r = run(name, std::min<int64_t>(steps, 5), &summaries); !r.ok()) {
      return Fail("warm-up " + name, r.status());
    }
  }
  std::map<std::string, std::vector<double>> wall, cpu, reduce;  // ms per round
  std::map<std::string, int64_t> logged;
  for (int round = 0; round < rounds; ++round) {
    std::printf("round %2d (wall/cpu ms per step):", round + 1);
    for (size_t k = 0; k < configs.size(); ++k) {
      const std::string& name = configs[(k + round) % configs.size()];
      int64_t summaries;
      absl::StatusOr<PerStep> t = run(name, steps, &summaries);
      if (!t.ok()) return Fail(name, t.status());
      wall[name].push_back(t->wall_ms);
      cpu[name].push_back(t->cpu_ms);
      reduce[name].push_back(t->reduce_ms);
      logged[name] = summaries;
      std::printf(" %s %.2f/%.2f", name.c_str(), t->wall_ms, t->cpu_ms);
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  for (const std::string& name : configs) {
    const auto [lo, hi] = std::minmax_element(wall[name].begin(), wall[name].end());
    const double med = Median(wall[name]);
    std::printf("%-9s wall median %.3f ms/step (%.2f steps/s, range %.3f..%.3f); process CPU "
                "median %.3f ms/step; logging steps per run %lld\n",
                name.c_str(), med, 1e3 / med, *lo, *hi, Median(cpu[name]),
                static_cast<long long>(logged[name]));
  }
  if (wall.count("loop_c1") && wall.count("loop_off")) {
    // The telemetry time measured inside the loop (its TelemetryReduceTime metric), and the
    // cadence-1 and cadence-100 ratios it would imply if it were serial. Logging steps pipeline:
    // step s's reduction runs after step s+1 was launched and, on the CPU plugin, finishes only
    // after it, so this time mostly overlaps step s+1: the implied ratios are a floor.
    const double r = Median(reduce["loop_c1"]), off = Median(wall["loop_off"]);
    std::printf("telemetry reduce + read inside the loop (overlapping the next step): median "
                "%.3f ms per logging step; ratios if it were serial: cadence 1 %.4f, "
                "cadence 100 %.4f\n",
                r, off / (off + r), off / (off + r / 100));
  }
  // A ratio is the median over rounds of base/other within the round (the two runs of a round
  // are close in time, so drift in the machine's load cancels better than in a ratio of
  // medians). The ratio of wall medians and the CPU-time ratio are printed for comparison.
  auto paired = [&](std::map<std::string, std::vector<double>>& m, const std::string& base,
                    const std::string& other) {
    std::vector<double> per_round;
    for (size_t r = 0; r < m[base].size(); ++r) per_round.push_back(m[base][r] / m[other][r]);
    return Median(per_round);
  };
  struct Ratio {
    const char* name;
    const char* base;
    const char* other;
  };
  std::vector<Ratio> ratios;
  for (const Ratio& r : {Ratio{"loop_vs_bare_execute", "bare", "loop_c100"},
                         Ratio{"telemetry_cadence1", "loop_off", "loop_c1"},
                         Ratio{"telemetry_cadence100", "loop_off", "loop_c100"}}) {
    if (wall.count(r.base) && wall.count(r.other)) ratios.push_back(r);
  }
  for (const Ratio& r : ratios) {
    std::printf("%s = %s/%s time: median of per-round ratios %.4f; ratio of medians %.4f; "
                "process CPU time, median of per-round ratios %.4f\n",
                r.name, r.base, r.other, paired(wall, r.base, r.other),
                Median(wall[r.base]) / Median(wall[r.other]), paired(cpu, r.base, r.other));
  }
  for (const Ratio& r : ratios) {
    std::printf("ratio %s %.4f\n", r.name, paired(wall, r.base, r.other));
  }
  return 0;
}
