// Transformer train steps through meshrun's runtime (PJRT C API, CPU plugin, 8 devices) vs the
// same jitted function driven from JAX in Python on the same devices, measured in the same run
// (the Python side runs after meshrun's, so the two never share the cores). Also compares the
// time to compile the step with the time to deserialize-and-load the same executable.
//
// Prints absolute figures, then as its last two lines:
//   ratio steps_vs_jax <meshrun steps/s / JAX steps/s>        (higher is better)
//   ratio compile_over_load <compile time / load time>
//
// Usage: meshrun_runtime_step_bench [--quick] [--mesh dp8|dp4_tp2|dp1] [--steps N]
// Needs the CPU plugin (scripts/setup.sh); without the JAX venv the JAX ratio is not printed.
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/bench_support.h"
#include "worker/runtime/backends.h"
#include "worker/runtime/example_job.h"
#include "worker/runtime/pjrt/pjrt_runtime.h"

namespace {

using namespace meshrun::runtime;
using meshrun::bench::Fail;

// Runs the JAX baseline and returns its "<key> <value>" lines' values; empty when it could not run.
std::vector<std::pair<std::string, double>> RunJax(const std::string& mesh, int steps) {
  const std::string python = MESHRUN_PYTHON;
  struct stat st;
  if (stat(python.c_str(), &st) != 0) {
    std::printf("jax baseline: skipped, no Python with JAX at %s (scripts/fetch_pjrt.sh)\n",
                python.c_str());
    return {};
  }
  const std::string command = python + " " + MESHRUN_SOURCE_DIR +
                              "/bench/runtime_jax_baseline.py --mesh " + mesh + " --steps " +
                              std::to_string(steps) + " 2>/dev/null";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return {};
  std::vector<std::pair<std::string, double>> out;
  std::array<char, 256> line;
  while (std::fgets(line.data(), line.size(), pipe) != nullptr) {
    char key[64];
    double value;
    if (std::sscanf(line.data(), "%63s %lf", key, &value) == 2) out.emplace_back(key, value);
  }
  const int rc = pclose(pipe);
  if (rc != 0) {
    std::printf("jax baseline: exited with status %d\n", rc);
    return {};
  }
  return out;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::string mesh = "dp8";
  int steps = 30;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
      steps = 10;
    } else if (std::strcmp(argv[i], "--mesh") == 0 && i + 1 < argc) {
      mesh = argv[++i];
    } else if (std::strcmp(argv[i], "--steps") == 0 && i + 1 < argc) {
      steps = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--quick] [--mesh dp8|dp4_tp2|dp1] [--steps N]\n", argv[0]);
      return 2;
    }
  }
  const int warmup = 3;
  const int loads = quick ? 3 : 5;

  absl::StatusOr<ExampleJob> job = LoadExampleJob(std::string(MESHRUN_SOURCE_DIR) +
                                                  "/examples/transformer_lm/" + mesh + "/job.json");
  if (!job.ok()) return Fail("load job", job.status());
  RuntimeConfig config{.plugin_path = DefaultPjrtPluginPath(), .cpu_device_count = 8};
  absl::StatusOr<std::unique_ptr<PjrtRuntime>> runtime = PjrtRuntime::Create(config);
  if (!runtime.ok()) return Fail("start runtime", runtime.status());
  std::printf("runtime: %s, %zu devices; job %s, %d steps after %d warm-up\n",
              ToString((*runtime)->identity()).c_str(),
              (*runtime)->addressable_devices().size(), job->name.c_str(), steps, warmup);

  // Compile, then load the same executable from its serialized bytes.
  absl::StatusOr<std::unique_ptr<ExampleRunner>> runner = ExampleRunner::Create(runtime->get(), *job);
  if (!runner.ok()) return Fail("compile", runner.status());
  const double compile_s = absl::ToDoubleSeconds((*runner)->step_compile_time());
  absl::StatusOr<std::string> bytes = (*runtime)->Serialize((*runner)->step_executable());
  if (!bytes.ok()) return Fail("serialize", bytes.status());
  std::vector<double> load_times;
  for (int i = 0; i < loads; ++i) {
    const absl::Time start = absl::Now();
    absl::StatusOr<std::unique_ptr<Executable>> loaded =
        (*runtime)->DeserializeAndLoad(*bytes, job->step.Signature());
    if (!loaded.ok()) return Fail("deserialize-and-load", loaded.status());
    load_times.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  }
  const double load_s = Median(load_times);
  std::printf("step compile: %.3f s; serialized executable %zu bytes; deserialize-and-load "
              "(median of %d): %.4f s\n",
              compile_s, bytes->size(), loads, load_s);

  if (absl::Status s = (*runner)->Initialize(); !s.ok()) return Fail("init", s);
  for (int i = 0; i < warmup; ++i) {
    if (auto s = (*runner)->Step(i); !s.ok()) return Fail("step", s.status());
  }
  const RuntimeCounters before = (*runtime)->counters();
  const absl::Time start = absl::Now();
  for (int i = 0; i < steps; ++i) {
    if (auto s = (*runner)->Step(warmup + i); !s.ok()) return Fail("step", s.status());
  }
  const double meshrun_steps_per_s = steps / absl::ToDoubleSeconds(absl::Now() - start);
  const RuntimeCounters counters = (*runtime)->counters();
  // Batches were uploaded by Initialize: the timed steps move nothing between host and device.
  std::printf("meshrun: %.3f steps/s (%.1f ms/step); during the timed steps h2d %lld, d2h %lld "
              "transfers (before them: h2d %lld, %lld bytes)\n",
              meshrun_steps_per_s, 1000.0 / meshrun_steps_per_s,
              static_cast<long long>(counters.host_to_device.count - before.host_to_device.count),
              static_cast<long long>(counters.device_to_host.count - before.device_to_host.count),
              static_cast<long long>(before.host_to_device.count),
              static_cast<long long>(before.host_to_device.bytes));
  runner->reset();  // free the devices' memory before JAX starts
  runtime->reset();

  double jax_steps_per_s = 0, jax_compile_s = 0;
  for (const auto& [key, value] : RunJax(mesh, steps)) {
    if (key == "steps_per_s") jax_steps_per_s = value;
    if (key == "compile_s") jax_compile_s = value;
  }
  if (jax_steps_per_s > 0) {
    std::printf("jax: %.3f steps/s (%.1f ms/step); its step compile %.3f s\n",
                jax_steps_per_s, 1000.0 / jax_steps_per_s, jax_compile_s);
    std::printf("ratio steps_vs_jax %.4f\n", meshrun_steps_per_s / jax_steps_per_s);
  }
  std::printf("ratio compile_over_load %.4f\n", compile_s / load_s);
  return 0;
}
