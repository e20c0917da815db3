// The block-sparse example (examples/transformer_lm/sparse_dp1) run the way the worker runs it:
// job.json -> JobSpec (bundle/job_bundle) -> mask contract -> the C++ planner builds every
// batch's plan tables -> the step through meshrun's PJRT runtime. Its loss sequence matches the
// one JAX computed with the exporter's own tables (reference.json), and active_tile_fraction
// matches too: the C++ tables mean what the exporter's mean. Needs the CPU PJRT plugin.
#include <sys/stat.h>

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "jobspec/job_validation.h"
#include "gtest/gtest.h"
#include "bundle/job_bundle.h"
#include "runtime/backends.h"
#include "bundle/example_job.h"
#include "testing/example_runner.h"
#include "testing/sparse_tables.h"
#include "runtime/pjrt/pjrt_runtime.h"
#include "worker/sparse/plan_batches.h"

namespace meshrun {
namespace {

TEST(SparseOracle, LossAndActiveTilesMatchJax) {
  const std::string plugin = runtime::DefaultPjrtPluginPath();
  struct stat st;
  if (stat(plugin.c_str(), &st) != 0) GTEST_SKIP() << "PJRT CPU plugin missing at " << plugin;
  const std::string path =
      std::string(MESHRUN_SOURCE_DIR) + "/examples/transformer_lm/sparse_dp1/job.json";
  absl::StatusOr<v1::JobSpec> spec = client::JobSpecFromBundle(path, {});
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_TRUE(spec->has_sparse_attention());
  ASSERT_TRUE(jobspec::ValidateJobSpec(*spec).ok()) << jobspec::ValidateJobSpec(*spec);
  auto builder = worker::sparse::PlanBuilder::Create(
      jobspec::SparseContractOf(spec->sparse_attention()));
  ASSERT_TRUE(builder.ok()) << builder.status();

  absl::StatusOr<runtime::ExampleJob> job = runtime::LoadExampleJob(path);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->data_arrays[0].global.name, spec->sparse_attention().doc_ids_input());
  ASSERT_TRUE(worker::sparse::AppendPlanTables(std::move(*builder), 0, *job).ok());

  auto rt = runtime::PjrtRuntime::Create({.plugin_path = plugin, .cpu_device_count = 8});
  ASSERT_TRUE(rt.ok()) << rt.status();
  auto runner = runtime::ExampleRunner::Create(rt->get(), *job);
  ASSERT_TRUE(runner.ok()) << runner.status();
  ASSERT_TRUE((*runner)->Initialize().ok());
  const int active = job->OutputIndex("metrics.active_tile_fraction");
  ASSERT_GE(active, 0);
  // The exporter's active fractions, to compare with what the step computes from our tables.
  std::ifstream in(std::string(MESHRUN_SOURCE_DIR) +
                   "/examples/transformer_lm/sparse_dp1/reference.json");
  std::stringstream text;
  text << in.rdbuf();
  google::protobuf::Struct reference;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(text.str(), &reference).ok());
  const auto& expected_fractions = reference.fields().at("active_tile_fraction").list_value();
  ASSERT_EQ(expected_fractions.values_size(), static_cast<int>(job->reference_loss.size()));
  float worst = 0;
  std::vector<float> fractions;
  for (int s = 0; s < static_cast<int>(job->reference_loss.size()); ++s) {
    auto values = (*runner)->Step(s, {job->loss_output, active});
    ASSERT_TRUE(values.ok()) << values.status();
    const float loss = (*values)[0].As<float>()[0];
    const float expected = job->reference_loss[s];
    worst = std::max(worst, std::fabs(loss - expected) / std::fabs(expected));
    EXPECT_LE(std::fabs(loss - expected) / std::fabs(expected), 1e-5f)
        << "step " << s << ": meshrun " << loss << ", JAX " << expected;
    fractions.push_back((*values)[1].As<float>()[0]);
  }
  for (size_t s = 0; s < fractions.size(); ++s) {
    // Fractions of 128 tiles: exact in f32 on both sides.
    EXPECT_EQ(fractions[s], expected_fractions.values(s).number_value()) << "step " << s;
  }
  EXPECT_GT(*std::max_element(fractions.begin(), fractions.end()),
            *std::min_element(fractions.begin(), fractions.end()));
  std::printf("sparse_dp1: 20 steps with C++-built plan tables, max relative loss difference "
              "%.3g\n", worst);
}

}  // namespace
}  // namespace meshrun
