#include "runtime/runtime.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace meshrun::runtime {

absl::StatusOr<std::string> Runtime::Serialize(const Executable&) {
  return absl::UnimplementedError(
      absl::StrCat(identity().platform_name, " runtime cannot serialize executables"));
}

absl::StatusOr<std::unique_ptr<Executable>> Runtime::DeserializeAndLoad(
    absl::string_view, std::optional<ProgramSignature>) {
  return absl::UnimplementedError(
      absl::StrCat(identity().platform_name, " runtime cannot load serialized executables"));
}

absl::StatusOr<ExecutableStats> Runtime::Stats(const Executable&) {
  return absl::UnimplementedError(
      absl::StrCat(identity().platform_name, " runtime reports no executable statistics"));
}

namespace {

class CompletedExecution final : public ExecutionEvent {
 public:
  absl::Status Await() override { return absl::OkStatus(); }
};

}  // namespace

absl::StatusOr<LaunchedExecution> Runtime::Launch(
    const Executable& executable, absl::Span<const std::vector<DeviceBuffer*>> args,
    const ExecuteOptions& options) {
  LaunchedExecution launched;
  ASSIGN_OR_RETURN(launched.outputs, Execute(executable, args, options));
  launched.done = std::make_unique<CompletedExecution>();
  return launched;
}

absl::Status RuntimeRegistry::Register(const std::string& kind, Factory factory) {
  absl::MutexLock lock(&mu_);
  if (!factories_.emplace(kind, std::move(factory)).second) {
    return absl::AlreadyExistsError(absl::StrCat("runtime kind '", kind, "' registered twice"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Runtime>> RuntimeRegistry::Create(
    absl::string_view kind, const RuntimeConfig& config) const {
  Factory factory;
  {
    absl::MutexLock lock(&mu_);
    auto it = factories_.find(kind);
    if (it == factories_.end()) {
      std::vector<std::string> known;
      for (const auto& [name, unused] : factories_) known.push_back(name);
      return absl::NotFoundError(absl::StrCat("no runtime of kind '", kind, "' (built with: ",
                                              known.empty() ? "none" : absl::StrJoin(known, ", "),
                                              ")"));
    }
    factory = it->second;
  }
  return factory(config);
}

std::vector<std::string> RuntimeRegistry::kinds() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [name, unused] : factories_) out.push_back(name);
  return out;
}

absl::Status CheckExecuteArgs(const Executable& executable,
                              absl::Span<const std::vector<DeviceBuffer*>> args,
                              const ExecuteOptions& options,
                              absl::Span<const DeviceDescription> addressable_devices,
                              bool check_donation_state) {
  const std::vector<int>& devices = executable.device_indices();
  if (args.size() != devices.size()) {
    return absl::InvalidArgumentError(absl::StrCat("executable runs on ", devices.size(),
                                                   " devices, got argument lists for ",
                                                   args.size()));
  }
  const std::optional<ProgramSignature>& signature = executable.signature();
  const size_t num_inputs = signature ? signature->inputs.size() : args.empty() ? 0 : args[0].size();
  for (int index : options.donate_inputs) {
    if (index < 0 || static_cast<size_t>(index) >= num_inputs) {
      return absl::InvalidArgumentError(
          absl::StrCat("donated input ", index, " is not in [0, ", num_inputs, ")"));
    }
  }
  auto device_name = [&](int index) -> std::string {
    return index >= 0 && static_cast<size_t>(index) < addressable_devices.size()
               ? addressable_devices[index].runtime_name
               : absl::StrCat("device index ", index);
  };
  // This runs before every step: the messages are built only for an input that is wrong.
  auto what = [&](size_t d, size_t i) {
    return signature ? absl::StrCat("input ", i, " '", signature->inputs[i].name, "' for ",
                                    device_name(devices[d]))
                     : absl::StrCat("input ", i, " for ", device_name(devices[d]));
  };
  for (size_t d = 0; d < args.size(); ++d) {
    if (args[d].size() != num_inputs) {
      return absl::InvalidArgumentError(absl::StrCat("program takes ", num_inputs, " inputs, got ",
                                                     args[d].size(), " for ",
                                                     device_name(devices[d])));
    }
    for (size_t i = 0; i < args[d].size(); ++i) {
      const DeviceBuffer* buffer = args[d][i];
      if (buffer == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(what(d, i), " is null"));
      }
      if (check_donation_state && buffer->IsDeleted()) {
        return absl::FailedPreconditionError(
            absl::StrCat(what(d, i), " was donated to an earlier execution or deleted"));
      }
      if (buffer->device_index() != devices[d]) {
        return absl::InvalidArgumentError(absl::StrCat(what(d, i), " lives on ",
                                                       device_name(buffer->device_index())));
      }
      if (signature && buffer->shape() != signature->inputs[i].shape) {
        return absl::InvalidArgumentError(absl::StrCat(what(d, i), ": expected ",
                                                       ToString(signature->inputs[i].shape),
                                                       ", got ", ToString(buffer->shape())));
      }
    }
  }
  // A donated buffer passed twice would be read after its memory was reused. Sorting a
  // device's inputs finds any repeated buffer at all (usually none) in O(n log n).
  if (options.donate_inputs.empty()) return absl::OkStatus();
  std::vector<const DeviceBuffer*> sorted;
  for (size_t d = 0; d < args.size(); ++d) {
    sorted.assign(args[d].begin(), args[d].end());
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end()) continue;
    for (int index : options.donate_inputs) {
      size_t uses = 0;
      for (const DeviceBuffer* buffer : args[d]) uses += buffer == args[d][index];
      if (uses > 1) {
        return absl::InvalidArgumentError(absl::StrCat("donated input ", index, " for ",
                                                       device_name(devices[d]),
                                                       " is also passed as another input"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace meshrun::runtime
