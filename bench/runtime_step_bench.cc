// Train steps through meshrun's runtime (PJRT C API, CPU plugin, 8 devices) vs the same jitted
// functions driven from JAX in Python on the same devices, for two models in one run:
//   small  the MLP classifier: a step of microseconds, so the per-step dispatch dominates;
//   lm     the transformer LM: compute-bound.
// JAX runs in a child process (bench/runtime_jax_baseline.py) that compiles both models once and
// then runs steps on command, so the two sides alternate round by round: in each round, each
// model runs `steps` steps on one side, then on the other (which side goes first alternates),
// and the round's ratio is meshrun steps/s over JAX steps/s. A neighbour's load that comes and
// goes then hits both sides of a round alike; the median over rounds and its spread are printed.
// Both sides dispatch asynchronously: meshrun's ExampleRunner launches step k+1 before waiting for
// step k (two in flight, as the worker's StepLoop), JAX returns before its step ran; each side's
// time ends when its last step is done.
// Also compares the time to compile the LM step with the time to deserialize-and-load it.
//
// Prints absolute figures and per-round ratios, then (higher is better):
//   ratio compile_over_load <compile time / load time>
//   ratio steps_vs_jax_small <median over rounds of the MLP's meshrun/JAX steps/s>
//   ratio steps_vs_jax <median over rounds of the transformer's meshrun/JAX steps/s>
//
// Usage: meshrun_runtime_step_bench [--quick] [--mesh dp8|dp4_tp2|dp1] [--rounds R]
//                                   [--steps N] [--small_steps N] [--model small|lm]
// --model runs one model only (for profiling, e.g. under valgrind --tool=callgrind).
// Needs the CPU plugin (scripts/setup.sh); without the JAX venv no steps_vs_jax ratio is printed.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/bench_support.h"
#include "common/mutex_checks.h"
#include "runtime/backends.h"
#include "bundle/example_job.h"
#include "testing/example_runner.h"
#include "runtime/pjrt/pjrt_runtime.h"

namespace {

using namespace meshrun::runtime;
using meshrun::bench::Fail;
using meshrun::bench::Median;
using meshrun::bench::Now;
using meshrun::bench::ProcessCpuSeconds;
using meshrun::bench::Spread;
using meshrun::bench::ThreadCpuSeconds;

// The JAX baseline as a child process speaking bench/runtime_jax_baseline.py's protocol.
class JaxProcess {
 public:
  ~JaxProcess() {
    if (to_ != nullptr) {
      std::fputs("quit\n", to_);
      std::fclose(to_);
    }
    if (from_ != nullptr) std::fclose(from_);
    if (pid_ > 0) waitpid(pid_, nullptr, 0);
  }
  // Starts it and waits for "ready"; false (with a line saying why) when it cannot run.
  bool Start(const std::string& mesh) {
    const std::string python = MESHRUN_PYTHON;
    struct stat st;
    if (stat(python.c_str(), &st) != 0) {
      std::printf("jax baseline: skipped, no Python with JAX at %s (scripts/fetch_pjrt.sh)\n",
                  python.c_str());
      return false;
    }
    const std::string script = std::string(MESHRUN_SOURCE_DIR) + "/bench/runtime_jax_baseline.py";
    int in[2], out[2];
    if (pipe(in) != 0 || pipe(out) != 0) return false;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(in[0], 0);
      dup2(out[1], 1);
      close(in[1]);
      close(out[0]);
      if (std::freopen("/dev/null", "w", stderr) == nullptr) _exit(127);
      execl(python.c_str(), python.c_str(), script.c_str(), "--mesh", mesh.c_str(), nullptr);
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    to_ = fdopen(in[1], "w");
    from_ = fdopen(out[0], "r");
    char line[256];
    while (std::fgets(line, sizeof(line), from_) != nullptr) {
      char key[64];
      double value;
      if (std::strncmp(line, "ready", 5) == 0) return true;
      if (std::sscanf(line, "compile_s_%63s %lf", key, &value) == 2) {
        std::printf("jax: %s step compile %.3f s\n", key, value);
      }
    }
    std::printf("jax baseline: did not start (exit status of %s)\n", script.c_str());
    return false;
  }
  struct Timing {
    double seconds = -1;  // negative on failure
    double thread_cpu = 0, process_cpu = 0;  // the dispatching Python thread; the whole process
  };
  // What JAX took for `steps` steps of `model`.
  Timing Run(const char* model, int steps) {
    std::fprintf(to_, "run %s %d\n", model, steps);
    std::fflush(to_);
    char line[256];
    Timing t;
    if (std::fgets(line, sizeof(line), from_) == nullptr ||
        std::sscanf(line, "elapsed %lf thread_cpu %lf process_cpu %lf", &t.seconds, &t.thread_cpu,
                    &t.process_cpu) != 3) {
      t.seconds = -1;
    }
    return t;
  }

 private:
  pid_t pid_ = -1;
  FILE* to_ = nullptr;
  FILE* from_ = nullptr;
};

struct Model {
  const char* jax_name;   // in runtime_jax_baseline.py
  const char* directory;  // under examples/
  int steps;              // per round and side
  std::unique_ptr<ExampleRunner> runner;
  int next_index = 0;
  std::vector<double> meshrun, jax, ratios;  // steps/s per round, and their ratio
  std::vector<double> host_us;  // CPU of the loop's thread per step, µs, per round
  std::vector<double> process_us;  // CPU of the whole process per step, µs, per round
  std::vector<double> jax_host_us, jax_process_us;  // the same for JAX's dispatching thread
};

}  // namespace

int main(int argc, char** argv) {
  meshrun::ConfigureMutexDeadlockDetection();
  bool quick = false;
  std::string mesh = "dp8";
  int rounds = 7, steps = 10, small_steps = 300;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--mesh") == 0 && i + 1 < argc) {
      mesh = argv[++i];
    } else if (std::strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) {
      rounds = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--steps") == 0 && i + 1 < argc) {
      steps = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--small_steps") == 0 && i + 1 < argc) {
      small_steps = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--model") == 0 && i + 1 < argc &&
               (std::strcmp(argv[i + 1], "small") == 0 || std::strcmp(argv[i + 1], "lm") == 0)) {
      only = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: %s [--quick] [--mesh dp8|dp4_tp2|dp1] [--rounds R] [--steps N] "
                   "[--small_steps N] [--model small|lm]\n", argv[0]);
      return 2;
    }
  }
  if (quick) rounds = 3;
  if (rounds < 1 || steps < 1 || small_steps < 1) {
    std::fprintf(stderr, "runtime_step_bench: --rounds, --steps, --small_steps must be >= 1\n");
    return 2;
  }
  const int warmup = 3;
  const int loads = quick ? 3 : 5;

  RuntimeConfig config{.plugin_path = DefaultPjrtPluginPath(), .cpu_device_count = 8};
  absl::StatusOr<std::unique_ptr<PjrtRuntime>> runtime = PjrtRuntime::Create(config);
  if (!runtime.ok()) return Fail("start runtime", runtime.status());
  std::printf("runtime: %s, %zu devices; mesh %s, %d rounds of %d LM steps and %d MLP steps "
              "per side, after %d warm-up steps\n",
              ToString((*runtime)->identity()).c_str(), (*runtime)->addressable_devices().size(),
              mesh.c_str(), rounds, steps, small_steps, warmup);

  std::vector<Model> models;
  if (only != "lm") models.push_back({"small", "mlp_classifier", small_steps, nullptr});
  if (only != "small") models.push_back({"lm", "transformer_lm", steps, nullptr});
  for (Model& model : models) {
    absl::StatusOr<ExampleJob> job = LoadExampleJob(std::string(MESHRUN_SOURCE_DIR) +
                                                    "/examples/" + model.directory + "/" + mesh +
                                                    "/job.json");
    if (!job.ok()) return Fail("load job", job.status());
    absl::StatusOr<std::unique_ptr<ExampleRunner>> runner =
        ExampleRunner::Create(runtime->get(), *job);
    if (!runner.ok()) return Fail("compile", runner.status());
    model.runner = std::move(*runner);
  }

  // Compile, then load the same LM executable from its serialized bytes.
  double compile_s = 0, load_s = 0;
  if (only != "small") {
    ExampleRunner& lm = *models.back().runner;
    compile_s = absl::ToDoubleSeconds(lm.step_compile_time());
    absl::StatusOr<std::string> bytes = (*runtime)->Serialize(lm.step_executable());
    if (!bytes.ok()) return Fail("serialize", bytes.status());
    std::vector<double> load_times;
    for (int i = 0; i < loads; ++i) {
      const absl::Time start = absl::Now();
      absl::StatusOr<std::unique_ptr<Executable>> loaded =
          (*runtime)->DeserializeAndLoad(*bytes, lm.job().step.Signature());
      if (!loaded.ok()) return Fail("deserialize-and-load", loaded.status());
      load_times.push_back(absl::ToDoubleSeconds(absl::Now() - start));
    }
    load_s = Median(load_times);
    std::printf("LM step compile: %.3f s; serialized executable %zu bytes; deserialize-and-load "
                "(median of %d): %.4f s\n",
                compile_s, bytes->size(), loads, load_s);
  }

  for (Model& model : models) {
    if (absl::Status s = model.runner->Initialize(); !s.ok()) return Fail("init", s);
    for (int i = 0; i < warmup; ++i) {
      if (auto s = model.runner->Step(model.next_index++); !s.ok()) return Fail("step", s.status());
    }
    if (absl::Status s = model.runner->Finish(); !s.ok()) return Fail("step", s);
  }
  JaxProcess jax;
  const bool have_jax = jax.Start(mesh);

  // meshrun's side of a round: `model.steps` steps; returns steps/s (0 on error, reported).
  auto run_meshrun = [&](Model& model) -> double {
    const RuntimeCounters before = (*runtime)->counters();
    const double start = Now();
    const double cpu_start = ThreadCpuSeconds();
    const double process_start = ProcessCpuSeconds();
    for (int i = 0; i < model.steps; ++i) {
      if (auto s = model.runner->Step(model.next_index++); !s.ok()) {
        Fail("step", s.status());
        return 0;
      }
    }
    if (absl::Status s = model.runner->Finish(); !s.ok()) {  // as JAX's block_until_ready
      Fail("step", s);
      return 0;
    }
    const double rate = model.steps / (Now() - start);
    model.host_us.push_back((ThreadCpuSeconds() - cpu_start) / model.steps * 1e6);
    model.process_us.push_back((ProcessCpuSeconds() - process_start) / model.steps * 1e6);
    const RuntimeCounters after = (*runtime)->counters();
    if (after.host_to_device.count != before.host_to_device.count ||
        after.device_to_host.count != before.device_to_host.count) {
      std::printf("warning: %s steps moved data between host and device\n", model.jax_name);
    }
    return rate;
  };
  for (int round = 0; round < rounds; ++round) {
    for (Model& model : models) {
      double m = 0, j = 0;
      for (int k = 0; k < 2; ++k) {
        if ((round + k) % 2 == 0) {
          m = run_meshrun(model);
          if (m == 0) return 1;
        } else if (have_jax) {
          const JaxProcess::Timing t = jax.Run(model.jax_name, model.steps);
          if (t.seconds <= 0) {
            std::fprintf(stderr, "runtime_step_bench: the JAX baseline failed\n");
            return 1;
          }
          j = model.steps / t.seconds;
          model.jax_host_us.push_back(t.thread_cpu / model.steps * 1e6);
          model.jax_process_us.push_back(t.process_cpu / model.steps * 1e6);
        }
      }
      model.meshrun.push_back(m);
      if (have_jax) {
        model.jax.push_back(j);
        model.ratios.push_back(m / j);
      }
    }
    std::printf("round %d:", round + 1);
    for (const Model& model : models) {
      std::printf("  %s meshrun %.1f steps/s", model.jax_name, model.meshrun.back());
      if (have_jax) {
        std::printf(" jax %.1f steps/s (x%.3f)", model.jax.back(), model.ratios.back());
      }
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  for (const Model& model : models) {
    std::printf("%s (%s/%s): meshrun steps/s %s\n", model.jax_name, model.directory,
                mesh.c_str(), Spread(model.meshrun, 2).c_str());
    // The host's own work per step (launch, argument checks, waiting is not CPU): what the
    // runtime adds on top of the plugin's compute threads.
    std::printf("%s: meshrun loop-thread CPU per step, us: %s\n", model.jax_name,
                Spread(model.host_us, 1).c_str());
    // With the compute threads: on a machine with fewer cores than busy threads, host work
    // per step takes cores from the compute, so this is the figure both sides compete on.
    std::printf("%s: meshrun process CPU per step, us: %s\n", model.jax_name,
                Spread(model.process_us, 1).c_str());
    if (!have_jax) continue;
    std::printf("%s: jax steps/s %s\n", model.jax_name, Spread(model.jax, 2).c_str());
    std::printf("%s: jax dispatching-thread CPU per step, us: %s\n", model.jax_name,
                Spread(model.jax_host_us, 1).c_str());
    std::printf("%s: jax process CPU per step, us: %s\n", model.jax_name,
                Spread(model.jax_process_us, 1).c_str());
    std::printf("%s: per-round meshrun/jax %s\n", model.jax_name, Spread(model.ratios).c_str());
  }
  if (load_s > 0) std::printf("ratio compile_over_load %.4f\n", compile_s / load_s);
  for (const Model& model : models) {
    if (!have_jax) break;
    std::printf("ratio %s %.4f\n",
                std::strcmp(model.jax_name, "small") == 0 ? "steps_vs_jax_small" : "steps_vs_jax",
                Median(model.ratios));
  }
  return 0;
}
