// The PJRT backend's shared pieces, internal to runtime/pjrt: the client state that the
// runtime, its executables and its buffers share, and the DeviceBuffer and Executable classes
// over PJRT handles. pjrt_runtime.cc makes them; nothing outside runtime/pjrt includes this.
//
// Lifetime: a buffer or executable holds the State, so the PJRT client outlives them all.
// Thread-safety: as DeviceBuffer and Executable (runtime.h); State::counters under State::mu.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <typeinfo>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "runtime/pjrt/pjrt_api.h"
#include "runtime/pjrt/pjrt_runtime.h"
#include "xla/pjrt/c/pjrt_c_api.h"

namespace meshrun::runtime {

struct PjrtRuntime::State {
  const pjrt::Plugin* plugin = nullptr;
  const PJRT_Api* api = nullptr;
  PJRT_Client* client = nullptr;
  std::shared_ptr<KeyValueClient> kv;  // the plugin may call it for the client's lifetime
  Clock* clock = nullptr;
  RuntimeIdentity identity;
  std::vector<DeviceDescription> devices;
  std::vector<DeviceDescription> addressable;
  std::vector<PJRT_Device*> addressable_handles;
  std::unordered_map<const PJRT_Device*, int> device_index;

  absl::Mutex mu;
  RuntimeCounters counters ABSL_GUARDED_BY(mu);

  ~State() {
    if (client == nullptr) return;
    PJRT_ARGS(PJRT_Client_Destroy_Args, destroy);
    destroy.client = client;
    pjrt::ErrorToStatus(api, api->PJRT_Client_Destroy(&destroy), "PJRT_Client_Destroy")
        .IgnoreError();
  }
};

namespace pjrt {

using State = PjrtRuntime::State;

class PjrtBuffer final : public DeviceBuffer {
 public:
  PjrtBuffer(std::shared_ptr<State> state, PJRT_Buffer* buffer, ArrayShape shape, int device_index)
      : state_(std::move(state)), buffer_(buffer), own_shape_(std::move(shape)),
        shape_(&own_shape_), device_index_(device_index) {}
  // An execution's output: its shape is `(*shapes)[index]`, the executable's, shared rather
  // than copied (an allocation per output per step otherwise).
  PjrtBuffer(std::shared_ptr<State> state, PJRT_Buffer* buffer,
             std::shared_ptr<const std::vector<ArrayShape>> shapes, size_t index,
             int device_index)
      : state_(std::move(state)), buffer_(buffer), shapes_(std::move(shapes)),
        shape_(&(*shapes_)[index]), device_index_(device_index) {}
  PjrtBuffer(const PjrtBuffer&) = delete;
  PjrtBuffer& operator=(const PjrtBuffer&) = delete;
  ~PjrtBuffer() override {
    PJRT_ARGS(PJRT_Buffer_Destroy_Args, destroy);
    destroy.buffer = buffer_;
    ErrorToStatus(state_->api, state_->api->PJRT_Buffer_Destroy(&destroy), "PJRT_Buffer_Destroy")
        .IgnoreError();
  }
  const ArrayShape& shape() const override { return *shape_; }
  int device_index() const override { return device_index_; }
  bool IsDeleted() const override {
    PJRT_ARGS(PJRT_Buffer_IsDeleted_Args, args);
    args.buffer = buffer_;
    if (!PJRT_CALL(state_->api, PJRT_Buffer_IsDeleted, args).ok()) return true;
    return args.is_deleted;
  }
  const State* state() const { return state_.get(); }
  PJRT_Buffer* handle() const { return buffer_; }

  // `buffer` as a PjrtBuffer, or null. PjrtBuffer is final, so comparing the dynamic type is
  // exact, and cheaper than dynamic_cast (which Launch called once per input per step).
  static const PjrtBuffer* Of(const DeviceBuffer* buffer) {
    return buffer != nullptr && typeid(*buffer) == typeid(PjrtBuffer)
               ? static_cast<const PjrtBuffer*>(buffer)
               : nullptr;
  }

 private:
  std::shared_ptr<State> state_;
  PJRT_Buffer* buffer_;
  ArrayShape own_shape_;
  std::shared_ptr<const std::vector<ArrayShape>> shapes_;
  const ArrayShape* shape_;  // own_shape_ or in shapes_
  int device_index_;
};

class PjrtExecutable final : public Executable {
 public:
  PjrtExecutable(std::shared_ptr<State> state, PJRT_LoadedExecutable* loaded)
      : state_(std::move(state)), loaded_(loaded) {}
  ~PjrtExecutable() override {
    PJRT_ARGS(PJRT_LoadedExecutable_Destroy_Args, destroy);
    destroy.executable = loaded_;
    ErrorToStatus(state_->api, state_->api->PJRT_LoadedExecutable_Destroy(&destroy),
                  "PJRT_LoadedExecutable_Destroy")
        .IgnoreError();
  }
  const std::vector<int>& device_indices() const override { return device_indices_; }
  const std::vector<ArrayShape>& output_shapes() const override { return *output_shapes_; }
  const std::optional<ProgramSignature>& signature() const override { return signature_; }
  const std::string& fingerprint() const override { return fingerprint_; }

  // Reads devices, outputs and fingerprint from the plugin and checks them against `signature`.
  absl::Status Describe(std::optional<ProgramSignature> signature);

  const State* state() const { return state_.get(); }
  PJRT_LoadedExecutable* handle() const { return loaded_; }
  size_t num_outputs() const { return num_outputs_; }
  // Every output's shape as compiled, when the plugin reports them; else null.
  const std::shared_ptr<const std::vector<ArrayShape>>& known_output_shapes() const {
    return known_output_shapes_;
  }

  // The inputs of [0, num_args) not in `donate`, as PJRT_ExecuteOptions wants them. A loop
  // passes the same list every step, so the answer is kept for the last list asked about.
  std::shared_ptr<const std::vector<int64_t>> NonDonated(const std::vector<int>& donate,
                                                         size_t num_args) const;

 private:
  std::shared_ptr<State> state_;
  PJRT_LoadedExecutable* loaded_;
  std::vector<int> device_indices_;
  std::shared_ptr<std::vector<ArrayShape>> output_shapes_ =
      std::make_shared<std::vector<ArrayShape>>();
  std::shared_ptr<const std::vector<ArrayShape>> known_output_shapes_;  // set by Describe
  std::optional<ProgramSignature> signature_;
  std::string fingerprint_;
  size_t num_outputs_ = 0;

  mutable absl::Mutex keep_mu_;
  mutable std::vector<int> donated_ ABSL_GUARDED_BY(keep_mu_);
  mutable size_t keep_args_ ABSL_GUARDED_BY(keep_mu_) = 0;
  mutable std::shared_ptr<const std::vector<int64_t>> keep_ ABSL_GUARDED_BY(keep_mu_);
};

// Runs `fn` with the PJRT_Executable behind `loaded`, then releases it.
template <typename Fn>
absl::Status WithExecutable(const PJRT_Api* api, PJRT_LoadedExecutable* loaded, Fn fn) {
  PJRT_ARGS(PJRT_LoadedExecutable_GetExecutable_Args, get);
  get.loaded_executable = loaded;
  RETURN_IF_ERROR(PJRT_CALL(api, PJRT_LoadedExecutable_GetExecutable, get));
  absl::Status status = fn(get.executable);
  PJRT_ARGS(PJRT_Executable_Destroy_Args, destroy);
  destroy.executable = get.executable;
  api->PJRT_Executable_Destroy(&destroy);
  return status;
}

// The element type and dimensions of a PJRT buffer. Errors: the plugin's.
absl::StatusOr<ArrayShape> BufferShape(const PJRT_Api* api, PJRT_Buffer* buffer);

}  // namespace pjrt
}  // namespace meshrun::runtime
