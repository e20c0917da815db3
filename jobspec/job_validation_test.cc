#include "jobspec/job_validation.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/store.h"

namespace meshrun::jobspec {
namespace {

// What an exporter writes besides a test's fields: each tensor's shard_shape (here unsplit: its
// shape), and init making the state (jobspec/spec_limits.h checks both).
v1::JobSpec AsExported(v1::JobSpec spec) {
  v1::Program* init = nullptr;
  const v1::Program* last = nullptr;
  for (v1::Program& p : *spec.mutable_programs()) {
    for (auto* list : {p.mutable_inputs(), p.mutable_outputs()}) {
      for (v1::TensorSpec& t : *list) {
        if (t.shard_shape_size() == 0) *t.mutable_shard_shape() = t.shape();
      }
    }
    if (p.role() == "init") init = &p;
    if (p.role() == "step" || p.role() == "apply") last = &p;
  }
  for (int i = 0; init != nullptr && last != nullptr && i < spec.state_count() &&
                  i < last->inputs_size() && init->outputs_size() <= i;
       ++i) {
    *init->add_outputs() = last->inputs(i);
  }
  return spec;
}

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
  v1::TensorSpec* tokens = spec.mutable_programs(1)->add_inputs();
  tokens->set_name("batch.tokens");
  tokens->set_dtype("s32");
  tokens->add_shape(8);
  tokens->add_shape(65);
  v1::TelemetryDeclaration* t = spec.add_telemetry();
  t->set_name("loss");
  t->set_combine(v1::COMBINE_MEAN);
  spec.set_telemetry_cadence(10);
  spec.set_steps(100);
  spec.mutable_data()->set_synthetic(true);
  return spec;
}

TEST(JobValidationTest, AcceptsAWellFormedJob) { EXPECT_TRUE(ValidateJobSpec(AsExported(GoodSpec())).ok()); }

// resume_from must hold every state array with the job's dtype and global shape: a checkpoint
// of another shape is refused at submit, naming the array and the dimension.
TEST(JobValidationTest, ResumeFromRefusesACheckpointOfAnotherShape) {
  namespace fs = std::filesystem;
  const std::string root = (fs::temp_directory_path() / "job_validation_resume").string();
  fs::remove_all(root);
  fs::create_directories(root);
  v1::JobSpec spec = GoodSpec();
  v1::Program* step = spec.mutable_programs(1);
  v1::TensorSpec w;
  w.set_name("state.w");
  w.set_dtype("f32");
  for (int64_t n : {4, 6}) w.add_shape(n);
  for (auto* list : {step->mutable_inputs(), step->mutable_outputs()}) {  // the state first
    *list->Add() = w;
    std::rotate(list->rbegin(), list->rbegin() + 1, list->rend());
  }
  spec.set_state_count(1);
  spec = AsExported(spec);
  ASSERT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  // Commits a checkpoint of step `n` holding state.w with `dims`; returns its directory.
  auto commit = [&](int64_t n, std::vector<int64_t> dims) {
    checkpoint::ArrayChunks entry;
    entry.array.set_name("state.w");
    entry.array.set_leaf("w");
    entry.array.set_dtype("f32");
    for (int64_t d : dims) {
      entry.array.add_shape(d);
      entry.array.add_chunk_shape(d);
    }
    entry.chunks.push_back(
        {std::string(dims.size() == 1 ? "0" : "0.0"),
         runtime::HostArray::From(runtime::DType::kF32, dims,
                                  std::vector<float>(dims.size() == 1 ? dims[0]
                                                                      : dims[0] * dims[1]))});
    v1::CheckpointManifest manifest;
    manifest.set_step(n);
    auto written = checkpoint::WriteChunks(checkpoint::TempStepDir(root, n), {entry});
    for (const v1::CheckpointArray& a : written.value()) *manifest.add_arrays() = a;
    return checkpoint::Commit(root, manifest, 0).value();
  };
  spec.set_resume_from(commit(10, {4, 6}));
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  spec.set_resume_from(commit(20, {4, 5}));
  absl::Status refused = ValidateJobSpec(spec);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.message(),
            "spec.resume_from array state.w dimension 1 is 5 in the checkpoint, 6 in the job");
  spec.set_resume_from(commit(30, {24}));
  EXPECT_EQ(ValidateJobSpec(spec).message(),
            "spec.resume_from array state.w is f32 of rank 1; the job's state input is f32 of "
            "rank 2");
  fs::remove_all(root);
}

TEST(JobValidationTest, EachRefusalNamesItsField) {
  const std::vector<std::pair<std::function<void(v1::JobSpec&)>, std::string>> cases = {
      {[](v1::JobSpec& s) { s.clear_name(); }, "spec.name"},
      {[](v1::JobSpec& s) { s.mutable_programs(0)->set_role("warmup"); }, "spec.programs[0].role"},
      {[](v1::JobSpec& s) { s.mutable_programs(1)->set_role("init"); }, "appears twice"},
      {[](v1::JobSpec& s) { s.mutable_programs(1)->clear_stablehlo(); },
       "spec.programs[1].stablehlo"},
      {[](v1::JobSpec& s) { s.mutable_programs(1)->set_stablehlo_sha256(std::string(64, 'a')); },
       "spec.programs[1].stablehlo_sha256"},
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
    const absl::Status status = ValidateJobSpec(AsExported(spec));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << expected;
    EXPECT_NE(status.message().find(expected), absl::string_view::npos)
        << "wanted \"" << expected << "\" in: " << status.message();
  }
}

// GoodSpec on token data: the step takes state, then batch.tokens s32 [8, 65].
v1::JobSpec TokenSpec(const std::string& glob) {
  v1::JobSpec spec = GoodSpec();
  spec.mutable_data()->set_token_shards_glob(glob);
  v1::Program* step = spec.mutable_programs(1);
  const v1::TensorSpec tokens = step->inputs(0);
  step->clear_inputs();
  v1::TensorSpec* state = step->add_inputs();
  state->set_name("state.w");
  state->set_dtype("f32");
  *step->add_inputs() = tokens;
  spec.set_state_count(1);
  return spec;
}

TEST(JobValidationTest, RefusesBatchInputsTokenDataCannotFill) {
  const std::vector<std::pair<std::function<void(v1::JobSpec&)>, std::string>> cases = {
      {[](v1::JobSpec& s) { s.mutable_programs(1)->mutable_inputs(1)->set_name("batch.x"); },
       "spec.programs[1].inputs[1].name \"batch.x\" is a batch input token data cannot fill"},
      {[](v1::JobSpec& s) { s.mutable_programs(1)->mutable_inputs(1)->set_dtype("f32"); },
       "spec.programs[1].inputs[1] \"batch.tokens\" is f32 of rank 2"},
      {[](v1::JobSpec& s) { s.mutable_programs(1)->mutable_inputs(1)->add_shape(2); },
       "is s32 of rank 3"},
      {[](v1::JobSpec& s) { s.set_state_count(2); }, "spec.programs[1].inputs has no batch.tokens"},
      {[](v1::JobSpec& s) { s.set_state_count(3); }, "spec.state_count is 3"},
      {[](v1::JobSpec& s) {
         v1::TensorSpec* ids = s.mutable_programs(1)->add_inputs();
         ids->set_name("batch.doc_ids");
         ids->set_dtype("s32");
         ids->add_shape(8);
         ids->add_shape(66);
       },
       "L' <= its L"},
      {[](v1::JobSpec& s) { s.mutable_data()->set_global_batch(16); }, "spec.data.global_batch"},
      {[](v1::JobSpec& s) { s.mutable_data()->set_sequence_length(64); },
       "spec.data.sequence_length"},
      {[](v1::JobSpec& s) { s.mutable_data()->set_synthetic(false); }, "spec.data.synthetic"},
  };
  for (const auto& [mutate, expected] : cases) {
    v1::JobSpec spec = TokenSpec("/nonexistent/*.tok");
    mutate(spec);
    const absl::Status status = ValidateJobSpec(AsExported(spec));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << expected;
    EXPECT_NE(status.message().find(expected), absl::string_view::npos)
        << "wanted \"" << expected << "\" in: " << status.message();
  }
  v1::JobSpec ok = TokenSpec("/nonexistent/*.tok");
  v1::TensorSpec* ids = ok.mutable_programs(1)->add_inputs();
  ids->set_name("batch.doc_ids");
  ids->set_dtype("s32");
  ids->add_shape(8);
  ids->add_shape(64);
  EXPECT_TRUE(ValidateJobSpec(AsExported(ok)).ok()) << ValidateJobSpec(AsExported(ok));
  ok.mutable_data()->set_synthetic(true);
  EXPECT_TRUE(ValidateJobSpec(AsExported(ok)).ok()) << ValidateJobSpec(AsExported(ok));
}

TEST(JobValidationTest, DataReceiptNamesTheGlobAndFile) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / absl::StrCat("job_validation_test_", getpid());
  std::filesystem::create_directories(dir);
  const std::string glob = (dir / "*.tok").string();

  const absl::Status missing = ReadDataReceipt(TokenSpec(glob)).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(missing.message().find("spec.data.token_shards_glob \"" + glob + "\""),
            absl::string_view::npos) << missing;
  EXPECT_NE(missing.message().find("no file matches"), absl::string_view::npos) << missing;

  std::ofstream(dir / "a.tok") << "not a shard at all, just some bytes of text.........";
  const absl::Status corrupt = ReadDataReceipt(TokenSpec(glob)).status();
  EXPECT_EQ(corrupt.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(corrupt.message().find((dir / "a.tok").string() + ": bad magic"),
            absl::string_view::npos) << corrupt;

  v1::JobSpec synthetic = GoodSpec();
  absl::StatusOr<v1::DataReceipt> receipt = ReadDataReceipt(synthetic);
  ASSERT_TRUE(receipt.ok()) << receipt.status();
  EXPECT_TRUE(receipt->synthetic());
  EXPECT_EQ(receipt->files_size(), 0);
  std::filesystem::remove_all(dir);
}

// The exported sparse example's contract: 64 tokens, 16-token tiles, at most 3 per row, 8 rows.
v1::JobSpec SparseSpec() {
  v1::JobSpec spec = GoodSpec();
  v1::Program* step = spec.mutable_programs(1);
  auto input = [&](const char* name, const char* dtype, std::vector<int64_t> shape) {
    v1::TensorSpec* t = step->add_inputs();
    t->set_name(name);
    t->set_dtype(dtype);
    for (int64_t d : shape) t->add_shape(d);
  };
  input("batch.doc_ids", "s32", {8, 64});  // after GoodSpec's batch.tokens s32 [8, 65]
  input("plan.block_mask", "u8", {8, 4, 4});
  input("plan.data_next", "u8", {8, 4, 3});
  input("plan.partial_masks", "u8", {8, 12, 16, 16});
  v1::SparseAttention* sparse = spec.mutable_sparse_attention();
  sparse->set_seq_len(64);
  sparse->set_causal(true);
  sparse->set_windowed(true);
  sparse->set_window_left(32);
  sparse->set_block_q(16);
  sparse->set_block_kv(16);
  sparse->set_max_grid_width(3);
  sparse->set_heads_per_plan(4);
  sparse->set_doc_ids_input("batch.doc_ids");
  sparse->set_block_mask_input("plan.block_mask");
  sparse->set_data_next_input("plan.data_next");
  sparse->set_partial_masks_input("plan.partial_masks");
  return spec;
}

TEST(JobValidationTest, SparseAttentionContractIsChecked) {
  EXPECT_TRUE(ValidateJobSpec(AsExported(SparseSpec())).ok()) << ValidateJobSpec(AsExported(SparseSpec()));
  const std::vector<std::pair<std::function<void(v1::JobSpec&)>, std::string>> cases = {
      {[](v1::JobSpec& s) { s.mutable_sparse_attention()->set_block_q(24); },
       "block_q=24 does not divide seq_len=64"},
      {[](v1::JobSpec& s) { s.mutable_sparse_attention()->set_window_left(64); },
       "window.left=64 is wider than the sequence"},
      {[](v1::JobSpec& s) { s.mutable_sparse_attention()->set_max_grid_width(0); },
       "max_grid_width=0 must be positive"},
      {[](v1::JobSpec& s) { s.mutable_sparse_attention()->set_doc_ids_input("batch.docs"); },
       "spec.sparse_attention.doc_ids_input \"batch.docs\" is not an input"},
      {[](v1::JobSpec& s) { s.mutable_sparse_attention()->set_seq_len(128); },
       "spec.sparse_attention.doc_ids_input \"batch.doc_ids\" must be s32 [rows, seq_len=128]"},
      {[](v1::JobSpec& s) { s.mutable_sparse_attention()->set_data_next_input("batch.tokens"); },
       "spec.sparse_attention.data_next_input \"batch.tokens\" must be among the step's last 3"},
      {[](v1::JobSpec& s) { s.mutable_sparse_attention()->set_max_grid_width(2); },
       "spec.sparse_attention max_grid_width=2 is too small: q-block row 2 needs 3 active "
       "tiles (the widest); raise max_grid_width to at least 3"},
      {[](v1::JobSpec& s) { s.mutable_programs(1)->mutable_inputs()->rbegin()[1].set_shape(2, 2); },
       "spec.sparse_attention.data_next_input \"plan.data_next\" is u8 [8, 4, 2] but the "
       "contract makes it u8 [8, 4, 3]"},
      {[](v1::JobSpec& s) { s.mutable_sparse_attention()->set_grid_width_input("plan.gw"); },
       "spec.sparse_attention.grid_width_input \"plan.gw\" is not an input"},
  };
  for (const auto& [mutate, expected] : cases) {
    v1::JobSpec spec = SparseSpec();
    mutate(spec);
    const absl::Status status = ValidateJobSpec(AsExported(spec));
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
  spec.mutable_data()->set_example_bundle("examples/transformer_moe/dp8/job.json");
  return spec;
}

TEST(JobValidationTest, ModeBNeedsGradApplyAndAccumulation) {
  EXPECT_TRUE(ValidateJobSpec(AsExported(MoeSpec())).ok()) << ValidateJobSpec(AsExported(MoeSpec()));
  // Any model exported with grad + apply (meshrun.export's mode B) runs in mode B.
  v1::JobSpec dense_b = AsExported(MoeSpec());
  dense_b.set_model_family(v1::MODEL_FAMILY_DENSE);
  EXPECT_TRUE(IsModeB(dense_b));
  EXPECT_TRUE(ValidateJobSpec(dense_b).ok()) << ValidateJobSpec(dense_b);
  const std::vector<std::pair<std::function<void(v1::JobSpec&)>, std::string>> cases = {
      {[](v1::JobSpec& s) { s.set_grad_accumulation(0); }, "spec.grad_accumulation is 0"},
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
    const absl::Status status = ValidateJobSpec(AsExported(spec));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << expected;
    EXPECT_NE(status.message().find(expected), absl::string_view::npos)
        << "wanted \"" << expected << "\" in: " << status.message();
  }
  v1::JobSpec dense = GoodSpec();
  dense.set_grad_accumulation(2);
  EXPECT_NE(ValidateJobSpec(AsExported(dense)).message().find("only compile mode B jobs"),
            absl::string_view::npos);
}

TEST(JobValidationTest, HostReplicasNeedModeBWithF32Accumulators) {
  v1::JobSpec spec = MoeSpec();
  spec.mutable_mesh()->set_host_replicas(2);
  EXPECT_TRUE(ValidateJobSpec(AsExported(spec)).ok()) << ValidateJobSpec(AsExported(spec));
  const std::vector<std::pair<std::function<void(v1::JobSpec&)>, std::string>> cases = {
      {[](v1::JobSpec& s) { s.mutable_mesh()->set_host_replicas(-1); },
       "spec.mesh.host_replicas is -1"},
      {[](v1::JobSpec& s) { s.mutable_programs(2)->mutable_inputs(1)->set_dtype("s32"); },
       "spec.mesh.host_replicas needs f32 accumulators; apply input acc is s32"},
  };
  for (const auto& [mutate, expected] : cases) {
    v1::JobSpec bad = spec;
    mutate(bad);
    const absl::Status status = ValidateJobSpec(AsExported(bad));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << expected;
    EXPECT_NE(status.message().find(expected), absl::string_view::npos)
        << "wanted \"" << expected << "\" in: " << status.message();
  }
  // A dense model runs as host replicas in mode B too, but not from one step program.
  v1::JobSpec dense = spec;
  dense.set_model_family(v1::MODEL_FAMILY_DENSE);
  EXPECT_TRUE(ValidateJobSpec(AsExported(dense)).ok()) << ValidateJobSpec(AsExported(dense));
  v1::JobSpec step = GoodSpec();
  step.mutable_mesh()->set_host_replicas(2);
  EXPECT_NE(ValidateJobSpec(AsExported(step)).message().find("host_replicas needs compile mode B"),
            absl::string_view::npos)
      << ValidateJobSpec(AsExported(step));
}

TEST(JobValidationTest, CompileModeFollowsModelFamily) {
  v1::JobSpec spec;
  for (auto [family, mode] : {std::pair{v1::MODEL_FAMILY_DENSE, "A"}, {v1::MODEL_FAMILY_MAMBA, "A"},
                              {v1::MODEL_FAMILY_MOE, "B"}}) {
    spec.set_model_family(family);
    EXPECT_STREQ(CompileMode(spec), mode);
  }
  spec.set_model_family(v1::MODEL_FAMILY_DENSE);
  spec.mutable_mesh()->set_host_replicas(2);  // the hosts average gradients: grad + apply
  EXPECT_STREQ(CompileMode(spec), "B");
}

}  // namespace
}  // namespace meshrun::jobspec
