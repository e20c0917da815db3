// The runtime conformance suite: one set of behaviours every backend of RegisterRuntimes must
// show, run against each backend that is present on this machine. A backend whose plugin is
// absent is skipped with a message naming what is missing.
#include <sys/stat.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "runtime/backends.h"
#include "runtime/compile_options.h"
#include "runtime/runtime.h"

namespace meshrun::runtime {
namespace {

using Outputs = std::vector<std::vector<std::unique_ptr<DeviceBuffer>>>;

// ---- programs (StableHLO text written for these tests) ----

constexpr char kAxpy[] = R"mlir(
module @axpy {
  func.func public @main(%x: tensor<4xf32>, %y: tensor<4xf32>) -> tensor<4xf32> {
    %two = stablehlo.constant dense<2.0> : tensor<4xf32>
    %0 = stablehlo.multiply %x, %two : tensor<4xf32>
    %1 = stablehlo.add %0, %y : tensor<4xf32>
    return %1 : tensor<4xf32>
  }
})mlir";

// Transcendentals and a reduction: enough arithmetic that a different compilation would show.
constexpr char kNumeric[] = R"mlir(
module @numeric {
  func.func public @main(%x: tensor<256xf32>) -> (tensor<256xf32>, tensor<f32>) {
    %0 = stablehlo.sine %x : tensor<256xf32>
    %1 = stablehlo.exponential %0 : tensor<256xf32>
    %2 = stablehlo.tanh %1 : tensor<256xf32>
    %3 = stablehlo.multiply %2, %x : tensor<256xf32>
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %4 = stablehlo.reduce(%3 init: %zero) applies stablehlo.add across dimensions = [0]
        : (tensor<256xf32>, tensor<f32>) -> tensor<f32>
    return %3, %4 : tensor<256xf32>, tensor<f32>
  }
})mlir";

// x * 2 + sum(x) over a 32-element vector sharded 8 ways: needs a cross-device reduction.
constexpr char kSpmd8[] = R"mlir(
module @spmd attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["data"=8]>
  func.func public @main(%x: tensor<32xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}]>})
      -> (tensor<32xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}]>}) {
    %two = stablehlo.constant dense<2.0> : tensor<32xf32>
    %0 = stablehlo.multiply %x, %two : tensor<32xf32>
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %1 = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [0]
        : (tensor<32xf32>, tensor<f32>) -> tensor<f32>
    %2 = stablehlo.broadcast_in_dim %1, dims = [] : (tensor<f32>) -> tensor<32xf32>
    %3 = stablehlo.add %0, %2 : tensor<32xf32>
    return %3 : tensor<32xf32>
  }
})mlir";

// state + delta, with the state aliased to the output (what JAX's donate_argnums writes).
constexpr char kDonate[] = R"mlir(
module @donate {
  func.func public @main(%state: tensor<4xf32> {tf.aliasing_output = 0 : i32},
                         %delta: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.add %state, %delta : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
})mlir";

// Type error: the verifier rejects adding f32[4] to f32[5].
constexpr char kMalformed[] = R"mlir(
module @malformed {
  func.func public @main(%x: tensor<4xf32>, %y: tensor<5xf32>) -> tensor<4xf32> {
    %0 = stablehlo.add %x, %y : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
})mlir";

ArrayShape F32(std::vector<int64_t> dims) { return {DType::kF32, std::move(dims)}; }

HostArray Floats(std::vector<float> values) {
  const int64_t n = static_cast<int64_t>(values.size());
  return HostArray::From(DType::kF32, {n}, values);
}

ProgramSignature AxpySignature() {
  return {{{"x", F32({4})}, {"y", F32({4})}}, {{"out", F32({4})}}};
}

bool FileExists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

std::string PluginPath() {
  const char* env = std::getenv("MESHRUN_PJRT_PLUGIN");
  return env != nullptr && *env != '\0' ? env : DefaultPjrtPluginPath();
}

// The config a backend needs here, or why it cannot run on this machine.
absl::StatusOr<RuntimeConfig> ConfigFor(const std::string& kind) {
  RuntimeConfig config;
  if (kind == "pjrt") {
    config.plugin_path = PluginPath();
    if (!FileExists(config.plugin_path)) {
      return absl::NotFoundError("PJRT plugin missing at " + config.plugin_path +
                                 " (run scripts/setup.sh, or set MESHRUN_PJRT_PLUGIN)");
    }
    // XLA's CPU plugin makes as many devices as asked; other plugins may refuse the option.
    if (absl::StrContains(config.plugin_path, "cpu")) config.cpu_device_count = 8;
  }
  return config;
}

std::vector<std::string> BackendKinds() {
  RuntimeRegistry registry;
  EXPECT_TRUE(RegisterRuntimes(registry).ok());
  return registry.kinds();
}

TEST(ConformanceSuite, HasBackends) {
  if (BackendKinds().empty()) GTEST_SKIP() << "no runtime backend built (MESHRUN_WITH_PJRT=OFF)";
}

class Conformance : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    absl::StatusOr<RuntimeConfig> config = ConfigFor(GetParam());
    if (!config.ok()) GTEST_SKIP() << GetParam() << ": " << config.status().message();
    config_ = *config;
    RuntimeRegistry registry;
    ASSERT_TRUE(RegisterRuntimes(registry).ok());
    absl::StatusOr<std::unique_ptr<Runtime>> runtime = registry.Create(GetParam(), config_);
    ASSERT_TRUE(runtime.ok()) << runtime.status();
    runtime_ = *std::move(runtime);
  }

  std::unique_ptr<Executable> CompileOrDie(const char* code, std::vector<int64_t> device_ids,
                                           std::optional<ProgramSignature> signature = {}) {
    absl::StatusOr<std::string> options = BuildCompileOptions(SpmdCompileOptions(device_ids));
    EXPECT_TRUE(options.ok()) << options.status();
    absl::StatusOr<std::unique_ptr<Executable>> exe =
        runtime_->Compile({code, "mlir", *options, std::move(signature)});
    EXPECT_TRUE(exe.ok()) << exe.status();
    return exe.ok() ? *std::move(exe) : nullptr;
  }

  std::unique_ptr<DeviceBuffer> Put(const HostArray& array, int device) {
    absl::StatusOr<std::unique_ptr<DeviceBuffer>> buffer = runtime_->ToDevice(array, device);
    EXPECT_TRUE(buffer.ok()) << buffer.status();
    return buffer.ok() ? *std::move(buffer) : nullptr;
  }

  std::vector<float> Get(const DeviceBuffer& buffer) {
    absl::StatusOr<HostArray> host = runtime_->ToHost(buffer);
    EXPECT_TRUE(host.ok()) << host.status();
    return host.ok() ? host->As<float>() : std::vector<float>{};
  }

  // Global ids of the first n addressable devices, or skip when there are fewer.
  std::vector<int64_t> FirstDevices(size_t n) {
    std::vector<int64_t> ids;
    for (const DeviceDescription& d : runtime_->addressable_devices()) {
      if (ids.size() < n) ids.push_back(d.global_id);
    }
    return ids;
  }

  RuntimeConfig config_;
  std::unique_ptr<Runtime> runtime_;
};

TEST_P(Conformance, ListsDevicesWithRuntimeNames) {
  const RuntimeIdentity& identity = runtime_->identity();
  EXPECT_FALSE(identity.platform_name.empty());
  EXPECT_EQ(identity.plugin_sha256.size(), 64u);
  EXPECT_GT(identity.pjrt_api_major + identity.pjrt_api_minor, 0u);
  ASSERT_FALSE(runtime_->addressable_devices().empty());
  EXPECT_GE(runtime_->devices().size(), runtime_->addressable_devices().size());
  for (size_t i = 0; i < runtime_->addressable_devices().size(); ++i) {
    const DeviceDescription& d = runtime_->addressable_devices()[i];
    EXPECT_EQ(d.local_id, static_cast<int>(i));
    EXPECT_FALSE(d.kind.empty());
    const std::string prefix = identity.platform_name == "tpu" ? "TPU" : identity.platform_name;
    EXPECT_EQ(d.runtime_name, prefix + ":" + std::to_string(d.global_id));
  }
  if (identity.platform_name == "cpu") {
    ASSERT_EQ(runtime_->addressable_devices().size(), 8u);  // cpu_device_count=8
    EXPECT_EQ(runtime_->addressable_devices()[5].runtime_name, "cpu:5");
    EXPECT_EQ(runtime_->addressable_devices()[5].process_index, 0);
  }
}

TEST_P(Conformance, CompilesAndExecutes) {
  std::unique_ptr<Executable> exe = CompileOrDie(kAxpy, FirstDevices(1), AxpySignature());
  ASSERT_NE(exe, nullptr);
  EXPECT_EQ(exe->device_indices(), std::vector<int>{0});
  ASSERT_EQ(exe->output_shapes().size(), 1u);
  EXPECT_EQ(exe->output_shapes()[0], F32({4}));
  auto x = Put(Floats({0, 1, 2, 3}), 0);
  auto y = Put(Floats({10, 10, 10, 10}), 0);
  absl::StatusOr<Outputs> out = runtime_->Execute(*exe, {{x.get(), y.get()}}, {});
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 1u);
  ASSERT_EQ((*out)[0].size(), 1u);
  EXPECT_EQ((*out)[0][0]->shape(), F32({4}));
  EXPECT_EQ(Get(*(*out)[0][0]), (std::vector<float>{10, 12, 14, 16}));
}

TEST_P(Conformance, CompilesMultiOutputProgram) {
  std::unique_ptr<Executable> exe = CompileOrDie(kNumeric, FirstDevices(1));
  ASSERT_NE(exe, nullptr);
  EXPECT_EQ(exe->output_shapes().size(), 2u);
}

TEST_P(Conformance, SerializeThenDeserializeGivesBitIdenticalOutputs) {
  std::unique_ptr<Executable> exe = CompileOrDie(kNumeric, FirstDevices(1));
  ASSERT_NE(exe, nullptr);
  absl::StatusOr<std::string> bytes = runtime_->Serialize(*exe);
  if (absl::IsUnimplemented(bytes.status())) GTEST_SKIP() << bytes.status().message();
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  ASSERT_FALSE(bytes->empty());
  absl::StatusOr<std::unique_ptr<Executable>> loaded = runtime_->DeserializeAndLoad(*bytes, {});
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)->output_shapes(), exe->output_shapes());
  EXPECT_EQ((*loaded)->fingerprint(), exe->fingerprint());

  std::vector<float> x(256);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.37f * static_cast<float>(i) - 41.0f;
  auto in = Put(Floats(x), 0);
  absl::StatusOr<Outputs> a = runtime_->Execute(*exe, {{in.get()}}, {});
  absl::StatusOr<Outputs> b = runtime_->Execute(**loaded, {{in.get()}}, {});
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  for (size_t i = 0; i < 2; ++i) {
    absl::StatusOr<HostArray> ha = runtime_->ToHost(*(*a)[0][i]);
    absl::StatusOr<HostArray> hb = runtime_->ToHost(*(*b)[0][i]);
    ASSERT_TRUE(ha.ok() && hb.ok());
    EXPECT_EQ(ha->bytes, hb->bytes) << "output " << i << " differs after deserialize-and-load";
  }

  absl::StatusOr<std::unique_ptr<Executable>> garbage =
      runtime_->DeserializeAndLoad("not an executable", {});
  EXPECT_FALSE(garbage.ok());
}

TEST_P(Conformance, ExecutesOnEightDevices) {
  std::vector<int64_t> ids = FirstDevices(8);
  if (ids.size() < 8) GTEST_SKIP() << "needs 8 addressable devices, backend has " << ids.size();
  std::unique_ptr<Executable> exe = CompileOrDie(kSpmd8, ids);
  ASSERT_NE(exe, nullptr);
  ASSERT_EQ(exe->device_indices().size(), 8u);
  EXPECT_EQ(exe->output_shapes()[0], F32({4}));  // per-device shard
  std::vector<std::unique_ptr<DeviceBuffer>> shards;
  std::vector<std::vector<DeviceBuffer*>> args;
  for (int d = 0; d < 8; ++d) {
    std::vector<float> shard;
    for (int i = 0; i < 4; ++i) shard.push_back(static_cast<float>(4 * d + i));
    shards.push_back(Put(Floats(shard), exe->device_indices()[d]));
    args.push_back({shards.back().get()});
  }
  absl::StatusOr<Outputs> out = runtime_->Execute(*exe, args, {});
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 8u);
  for (int d = 0; d < 8; ++d) {
    EXPECT_EQ((*out)[d][0]->device_index(), exe->device_indices()[d]);
    std::vector<float> expected;
    for (int i = 0; i < 4; ++i) expected.push_back(2.0f * (4 * d + i) + 496.0f);  // sum 0..31
    EXPECT_EQ(Get(*(*out)[d][0]), expected) << "device " << d;
  }
}

TEST_P(Conformance, DonatedStateIsConsumedAndKeptInputsSurvive) {
  ProgramSignature signature{{{"state", F32({4})}, {"delta", F32({4})}}, {{"state", F32({4})}}};
  std::unique_ptr<Executable> exe = CompileOrDie(kDonate, FirstDevices(1), signature);
  ASSERT_NE(exe, nullptr);
  auto state = Put(Floats({1, 2, 3, 4}), 0);
  auto delta = Put(Floats({1, 1, 1, 1}), 0);

  // Not donated: the state buffer stays usable.
  absl::StatusOr<Outputs> kept = runtime_->Execute(*exe, {{state.get(), delta.get()}}, {});
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_FALSE(state->IsDeleted());

  // Donated: the step consumes the state; the delta is kept.
  absl::StatusOr<Outputs> out =
      runtime_->Execute(*exe, {{state.get(), delta.get()}}, {.donate_inputs = {0}});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(state->IsDeleted());
  EXPECT_FALSE(delta->IsDeleted());
  EXPECT_EQ(Get(*(*out)[0][0]), (std::vector<float>{2, 3, 4, 5}));

  // Steps chain on the returned state, donating it each time.
  std::unique_ptr<DeviceBuffer> next = std::move((*out)[0][0]);
  for (int step = 0; step < 3; ++step) {
    absl::StatusOr<Outputs> o =
        runtime_->Execute(*exe, {{next.get(), delta.get()}}, {.donate_inputs = {0}});
    ASSERT_TRUE(o.ok()) << o.status();
    EXPECT_TRUE(next->IsDeleted());
    next = std::move((*o)[0][0]);
  }
  EXPECT_EQ(Get(*next), (std::vector<float>{5, 6, 7, 8}));

  // Using a consumed buffer again is refused before anything runs.
  const int64_t executions = runtime_->counters().executions;
  absl::StatusOr<Outputs> again = runtime_->Execute(*exe, {{state.get(), delta.get()}}, {});
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition) << again.status();
  EXPECT_TRUE(absl::StrContains(again.status().message(), "'state'")) << again.status();
  EXPECT_EQ(runtime_->counters().executions, executions);
  EXPECT_EQ(runtime_->ToHost(*state).status().code(), absl::StatusCode::kFailedPrecondition);
}

// Launch returns before the execution completes: steps chain on state still being computed,
// two in flight at a time as the step loop runs them, and end where Execute's chain ends.
TEST_P(Conformance, LaunchedStepsChainOnStateStillBeingComputed) {
  ProgramSignature signature{{{"state", F32({4})}, {"delta", F32({4})}}, {{"state", F32({4})}}};
  std::unique_ptr<Executable> exe = CompileOrDie(kDonate, FirstDevices(1), signature);
  ASSERT_NE(exe, nullptr);
  auto delta = Put(Floats({1, 1, 1, 1}), 0);
  std::unique_ptr<DeviceBuffer> state = Put(Floats({1, 2, 3, 4}), 0);
  const int64_t executions = runtime_->counters().executions;
  std::unique_ptr<ExecutionEvent> previous;
  for (int step = 0; step < 20; ++step) {
    absl::StatusOr<LaunchedExecution> launched =
        runtime_->Launch(*exe, {{state.get(), delta.get()}}, {.donate_inputs = {0}});
    ASSERT_TRUE(launched.ok()) << launched.status();
    ASSERT_NE(launched->done, nullptr);
    if (previous != nullptr) {
      ASSERT_TRUE(previous->Await().ok());
    }
    EXPECT_TRUE(previous == nullptr || previous->Await().ok());  // awaiting again is harmless
    previous = std::move(launched->done);
    state = std::move(launched->outputs[0][0]);
  }
  ASSERT_TRUE(previous->Await().ok());
  EXPECT_EQ(Get(*state), (std::vector<float>{21, 22, 23, 24}));
  EXPECT_EQ(runtime_->counters().executions - executions, 20);
  // A launch refused before it runs says why, as Execute does.
  auto consumed = Put(Floats({0, 0, 0, 0}), 0);
  ASSERT_TRUE(
      runtime_->Execute(*exe, {{consumed.get(), delta.get()}}, {.donate_inputs = {0}}).ok());
  absl::StatusOr<LaunchedExecution> again =
      runtime_->Launch(*exe, {{consumed.get(), delta.get()}}, {});
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition) << again.status();
}

TEST_P(Conformance, CountsEveryTransfer) {
  std::unique_ptr<Executable> exe = CompileOrDie(kAxpy, FirstDevices(1), AxpySignature());
  ASSERT_NE(exe, nullptr);
  const RuntimeCounters before = runtime_->counters();
  auto x = Put(Floats({0, 1, 2, 3}), 0);
  auto y = Put(Floats({1, 1, 1, 1}), 0);
  absl::StatusOr<Outputs> out = runtime_->Execute(*exe, {{x.get(), y.get()}}, {});
  ASSERT_TRUE(out.ok()) << out.status();
  Get(*(*out)[0][0]);
  const RuntimeCounters after = runtime_->counters();
  EXPECT_EQ(after.host_to_device.count - before.host_to_device.count, 2);
  EXPECT_EQ(after.host_to_device.bytes - before.host_to_device.bytes, 32);
  EXPECT_GT(after.host_to_device.time, before.host_to_device.time);
  EXPECT_EQ(after.device_to_host.count - before.device_to_host.count, 1);
  EXPECT_EQ(after.device_to_host.bytes - before.device_to_host.bytes, 16);
  EXPECT_GT(after.device_to_host.time, before.device_to_host.time);
  EXPECT_EQ(after.executions - before.executions, 1);
  // Executing moves nothing between host and device.
  ASSERT_TRUE(runtime_->Execute(*exe, {{x.get(), y.get()}}, {}).ok());
  EXPECT_EQ(runtime_->counters().host_to_device.count, after.host_to_device.count);
  EXPECT_EQ(runtime_->counters().device_to_host.count, after.device_to_host.count);
}

TEST_P(Conformance, ReportsMemoryByRuntimeNameNeverAsZero) {
  for (const DeviceDescription& d : runtime_->addressable_devices()) {
    absl::StatusOr<MemoryStats> stats = runtime_->GetMemoryStats(d.runtime_name);
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->runtime_name, d.runtime_name);
    const bool complete = stats->bytes_in_use && stats->peak_bytes_in_use && stats->bytes_limit;
    EXPECT_EQ(stats->unreported_reason.empty(), complete) << stats->unreported_reason;
    if (stats->bytes_limit) {
      EXPECT_GT(*stats->bytes_limit, 0);
    }
    if (runtime_->identity().platform_name == "cpu") {
      EXPECT_FALSE(stats->bytes_in_use.has_value());
      EXPECT_TRUE(absl::StrContains(stats->unreported_reason, "not reported by this plugin"))
          << stats->unreported_reason;
    }
  }
  absl::StatusOr<MemoryStats> missing = runtime_->GetMemoryStats("nosuch:99");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(missing.status().message(),
                                runtime_->addressable_devices()[0].runtime_name));
}

TEST_P(Conformance, MalformedProgramIsInvalidArgumentWithCompilerMessage) {
  absl::StatusOr<std::string> options = BuildCompileOptions(SpmdCompileOptions(FirstDevices(1)));
  ASSERT_TRUE(options.ok());
  absl::StatusOr<std::unique_ptr<Executable>> exe =
      runtime_->Compile({kMalformed, "mlir", *options, {}});
  ASSERT_EQ(exe.status().code(), absl::StatusCode::kInvalidArgument) << exe.status();
  // The compiler's own words reach the caller: it names the offending type.
  EXPECT_TRUE(absl::StrContains(exe.status().message(), "tensor<5xf32>")) << exe.status();

  absl::StatusOr<std::unique_ptr<Executable>> garbage =
      runtime_->Compile({"this is not a program", "mlir", *options, {}});
  EXPECT_EQ(garbage.status().code(), absl::StatusCode::kInvalidArgument) << garbage.status();
}

TEST_P(Conformance, SignatureDisagreeingWithProgramIsRefusedAtCompile) {
  ProgramSignature wrong = AxpySignature();
  wrong.outputs[0].shape = F32({5});
  absl::StatusOr<std::string> options = BuildCompileOptions(SpmdCompileOptions(FirstDevices(1)));
  absl::StatusOr<std::unique_ptr<Executable>> exe =
      runtime_->Compile({kAxpy, "mlir", *options, wrong});
  EXPECT_EQ(exe.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(exe.status().message(), "f32[5]")) << exe.status();
}

// limits (issue 16): declared inputs are checked against the compiled program's parameters,
// at compile and at load, naming the input.
TEST_P(Conformance, InputsDisagreeingWithProgramAreRefusedAtCompileAndLoad) {
  absl::StatusOr<std::string> options = BuildCompileOptions(SpmdCompileOptions(FirstDevices(1)));
  ASSERT_TRUE(options.ok());
  ProgramSignature wrong_shape = AxpySignature();
  wrong_shape.inputs[1].shape = F32({8});
  absl::StatusOr<std::unique_ptr<Executable>> exe =
      runtime_->Compile({kAxpy, "mlir", *options, wrong_shape});
  EXPECT_EQ(exe.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(exe.status().message(),
                                "input 1 'y': the job declares f32[8] per device, the compiled "
                                "program takes f32[4]"))
      << exe.status();
  ProgramSignature wrong_type = AxpySignature();
  wrong_type.inputs[0].shape.dtype = DType::kS32;
  exe = runtime_->Compile({kAxpy, "mlir", *options, wrong_type});
  EXPECT_TRUE(absl::StrContains(exe.status().message(), "input 0 'x'")) << exe.status();
  ProgramSignature extra = AxpySignature();
  extra.inputs.push_back({"z", F32({4})});
  exe = runtime_->Compile({kAxpy, "mlir", *options, extra});
  EXPECT_TRUE(absl::StrContains(exe.status().message(),
                                "the job declares 3 inputs, the compiled program takes 2"))
      << exe.status();

  std::unique_ptr<Executable> good = CompileOrDie(kAxpy, FirstDevices(1), AxpySignature());
  ASSERT_NE(good, nullptr);
  absl::StatusOr<std::string> bytes = runtime_->Serialize(*good);
  if (absl::IsUnimplemented(bytes.status())) return;
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<std::unique_ptr<Executable>> loaded =
      runtime_->DeserializeAndLoad(*bytes, wrong_shape);
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(loaded.status().message(), "input 1 'y'")) << loaded.status();
  EXPECT_TRUE(runtime_->DeserializeAndLoad(*bytes, AxpySignature()).ok());
}

TEST_P(Conformance, WrongInputsAreRefusedBeforeExecution) {
  std::unique_ptr<Executable> exe = CompileOrDie(kAxpy, FirstDevices(1), AxpySignature());
  ASSERT_NE(exe, nullptr);
  auto x = Put(Floats({0, 1, 2, 3}), 0);
  auto wide = Put(Floats({0, 1, 2, 3, 4}), 0);
  auto ints = Put(HostArray::From<int32_t>(DType::kS32, {4}, {0, 1, 2, 3}), 0);
  const int64_t executions = runtime_->counters().executions;

  absl::StatusOr<Outputs> shape = runtime_->Execute(*exe, {{x.get(), wide.get()}}, {});
  EXPECT_EQ(shape.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(shape.status().message(), "'y'")) << shape.status();
  EXPECT_TRUE(absl::StrContains(shape.status().message(), "expected f32[4], got f32[5]"))
      << shape.status();

  absl::StatusOr<Outputs> dtype = runtime_->Execute(*exe, {{ints.get(), x.get()}}, {});
  EXPECT_EQ(dtype.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(dtype.status().message(), "expected f32[4], got s32[4]"))
      << dtype.status();

  absl::StatusOr<Outputs> count = runtime_->Execute(*exe, {{x.get()}}, {});
  EXPECT_EQ(count.status().code(), absl::StatusCode::kInvalidArgument) << count.status();

  absl::StatusOr<Outputs> devices = runtime_->Execute(*exe, {{x.get(), x.get()}, {}}, {});
  EXPECT_EQ(devices.status().code(), absl::StatusCode::kInvalidArgument) << devices.status();

  if (runtime_->addressable_devices().size() > 1) {
    auto elsewhere = Put(Floats({0, 1, 2, 3}), 1);
    absl::StatusOr<Outputs> placed = runtime_->Execute(*exe, {{x.get(), elsewhere.get()}}, {});
    EXPECT_EQ(placed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(placed.status().message(),
                                  runtime_->addressable_devices()[1].runtime_name))
        << placed.status();
  }
  EXPECT_EQ(runtime_->counters().executions, executions);

  EXPECT_EQ(runtime_->ToDevice(Floats({1}), 1000).status().code(),
            absl::StatusCode::kInvalidArgument);
  HostArray short_array = Floats({1, 2});
  short_array.shape.dims = {3};
  EXPECT_EQ(runtime_->ToDevice(short_array, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(Conformance, StartsWithKeyValueCallbacks) {
  RuntimeConfig config = config_;
  auto kv = std::make_shared<InMemoryKeyValueClient>();
  config.kv_client = kv;
  RuntimeRegistry registry;
  ASSERT_TRUE(RegisterRuntimes(registry).ok());
  absl::StatusOr<std::unique_ptr<Runtime>> runtime = registry.Create(GetParam(), config);
  ASSERT_TRUE(runtime.ok()) << runtime.status();
  EXPECT_EQ((*runtime)->addressable_devices().size(), runtime_->addressable_devices().size());
}

INSTANTIATE_TEST_SUITE_P(Backends, Conformance, testing::ValuesIn(BackendKinds()),
                         [](const testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(Conformance);

// ---- how the PJRT backend fails to start: no plugin needed ----

class PjrtStartErrors : public testing::Test {
 protected:
  void SetUp() override {
    if (!BackendKindsContain("pjrt")) GTEST_SKIP() << "built without MESHRUN_WITH_PJRT";
  }
  static bool BackendKindsContain(const std::string& kind) {
    for (const std::string& k : BackendKinds()) {
      if (k == kind) return true;
    }
    return false;
  }
  absl::Status Start(const std::string& path) {
    RuntimeRegistry registry;
    EXPECT_TRUE(RegisterRuntimes(registry).ok());
    RuntimeConfig config;
    config.plugin_path = path;
    return registry.Create("pjrt", config).status();
  }
};

TEST_F(PjrtStartErrors, MissingPluginNamesThePath) {
  const std::string path = "/nonexistent/dir/libmissing_pjrt.so";
  absl::Status status = Start(path);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(status.message(), path)) << status;
  EXPECT_EQ(Start("").code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(PjrtStartErrors, FileThatIsNotAPluginNamesThePath) {
  const std::string not_elf = std::string(MESHRUN_SOURCE_DIR) + "/runtime/runtime.h";
  absl::Status status = Start(not_elf);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(status.message(), not_elf)) << status;

  // A real shared library that is not a PJRT plugin.
  for (const char* lib : {"/lib/x86_64-linux-gnu/libz.so.1", "/usr/lib/x86_64-linux-gnu/libz.so.1"}) {
    if (!FileExists(lib)) continue;
    absl::Status s = Start(lib);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(s.message(), "is not a PJRT plugin")) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), lib)) << s;
    break;
  }
}

TEST(RuntimeRegistry, UnknownKindNamesTheBuiltOnes) {
  RuntimeRegistry registry;
  ASSERT_TRUE(RegisterRuntimes(registry).ok());
  if (!registry.kinds().empty()) {
    EXPECT_EQ(RegisterRuntimes(registry).code(), absl::StatusCode::kAlreadyExists);
  }
  absl::Status status = registry.Create("nosuch", {}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  for (const std::string& kind : registry.kinds()) {
    EXPECT_TRUE(absl::StrContains(status.message(), kind)) << status;
  }
}

}  // namespace
}  // namespace meshrun::runtime
