#include "runtime/hlo_signature.h"

#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace meshrun::runtime {
namespace {

// One field of a protobuf message: its number, wire type and payload (varint value, or the
// bytes of a length-delimited field).
struct Field {
  int number = 0;
  int wire_type = 0;
  uint64_t varint = 0;
  absl::string_view bytes;
};

class WireReader {
 public:
  explicit WireReader(absl::string_view data) : data_(data) {}
  bool done() const { return data_.empty(); }

  absl::StatusOr<Field> Next() {
    Field f;
    ASSIGN_OR_RETURN(uint64_t key, Varint());
    f.number = static_cast<int>(key >> 3);
    f.wire_type = static_cast<int>(key & 7);
    switch (f.wire_type) {
      case 0: {
        ASSIGN_OR_RETURN(f.varint, Varint());
        return f;
      }
      case 1:
        return Skip(8, f);
      case 5:
        return Skip(4, f);
      case 2: {
        ASSIGN_OR_RETURN(uint64_t size, Varint());
        if (size > data_.size()) return Malformed();
        f.bytes = data_.substr(0, size);
        data_.remove_prefix(size);
        return f;
      }
      default:
        return Malformed();
    }
  }

  absl::StatusOr<uint64_t> Varint() {
    uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (data_.empty()) return Malformed();
      const auto byte = static_cast<uint8_t>(data_.front());
      data_.remove_prefix(1);
      value |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) return value;
    }
    return Malformed();
  }

 private:
  absl::StatusOr<Field> Skip(size_t n, Field f) {
    if (data_.size() < n) return Malformed();
    data_.remove_prefix(n);
    return f;
  }
  static absl::Status Malformed() {
    return absl::InvalidArgumentError("the optimized program is not a well-formed HLO module");
  }
  absl::string_view data_;
};

// The first length-delimited field `number` of `message`; empty when absent.
absl::StatusOr<absl::string_view> SubMessage(absl::string_view message, int number) {
  WireReader reader(message);
  while (!reader.done()) {
    ASSIGN_OR_RETURN(Field f, reader.Next());
    if (f.number == number && f.wire_type == 2) return f.bytes;
  }
  return absl::string_view();
}

// xla::PrimitiveType values.
absl::StatusOr<DType> FromPrimitiveType(uint64_t type) {
  switch (type) {
    case 1: return DType::kPred;
    case 2: return DType::kS8;
    case 3: return DType::kS16;
    case 4: return DType::kS32;
    case 5: return DType::kS64;
    case 6: return DType::kU8;
    case 7: return DType::kU16;
    case 8: return DType::kU32;
    case 9: return DType::kU64;
    case 10: return DType::kF16;
    case 11: return DType::kF32;
    case 12: return DType::kF64;
    case 16: return DType::kBF16;
    default:
      return absl::UnimplementedError(
          absl::StrCat("the program takes a parameter of XLA element type ", type,
                       ", which meshrun has no dtype for"));
  }
}

absl::StatusOr<ArrayShape> ParseShape(absl::string_view shape_proto) {
  ArrayShape shape;
  WireReader reader(shape_proto);
  while (!reader.done()) {
    ASSIGN_OR_RETURN(Field f, reader.Next());
    if (f.number == 2 && f.wire_type == 0) {
      if (f.varint == 13) {
        return absl::UnimplementedError("the program takes a tuple parameter");
      }
      ASSIGN_OR_RETURN(shape.dtype, FromPrimitiveType(f.varint));
    } else if (f.number == 3 && f.wire_type == 2) {  // packed dimensions
      WireReader dims(f.bytes);
      while (!dims.done()) {
        ASSIGN_OR_RETURN(uint64_t d, dims.Varint());
        shape.dims.push_back(static_cast<int64_t>(d));
      }
    } else if (f.number == 3 && f.wire_type == 0) {
      shape.dims.push_back(static_cast<int64_t>(f.varint));
    }
  }
  if (shape.dtype == DType::kInvalid) {
    return absl::InvalidArgumentError("a parameter of the optimized program has no element type");
  }
  return shape;
}

}  // namespace

absl::StatusOr<std::vector<ArrayShape>> EntryParameterShapes(absl::string_view serialized,
                                                             absl::string_view format) {
  absl::string_view module = serialized;
  if (format == "hlo_with_config") {
    ASSIGN_OR_RETURN(module, SubMessage(serialized, 1));
  } else if (format != "hlo") {
    return absl::InvalidArgumentError(
        absl::StrCat("optimized program format \"", std::string(format), "\" is not HLO"));
  }
  ASSIGN_OR_RETURN(absl::string_view program_shape, SubMessage(module, 4));
  if (program_shape.empty()) {
    return absl::InvalidArgumentError("the optimized HLO module has no entry program shape");
  }
  std::vector<ArrayShape> out;
  WireReader reader(program_shape);
  while (!reader.done()) {
    ASSIGN_OR_RETURN(Field f, reader.Next());
    if (f.number != 1 || f.wire_type != 2) continue;
    ASSIGN_OR_RETURN(ArrayShape shape, ParseShape(f.bytes));
    out.push_back(std::move(shape));
  }
  return out;
}

absl::Status CheckDeclaredInputs(const std::vector<ArrayShape>& parameters,
                                 const ProgramSignature& signature) {
  if (parameters.size() != signature.inputs.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the job declares ", signature.inputs.size(), " inputs, the compiled program takes ",
        parameters.size(), "; declare every parameter of the exported program, in order"));
  }
  for (size_t i = 0; i < parameters.size(); ++i) {
    if (parameters[i] != signature.inputs[i].shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input ", i, " '", signature.inputs[i].name, "': the job declares ",
          ToString(signature.inputs[i].shape), " per device, the compiled program takes ",
          ToString(parameters[i]), "; fix its dtype/shard_shape (or shape and sharding)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace meshrun::runtime
