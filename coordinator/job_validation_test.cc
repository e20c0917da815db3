#include "coordinator/job_validation.h"

#include <gtest/gtest.h>

#include <functional>
#include <vector>

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

// An MoE job: init -> s; grad(s, acc, batch) -> acc; apply(s, acc) -> (s, acc, loss).
v1::JobSpec MoeSpec() {
  v1::JobSpec spec = GoodSpec();
  spec.set_model_family(v1::MODEL_FAMILY_MOE);
  spec.clear_programs();
  auto add = [&](const char* role, std::vector<const char*> inputs,
                 std::vector<const char*> outputs) {
    v1::Program* p = spec.add_programs();
    p->set_role(role);
    p->set_stablehlo("module {}");
    for (const char* name : inputs) {
      p->add_inputs()->set_name(name);
      p->mutable_inputs()->rbegin()->set_dtype("f32");
    }
    for (const char* name : outputs) {
      p->add_outputs()->set_name(name);
      p->mutable_outputs()->rbegin()->set_dtype("f32");
    }
  };
  add("init", {}, {"s"});
  add("grad", {"s", "acc", "batch"}, {"acc"});
  add("apply", {"s", "acc"}, {"s", "acc", "loss"});
  spec.set_state_count(1);
  spec.set_grad_accumulation(2);
  return spec;
}

TEST(JobValidationTest, ModeBNeedsGradApplyAndAccumulation) {
  EXPECT_TRUE(ValidateJobSpec(MoeSpec()).ok()) << ValidateJobSpec(MoeSpec());
  const std::vector<std::pair<std::function<void(v1::JobSpec&)>, std::string>> cases = {
      {[](v1::JobSpec& s) { s.set_grad_accumulation(0); }, "spec.grad_accumulation is 0"},
      {[](v1::JobSpec& s) { s.set_model_family(v1::MODEL_FAMILY_DENSE); },
       "need a \"step\" program"},
      {[](v1::JobSpec& s) { *s.add_programs() = GoodSpec().programs(1); }, "drop \"step\""},
      {[](v1::JobSpec& s) { s.mutable_programs(2)->mutable_inputs()->RemoveLast(); },
       "do not fit compile mode B"},
      {[](v1::JobSpec& s) { s.mutable_programs(1)->mutable_inputs()->RemoveLast(); },
       "do not fit compile mode B"},
      {[](v1::JobSpec& s) { s.mutable_telemetry(0)->set_name("acc2"); },
       "\"acc2\" is not an output of the apply program"},
  };
  for (const auto& [mutate, expected] : cases) {
    v1::JobSpec spec = MoeSpec();
    mutate(spec);
    const absl::Status status = ValidateJobSpec(spec);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << expected;
    EXPECT_NE(status.message().find(expected), absl::string_view::npos)
        << "wanted \"" << expected << "\" in: " << status.message();
  }
  v1::JobSpec dense = GoodSpec();
  dense.set_grad_accumulation(2);
  EXPECT_NE(ValidateJobSpec(dense).message().find("only MoE jobs"), absl::string_view::npos);
}

TEST(JobValidationTest, CompileModeFollowsModelFamily) {
  EXPECT_STREQ(CompileMode(v1::MODEL_FAMILY_DENSE), "A");
  EXPECT_STREQ(CompileMode(v1::MODEL_FAMILY_MAMBA), "A");
  EXPECT_STREQ(CompileMode(v1::MODEL_FAMILY_MOE), "B");
}

}  // namespace
}  // namespace meshrun::coordinator
