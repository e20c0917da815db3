// The block-sparse example (examples/transformer_lm/sparse_dp1) as the worker runs it: is
// building a batch's plan tables on the host cheap next to the step it feeds?
//   plan:  PlanBatches::Next on each of the example's 20 batches (8 rows x 64 tokens: 8 plans,
//          the five tables laid out as step inputs), timed on the host;
//   step:  the sparse training step through meshrun's PJRT runtime (CPU plugin), with the
//          batches and their tables already on device.
// Both run in this process, one after the other. Prints absolute times, then
//   ratio step_over_plan <step time / plan time per batch>      (higher is better)
// Usage: meshrun_sparse_step_bench [--quick]
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_support.h"
#include "common/mutex_checks.h"
#include "jobspec/job_validation.h"
#include "bundle/job_bundle.h"
#include "runtime/backends.h"
#include "worker/batch_sources.h"
#include "bundle/example_job.h"
#include "testing/example_runner.h"
#include "testing/sparse_tables.h"
#include "runtime/pjrt/pjrt_runtime.h"
#include "worker/sparse/plan_batches.h"

namespace {

using namespace meshrun;
using bench::Fail;

}  // namespace

int main(int argc, char** argv) {
  meshrun::ConfigureMutexDeadlockDetection();
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const int plan_rounds = quick ? 50 : 500;
  const int steps = quick ? 10 : 40;
  const std::string path =
      std::string(MESHRUN_SOURCE_DIR) + "/examples/transformer_lm/sparse_dp1/job.json";
  absl::StatusOr<v1::JobSpec> spec = client::JobSpecFromBundle(path, {});
  if (!spec.ok()) return Fail("read bundle", spec.status());
  const worker::sparse::MaskContract contract =
      jobspec::SparseContractOf(spec->sparse_attention());
  auto created = worker::sparse::PlanBuilder::Create(contract);
  if (!created.ok()) return Fail("planner", created.status());
  const std::shared_ptr<const worker::sparse::PlanBuilder> builder = std::move(*created);
  absl::StatusOr<runtime::ExampleJob> job = runtime::LoadExampleJob(path);
  if (!job.ok()) return Fail("load job", job.status());
  std::printf("job %s: %s, %zu batches of %lld rows\n", job->name.c_str(),
              contract.ToString().c_str(), job->batches.size(),
              static_cast<long long>(job->batches[0][0].shape.dims[0]));

  // Plan: the time from one doc_ids batch to the five tables, as the worker's prefetcher pays it
  // (the inner source's copy of the batch included, as in the worker).
  std::vector<worker::sparse::PlanTable> tables;
  for (size_t i = job->num_state + job->data_arrays.size(); i < job->step.inputs.size(); ++i) {
    const std::string& name = job->step.inputs[i].global.name;
    tables.push_back(*worker::sparse::ParsePlanTable(name.substr(name.find('.') + 1)));
  }
  auto source = worker::sparse::PlanBatches::Create(
      {.inner = worker::MakeCycledBatches(job->batches), .builder = builder, .doc_ids_index = 0,
       .tables = tables});
  if (!source.ok()) return Fail("plan source", source.status());
  std::vector<double> plan_times;
  size_t table_bytes = 0;
  for (int r = 0; r < plan_rounds; ++r) {
    const double start = bench::Now();
    auto batch = (*source)->Next();
    plan_times.push_back(bench::Now() - start);
    if (!batch.ok()) return Fail("plan", batch.status());
    table_bytes = 0;
    for (size_t a = job->data_arrays.size(); a < batch->size(); ++a) {
      table_bytes += (*batch)[a].bytes.size();
    }
  }
  const double plan_s = bench::Median(plan_times);
  std::printf("plan per batch (median of %d): %.1f us for %zu table bytes\n", plan_rounds,
              plan_s * 1e6, table_bytes);

  // Step: the sparse step through the runtime, tables already on device.
  if (auto s = worker::sparse::AppendPlanTables(builder, 0, *job); !s.ok()) {
    return Fail("tables", s);
  }
  auto rt = runtime::PjrtRuntime::Create(
      {.plugin_path = runtime::DefaultPjrtPluginPath(), .cpu_device_count = 8});
  if (!rt.ok()) return Fail("start runtime", rt.status());
  auto runner = runtime::ExampleRunner::Create(rt->get(), *job);
  if (!runner.ok()) return Fail("compile", runner.status());
  if (auto s = (*runner)->Initialize(); !s.ok()) return Fail("init", s);
  for (int i = 0; i < 3; ++i) {
    if (auto s = (*runner)->Step(i); !s.ok()) return Fail("step", s.status());
  }
  std::vector<double> step_times;
  for (int i = 0; i < steps; ++i) {
    const double start = bench::Now();
    if (auto s = (*runner)->Step(3 + i, {job->loss_output}); !s.ok()) {
      return Fail("step", s.status());
    }
    step_times.push_back(bench::Now() - start);
  }
  const double step_s = bench::Median(step_times);
  std::printf("sparse step through the runtime (median of %d, loss read back): %.2f ms; "
              "compile %.2f s\n",
              steps, step_s * 1e3, absl::ToDoubleSeconds((*runner)->step_compile_time()));
  std::printf("plan / step: %.4f (%.2f%% of a step)\n", plan_s / step_s, 100 * plan_s / step_s);
  std::printf("ratio step_over_plan %.1f\n", step_s / plan_s);
  return 0;
}
