// Checkpoint cost on the transformer LM (examples/transformer_lm/dp8, 8 CPU devices), in one
// process: the worker's StepLoop with and without a CheckpointSaver, the saver's write
// throughput beside a plain write + fsync of the same bytes to the same directory, and the
// time to the first step from a checkpoint (RestoreState) beside a cold start (init).
//
// Configurations (rounds interleave them, rotating the order):
//   none   StepLoop, N steps, no checkpoint.
//   every  StepLoop, N steps, a checkpoint every --every steps (and after the last, as a job
//          does), written by the worker's CheckpointSaver into a directory under --dir; the run
//          ends when the last checkpoint was written (Flush), so unfinished writes count.
// Timed span: Start() until the loop's on_done (+ the saver's Flush for `every`).
//
// Prints absolute figures, then (higher is better):
//   ratio checkpoint_overhead      <none time / every time>, median over rounds
//   ratio checkpoint_write_vs_disk <saver bytes/s (CheckpointBytes / CheckpointWriteTime) /
//                                   plain write+fsync bytes/s of as many bytes in one file>
// and, as figures: restore-to-first-step and cold-start-to-first-step seconds.
//
// Usage: meshrun_checkpoint_bench [--steps N] [--every K] [--rounds R] [--dir PATH]
//
// On the shared 2-core build machine (load ~12, ext4 on a virtio disk whose write+fsync of 15 MB
// runs at ~1.5 GB/s): 15.1 MB per checkpoint, the loop blocked 5.7 ms per checkpoint, overhead
// 0.97 (per-run times swing 24-45 s, so this is noise-bound); first step 0.23 s from a
// checkpoint vs 0.19 s from init. The writer: 140 MB/s median of 3 runs of --steps 60 --every 20
// --rounds 1 (load ~10.5), ratio 0.19; its fsyncs, once 90% of its time one journal commit each,
// now go out together (checkpoint/store.cc SyncAll); the writes compete with the step loop for
// the two cores (docs/checkpoints.md, "Not yet").
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "bench/bench_support.h"
#include "checkpoint/store.h"
#include "common/file_sync.h"
#include "worker/checkpointing.h"
#include "worker/runtime/backends.h"
#include "worker/runtime/compile_options.h"
#include "worker/runtime/example_job.h"
#include "worker/runtime/pjrt/pjrt_runtime.h"
#include "worker/step_loop.h"

namespace {

namespace fs = std::filesystem;
using meshrun::bench::Fail;
using meshrun::bench::Median;
using meshrun::bench::Now;
using namespace meshrun;
using runtime::ExampleJob;
using runtime::HostArray;

class CyclingBatches : public worker::BatchSource {
 public:
  explicit CyclingBatches(const ExampleJob& job) : job_(job) {}
  absl::StatusOr<std::vector<HostArray>> Next() override {
    return job_.batches[calls_++ % job_.batches.size()];
  }

 private:
  const ExampleJob& job_;
  size_t calls_ = 0;
};

std::vector<v1::TensorSpec> StateSpecs(const ExampleJob& job) {
  std::vector<v1::TensorSpec> out;
  for (int i = 0; i < job.num_state; ++i) {
    const runtime::ExampleArray& a = job.step.inputs[i];
    v1::TensorSpec spec;
    spec.set_name(a.global.name);
    spec.set_dtype(std::string(runtime::DTypeName(a.global.shape.dtype)));
    for (int64_t n : a.global.shape.dims) spec.add_shape(n);
    for (const std::string& s : a.sharding) spec.add_sharding(s);
    for (int64_t n : a.shard.dims) spec.add_shard_shape(n);
    out.push_back(std::move(spec));
  }
  return out;
}

struct Bench {
  runtime::Runtime* runtime;
  const ExampleJob& job;
  std::shared_ptr<const runtime::Executable> init, step;
  std::string dir;
  worker::Metrics saver_metrics;
  absl::Mutex mu;
  std::vector<v1::ReportCheckpointRequest> reports ABSL_GUARDED_BY(mu);

  worker::RunSpec Spec(int64_t steps) {
    worker::RunSpec spec{.job_id = "bench", .host = "host-0", .num_state = job.num_state,
                         .seed = job.seed, .mesh_axes = job.mesh_axes,
                         .mesh_shape = job.mesh_shape, .device_ids = job.device_ids,
                         .telemetry_cadence = steps + 1, .steps = steps,
                         .replica_count = static_cast<int>(job.mesh_shape[0])};
    for (const auto& a : job.data_arrays) spec.batch_sharding.push_back(a.sharding);
    return spec;
  }

  // Seconds for `steps` steps; every > 0 adds a saver writing into `dir`.
  absl::StatusOr<double> Run(int64_t steps, int64_t every,
                             worker::StepLoop::RestoreState restore = nullptr,
                             double* first_step_seconds = nullptr) {
    std::unique_ptr<worker::CheckpointSaver> saver;
    worker::StepLoop::Config config{.runtime = runtime, .init = init, .step = step,
                                    .spec = Spec(steps),
                                    .batches = std::make_unique<CyclingBatches>(job)};
    if (every > 0) {
      fs::remove_all(dir);
      fs::create_directories(dir);
      auto created = worker::CheckpointSaver::Create(
          {.runtime = runtime, .job_id = "bench", .host = "host-0", .incarnation = "1",
           .directory = dir, .state = StateSpecs(job), .mesh_axes = job.mesh_axes,
           .mesh_shape = job.mesh_shape,
           .report = [this](v1::ReportCheckpointRequest r) {
             absl::MutexLock l(&mu);
             reports.push_back(std::move(r));
           },
           .metrics = &saver_metrics});
      if (!created.ok()) return created.status();
      saver = std::move(*created);
      config.checkpoint = saver->Hook();
      config.checkpoint_every = every;
    }
    if (restore) config.restore_state = std::move(restore);
    double done = 0, first = 0;
    const double start = Now();
    config.on_done = [&](const worker::LoopResult&) { done = Now(); };
    auto loop = worker::StepLoop::Create(std::move(config));
    if (!loop.ok()) return loop.status();
    if (absl::Status s = (*loop)->Start(); !s.ok()) return s;
    const worker::LoopResult result = (*loop)->Wait();
    if (result.outcome != worker::LoopOutcome::kSucceeded) return result.error;
    first = done;
    if (saver != nullptr) {
      saver->Flush();
      done = Now();
    }
    if (first_step_seconds != nullptr) *first_step_seconds = first - start;
    return done - start;
  }

  // Commits the newest step the saver reported (as the coordinator would), for the restore.
  absl::StatusOr<std::string> CommitNewest() {
    absl::MutexLock l(&mu);
    if (reports.empty()) return absl::FailedPreconditionError("no checkpoint was reported");
    const v1::ReportCheckpointRequest& r = reports.back();
    if (!r.error().empty()) return absl::InternalError(r.error());
    v1::CheckpointManifest manifest;
    manifest.set_job_id("bench");
    manifest.set_step(r.step());
    for (const v1::CheckpointArray& a : r.arrays()) *manifest.add_arrays() = a;
    return checkpoint::Commit(dir, manifest, 1);
  }
};

// Seconds to write `bytes` to one new file under `dir` and fsync it (64 MiB pieces).
double PlainWrite(const std::string& dir, int64_t bytes) {
  const std::string path = dir + "/plain.bin";
  std::string piece(64 << 20, '\x5a');
  const double start = Now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  for (int64_t done = 0; fd >= 0 && done < bytes;) {
    const ssize_t n = ::write(fd, piece.data(),
                              static_cast<size_t>(std::min<int64_t>(piece.size(), bytes - done)));
    if (n <= 0) break;
    done += n;
  }
  if (fd >= 0) {
    FsyncInPieces(fd);
    ::close(fd);
  }
  const double seconds = Now() - start;
  fs::remove(path);
  return seconds;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t steps = 200, every = 100;
  int rounds = 2;
  std::string dir = (fs::temp_directory_path() / "meshrun_checkpoint_bench").string();
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--steps") == 0) steps = std::atoll(argv[i + 1]);
    else if (std::strcmp(argv[i], "--every") == 0) every = std::atoll(argv[i + 1]);
    else if (std::strcmp(argv[i], "--rounds") == 0) rounds = std::atoi(argv[i + 1]);
    else if (std::strcmp(argv[i], "--dir") == 0) dir = argv[i + 1];
  }
  if (steps < 1 || every < 1 || rounds < 1) {
    std::fprintf(stderr, "usage: %s [--steps N] [--every K] [--rounds R] [--dir PATH]\n", argv[0]);
    return 2;
  }
  auto rt = runtime::PjrtRuntime::Create(
      {.plugin_path = runtime::DefaultPjrtPluginPath(), .cpu_device_count = 8});
  if (!rt.ok()) return Fail("start runtime", rt.status());
  auto job = runtime::LoadExampleJob(std::string(MESHRUN_SOURCE_DIR) +
                                     "/examples/transformer_lm/dp8/job.json");
  if (!job.ok()) return Fail("load job", job.status());
  auto options = runtime::BuildCompileOptions(runtime::SpmdCompileOptions(job->device_ids));
  if (!options.ok()) return Fail("compile options", options.status());
  auto init = (*rt)->Compile({job->init.code, "mlir", *options, job->init.Signature()});
  if (!init.ok()) return Fail("compile init", init.status());
  auto step = (*rt)->Compile({job->step.code, "mlir", *options, job->step.Signature()});
  if (!step.ok()) return Fail("compile step", step.status());
  Bench bench{.runtime = rt->get(), .job = *job, .init = std::move(*init), .step = std::move(*step),
              .dir = dir};

  if (auto warm = bench.Run(2, 0); !warm.ok()) return Fail("warm-up", warm.status());
  std::map<std::string, std::vector<double>> seconds;
  for (int round = 0; round < rounds; ++round) {
    for (int k = 0; k < 2; ++k) {
      const bool with = (k + round) % 2 == 1;
      auto t = bench.Run(steps, with ? every : 0);
      if (!t.ok()) return Fail(with ? "every" : "none", t.status());
      seconds[with ? "every" : "none"].push_back(*t);
      std::printf("round %d %s: %.2f s (%.2f steps/s)\n", round + 1, with ? "every" : "none", *t,
                  steps / *t);
      std::fflush(stdout);
    }
  }
  const worker::MetricValue bytes = bench.saver_metrics.Get(worker::kCheckpointBytes);
  const worker::MetricValue write = bench.saver_metrics.Get(worker::kCheckpointWriteTime);
  double blocking_ms = 0;  // the step loop's wait per checkpoint, as the saver reported it
  {
    absl::MutexLock l(&bench.mu);
    for (const auto& r : bench.reports) blocking_ms += r.blocking_seconds() * 1e3;
    if (!bench.reports.empty()) blocking_ms /= static_cast<double>(bench.reports.size());
  }
  const double per_checkpoint = bytes.count > 0 ? bytes.total / bytes.count : 0;
  const double saver_rate = write.total > 0 ? bytes.total / write.total : 0;
  std::vector<double> plain;
  for (int i = 0; i < 3; ++i) plain.push_back(PlainWrite(dir, static_cast<int64_t>(per_checkpoint)));
  const double plain_rate = per_checkpoint / Median(plain);

  // Time to the first step: from the newest checkpoint vs init.
  auto committed = bench.CommitNewest();
  if (!committed.ok()) return Fail("commit", committed.status());
  const std::vector<v1::TensorSpec> state = StateSpecs(*job);
  double cold = 0, warm = 0;
  if (auto t = bench.Run(1, 0, nullptr, &cold); !t.ok()) return Fail("cold start", t.status());
  worker::Metrics restore_metrics;
  auto restore = [&](const std::vector<int>& devices, const std::vector<int64_t>& partitions) {
    return worker::RestoreState(**rt, *committed, state, job->mesh_axes, job->mesh_shape, devices,
                                partitions, &restore_metrics);
  };
  if (auto t = bench.Run(1, 0, restore, &warm); !t.ok()) return Fail("restore", t.status());

  const double none = Median(seconds["none"]), with = Median(seconds["every"]);
  std::printf("transformer_lm/dp8, %lld steps, checkpoint every %lld: none %.2f s (%.3f steps/s), "
              "every %.2f s (%.3f steps/s)\n", static_cast<long long>(steps),
              static_cast<long long>(every), none, steps / none, with, steps / with);
  std::printf("checkpoint: %.1f MB each, %lld written; loop blocked %.1f ms per checkpoint; "
              "writer %.1f MB/s; plain write+fsync of as many bytes %.1f MB/s (in %s)\n",
              per_checkpoint / 1e6, static_cast<long long>(bytes.count),
              blocking_ms,
              saver_rate / 1e6, plain_rate / 1e6, dir.c_str());
  std::printf("first step: cold start (init) %.3f s, restore from a checkpoint %.3f s\n", cold,
              warm);
  std::printf("ratio checkpoint_write_vs_disk %.4f\n", plain_rate > 0 ? saver_rate / plain_rate : 0);
  std::printf("ratio checkpoint_overhead %.4f\n", none / with);
  fs::remove_all(dir);
  return 0;
}
