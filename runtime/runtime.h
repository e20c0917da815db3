// The runtime interface: one object shaped like a PJRT client, through which the worker and
// the coordinator (to compile) drive devices. Backends (today: any PJRT plugin through the
// PJRT C API, runtime/pjrt/) implement it and are registered explicitly in a
// RuntimeRegistry by RegisterRuntimes (backends.h).
//
// Lifetime: executables and device buffers may outlive the Runtime that made them (they keep
// the backend's client alive), but must only be passed back to that same Runtime.
// Thread-safety: every Runtime method is safe to call concurrently. A DeviceBuffer or
// Executable may be used from several threads; donating a buffer while another thread reads it
// is the caller's race.
// Errors: a backend reports its own errors with the backend's code and message (for PJRT: the
// plugin's PJRT_Error_Code and text, prefixed with the C API call that failed).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "runtime/compile_target.h"
#include "runtime/identity.h"
#include "runtime/kv_client.h"
#include "runtime/types.h"

namespace meshrun::runtime {

// An array resident on one addressable device.
class DeviceBuffer {
 public:
  virtual ~DeviceBuffer() = default;
  virtual const ArrayShape& shape() const = 0;
  // Index into Runtime::addressable_devices().
  virtual int device_index() const = 0;
  // True once the buffer was donated to an execution (or deleted): it must not be used again.
  virtual bool IsDeleted() const = 0;
};

// A compiled program loaded onto this runtime's devices.
class Executable {
 public:
  virtual ~Executable() = default;
  // The addressable devices it runs on (indices into Runtime::addressable_devices()), in the
  // order Execute takes per-device argument lists: partition order for SPMD programs.
  virtual const std::vector<int>& device_indices() const = 0;
  // Per-device output types as the backend compiled them.
  virtual const std::vector<ArrayShape>& output_shapes() const = 0;
  // The signature given at compile / load time, if any.
  virtual const std::optional<ProgramSignature>& signature() const = 0;
  // The backend's fingerprint of the compiled code; empty when it has none.
  virtual const std::string& fingerprint() const = 0;
};

struct ProgramSource {
  std::string code;                // StableHLO: MLIR text or bytecode (portable artifact)
  std::string format = "mlir";     // PJRT program format
  std::string compile_options;     // serialized XLA CompileOptions (compile_options.h)
  std::optional<ProgramSignature> signature;
};

struct ExecuteOptions {
  // Inputs whose buffers the caller hands over: where the program aliases an input to an output
  // (JAX donate_argnums), the output reuses its memory and the buffer becomes IsDeleted().
  // Every other input is kept intact.
  std::vector<int> donate_inputs;
};

// The completion of a launched execution (Runtime::Launch).
// Thread-safety: not thread-safe; one owner awaits it. Destroying it without Await is allowed (the
// execution still finishes; its failure then shows only in its outputs).
class ExecutionEvent {
 public:
  virtual ~ExecutionEvent() = default;
  // Blocks until every device finished. Errors: the backend's (the execution failed). Calling
  // it again returns the same status at once.
  virtual absl::Status Await() = 0;
};

// What Runtime::Launch returns: outputs[d][i], which may still be being computed, and the event
// that says when (and whether) they are.
struct LaunchedExecution {
  std::vector<std::vector<std::unique_ptr<DeviceBuffer>>> outputs;
  std::unique_ptr<ExecutionEvent> done;
};

struct TransferCounter {
  int64_t count = 0;
  int64_t bytes = 0;
  absl::Duration time;  // wall time from the call until the data was in place
};

struct RuntimeCounters {
  TransferCounter host_to_device;
  TransferCounter device_to_host;
  int64_t executions = 0;        // launched, counted at launch
  // From launch until every device finished, summed over executions whose completion was
  // awaited (Execute always awaits; Launch when its event is awaited, so with executions in
  // flight back to back the intervals overlap).
  absl::Duration execute_time;
};

// Memory of one device. A quantity the backend does not report is absent, never 0;
// `unreported_reason` then says which and why ("not reported by this plugin: ...").
struct MemoryStats {
  std::string runtime_name;
  std::optional<int64_t> bytes_in_use;
  std::optional<int64_t> peak_bytes_in_use;
  std::optional<int64_t> bytes_limit;
  std::string unreported_reason;
};

using CreateOptionValue = std::variant<int64_t, std::string, bool>;

// What a backend needs to start. Each backend reads the fields it understands.
struct RuntimeConfig {
  std::string plugin_path;                  // PJRT: the plugin .so (libtpu.so, xla_cpu_pjrt.so)
  std::optional<int64_t> cpu_device_count;  // PJRT CPU plugin: create option cpu_device_count
  std::map<std::string, CreateOptionValue> create_options;  // more plugin create options
  // Multi-host start-up exchange (PJRT kv callbacks). Null: the plugin gets no callbacks.
  std::shared_ptr<KeyValueClient> kv_client;
  Clock* clock = &RealClock();  // times transfers and executions; must outlive the runtime
};

class Runtime {
 public:
  virtual ~Runtime() = default;

  virtual const RuntimeIdentity& identity() const = 0;
  // Every device of the platform (all hosts), with global ids.
  virtual const std::vector<DeviceDescription>& devices() const = 0;
  // The devices of this process; a device_index is a position in this list.
  virtual const std::vector<DeviceDescription>& addressable_devices() const = 0;

  // Errors: the compiler's (INVALID_ARGUMENT with its message for a malformed program; a PJRT
  // plugin's UNKNOWN compile error is reported as INVALID_ARGUMENT, the code kept in the text);
  // INVALID_ARGUMENT when the signature's outputs disagree with the compiled program.
  virtual absl::StatusOr<std::unique_ptr<Executable>> Compile(const ProgramSource& program) = 0;

  // Bytes that DeserializeAndLoad accepts on a runtime with the same identity().
  // Errors: UNIMPLEMENTED (backend cannot serialize), the backend's own.
  virtual absl::StatusOr<std::string> Serialize(const Executable& executable);
  // Errors: UNIMPLEMENTED, INVALID_ARGUMENT (bytes not an executable of this identity).
  virtual absl::StatusOr<std::unique_ptr<Executable>> DeserializeAndLoad(
      absl::string_view serialized, std::optional<ProgramSignature> signature);

  // Copies `array` to addressable device `device_index`; returns when the copy is complete.
  // Errors: INVALID_ARGUMENT (device index out of range, bytes not matching the shape).
  virtual absl::StatusOr<std::unique_ptr<DeviceBuffer>> ToDevice(const HostArray& array,
                                                                 int device_index) = 0;
  // Errors: FAILED_PRECONDITION (buffer donated or deleted), the backend's own.
  virtual absl::StatusOr<HostArray> ToHost(const DeviceBuffer& buffer) = 0;

  // Runs `executable` once on each of its devices: args[d] are the inputs for
  // device_indices()[d]. Returns outputs[d][i] when every device has finished.
  // Errors (all before anything runs): INVALID_ARGUMENT for a wrong number of device lists or
  // inputs, an input on the wrong device, or an input whose dtype/shape differs from the
  // signature (naming the input); FAILED_PRECONDITION for an input already donated.
  // Then the backend's own (execution failures).
  virtual absl::StatusOr<std::vector<std::vector<std::unique_ptr<DeviceBuffer>>>> Execute(
      const Executable& executable, absl::Span<const std::vector<DeviceBuffer*>> args,
      const ExecuteOptions& options) = 0;

  // Like Execute, but returns once the execution is enqueued, without waiting for it: this is
  // how a loop keeps the next step's launch off the critical path. The outputs may be passed to
  // further Launch/Execute calls at once (the backend orders those after this execution) and
  // read with ToHost (which waits for them). Errors: as Execute's, all before anything runs; an
  // execution that fails on a device reports it through `done->Await()` (its outputs then hold
  // the error, and executions that take them fail too). The default calls Execute and returns
  // an event that is already complete.
  virtual absl::StatusOr<LaunchedExecution> Launch(
      const Executable& executable, absl::Span<const std::vector<DeviceBuffer*>> args,
      const ExecuteOptions& options);

  // What the compiler knows of `executable`: memory per device, FLOPs per execution,
  // fingerprint (compile_target.h; figures the backend does not report are absent).
  // Errors: UNIMPLEMENTED (the backend reports none), INVALID_ARGUMENT (not this runtime's).
  virtual absl::StatusOr<ExecutableStats> Stats(const Executable& executable);

  // Errors: NOT_FOUND (no addressable device of that runtime name, the names listed).
  // A backend that does not report memory answers OK with every quantity absent.
  virtual absl::StatusOr<MemoryStats> GetMemoryStats(absl::string_view runtime_name) = 0;

  virtual RuntimeCounters counters() const = 0;
};

// Backends by kind ("pjrt"). Register at start-up, then Create.
class RuntimeRegistry {
 public:
  using Factory = std::function<absl::StatusOr<std::unique_ptr<Runtime>>(const RuntimeConfig&)>;

  // Errors: ALREADY_EXISTS (kind registered twice).
  absl::Status Register(const std::string& kind, Factory factory);
  // Errors: NOT_FOUND naming the registered kinds; then the factory's own.
  absl::StatusOr<std::unique_ptr<Runtime>> Create(absl::string_view kind,
                                                  const RuntimeConfig& config) const;
  std::vector<std::string> kinds() const;

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, Factory, std::less<>> factories_ ABSL_GUARDED_BY(mu_);
};

// Checks `args` against `executable` before a backend launches it: device list and input counts,
// placement, dtype/shape against the signature and, with `check_donation_state`, whether an
// input was already donated or deleted (DeviceBuffer::IsDeleted, one backend call per input; a
// backend that refuses such inputs itself may skip it and call again with it set to name the
// input once its launch failed). Errors: as Runtime::Execute. `addressable_devices` name the
// devices in messages, which are built only on failure.
absl::Status CheckExecuteArgs(const Executable& executable,
                              absl::Span<const std::vector<DeviceBuffer*>> args,
                              const ExecuteOptions& options,
                              absl::Span<const DeviceDescription> addressable_devices,
                              bool check_donation_state = true);

}  // namespace meshrun::runtime
