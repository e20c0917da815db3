#include "coordinator/job_validation.h"

#include <gtest/gtest.h>

#include <functional>

namespace meshrun::coordinator {
namespace {

v1::JobSpec GoodSpec() {
  v1::JobSpec spec;
  spec.set_name("mlp");
  for (const char* role : {"init", "step"}) {
    v1::Program* p = spec.add_programs();
    p->set_role(role);
    p->set_stablehlo("module {}");
  }
  v1::TensorSpec* out = spec.mutable_programs(1)->add_outputs();
  out->set_name("loss");
  out->set_dtype("f32");
  v1::TelemetryDeclaration* t = spec.add_telemetry();
  t->set_name("loss");
  t->set_combine(v1::COMBINE_MEAN);
  spec.set_telemetry_cadence(10);
  spec.set_steps(100);
  spec.mutable_data()->set_synthetic(true);
  return spec;
}

TEST(JobValidationTest, AcceptsAWellFormedJob) { EXPECT_TRUE(ValidateJobSpec(GoodSpec()).ok()); }

TEST(JobValidationTest, EachRefusalNamesItsField) {
  const std::vector<std::pair<std::function<void(v1::JobSpec&)>, std::string>> cases = {
      {[](v1::JobSpec& s) { s.clear_name(); }, "spec.name"},
      {[](v1::JobSpec& s) { s.mutable_programs(0)->set_role("warmup"); }, "spec.programs[0].role"},
      {[](v1::JobSpec& s) { s.mutable_programs(1)->set_role("init"); }, "appears twice"},
      {[](v1::JobSpec& s) { s.mutable_programs(1)->clear_stablehlo(); },
       "spec.programs[1].stablehlo"},
      {[](v1::JobSpec& s) { s.set_model_family(v1::MODEL_FAMILY_MOE); }, "\"grad\" and \"apply\""},
      {[](v1::JobSpec& s) { s.mutable_programs(1)->mutable_outputs(0)->set_dtype("float"); },
       "spec.programs[1].outputs[0].dtype"},
      {[](v1::JobSpec& s) { s.mutable_telemetry(0)->set_name("los"); },
       "\"los\" is not an output of the step program"},
      {[](v1::JobSpec& s) { s.mutable_telemetry(0)->clear_combine(); },
       "spec.telemetry[0].combine"},
      {[](v1::JobSpec& s) { s.set_telemetry_cadence(0); }, "spec.telemetry_cadence is 0"},
      {[](v1::JobSpec& s) { s.set_steps(0); }, "spec.steps"},
      {[](v1::JobSpec& s) { s.clear_data(); }, "spec.data has no source"},
      {[](v1::JobSpec& s) { s.mutable_mesh()->set_tensor_parallel(-2); }, "spec.mesh"},
  };
  for (const auto& [mutate, expected] : cases) {
    v1::JobSpec spec = GoodSpec();
    mutate(spec);
    const absl::Status status = ValidateJobSpec(spec);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << expected;
    EXPECT_NE(status.message().find(expected), absl::string_view::npos)
        << "wanted \"" << expected << "\" in: " << status.message();
  }
}

TEST(JobValidationTest, CompileModeFollowsModelFamily) {
  EXPECT_STREQ(CompileMode(v1::MODEL_FAMILY_DENSE), "A");
  EXPECT_STREQ(CompileMode(v1::MODEL_FAMILY_MAMBA), "A");
  EXPECT_STREQ(CompileMode(v1::MODEL_FAMILY_MOE), "B");
}

}  // namespace
}  // namespace meshrun::coordinator
