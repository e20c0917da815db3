#include "runtime/pjrt/pjrt_objects.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "runtime/hlo_signature.h"

namespace meshrun::runtime::pjrt {
namespace {

// The declared inputs against the parameters of the optimized program (hlo_signature.h). A
// plugin that cannot hand the program back, or a program meshrun cannot read the parameters of,
// is not checked here: Execute still checks every argument against the signature.
absl::Status CheckCompiledInputs(const PJRT_Api* api, PJRT_Executable* exe,
                                 const ProgramSignature& signature) {
  std::optional<OptimizedProgram> program = GetOptimizedProgram(api, exe);
  if (!program) return absl::OkStatus();
  absl::StatusOr<std::vector<ArrayShape>> parameters =
      EntryParameterShapes(program->code, program->format);
  if (!parameters.ok()) return absl::OkStatus();
  return CheckDeclaredInputs(*parameters, signature);
}

}  // namespace

std::shared_ptr<const std::vector<int64_t>> PjrtExecutable::NonDonated(
    const std::vector<int>& donate, size_t num_args) const {
  absl::MutexLock lock(&keep_mu_);
  if (keep_ == nullptr || keep_args_ != num_args || donated_ != donate) {
    std::vector<bool> donated(num_args, false);
    for (int index : donate) donated[index] = true;  // in range: CheckExecuteArgs
    auto keep = std::make_shared<std::vector<int64_t>>();
    keep->reserve(num_args);
    for (size_t i = 0; i < num_args; ++i) {
      if (!donated[i]) keep->push_back(static_cast<int64_t>(i));
    }
    keep_ = std::move(keep);
    keep_args_ = num_args;
    donated_ = donate;
  }
  return keep_;
}

absl::Status PjrtExecutable::Describe(std::optional<ProgramSignature> signature) {
  const PJRT_Api* api = state_->api;
  PJRT_ARGS(PJRT_LoadedExecutable_AddressableDevices_Args, devices);
  devices.executable = loaded_;
  RETURN_IF_ERROR(PJRT_CALL(api, PJRT_LoadedExecutable_AddressableDevices, devices));
  for (size_t i = 0; i < devices.num_addressable_devices; ++i) {
    auto it = state_->device_index.find(devices.addressable_devices[i]);
    if (it == state_->device_index.end()) {
      return absl::InternalError("executable runs on a device the client does not list");
    }
    device_indices_.push_back(it->second);
  }
  RETURN_IF_ERROR(WithExecutable(api, loaded_, [&](PJRT_Executable* exe) -> absl::Status {
    PJRT_ARGS(PJRT_Executable_NumOutputs_Args, outputs);
    outputs.executable = exe;
    RETURN_IF_ERROR(PJRT_CALL(api, PJRT_Executable_NumOutputs, outputs));
    num_outputs_ = outputs.num_outputs;
    if (PJRT_HAS(api, PJRT_Executable_OutputElementTypes) &&
        PJRT_HAS(api, PJRT_Executable_OutputDimensions)) {
      PJRT_ARGS(PJRT_Executable_OutputElementTypes_Args, types);
      types.executable = exe;
      RETURN_IF_ERROR(PJRT_CALL(api, PJRT_Executable_OutputElementTypes, types));
      PJRT_ARGS(PJRT_Executable_OutputDimensions_Args, dims);
      dims.executable = exe;
      RETURN_IF_ERROR(PJRT_CALL(api, PJRT_Executable_OutputDimensions, dims));
      const int64_t* next = dims.dims;
      for (size_t i = 0; i < dims.num_outputs && i < types.num_output_types; ++i) {
        ArrayShape shape{FromPjrt(types.output_types[i]), {}};
        shape.dims.assign(next, next + dims.dim_sizes[i]);
        next += dims.dim_sizes[i];
        output_shapes_->push_back(std::move(shape));
      }
    }
    if (signature && PJRT_HAS(api, PJRT_Executable_OptimizedProgram)) {
      RETURN_IF_ERROR(CheckCompiledInputs(api, exe, *signature));
    }
    if (PJRT_HAS(api, PJRT_Executable_Fingerprint)) {
      PJRT_ARGS(PJRT_Executable_Fingerprint_Args, fp);
      fp.executable = exe;
      // Plugins without fingerprints answer UNIMPLEMENTED; the fingerprint is then empty.
      if (PJRT_CALL(api, PJRT_Executable_Fingerprint, fp).ok()) {
        fingerprint_.assign(fp.executable_fingerprint, fp.executable_fingerprint_size);
      }
    }
    return absl::OkStatus();
  }));
  if (signature) {
    if (signature->outputs.size() != num_outputs_) {
      return absl::InvalidArgumentError(absl::StrCat("signature declares ",
                                                     signature->outputs.size(),
                                                     " outputs, the program returns ",
                                                     num_outputs_));
    }
    for (size_t i = 0; i < output_shapes_->size(); ++i) {
      if ((*output_shapes_)[i] != signature->outputs[i].shape) {
        return absl::InvalidArgumentError(absl::StrCat(
            "output ", i, " '", signature->outputs[i].name, "': signature declares ",
            ToString(signature->outputs[i].shape), ", the program returns ",
            ToString((*output_shapes_)[i])));
      }
    }
  }
  if (output_shapes_->size() == num_outputs_) known_output_shapes_ = output_shapes_;
  signature_ = std::move(signature);
  return absl::OkStatus();
}

absl::StatusOr<ArrayShape> BufferShape(const PJRT_Api* api, PJRT_Buffer* buffer) {
  PJRT_ARGS(PJRT_Buffer_ElementType_Args, type);
  type.buffer = buffer;
  RETURN_IF_ERROR(PJRT_CALL(api, PJRT_Buffer_ElementType, type));
  PJRT_ARGS(PJRT_Buffer_Dimensions_Args, dims);
  dims.buffer = buffer;
  RETURN_IF_ERROR(PJRT_CALL(api, PJRT_Buffer_Dimensions, dims));
  return ArrayShape{FromPjrt(type.type), std::vector<int64_t>(dims.dims, dims.dims + dims.num_dims)};
}

}  // namespace meshrun::runtime::pjrt
