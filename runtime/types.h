// Plain value types of the runtime interface: element types, array shapes, host arrays and the
// declared signature of a program. No device state lives here.
// Thread-safety: values; safe to share read-only.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace meshrun::runtime {

enum class DType {
  kInvalid,
  kPred,
  kS8,
  kS16,
  kS32,
  kS64,
  kU8,
  kU16,
  kU32,
  kU64,
  kF16,
  kBF16,
  kF32,
  kF64,
};

// "f32", "bf16", "s32", "u8", "pred" (the dtype names of meshrun.v1.TensorSpec).
absl::string_view DTypeName(DType dtype);
// Accepts meshrun's names and numpy's ("float32", "int32", "uint32", "bool", "bfloat16").
// Errors: INVALID_ARGUMENT naming the unknown type.
absl::StatusOr<DType> ParseDType(absl::string_view name);
int64_t DTypeByteSize(DType dtype);

// A dense row-major array type as seen by one device (a shard, not the global array).
struct ArrayShape {
  DType dtype = DType::kInvalid;
  std::vector<int64_t> dims;

  int64_t NumElements() const;
  int64_t ByteSize() const { return NumElements() * DTypeByteSize(dtype); }
  friend bool operator==(const ArrayShape&, const ArrayShape&) = default;
};

// "f32[16,32]", "s32[]".
std::string ToString(const ArrayShape& shape);

struct ArraySpec {
  std::string name;
  ArrayShape shape;
  friend bool operator==(const ArraySpec&, const ArraySpec&) = default;
};

// What a program takes and returns on each device, in order, as the job declares it. Given to
// Compile / DeserializeAndLoad so that Execute can refuse wrong arguments before anything runs.
struct ProgramSignature {
  std::vector<ArraySpec> inputs;
  std::vector<ArraySpec> outputs;
};

// An array in host memory: `bytes` holds shape.ByteSize() bytes, row-major, little-endian.
struct HostArray {
  ArrayShape shape;
  std::string bytes;

  template <typename T>
  static HostArray From(DType dtype, std::vector<int64_t> dims, const std::vector<T>& values) {
    HostArray out{{dtype, std::move(dims)}, std::string(values.size() * sizeof(T), '\0')};
    if (!values.empty()) std::memcpy(out.bytes.data(), values.data(), out.bytes.size());
    return out;
  }
  // Element-wise copy out; T must have the dtype's size.
  template <typename T>
  std::vector<T> As() const {
    std::vector<T> out(bytes.size() / sizeof(T));
    if (!out.empty()) std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
    return out;
  }
};

}  // namespace meshrun::runtime
