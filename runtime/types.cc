#include "runtime/types.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace meshrun::runtime {
namespace {

struct DTypeInfo {
  DType dtype;
  absl::string_view name;
  absl::string_view numpy_name;
  int64_t size;
};

constexpr DTypeInfo kDTypes[] = {
    {DType::kPred, "pred", "bool", 1},     {DType::kS8, "s8", "int8", 1},
    {DType::kS16, "s16", "int16", 2},      {DType::kS32, "s32", "int32", 4},
    {DType::kS64, "s64", "int64", 8},      {DType::kU8, "u8", "uint8", 1},
    {DType::kU16, "u16", "uint16", 2},     {DType::kU32, "u32", "uint32", 4},
    {DType::kU64, "u64", "uint64", 8},     {DType::kF16, "f16", "float16", 2},
    {DType::kBF16, "bf16", "bfloat16", 2}, {DType::kF32, "f32", "float32", 4},
    {DType::kF64, "f64", "float64", 8},
};

const DTypeInfo* Find(DType dtype) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.dtype == dtype) return &info;
  }
  return nullptr;
}

}  // namespace

absl::string_view DTypeName(DType dtype) {
  const DTypeInfo* info = Find(dtype);
  return info == nullptr ? "invalid" : info->name;
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  for (const DTypeInfo& info : kDTypes) {
    if (name == info.name || name == info.numpy_name) return info.dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype '", name, "'"));
}

int64_t DTypeByteSize(DType dtype) {
  const DTypeInfo* info = Find(dtype);
  return info == nullptr ? 0 : info->size;
}

int64_t ArrayShape::NumElements() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

std::string ToString(const ArrayShape& shape) {
  return absl::StrCat(DTypeName(shape.dtype), "[", absl::StrJoin(shape.dims, ","), "]");
}

}  // namespace meshrun::runtime
