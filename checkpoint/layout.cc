#include "checkpoint/layout.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace meshrun::checkpoint {
namespace {

using runtime::DType;

// zarr v2 names, little-endian where the size is over one byte; bfloat16 as TensorStore names
// it.
constexpr std::pair<DType, const char*> kZarrTypes[] = {
    {DType::kPred, "|b1"}, {DType::kS8, "|i1"},  {DType::kS16, "<i2"},  {DType::kS32, "<i4"},
    {DType::kS64, "<i8"},  {DType::kU8, "|u1"},  {DType::kU16, "<u2"},  {DType::kU32, "<u4"},
    {DType::kU64, "<u8"},  {DType::kF16, "<f2"}, {DType::kBF16, "bfloat16"},
    {DType::kF32, "<f4"},  {DType::kF64, "<f8"},
};

std::string JsonList(const google::protobuf::RepeatedField<int64_t>& values) {
  return absl::StrCat("[", absl::StrJoin(values, ","), "]");
}

// A JSON string literal; leaf names are dotted identifiers, but quote what JSON requires.
std::string Quoted(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

absl::StatusOr<std::vector<int64_t>> IntList(const google::protobuf::Value& value,
                                             const std::string& field) {
  if (!value.has_list_value()) {
    return absl::InvalidArgumentError(absl::StrCat(".zarray ", field, " is not a list"));
  }
  std::vector<int64_t> out;
  for (const auto& v : value.list_value().values()) {
    if (!v.has_number_value() || v.number_value() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(".zarray ", field, " holds something other than sizes"));
    }
    out.push_back(static_cast<int64_t>(v.number_value()));
  }
  return out;
}

}  // namespace

absl::StatusOr<Block> BlockOf(const std::vector<int64_t>& dims,
                              const std::vector<std::string>& sharding,
                              const std::vector<std::string>& mesh_axes,
                              const std::vector<int64_t>& mesh_shape, int64_t partition) {
  int64_t partitions = 1;
  for (int64_t n : mesh_shape) partitions *= n;
  if (partition < 0 || partition >= partitions) {
    return absl::InvalidArgumentError(
        absl::StrCat("partition ", partition, " is outside a mesh of ", partitions));
  }
  std::vector<int64_t> coord(mesh_shape.size());
  for (int a = static_cast<int>(mesh_shape.size()) - 1, p = static_cast<int>(partition); a >= 0;
       --a) {
    coord[a] = p % mesh_shape[a];
    p /= static_cast<int>(mesh_shape[a]);
  }
  Block block{std::vector<int64_t>(dims.size(), 0), dims};
  for (size_t i = 0; i < dims.size() && i < sharding.size(); ++i) {
    if (sharding[i].empty()) continue;
    size_t a = 0;
    while (a < mesh_axes.size() && mesh_axes[a] != sharding[i]) ++a;
    if (a == mesh_axes.size()) {
      return absl::InvalidArgumentError(absl::StrCat("mesh axis \"", sharding[i],
                                                     "\" is not one of the mesh's (",
                                                     absl::StrJoin(mesh_axes, ", "), ")"));
    }
    if (dims[i] % mesh_shape[a] != 0) {
      return absl::InvalidArgumentError(absl::StrCat("dimension ", i, " (", dims[i],
                                                     ") does not split ", mesh_shape[a],
                                                     " ways over axis ", sharding[i]));
    }
    block.size[i] = dims[i] / mesh_shape[a];
    block.start[i] = coord[a] * block.size[i];
  }
  return block;
}

std::string ChunkKey(const std::vector<int64_t>& start, const std::vector<int64_t>& chunk_shape) {
  if (start.empty()) return "0";
  std::vector<int64_t> grid(start.size());
  for (size_t i = 0; i < start.size(); ++i) {
    grid[i] = chunk_shape[i] == 0 ? 0 : start[i] / chunk_shape[i];
  }
  return absl::StrJoin(grid, ".");
}

void CopyBlock(const char* src, const std::vector<int64_t>& src_dims,
               const std::vector<int64_t>& src_start, char* dst,
               const std::vector<int64_t>& dst_dims, const std::vector<int64_t>& dst_start,
               const std::vector<int64_t>& size, int64_t element) {
  const size_t rank = size.size();
  int64_t elements = 1;
  for (int64_t n : size) elements *= n;
  if (elements == 0) return;
  if (rank == 0) {
    std::memcpy(dst, src, static_cast<size_t>(element));
    return;
  }
  // Row by row along the last dimension.
  const int64_t row = size[rank - 1];
  std::vector<int64_t> index(rank, 0);
  for (int64_t done = 0; done < elements; done += row) {
    int64_t s = 0, d = 0;
    for (size_t i = 0; i < rank; ++i) {
      s = s * src_dims[i] + src_start[i] + index[i];
      d = d * dst_dims[i] + dst_start[i] + index[i];
    }
    std::memcpy(dst + d * element, src + s * element, static_cast<size_t>(row * element));
    for (int i = static_cast<int>(rank) - 2; i >= 0; --i) {
      if (++index[i] < size[i]) break;
      index[i] = 0;
    }
  }
}

std::string LeafOf(const std::string& state_name) {
  return absl::StartsWith(state_name, "state.") ? state_name.substr(6) : state_name;
}

absl::StatusOr<std::string> ZarrDType(DType dtype) {
  for (const auto& [type, name] : kZarrTypes) {
    if (type == dtype) return std::string(name);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("dtype ", runtime::DTypeName(dtype), " has no zarr v2 name"));
}

absl::StatusOr<DType> ParseZarrDType(const std::string& zarr_dtype) {
  for (const auto& [type, name] : kZarrTypes) {
    if (zarr_dtype == name) return type;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      ".zarray dtype \"", zarr_dtype, "\" is not one meshrun reads (little-endian numbers, "
      "bool, bfloat16)"));
}

absl::StatusOr<std::string> ZarrArrayJson(const v1::CheckpointArray& array) {
  ASSIGN_OR_RETURN(DType dtype, runtime::ParseDType(array.dtype()));
  ASSIGN_OR_RETURN(std::string zarr_dtype, ZarrDType(dtype));
  return absl::StrCat("{\"chunks\":", JsonList(array.chunk_shape()),
                      ",\"compressor\":null,\"dimension_separator\":\".\",\"dtype\":\"",
                      zarr_dtype,
                      "\",\"fill_value\":null,\"filters\":null,\"order\":\"C\",\"shape\":",
                      JsonList(array.shape()), ",\"zarr_format\":2}");
}

absl::StatusOr<ZarrArray> ParseZarrArray(const std::string& json) {
  google::protobuf::Struct doc;
  if (!google::protobuf::util::JsonStringToMessage(json, &doc).ok()) {
    return absl::InvalidArgumentError(".zarray is not a JSON object");
  }
  const auto& f = doc.fields();
  auto get = [&](const std::string& name) -> const google::protobuf::Value* {
    auto it = f.find(name);
    return it == f.end() ? nullptr : &it->second;
  };
  const auto* format = get("zarr_format");
  if (format == nullptr || format->number_value() != 2) {
    return absl::InvalidArgumentError(".zarray zarr_format is not 2");
  }
  if (const auto* filters = get("filters"); filters != nullptr && !filters->has_null_value()) {
    return absl::InvalidArgumentError(
        ".zarray filters is set; meshrun reads arrays without filters only");
  }
  std::string compressor;
  if (const auto* c = get("compressor"); c != nullptr && !c->has_null_value()) {
    const auto id = c->struct_value().fields().find("id");
    compressor = id == c->struct_value().fields().end() ? "" : id->second.string_value();
    if (compressor != "zstd") {
      return absl::InvalidArgumentError(absl::StrCat(
          ".zarray compressor is \"", compressor, "\"; meshrun reads uncompressed or zstd "
          "chunks only (Orbax's default)"));
    }
  }
  if (const auto* order = get("order"); order != nullptr && order->string_value() != "C") {
    return absl::InvalidArgumentError(".zarray order is not \"C\"");
  }
  if (const auto* sep = get("dimension_separator");
      sep != nullptr && sep->has_string_value() && sep->string_value() != ".") {
    return absl::InvalidArgumentError(".zarray dimension_separator is not \".\"");
  }
  const auto* dtype = get("dtype");
  const auto* shape = get("shape");
  const auto* chunks = get("chunks");
  if (dtype == nullptr || shape == nullptr || chunks == nullptr) {
    return absl::InvalidArgumentError(".zarray lacks dtype, shape or chunks");
  }
  ZarrArray out;
  out.compressor = compressor;
  ASSIGN_OR_RETURN(out.dtype, ParseZarrDType(dtype->string_value()));
  ASSIGN_OR_RETURN(out.shape, IntList(*shape, "shape"));
  ASSIGN_OR_RETURN(out.chunks, IntList(*chunks, "chunks"));
  if (out.shape.size() != out.chunks.size()) {
    return absl::InvalidArgumentError(".zarray chunks and shape differ in rank");
  }
  for (int64_t c : out.chunks) {
    if (c == 0) return absl::InvalidArgumentError(".zarray chunks has a 0");
  }
  return out;
}

std::string OrbaxTreeMetadataJson(const v1::CheckpointManifest& manifest) {
  std::vector<std::string> entries;
  for (const v1::CheckpointArray& array : manifest.arrays()) {
    std::vector<std::string> keys = absl::StrSplit(array.leaf(), '.');
    std::vector<std::string> quoted, key_metadata;
    for (const std::string& key : keys) {
      quoted.push_back(absl::StrCat("'", key, "'"));
      key_metadata.push_back(absl::StrCat("{\"key\":", Quoted(key), ",\"key_type\":2}"));
    }
    // Orbax keys the tree by the Python repr of the key tuple: "('opt', 'm', 'w1')", "('x',)".
    const std::string tuple = absl::StrCat("(", absl::StrJoin(quoted, ", "),
                                           quoted.size() == 1 ? ",)" : ")");
    entries.push_back(absl::StrCat(
        Quoted(tuple), ":{\"key_metadata\":[", absl::StrJoin(key_metadata, ","),
        "],\"value_metadata\":{\"value_type\":\"jax.Array\",\"skip_deserialize\":false,"
        "\"write_shape\":",
        JsonList(array.chunk_shape()), "}}"));
  }
  return absl::StrCat("{\"tree_metadata\":{", absl::StrJoin(entries, ","),
                      "},\"use_ocdbt\":false,\"use_zarr3\":false,"
                      "\"store_array_data_equal_to_fill_value\":true,\"custom_metadata\":null}");
}

std::string OrbaxStepMetadataJson(int64_t init_unix_nanos, int64_t commit_unix_nanos) {
  return absl::StrCat(
      "{\"item_handlers\":\"orbax.checkpoint._src.handlers.pytree_checkpoint_handler."
      "PyTreeCheckpointHandler\",\"metrics\":{},\"performance_metrics\":{},"
      "\"init_timestamp_nsecs\":",
      init_unix_nanos, ",\"commit_timestamp_nsecs\":", commit_unix_nanos,
      ",\"custom_metadata\":{}}");
}

}  // namespace meshrun::checkpoint
