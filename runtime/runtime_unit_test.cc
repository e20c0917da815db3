// Fast tests of the runtime's plain parts: compile options (against the bytes JAX writes),
// dtypes and shapes, the in-memory key-value client, argument checks, example sharding.
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "common/path_roots.h"
#include "gtest/gtest.h"
#include "runtime/compile_options.h"
#include "bundle/example_job.h"
#include "runtime/shard.h"
#include "runtime/kv_client.h"
#include "runtime/runtime.h"

namespace meshrun::runtime {
namespace {

std::string ReadExample(const std::string& relative) {
  std::ifstream in(std::string(MESHRUN_SOURCE_DIR) + "/examples/" + relative, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// ---- compile options ----

TEST(CompileOptions, MatchWhatJaxWritesOnEveryFieldMeshrunSets) {
  for (int n : {1, 8}) {
    const std::string jax = ReadExample("jax_compile_options/partitions_" + std::to_string(n) + ".pb");
    ASSERT_FALSE(jax.empty()) << "examples/jax_compile_options missing";
    std::vector<int64_t> ids;
    for (int i = 0; i < n; ++i) ids.push_back(i);
    const CompileOptionsSpec spec = SpmdCompileOptions(ids);
    absl::StatusOr<std::string> ours = BuildCompileOptions(spec);
    ASSERT_TRUE(ours.ok()) << ours.status();

    // JAX's bytes read through meshrun's message give the same spec...
    absl::StatusOr<CompileOptionsSpec> parsed = ParseCompileOptions(jax);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, spec);
    // ...and, reduced to the fields meshrun models, the very same bytes as meshrun writes.
    absl::StatusOr<std::string> canonical = CanonicalCompileOptions(jax);
    ASSERT_TRUE(canonical.ok());
    EXPECT_EQ(*canonical, *ours) << n << " partitions";
    // JAX writes more (its debug options); meshrun leaves those to the plugin's defaults.
    EXPECT_LT(ours->size(), jax.size());
  }
}

TEST(CompileOptions, DeviceAssignmentIsReplicaMajorAsXlaReadsIt) {
  CompileOptionsSpec spec;
  spec.num_replicas = 2;
  spec.num_partitions = 3;
  spec.device_assignment = {{4, 5, 6}, {7, 8, 9}};
  spec.process_index = 1;
  spec.process_count = 2;
  absl::StatusOr<std::string> bytes = BuildCompileOptions(spec);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<CompileOptionsSpec> back = ParseCompileOptions(*bytes);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, spec);
}

TEST(CompileOptions, RefusesInconsistentSpecs) {
  CompileOptionsSpec spec = SpmdCompileOptions({0, 1});
  spec.num_partitions = 3;
  EXPECT_EQ(BuildCompileOptions(spec).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BuildCompileOptions(SpmdCompileOptions({0, 0})).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BuildCompileOptions(SpmdCompileOptions({})).status().code(),
            absl::StatusCode::kInvalidArgument);
  CompileOptionsSpec process = SpmdCompileOptions({0});
  process.process_index = 2;
  EXPECT_EQ(BuildCompileOptions(process).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseCompileOptions("\xff\xff garbage").status().code(),
            absl::StatusCode::kInvalidArgument);
}

// security (issue 27, item 2): a job's compile options reach a compiler only as rebuilt from the
// fields a user may set; XLA's debug options (xla_dump_to: files written anywhere) are refused.
std::string LengthDelimited(int field, const std::string& payload) {
  return std::string(1, static_cast<char>(field << 3 | 2)) +
         std::string(1, static_cast<char>(payload.size())) + payload;
}

TEST(CompileOptions, ClientOptionsAreRebuiltFromTheAllowedFieldsAlone) {
  CompileOptionsSpec spec = SpmdCompileOptions({0, 1});
  spec.xla_flags["xla_tpu_enable_latency_hiding_scheduler"] = true;
  spec.xla_flags["xla_latency_hiding_scheduler_rerun"] = int64_t{2};
  absl::StatusOr<std::string> allowed = BuildCompileOptions(spec);
  ASSERT_TRUE(allowed.ok()) << allowed.status();
  absl::StatusOr<std::string> rebuilt = RebuildClientCompileOptions(*allowed, "compile_options");
  ASSERT_TRUE(rebuilt.ok()) << rebuilt.status();
  EXPECT_EQ(ParseCompileOptions(*rebuilt).value(), spec);

  // executable_build_options { num_partitions: 2  debug_options { xla_dump_to: "/tmp/x" } }
  const std::string dump = LengthDelimited(3, std::string("\x28\x02", 2) +
                                                  LengthDelimited(3, LengthDelimited(8, "/tmp/x")));
  absl::Status refused = RebuildClientCompileOptions(dump, "programs[0].compile_options").status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(refused.message(), "programs[0].compile_options sets "
                                                   "executable_build_options.debug_options"))
      << refused;
  // env_option_overrides { key: "xla_dump_to" value { string_field: "/tmp/x" } }
  const std::string flag =
      LengthDelimited(7, LengthDelimited(1, "xla_dump_to") +
                             LengthDelimited(2, LengthDelimited(1, "/tmp/x")));
  refused = RebuildClientCompileOptions(flag, "compile_options").status();
  EXPECT_TRUE(absl::StrContains(refused.message(), "the XLA flag xla_dump_to")) << refused;
  const std::string string_value = LengthDelimited(
      7, LengthDelimited(1, "xla_cpu_enable_fast_math") +
             LengthDelimited(2, LengthDelimited(1, "yes")));
  refused = RebuildClientCompileOptions(string_value, "compile_options").status();
  EXPECT_TRUE(absl::StrContains(refused.message(), "takes a bool or an integer")) << refused;
  // argument_layouts (field 1 of CompileOptionsProto), a field meshrun does not model.
  refused = RebuildClientCompileOptions(LengthDelimited(1, ""), "compile_options").status();
  EXPECT_TRUE(absl::StrContains(refused.message(), "argument_layouts (field 1)")) << refused;
}

// ---- types ----

TEST(Types, NamesAndSizes) {
  EXPECT_EQ(ParseDType("f32").value(), DType::kF32);
  EXPECT_EQ(ParseDType("float32").value(), DType::kF32);
  EXPECT_EQ(ParseDType("bfloat16").value(), DType::kBF16);
  EXPECT_EQ(ParseDType("u32").value(), DType::kU32);
  EXPECT_EQ(ParseDType("complex64").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DTypeName(DType::kS32), "s32");
  EXPECT_EQ(DTypeByteSize(DType::kBF16), 2);
  ArrayShape shape{DType::kF32, {16, 32}};
  EXPECT_EQ(shape.ByteSize(), 16 * 32 * 4);
  EXPECT_EQ(ToString(shape), "f32[16,32]");
  EXPECT_EQ(ToString(ArrayShape{DType::kS32, {}}), "s32[]");
  EXPECT_EQ(HostArray::From<float>(DType::kF32, {2}, {1.5f, 2.5f}).As<float>(),
            (std::vector<float>{1.5f, 2.5f}));
}

// ---- key-value client ----

TEST(InMemoryKeyValueClient, GetWaitsForSetAndTimesOut) {
  InMemoryKeyValueClient kv;
  EXPECT_EQ(kv.TryGet("a").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(kv.Get("a", absl::Milliseconds(10)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(20));
    ASSERT_TRUE(kv.Set("a", "value").ok());
  });
  absl::StatusOr<std::string> value = kv.Get("a", absl::Seconds(10));
  setter.join();
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "value");
  EXPECT_EQ(kv.TryGet("a").value(), "value");
}

// ---- argument checks shared by backends ----

class FakeBuffer final : public DeviceBuffer {
 public:
  FakeBuffer(ArrayShape shape, int device, bool deleted = false)
      : shape_(std::move(shape)), device_(device), deleted_(deleted) {}
  const ArrayShape& shape() const override { return shape_; }
  int device_index() const override { return device_; }
  bool IsDeleted() const override { return deleted_; }

 private:
  ArrayShape shape_;
  int device_;
  bool deleted_;
};

class FakeExecutable final : public Executable {
 public:
  FakeExecutable(std::vector<int> devices, std::optional<ProgramSignature> signature)
      : devices_(std::move(devices)), signature_(std::move(signature)) {}
  const std::vector<int>& device_indices() const override { return devices_; }
  const std::vector<ArrayShape>& output_shapes() const override { return outputs_; }
  const std::optional<ProgramSignature>& signature() const override { return signature_; }
  const std::string& fingerprint() const override { return fingerprint_; }

 private:
  std::vector<int> devices_;
  std::vector<ArrayShape> outputs_;
  std::optional<ProgramSignature> signature_;
  std::string fingerprint_;
};

TEST(CheckExecuteArgs, NamesTheInputAndDevice) {
  const ArrayShape f32{DType::kF32, {4}};
  FakeExecutable exe({0, 1}, ProgramSignature{{{"w", f32}, {"x", f32}}, {}});
  std::vector<DeviceDescription> devices(2);
  devices[0].runtime_name = "cpu:0";
  devices[1].runtime_name = "cpu:1";
  FakeBuffer w0(f32, 0), x0(f32, 0), w1(f32, 1), x1(f32, 1);
  FakeBuffer wrong_shape({DType::kF32, {5}}, 1), gone(f32, 1, true), misplaced(f32, 0);
  EXPECT_TRUE(CheckExecuteArgs(exe, {{&w0, &x0}, {&w1, &x1}}, {}, devices).ok());

  absl::Status s = CheckExecuteArgs(exe, {{&w0, &x0}, {&w1, &wrong_shape}}, {}, devices);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "input 1 'x' for cpu:1: expected f32[4], got f32[5]"))
      << s;
  s = CheckExecuteArgs(exe, {{&w0, &x0}, {&gone, &x1}}, {}, devices);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  s = CheckExecuteArgs(exe, {{&w0, &x0}, {&misplaced, &x1}}, {}, devices);
  EXPECT_TRUE(absl::StrContains(s.message(), "lives on cpu:0")) << s;
  s = CheckExecuteArgs(exe, {{&w0, &x0}}, {}, devices);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  s = CheckExecuteArgs(exe, {{&w0, &x0}, {&w1, &x1}}, {.donate_inputs = {2}}, devices);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  s = CheckExecuteArgs(exe, {{&w0, &w0}, {&w1, &x1}}, {.donate_inputs = {0}}, devices);
  EXPECT_TRUE(absl::StrContains(s.message(), "also passed")) << s;
}

// ---- example sharding ----

TEST(ShardOf, SplitsRowsByDataAndColumnsByModel) {
  std::vector<int32_t> values(8 * 6);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<int32_t>(i);
  const HostArray global = HostArray::From(DType::kS32, {8, 6}, values);
  // mesh data=4 x model=2; partition 5 = (data 2, model 1): rows 4-5, columns 3-5.
  absl::StatusOr<HostArray> shard = ShardOf(global, {"data", "model"}, {"data", "model"}, {4, 2}, 5);
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_EQ(shard->shape.dims, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(shard->As<int32_t>(), (std::vector<int32_t>{27, 28, 29, 33, 34, 35}));
  absl::StatusOr<HostArray> replicated = ShardOf(global, {"", ""}, {"data"}, {8}, 3);
  EXPECT_EQ(replicated->bytes, global.bytes);
  EXPECT_FALSE(ShardOf(global, {"", "data"}, {"data"}, {4}, 0).ok());  // 6 does not split 4 ways
  EXPECT_FALSE(ShardOf(global, {"expert", ""}, {"data"}, {4}, 0).ok());
}

TEST(ExampleJob, LoadsTheCommittedTransformerJob) {
  absl::StatusOr<ExampleJob> job = LoadExampleJob(std::string(MESHRUN_SOURCE_DIR) +
                                                  "/examples/transformer_lm/dp4_tp2/job.json");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->mesh_axes, (std::vector<std::string>{"data", "model"}));
  EXPECT_EQ(job->batches.size(), 20u);
  EXPECT_EQ(job->reference_loss.size(), 20u);
  EXPECT_EQ(job->step.donated_inputs.size(), static_cast<size_t>(job->num_state));
  EXPECT_GE(job->OutputIndex("metrics.sink_mass"), 0);
  int64_t params = 0;
  for (const ExampleArray& a : job->init.outputs) {
    if (absl::StartsWith(a.global.name, "state.params.")) params += a.global.shape.NumElements();
  }
  EXPECT_GE(params, 1'000'000);  // "about 1-5 M parameters"
  EXPECT_LE(params, 5'000'000);
}

// A worker reads a job's bundle with its --data_root roots: every file job.json names is
// resolved against the bundle's directory and must lie under a root.
TEST(ExampleJob, FilesTheBundleNamesOutsideTheRootsAreRefused) {
  namespace fs = std::filesystem;
  const std::string examples = fs::canonical(std::string(MESHRUN_SOURCE_DIR) + "/examples");
  const std::string dp1 = examples + "/transformer_lm/dp1";
  absl::StatusOr<PathRoots> all = PathRoots::Create({examples});
  ASSERT_TRUE(all.ok()) << all.status();
  absl::StatusOr<ExampleJob> job = LoadExampleJob(dp1 + "/job.json", &*all);
  ASSERT_TRUE(job.ok()) << job.status();  // "../data.bin" stays under examples/
  EXPECT_FALSE(job->batches.empty());

  // Rooted at the bundle's own directory, its "../data.bin" climbs out.
  absl::StatusOr<PathRoots> bundle_only = PathRoots::Create({dp1});
  ASSERT_TRUE(bundle_only.ok()) << bundle_only.status();
  job = LoadExampleJob(dp1 + "/job.json", &*bundle_only);
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument) << job.status();
  EXPECT_TRUE(absl::StrContains(job.status().message(), "data.file")) << job.status();
  EXPECT_TRUE(absl::StrContains(job.status().message(), "is outside")) << job.status();
  EXPECT_TRUE(absl::StrContains(job.status().message(), "(" + dp1 + ")")) << job.status();

  // A job.json that is a symlink out of the root is refused before it is read.
  const fs::path root = fs::path(::testing::TempDir()) / "example_job_roots";
  fs::remove_all(root);
  fs::create_directories(root / "bundle");
  fs::create_symlink(dp1 + "/job.json", root / "bundle" / "job.json");
  absl::StatusOr<PathRoots> temp = PathRoots::Create({root.string()});
  ASSERT_TRUE(temp.ok()) << temp.status();
  for (const fs::path& path : {root / "bundle", root / "bundle" / "job.json"}) {
    job = LoadExampleJob(path.string(), &*temp);
    ASSERT_FALSE(job.ok()) << path;
    EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument) << job.status();
    EXPECT_TRUE(absl::StrContains(job.status().message(), "spec.data.example_bundle"))
        << job.status();
    EXPECT_TRUE(absl::StrContains(job.status().message(), "is outside")) << job.status();
  }
  fs::remove_all(root);
}

}  // namespace
}  // namespace meshrun::runtime
