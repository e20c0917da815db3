#include "jobspec/spec_limits.h"

#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "jobspec/job_validation.h"

namespace meshrun::jobspec {
namespace {

v1::TensorSpec Tensor(const std::string& name, const std::string& dtype,
                      std::vector<int64_t> shape, std::vector<std::string> sharding,
                      std::vector<int64_t> shard_shape) {
  v1::TensorSpec t;
  t.set_name(name);
  t.set_dtype(dtype);
  for (int64_t d : shape) t.add_shape(d);
  for (const std::string& a : sharding) t.add_sharding(a);
  for (int64_t d : shard_shape) t.add_shard_shape(d);
  return t;
}

// init() -> w; step(w, batch.tokens) -> (w, loss) on a (data=4, model=2) mesh: w split over
// "model" on dimension 1, the batch over "data".
v1::JobSpec ShardedSpec() {
  v1::JobSpec spec;
  spec.set_name("sharded");
  const v1::TensorSpec w = Tensor("state.w", "f32", {8, 4}, {"", "model"}, {8, 2});
  v1::Program* init = spec.add_programs();
  init->set_role("init");
  init->set_stablehlo("module {}");
  *init->add_outputs() = w;
  v1::Program* step = spec.add_programs();
  step->set_role("step");
  step->set_stablehlo("module {}");
  *step->add_inputs() = w;
  *step->add_inputs() = Tensor("batch.tokens", "s32", {8, 65}, {"data", ""}, {2, 65});
  *step->add_outputs() = w;
  *step->add_outputs() = Tensor("loss", "f32", {}, {}, {});
  step->add_donated_inputs(0);
  spec.set_state_count(1);
  v1::TelemetryDeclaration* t = spec.add_telemetry();
  t->set_name("loss");
  t->set_combine(v1::COMBINE_MEAN);
  spec.set_telemetry_cadence(10);
  spec.set_steps(100);
  spec.mutable_data()->set_synthetic(true);
  return spec;
}

using Mutation = std::pair<std::function<void(v1::JobSpec&)>, std::string>;

void ExpectRefusals(const std::vector<Mutation>& cases) {
  for (const auto& [mutate, expected] : cases) {
    v1::JobSpec spec = ShardedSpec();
    mutate(spec);
    const absl::Status status = ValidateJobSpec(spec);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << expected << ": " << status;
    EXPECT_NE(status.message().find(expected), absl::string_view::npos)
        << "wanted \"" << expected << "\" in: " << status.message();
  }
}

TEST(SpecLimitsTest, AcceptsAConsistentShardedJob) {
  EXPECT_TRUE(ValidateJobSpec(ShardedSpec()).ok()) << ValidateJobSpec(ShardedSpec());
}

TEST(SpecLimitsTest, RefusesSizesOverTheirBounds) {
  ExpectRefusals({
      {[](v1::JobSpec& s) { s.set_name(std::string(300, 'j')); }, "spec.name is 300 bytes"},
      {[](v1::JobSpec& s) { s.set_name("a\nb"); }, "spec.name holds a control character"},
      {[](v1::JobSpec& s) { s.set_state_count(-1); }, "spec.state_count is -1"},
      {[](v1::JobSpec& s) { s.set_state_count(std::numeric_limits<int32_t>::max()); },
       "spec.state_count is 2147483647"},
      {[](v1::JobSpec& s) { s.set_steps(int64_t{1} << 50); }, "spec.steps is"},
      {[](v1::JobSpec& s) { s.set_telemetry_cadence(2000000); }, "spec.telemetry_cadence is"},
      {[](v1::JobSpec& s) { s.mutable_mesh()->set_data_parallel(1 << 20); },
       "spec.mesh.data_parallel is"},
      {[](v1::JobSpec& s) { s.mutable_data()->set_global_batch(-3); }, "spec.data.global_batch"},
      {[](v1::JobSpec& s) { s.set_max_restarts(1000); }, "spec.max_restarts is 1000"},
      {[](v1::JobSpec& s) { s.set_resume_from(std::string(5000, '/')); },
       "spec.resume_from is 5000 bytes"},
      {[](v1::JobSpec& s) { s.mutable_programs(1)->set_compile_options(std::string(2 << 20, 'x')); },
       "spec.programs[1].compile_options is"},
      {[](v1::JobSpec& s) {
         v1::TensorSpec* t = s.mutable_programs(1)->mutable_inputs(1);
         t->set_shape(0, -8);
       },
       "spec.programs[1].inputs[1].shape dimension 0 is -8"},
      // 2^31 * 2^31 overflows no int64 but is over the element bound; 2^40 * 2^40 overflows.
      {[](v1::JobSpec& s) {
         v1::TensorSpec* t = s.mutable_programs(1)->mutable_inputs(1);
         t->set_shape(0, int64_t{1} << 31);
         t->set_shape(1, int64_t{1} << 31);
       },
       "elements"},
      {[](v1::JobSpec& s) {
         v1::TensorSpec* t = s.mutable_programs(1)->mutable_inputs(1);
         t->set_shape(0, int64_t{1} << 40);
         t->set_shape(1, int64_t{1} << 40);
       },
       "spec.programs[1].inputs[1].shape [1099511627776, 1099511627776] has over"},
      {[](v1::JobSpec& s) {
         v1::TensorSpec* t = s.mutable_programs(1)->mutable_inputs(1);
         for (int i = 0; i < 20; ++i) t->add_shape(1);
       },
       "has rank over 16"},
  });
}

TEST(SpecLimitsTest, RefusesDeclarationsThatDisagree) {
  ExpectRefusals({
      {[](v1::JobSpec& s) { s.mutable_programs(1)->mutable_inputs(1)->set_sharding(0, "rows"); },
       "spec.programs[1].inputs[1].sharding[0] \"rows\" is not a mesh axis"},
      {[](v1::JobSpec& s) { s.mutable_programs(1)->mutable_inputs(1)->set_shard_shape(0, 3); },
       "spec.programs[1].inputs[1].shard_shape[0] is 3 but dimension 0 is 8 split over \"data\""},
      {[](v1::JobSpec& s) { s.mutable_programs(1)->mutable_inputs(1)->set_shard_shape(1, 64); },
       "shard_shape[1] is 64 but dimension 1 is 65 and not split"},
      {[](v1::JobSpec& s) { s.mutable_programs(1)->mutable_inputs(1)->clear_shard_shape(); },
       "spec.programs[1].inputs[1].shard_shape has 0 entries for 2 dimensions"},
      {[](v1::JobSpec& s) { s.mutable_programs(1)->mutable_inputs(1)->add_sharding(""); },
       "spec.programs[1].inputs[1].sharding has 3 entries for 2 dimensions"},
      {[](v1::JobSpec& s) { s.mutable_programs(1)->set_donated_inputs(0, 2); },
       "spec.programs[1].donated_inputs[0] is 2; the step program has 2 inputs"},
      {[](v1::JobSpec& s) { s.mutable_programs(1)->set_donated_inputs(0, -1); },
       "donated_inputs[0] is -1"},
      {[](v1::JobSpec& s) { s.mutable_programs(1)->add_donated_inputs(0); },
       "donated_inputs[1] donates input 0 twice"},
      // A state input whose declared shape is not what the step returns.
      {[](v1::JobSpec& s) {
         v1::TensorSpec* w = s.mutable_programs(1)->mutable_inputs(0);
         w->set_shape(0, 16);
         w->set_shard_shape(0, 16);
       },
       "spec.programs(step).outputs[0] \"state.w\" is f32 [8, 4]"},
      {[](v1::JobSpec& s) { s.mutable_programs(0)->mutable_outputs(0)->set_dtype("bf16"); },
       "spec.programs(init).outputs[0] is bf16"},
      {[](v1::JobSpec& s) {
         v1::TensorSpec* loss = s.mutable_programs(1)->mutable_outputs(1);
         loss->add_shape(1 << 20);
         loss->add_shard_shape(1 << 20);
       },
       "spec.telemetry[0] \"loss\" has 1048576 elements"},
  });
}

TEST(SpecLimitsTest, ShardingMustFitThePlannedMesh) {
  const v1::JobSpec spec = ShardedSpec();
  EXPECT_TRUE(CheckShardingFitsMesh(spec, {"data", "model"}, {4, 2}).ok());
  absl::Status s = CheckShardingFitsMesh(spec, {"data"}, {8});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("\"state.w\" splits dimension 1 over \"model\", which the planned "
                             "mesh (data) = [8] does not have"),
            std::string::npos)
      << s;
  s = CheckShardingFitsMesh(spec, {"data", "model"}, {2, 4});
  EXPECT_NE(s.message().find("\"state.w\" splits dimension 1 (4) over \"model\" of size 4"),
            std::string::npos)
      << s;
}

TEST(SpecLimitsTest, CheckedElementsCatchesOverflow) {
  EXPECT_EQ(*CheckedElements({2, 3, 4}, "x"), 24);
  EXPECT_EQ(*CheckedElements({}, "x"), 1);
  EXPECT_EQ(*CheckedElements({5, 0}, "x"), 0);
  EXPECT_FALSE(CheckedElements({int64_t{1} << 40, int64_t{1} << 40, 4}, "x").ok());
  EXPECT_FALSE(CheckedElements({std::numeric_limits<int64_t>::max()}, "x").ok());
}

}  // namespace
}  // namespace meshrun::jobspec
