// Checkpoint cost on the transformer LM (examples/transformer_lm/dp8, 8 CPU devices), in one
// process: the worker's StepLoop with and without a CheckpointSaver, the checkpoint writer's
// throughput (alone) beside a plain write + fsync of the same bytes to the same directory, and
// the time to the first step from a checkpoint (RestoreState) beside a cold start (init).
//
// Two comparisons, each alternating its sides round by round (the order alternating too) and
// reporting the median of the per-round ratios with its spread (bench/README.md):
//
//   checkpoint_overhead       StepLoop for N steps without a checkpoint (`none`) against the
//                             same with a checkpoint every --every steps and after the last, as a
//                             job does (`every`), written by the worker's CheckpointSaver; the
//                             `every` run ends when its last checkpoint was written (Flush).
//                             Timed: Start() until on_done (+ the Flush). Ratio none / every.
//   checkpoint_write_vs_disk  the checkpoint writer (checkpoint::WriteChunks: the state's chunks,
//                             .zarray files and sha256s into a new step directory, fsynced with
//                             their directories) against one plain write + fsync of the same
//                             bytes into a new file, in the same directory, with no step loop
//                             running on either side. Nothing written is deleted before the end
//                             of the run: on ext4 without a journal (this machine's root) a new
//                             inode costs more CPU the more inodes of its block group were
//                             deleted in the last 30 s, so deleting between rounds would tax the
//                             side that makes 112 inodes (the plain side makes one).
//                             Ratio writer bytes/s / plain bytes/s.
// With --memory_every K, one comparison instead (docs/checkpoints.md, "Memory tier"):
//   memory_checkpoint_overhead  StepLoop for N steps without checkpoints against the same with
//                             an in-memory checkpoint every K steps (worker/memory_checkpoints.h:
//                             the state's distinct blocks copied to host and kept, as a worker
//                             does). Ratio none / memory.
// Also printed: the saver's throughput while training (its writes then compete with the step
// loop for the cores), and restore-to-first-step beside cold-start-to-first-step seconds.
//
// Usage: meshrun_checkpoint_bench [--steps N] [--every K] [--rounds R] [--write_rounds W]
//                                 [--dir PATH] [--memory_every K]
//
// Figures and what limits them: docs/checkpoints.md ("Figures") and bench/README.md.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "bench/bench_support.h"
#include "common/mutex_checks.h"
#include "checkpoint/layout.h"
#include "checkpoint/store.h"
#include "common/file_sync.h"
#include "worker/checkpointing.h"
#include "worker/memory_checkpoints.h"
#include "runtime/backends.h"
#include "runtime/compile_options.h"
#include "bundle/example_job.h"
#include "runtime/pjrt/pjrt_runtime.h"
#include "worker/step_loop.h"

namespace {

namespace fs = std::filesystem;
using meshrun::bench::Fail;
using meshrun::bench::Median;
using meshrun::bench::Now;
using meshrun::bench::ProcessCpuSeconds;
using meshrun::bench::Spread;
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
  worker::MemoryCheckpointStore memory;

  worker::RunSpec Spec(int64_t steps) {
    worker::RunSpec spec{.job_id = "bench", .host = "host-0", .num_state = job.num_state,
                         .seed = job.seed, .mesh_axes = job.mesh_axes,
                         .mesh_shape = job.mesh_shape, .device_ids = job.device_ids,
                         .telemetry_cadence = steps + 1, .steps = steps,
                         .replica_count = static_cast<int>(job.mesh_shape[0])};
    for (const auto& a : job.data_arrays) spec.batch_sharding.push_back(a.sharding);
    return spec;
  }

  // Seconds for `steps` steps; every > 0 adds a saver writing into `dir`, memory_every > 0
  // in-memory checkpoints into `memory`.
  absl::StatusOr<double> Run(int64_t steps, int64_t every,
                             worker::StepLoop::RestoreState restore = nullptr,
                             double* first_step_seconds = nullptr, int64_t memory_every = 0) {
    std::unique_ptr<worker::CheckpointSaver> saver;
    worker::StepLoop::Config config{.runtime = runtime, .init = init, .step = step,
                                    .spec = Spec(steps),
                                    .batches = std::make_unique<CyclingBatches>(job)};
    if (memory_every > 0) {
      config.memory_checkpoint_every = memory_every;
      config.memory_checkpoint = [this, layout = worker::StateLayout{
                                            .state = StateSpecs(job), .mesh_axes = job.mesh_axes,
                                            .mesh_shape = job.mesh_shape}](
                                     int64_t s, const worker::StepLoop::DeviceBuffers& state,
                                     const std::vector<int64_t>& partitions, int64_t position) {
        auto snapshot = worker::TakeSnapshot(*runtime, layout, "bench", s, position, state,
                                             partitions, nullptr);
        if (snapshot.ok()) memory.Put(*std::move(snapshot));
      };
    }
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

// Seconds to write `bytes` into the new file `path` and fsync it as the writer fsyncs a large
// chunk (FsyncInPieces). -1 on an error.
double PlainWrite(const std::string& path, const std::string& bytes) {
  const double start = Now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  for (size_t done = 0; done < bytes.size();) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n <= 0) {
      ::close(fd);
      return -1;
    }
    done += static_cast<size_t>(n);
  }
  const int error = FsyncInPieces(fd);
  ::close(fd);
  return error == 0 ? Now() - start : -1;
}

// The chunks the saver wrote for `manifest`'s arrays, cut again from the committed checkpoint:
// the writer's input for the write comparison.
absl::StatusOr<std::vector<checkpoint::ArrayChunks>> ChunksOf(const std::string& step_dir) {
  auto manifest = checkpoint::ReadManifest(step_dir);
  if (!manifest.ok()) return manifest.status();
  std::vector<checkpoint::ArrayChunks> out;
  for (const v1::CheckpointArray& array : manifest->arrays()) {
    auto global = checkpoint::ReadArray(step_dir, array);
    if (!global.ok()) return global.status();
    const std::vector<int64_t> chunk(array.chunk_shape().begin(), array.chunk_shape().end());
    const int64_t element = runtime::DTypeByteSize(global->shape.dtype);
    checkpoint::ArrayChunks entry{array, {}};
    entry.array.clear_chunks();
    for (const v1::CheckpointChunk& c : array.chunks()) {
      std::vector<int64_t> start;  // a scalar's key is "0" and its start empty
      for (absl::string_view part : absl::StrSplit(c.key(), '.')) {
        int64_t g = 0;
        if (chunk.empty()) break;
        if (!absl::SimpleAtoi(part, &g) || start.size() == chunk.size()) {
          return absl::DataLossError("bad chunk key " + c.key());
        }
        start.push_back(g * chunk[start.size()]);
      }
      HostArray block{{global->shape.dtype, chunk}, {}};
      block.bytes.assign(static_cast<size_t>(block.shape.ByteSize()), '\0');
      checkpoint::CopyBlock(global->bytes.data(), global->shape.dims, start, block.bytes.data(),
                            chunk, std::vector<int64_t>(chunk.size(), 0), chunk, element);
      entry.chunks.push_back({c.key(), std::move(block)});
    }
    out.push_back(std::move(entry));
  }
  return out;
}

// The memory_checkpoint_overhead comparison (see the file comment); returns main's status.
int MemoryOverhead(Bench& bench, int64_t steps, int64_t memory_every, int rounds) {
  std::vector<double> overhead;  // none / memory, per round
  for (int round = 0; round < rounds; ++round) {
    double t[2] = {0, 0};
    for (int k = 0; k < 2; ++k) {
      const bool with = (k + round) % 2 == 1;
      auto run = bench.Run(steps, 0, nullptr, nullptr, with ? memory_every : 0);
      if (!run.ok()) return Fail(with ? "memory" : "none", run.status());
      t[with] = *run;
      std::printf("round %d %s: %.2f s (%.2f steps/s)\n", round + 1, with ? "memory" : "none",
                  *run, steps / *run);
      std::fflush(stdout);
    }
    overhead.push_back(t[0] / t[1]);
  }
  std::printf("in-memory checkpoint every %lld steps: %lld bytes held per step kept\n",
              static_cast<long long>(memory_every),
              static_cast<long long>(bench.memory.Held().empty()
                                         ? 0 : bench.memory.Held().front()->Bytes()));
  std::printf("memory_checkpoint_overhead per round: %s\n", Spread(overhead).c_str());
  std::printf("ratio memory_checkpoint_overhead %.4f\n", Median(overhead));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  meshrun::ConfigureMutexDeadlockDetection();
  int64_t steps = 200, every = 100, memory_every = 0;
  int rounds = 2, write_rounds = 15;
  std::string dir = (fs::temp_directory_path() / "meshrun_checkpoint_bench").string();
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--steps") == 0) steps = std::atoll(argv[i + 1]);
    else if (std::strcmp(argv[i], "--every") == 0) every = std::atoll(argv[i + 1]);
    else if (std::strcmp(argv[i], "--rounds") == 0) rounds = std::atoi(argv[i + 1]);
    else if (std::strcmp(argv[i], "--write_rounds") == 0) write_rounds = std::atoi(argv[i + 1]);
    else if (std::strcmp(argv[i], "--dir") == 0) dir = argv[i + 1];
    else if (std::strcmp(argv[i], "--memory_every") == 0) memory_every = std::atoll(argv[i + 1]);
  }
  if (steps < 1 || every < 1 || rounds < 1 || write_rounds < 1 || memory_every < 0) {
    std::fprintf(stderr,
                 "usage: %s [--steps N] [--every K] [--rounds R] [--write_rounds W] [--dir PATH] "
                 "[--memory_every K]\n",
                 argv[0]);
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
  if (memory_every > 0) return MemoryOverhead(bench, steps, memory_every, rounds);
  std::map<std::string, std::vector<double>> seconds, cpu;
  std::vector<double> overhead;  // none / every, per round
  for (int round = 0; round < rounds; ++round) {
    double t[2] = {0, 0};
    for (int k = 0; k < 2; ++k) {
      const bool with = (k + round) % 2 == 1;
      const double cpu_start = ProcessCpuSeconds();
      auto run = bench.Run(steps, with ? every : 0);
      if (!run.ok()) return Fail(with ? "every" : "none", run.status());
      t[with] = *run;
      seconds[with ? "every" : "none"].push_back(*run);
      cpu[with ? "every" : "none"].push_back(ProcessCpuSeconds() - cpu_start);
      std::printf("round %d %s: %.2f s (%.2f steps/s)\n", round + 1, with ? "every" : "none", *run,
                  steps / *run);
      std::fflush(stdout);
    }
    overhead.push_back(t[0] / t[1]);
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
  const double training_rate = write.total > 0 ? bytes.total / write.total : 0;

  auto committed = bench.CommitNewest();
  if (!committed.ok()) return Fail("commit", committed.status());
  auto chunks = ChunksOf(*committed);
  if (!chunks.ok()) return Fail("read the checkpoint back", chunks.status());
  std::string flat;  // the same bytes, for the plain write
  size_t files = 0;
  for (const checkpoint::ArrayChunks& a : *chunks) {
    files += 1 + a.chunks.size();
    for (const checkpoint::Chunk& c : a.chunks) flat += c.data.bytes;
  }
  const std::string writes = dir + "/writes";
  fs::create_directories(writes);
  std::vector<double> writer_s, plain_s, write_ratio;
  for (int round = 0; round < write_rounds; ++round) {
    double tw = 0, tp = 0;
    for (int k = 0; k < 2; ++k) {
      if ((k + round) % 2 == 0) {
        const double start = Now();
        auto written = checkpoint::WriteChunks(checkpoint::TempStepDir(writes, round), *chunks);
        if (!written.ok()) return Fail("checkpoint write", written.status());
        tw = Now() - start;
      } else {
        tp = PlainWrite(absl::StrCat(writes, "/plain-", round, ".bin"), flat);
        if (tp < 0) return Fail("plain write", absl::UnavailableError(std::strerror(errno)));
      }
    }
    writer_s.push_back(tw);
    plain_s.push_back(tp);
    write_ratio.push_back(tp / tw);
  }
  fs::remove_all(writes);

  // Time to the first step: from the newest checkpoint vs init.
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
  const double mb = static_cast<double>(flat.size()) / 1e6;
  std::printf("transformer_lm/dp8, %lld steps, checkpoint every %lld: none %.2f s (%.3f steps/s), "
              "every %.2f s (%.3f steps/s); process CPU none %.2f s, every %.2f s (medians)\n",
              static_cast<long long>(steps), static_cast<long long>(every), none, steps / none,
              with, steps / with, Median(cpu["none"]), Median(cpu["every"]));
  std::printf("checkpoint: %.1f MB in %zu files, %lld written while training; loop blocked %.1f ms "
              "per checkpoint; writer while training %.1f MB/s\n",
              per_checkpoint / 1e6, files, static_cast<long long>(bytes.count), blocking_ms,
              training_rate / 1e6);
  std::printf("write alone (in %s): writer %.1f MB/s (%.1f ms), plain write+fsync %.1f MB/s "
              "(%.1f ms) (medians of %d rounds)\n",
              writes.c_str(), mb / Median(writer_s), Median(writer_s) * 1e3, mb / Median(plain_s),
              Median(plain_s) * 1e3, write_rounds);
  std::printf("first step: cold start (init) %.3f s, restore from a checkpoint %.3f s\n", cold,
              warm);
  std::printf("checkpoint_write_vs_disk per round: %s\n", Spread(write_ratio).c_str());
  std::printf("ratio checkpoint_write_vs_disk %.4f\n", Median(write_ratio));
  std::printf("checkpoint_overhead per round: %s\n", Spread(overhead).c_str());
  std::printf("ratio checkpoint_overhead %.4f\n", Median(overhead));
  fs::remove_all(dir);
  return 0;
}
