// Time to first step of the transformer_lm/dp8 job on the CPU PJRT plugin (8 devices), cold vs
// warm, in the same run on the same runtime:
//   cold  build the compile options, compile init and step through the runtime, then run init
//         (seed uploaded), upload batch 1's shards and run step 1 (state donated) to completion.
//   warm  as a worker with a cache hit: read both serialized executables from a local
//         ExecutableStore (which re-verifies their sha256), DeserializeAndLoad them, then the same
//         init and step 1.
// The runtime (plugin loaded, devices up) and the job files (LoadExampleJob) are ready before
// either starts: both are the same for a worker whatever it finds in its cache. The serialized
// executables come from a compile done before the timed rounds (which also warms the plugin).
// Rounds alternate which goes first; figures are medians.
//
// Prints absolute seconds with their parts, then as its last line (higher is better):
//   ratio cold_over_warm_first_step <cold time / warm time>
//
// Usage: meshrun_warm_start_bench [--job transformer_lm/dp8] [--rounds R]
#include <stdlib.h>
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_support.h"
#include "common/mutex_checks.h"
#include "common/sha256.h"
#include "worker/executable_store.h"
#include "runtime/backends.h"
#include "runtime/pjrt/pjrt_runtime.h"
#include "runtime/compile_options.h"
#include "bundle/example_job.h"
#include "runtime/shard.h"

namespace {

using meshrun::bench::Fail;
using meshrun::bench::Median;
using meshrun::bench::Now;

using namespace meshrun;
using runtime::DeviceBuffer;
using runtime::Executable;
using runtime::ExampleJob;
using runtime::HostArray;
using runtime::Runtime;

// Runs init, uploads batch 1, runs step 1; returns step 1's loss (read after the timing).
absl::StatusOr<float> InitAndFirstStep(Runtime& rt, const ExampleJob& job, const Executable& init,
                                       const Executable& step, double* finished) {
  const std::vector<int>& devices = init.device_indices();
  std::vector<std::unique_ptr<DeviceBuffer>> seeds;
  std::vector<std::vector<DeviceBuffer*>> init_args;
  for (int device : devices) {
    absl::StatusOr<std::unique_ptr<DeviceBuffer>> seed =
        rt.ToDevice(HostArray::From<uint32_t>(runtime::DType::kU32, {}, {job.seed}), device);
    if (!seed.ok()) return seed.status();
    init_args.push_back({seed->get()});
    seeds.push_back(std::move(*seed));
  }
  auto state = rt.Execute(init, init_args, {});
  if (!state.ok()) return state.status();
  std::vector<std::vector<std::unique_ptr<DeviceBuffer>>> batch(devices.size());
  std::vector<std::vector<DeviceBuffer*>> args(devices.size());
  std::vector<int> donate;
  for (int i = 0; i < job.num_state; ++i) donate.push_back(i);
  for (size_t p = 0; p < devices.size(); ++p) {
    for (int i = 0; i < job.num_state; ++i) args[p].push_back((*state)[p][i].get());
    for (size_t a = 0; a < job.batches[0].size(); ++a) {
      absl::StatusOr<HostArray> shard = runtime::ShardOf(
          job.batches[0][a], job.data_arrays[a].sharding, job.mesh_axes, job.mesh_shape,
          static_cast<int>(p));
      if (!shard.ok()) return shard.status();
      absl::StatusOr<std::unique_ptr<DeviceBuffer>> buffer = rt.ToDevice(*shard, devices[p]);
      if (!buffer.ok()) return buffer.status();
      args[p].push_back(buffer->get());
      batch[p].push_back(std::move(*buffer));
    }
  }
  auto outputs = rt.Execute(step, args, {.donate_inputs = donate});  // returns when all are done
  if (!outputs.ok()) return outputs.status();
  *finished = Now();
  absl::StatusOr<HostArray> loss = rt.ToHost(*(*outputs)[0][job.loss_output]);
  if (!loss.ok()) return loss.status();
  float value;
  std::memcpy(&value, loss->bytes.data(), sizeof(value));
  return value;
}

absl::StatusOr<std::string> StoreBytes(worker::ExecutableStore& store, const std::string& bytes) {
  const std::string fingerprint = Sha256Hex(bytes);
  if (store.Has(fingerprint)) return fingerprint;
  auto upload = store.Begin(fingerprint, static_cast<int64_t>(bytes.size()));
  if (!upload.ok()) return upload.status();
  for (size_t off = 0; off < bytes.size(); off += worker::ExecutableStore::kMaxChunkBytes) {
    absl::Status s = (*upload)->Append(
        static_cast<int64_t>(off),
        absl::string_view(bytes).substr(off, worker::ExecutableStore::kMaxChunkBytes));
    if (!s.ok()) return s;
  }
  if (absl::Status s = (*upload)->Commit(fingerprint); !s.ok()) return s;
  return fingerprint;
}

struct Times {
  double prepare = 0;  // cold: options + compile both; warm: store reads + deserialize-and-load
  double run = 0;      // init + batch upload + step 1
  double total() const { return prepare + run; }
};

}  // namespace

int main(int argc, char** argv) {
  meshrun::ConfigureMutexDeadlockDetection();
  std::string job_name = "transformer_lm/dp8";
  int rounds = 5;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--job") == 0 && i + 1 < argc) {
      job_name = argv[++i];
    } else if (std::strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) {
      rounds = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--job transformer_lm/dp8] [--rounds R]\n", argv[0]);
      return 2;
    }
  }
  if (rounds < 1) return 2;
  auto rt = runtime::PjrtRuntime::Create(
      {.plugin_path = runtime::DefaultPjrtPluginPath(), .cpu_device_count = 8});
  if (!rt.ok()) return Fail("start runtime", rt.status());
  Runtime& runtime = **rt;
  auto job = runtime::LoadExampleJob(std::string(MESHRUN_SOURCE_DIR) + "/examples/" + job_name +
                                     "/job.json");
  if (!job.ok()) return Fail("load job", job.status());

  std::string templ = std::filesystem::temp_directory_path().string() + "/meshrun_warm_bench.XXXXXX";
  if (mkdtemp(templ.data()) == nullptr) return Fail("temp dir", absl::InternalError(templ));
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } cleanup{templ};
  auto store = worker::ExecutableStore::Create(templ + "/executables");
  if (!store.ok()) return Fail("store", store.status());

  auto cold = [&](std::unique_ptr<Executable>* init_out,
                  std::unique_ptr<Executable>* step_out) -> absl::StatusOr<Times> {
    Times t;
    const double start = Now();
    auto options = runtime::BuildCompileOptions(runtime::SpmdCompileOptions(job->device_ids));
    if (!options.ok()) return options.status();
    auto init = runtime.Compile({job->init.code, "mlir", *options, job->init.Signature()});
    if (!init.ok()) return init.status();
    auto step = runtime.Compile({job->step.code, "mlir", *options, job->step.Signature()});
    if (!step.ok()) return step.status();
    const double compiled = Now();
    double finished = 0;
    auto loss = InitAndFirstStep(runtime, *job, **init, **step, &finished);
    if (!loss.ok()) return loss.status();
    if (!job->reference_loss.empty() &&
        std::abs(*loss - job->reference_loss[0]) > 1e-3f * std::abs(job->reference_loss[0])) {
      return absl::InternalError("cold step 1 loss differs from the reference");
    }
    t.prepare = compiled - start;
    t.run = finished - compiled;
    if (init_out != nullptr) *init_out = std::move(*init);
    if (step_out != nullptr) *step_out = std::move(*step);
    return t;
  };

  // The executables a coordinator would have sent: compiled once, serialized, stored locally.
  std::unique_ptr<Executable> init0, step0;
  auto first = cold(&init0, &step0);
  if (!first.ok()) return Fail("first compile", first.status());
  auto init_bytes = runtime.Serialize(*init0);
  if (!init_bytes.ok()) return Fail("serialize init", init_bytes.status());
  auto step_bytes = runtime.Serialize(*step0);
  if (!step_bytes.ok()) return Fail("serialize step", step_bytes.status());
  init0.reset();
  step0.reset();
  auto init_fp = StoreBytes(**store, *init_bytes);
  if (!init_fp.ok()) return Fail("store init", init_fp.status());
  auto step_fp = StoreBytes(**store, *step_bytes);
  if (!step_fp.ok()) return Fail("store step", step_fp.status());

  auto warm = [&]() -> absl::StatusOr<Times> {
    Times t;
    const double start = Now();
    auto ib = (*store)->Read(*init_fp);
    if (!ib.ok()) return ib.status();
    auto sb = (*store)->Read(*step_fp);
    if (!sb.ok()) return sb.status();
    auto init = runtime.DeserializeAndLoad(*ib, job->init.Signature());
    if (!init.ok()) return init.status();
    auto step = runtime.DeserializeAndLoad(*sb, job->step.Signature());
    if (!step.ok()) return step.status();
    const double loaded = Now();
    double finished = 0;
    auto loss = InitAndFirstStep(runtime, *job, **init, **step, &finished);
    if (!loss.ok()) return loss.status();
    if (!job->reference_loss.empty() &&
        std::abs(*loss - job->reference_loss[0]) > 1e-3f * std::abs(job->reference_loss[0])) {
      return absl::InternalError("warm step 1 loss differs from the reference");
    }
    t.prepare = loaded - start;
    t.run = finished - loaded;
    return t;
  };
  if (auto w = warm(); !w.ok()) return Fail("warm-up load", w.status());

  std::printf("job %s on %zu CPU devices; serialized init %zu bytes, step %zu bytes; %d rounds "
              "(first compile, untimed: %.2f s + %.3f s)\n",
              job->name.c_str(), runtime.addressable_devices().size(), init_bytes->size(),
              step_bytes->size(), rounds, first->prepare, first->run);
  std::vector<double> cold_total, cold_prep, cold_run, warm_total, warm_prep, warm_run, paired;
  for (int round = 0; round < rounds; ++round) {
    Times c, w;
    for (int k = 0; k < 2; ++k) {
      const bool cold_now = (k + round) % 2 == 0;
      absl::StatusOr<Times> t = cold_now ? cold(nullptr, nullptr) : warm();
      if (!t.ok()) return Fail(cold_now ? "cold" : "warm", t.status());
      (cold_now ? c : w) = *t;
    }
    cold_total.push_back(c.total());
    cold_prep.push_back(c.prepare);
    cold_run.push_back(c.run);
    warm_total.push_back(w.total());
    warm_prep.push_back(w.prepare);
    warm_run.push_back(w.run);
    paired.push_back(c.total() / w.total());
    std::printf("round %d: cold %.3f s (compile %.3f + init/step 1 %.3f); warm %.3f s (read+load "
                "%.3f + init/step 1 %.3f)\n",
                round + 1, c.total(), c.prepare, c.run, w.total(), w.prepare, w.run);
    std::fflush(stdout);
  }
  std::printf("cold: median %.3f s to first step (compile init+step %.3f s, init + step 1 %.3f s)\n",
              Median(cold_total), Median(cold_prep), Median(cold_run));
  std::printf("warm: median %.3f s to first step (store read + deserialize-and-load %.3f s, "
              "init + step 1 %.3f s)\n",
              Median(warm_total), Median(warm_prep), Median(warm_run));
  std::printf("ratio of medians %.2f; median of per-round ratios %.2f\n",
              Median(cold_total) / Median(warm_total), Median(paired));
  std::printf("ratio cold_over_warm_first_step %.4f\n", Median(paired));
  return 0;
}
