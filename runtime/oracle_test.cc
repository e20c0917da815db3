// The oracle: 20 training steps of each example job through meshrun's runtime give the loss
// sequence JAX computed for the same programs on its own CPU backend (examples/*/reference.json,
// written by examples/export_examples.py). Needs the CPU PJRT plugin with 8 devices.
#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "gtest/gtest.h"
#include "runtime/backends.h"
#include "bundle/example_job.h"
#include "testing/example_runner.h"
#include "runtime/pjrt/pjrt_runtime.h"

namespace meshrun::runtime {
namespace {

constexpr float kMaxRelativeDifference = 1e-5f;

struct Case {
  std::string job;  // examples/<model>/<mesh>
  bool serialized;  // run the step from Serialize -> DeserializeAndLoad
};

class Oracle : public testing::TestWithParam<Case> {};

TEST_P(Oracle, LossSequenceMatchesJax) {
  const std::string plugin = DefaultPjrtPluginPath();
  struct stat st;
  if (stat(plugin.c_str(), &st) != 0) {
    GTEST_SKIP() << "PJRT CPU plugin missing at " << plugin << " (run scripts/setup.sh)";
  }
  absl::StatusOr<ExampleJob> job =
      LoadExampleJob(std::string(MESHRUN_SOURCE_DIR) + "/examples/" + GetParam().job + "/job.json");
  ASSERT_TRUE(job.ok()) << job.status();
  RuntimeConfig config{.plugin_path = plugin, .cpu_device_count = 8};
  absl::StatusOr<std::unique_ptr<PjrtRuntime>> runtime = PjrtRuntime::Create(config);
  ASSERT_TRUE(runtime.ok()) << runtime.status();
  absl::StatusOr<std::unique_ptr<ExampleRunner>> runner =
      ExampleRunner::Create(runtime->get(), *job, GetParam().serialized);
  ASSERT_TRUE(runner.ok()) << runner.status();
  ASSERT_TRUE((*runner)->Initialize().ok());

  const int grad_norm = job->OutputIndex("metrics.grad_norm");
  const int sink = job->OutputIndex("metrics.sink_mass");
  std::vector<int> read = {job->loss_output, grad_norm};
  if (sink >= 0) read.push_back(sink);
  float worst = 0, worst_norm = 0;
  int identical = 0;
  const int steps = static_cast<int>(job->reference_loss.size());
  ASSERT_EQ(steps, 20);
  for (int s = 0; s < steps; ++s) {
    absl::StatusOr<std::vector<HostArray>> values = (*runner)->Step(s, read);
    ASSERT_TRUE(values.ok()) << values.status();
    const float loss = (*values)[0].As<float>()[0];
    const float norm = (*values)[1].As<float>()[0];
    const float expected = job->reference_loss[s];
    const float relative = std::fabs(loss - expected) / std::fabs(expected);
    identical += loss == expected;
    worst = std::max(worst, relative);
    worst_norm = std::max(worst_norm, std::fabs(norm - job->reference_grad_norm[s]) /
                                          std::fabs(job->reference_grad_norm[s]));
    EXPECT_LE(relative, kMaxRelativeDifference)
        << "step " << s << ": meshrun " << loss << ", JAX " << expected;
    if (sink >= 0) {
      const std::vector<float> mass = (*values)[2].As<float>();
      ASSERT_EQ((*values)[2].shape.dims, (std::vector<int64_t>{6, 4}));
      for (float m : mass) EXPECT_TRUE(m >= 0 && m <= 1.0001f) << m;
    }
  }
  EXPECT_LT(job->reference_loss.back(), job->reference_loss.front());  // it trains
  std::printf("%s%s: %d/%d losses bit-identical to JAX, max relative difference %.3g "
              "(grad norm %.3g)\n",
              job->name.c_str(), GetParam().serialized ? " (deserialized step)" : "", identical,
              steps, worst, worst_norm);
}

INSTANTIATE_TEST_SUITE_P(
    Examples, Oracle,
    testing::Values(Case{"mlp_classifier/dp1", false}, Case{"mlp_classifier/dp8", false},
                    Case{"mlp_classifier/dp4_tp2", false}, Case{"transformer_lm/dp1", false},
                    Case{"transformer_lm/dp8", false}, Case{"transformer_lm/dp4_tp2", false},
                    Case{"transformer_lm/dp8", true}),
    [](const testing::TestParamInfo<Case>& info) {
      std::string name = info.param.job + (info.param.serialized ? "_deserialized" : "");
      for (char& c : name) {
        if (c == '/') c = '_';
      }
      return name;
    });

}  // namespace
}  // namespace meshrun::runtime
