// The PJRT backend of the runtime interface: drives any PJRT plugin (libtpu.so on TPU hosts,
// XLA's CPU plugin xla_cpu_pjrt.so as the embedded default) through the PJRT C API.
//
// Create() loads the plugin with dlopen + GetPjrtApi (once per process and path; plugins are
// never unloaded), refuses a plugin whose C API major version differs from the header meshrun
// was built with, initializes it, and creates a client with the config's create options and,
// when a KeyValueClient is given, kv callbacks backed by it. Functions newer than the plugin
// (past its PJRT_Api struct_size) are treated as absent: the feature is reported unavailable.
//
// Thread-safety and lifetime: as Runtime (runtime.h). The PJRT client is destroyed when the
// runtime and every executable and buffer made by it are gone.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/runtime.h"

namespace meshrun::runtime {

class PjrtRuntime final : public Runtime {
 public:
  // Errors: INVALID_ARGUMENT (empty plugin path; file is not a loadable PJRT plugin: the path
  // and dlerror named), NOT_FOUND (no file at the plugin path, named), FAILED_PRECONDITION (C API
  // major version mismatch, or a required function missing; both versions named); then the
  // plugin's own errors from PJRT_Plugin_Initialize and PJRT_Client_Create.
  static absl::StatusOr<std::unique_ptr<PjrtRuntime>> Create(const RuntimeConfig& config);
  ~PjrtRuntime() override;

  const RuntimeIdentity& identity() const override;
  const std::vector<DeviceDescription>& devices() const override;
  const std::vector<DeviceDescription>& addressable_devices() const override;
  absl::StatusOr<std::unique_ptr<Executable>> Compile(const ProgramSource& program) override;
  absl::StatusOr<std::string> Serialize(const Executable& executable) override;
  absl::StatusOr<std::unique_ptr<Executable>> DeserializeAndLoad(
      absl::string_view serialized, std::optional<ProgramSignature> signature) override;
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> ToDevice(const HostArray& array,
                                                         int device_index) override;
  absl::StatusOr<HostArray> ToHost(const DeviceBuffer& buffer) override;
  absl::StatusOr<std::vector<std::vector<std::unique_ptr<DeviceBuffer>>>> Execute(
      const Executable& executable, absl::Span<const std::vector<DeviceBuffer*>> args,
      const ExecuteOptions& options) override;
  absl::StatusOr<LaunchedExecution> Launch(const Executable& executable,
                                           absl::Span<const std::vector<DeviceBuffer*>> args,
                                           const ExecuteOptions& options) override;
  absl::StatusOr<ExecutableStats> Stats(const Executable& executable) override;
  absl::StatusOr<MemoryStats> GetMemoryStats(absl::string_view runtime_name) override;
  RuntimeCounters counters() const override;

  // The plugin's PJRT_Plugin_Attributes as strings ("stablehlo_current_version" -> "[1,13,3]").
  const std::map<std::string, std::string>& plugin_attributes() const;

  struct State;  // the PJRT client and its tables; shared with executables and buffers

 private:
  explicit PjrtRuntime(std::shared_ptr<State> state);

  std::shared_ptr<State> state_;
};

}  // namespace meshrun::runtime
