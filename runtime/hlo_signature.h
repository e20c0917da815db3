// The parameter types of a compiled program, read from the optimized HLO module a PJRT plugin
// hands back (PJRT_Executable_OptimizedProgram): the entry computation's program shape after
// SPMD partitioning, i.e. what one device takes. Lets a load check a job's declared inputs
// against the program itself, so a mismatch fails the job when it loads, naming the input,
// instead of at its first step.
//
// A small reader of the protobuf wire format (no XLA headers): HloModuleProto field 4
// (host_program_shape) -> ProgramShapeProto field 1 (parameters) -> ShapeProto fields 2
// (element_type) and 3 (dimensions); a "hlo_with_config" module is wrapped in field 1.
// Thread-safety: stateless.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/types.h"

namespace meshrun::runtime {

// Errors: INVALID_ARGUMENT (bytes that are no HLO module, a format other than "hlo" or
// "hlo_with_config"), UNIMPLEMENTED (a tuple or an element type meshrun has no dtype for).
absl::StatusOr<std::vector<ArrayShape>> EntryParameterShapes(absl::string_view serialized,
                                                             absl::string_view format);

// The declared inputs against the compiled parameters: same count, and each the same dtype and
// per-device shape. Errors: INVALID_ARGUMENT naming the first input that differs and both types.
absl::Status CheckDeclaredInputs(const std::vector<ArrayShape>& parameters,
                                 const ProgramSignature& signature);

}  // namespace meshrun::runtime
