#include "checkpoint/orbax_read.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <zstd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/layout.h"
#include "common/status_macros.h"

namespace meshrun::checkpoint {
namespace {

namespace fs = std::filesystem;

constexpr char kTreeMetadata[] = "_METADATA";

bool IsItemDir(const fs::path& path) {
  std::error_code error;
  return fs::is_regular_file(path / kTreeMetadata, error) &&
         path.filename().string().find("orbax-checkpoint-tmp") == std::string::npos;
}

absl::StatusOr<std::string> ReadText(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::FailedPreconditionError(absl::StrCat("cannot read ", path.string()));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The step an Orbax directory stands for: its name, or its parent's, when a number.
int64_t StepOf(const fs::path& item_dir) {
  for (const fs::path& p : {item_dir.filename(), item_dir.parent_path().filename()}) {
    int64_t step = 0;
    const std::string name = p.string();
    if (!name.empty() && std::all_of(name.begin(), name.end(), ::isdigit) &&
        absl::SimpleAtoi(name, &step)) {
      return step;
    }
  }
  return 0;
}

}  // namespace

std::string OrbaxItemDir(const std::string& path) {
  const fs::path dir(path);
  if (IsItemDir(dir)) return dir.string();
  if (dir.filename().string().find("orbax-checkpoint-tmp") != std::string::npos) return "";
  std::string found;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    if (!entry.is_directory() || !IsItemDir(entry.path())) continue;
    if (!found.empty()) return "";  // several items: the caller must name one
    found = entry.path().string();
  }
  return found;
}

absl::StatusOr<v1::CheckpointManifest> ManifestFromOrbax(const std::string& item_dir) {
  const fs::path dir(item_dir);
  if (!IsItemDir(dir)) {
    return absl::FailedPreconditionError(
        absl::StrCat(item_dir, " is not an Orbax checkpoint item (no ", kTreeMetadata, ")"));
  }
  const std::string metadata_path = (dir / kTreeMetadata).string();
  ASSIGN_OR_RETURN(std::string json, ReadText(metadata_path));
  google::protobuf::Struct doc;
  if (!google::protobuf::util::JsonStringToMessage(json, &doc).ok()) {
    return absl::InvalidArgumentError(absl::StrCat(metadata_path, " is not a JSON object"));
  }
  const auto& fields = doc.fields();
  for (const char* flag : {"use_ocdbt", "use_zarr3"}) {
    auto it = fields.find(flag);
    if (it != fields.end() && it->second.bool_value()) {
      return absl::FailedPreconditionError(absl::StrCat(
          metadata_path, " says ", flag, "=true; meshrun reads Orbax checkpoints saved with "
          "PyTreeCheckpointHandler(use_ocdbt=False) (zarr v2), one directory per leaf"));
    }
  }
  auto tree = fields.find("tree_metadata");
  if (tree == fields.end() || !tree->second.has_struct_value()) {
    return absl::InvalidArgumentError(absl::StrCat(metadata_path, " has no tree_metadata"));
  }
  v1::CheckpointManifest manifest;
  manifest.set_step(StepOf(dir));
  for (const auto& [tuple, entry] : tree->second.struct_value().fields()) {
    const auto& entry_fields = entry.struct_value().fields();
    auto keys = entry_fields.find("key_metadata");
    if (keys == entry_fields.end() || !keys->second.has_list_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat(metadata_path, " entry ", tuple, " has no key_metadata"));
    }
    std::vector<std::string> path;
    for (const auto& key : keys->second.list_value().values()) {
      const auto& k = key.struct_value().fields().find("key");
      if (k == key.struct_value().fields().end()) {
        return absl::InvalidArgumentError(
            absl::StrCat(metadata_path, " entry ", tuple, " has a key without \"key\""));
      }
      path.push_back(k->second.has_number_value()
                         ? absl::StrCat(static_cast<int64_t>(k->second.number_value()))
                         : k->second.string_value());
    }
    const std::string leaf = absl::StrJoin(path, ".");
    const fs::path zarray_path = dir / leaf / ".zarray";
    ASSIGN_OR_RETURN(std::string zarray_json, ReadText(zarray_path));
    absl::StatusOr<ZarrArray> zarray = ParseZarrArray(zarray_json);
    if (!zarray.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(zarray_path.string(), ": ", zarray.status().message()));
    }
    v1::CheckpointArray* array = manifest.add_arrays();
    array->set_name(absl::StrCat("state.", leaf));
    array->set_leaf(leaf);
    array->set_dtype(std::string(runtime::DTypeName(zarray->dtype)));
    array->set_compressor(zarray->compressor);
    for (int64_t n : zarray->shape) array->add_shape(n);
    for (int64_t n : zarray->chunks) array->add_chunk_shape(n);
    // Every chunk of the grid (zarr v2 pads the edge chunks to the full chunk shape).
    std::vector<int64_t> grid;
    int64_t count = 1;
    for (size_t i = 0; i < zarray->shape.size(); ++i) {
      grid.push_back((zarray->shape[i] + zarray->chunks[i] - 1) / zarray->chunks[i]);
      count *= grid.back();
    }
    int64_t element_count = 1;
    for (int64_t n : zarray->chunks) element_count *= n;
    for (int64_t c = 0; c < count; ++c) {
      std::vector<int64_t> coord(grid.size());
      for (int64_t i = static_cast<int64_t>(grid.size()) - 1, rest = c; i >= 0; --i) {
        coord[i] = rest % grid[i];
        rest /= grid[i];
      }
      v1::CheckpointChunk* chunk = array->add_chunks();
      chunk->set_key(grid.empty() ? "0" : absl::StrJoin(coord, "."));
      chunk->set_bytes(element_count * runtime::DTypeByteSize(zarray->dtype));
    }
  }
  // _METADATA lists leaves by the repr of their key tuple; order them by leaf path.
  std::sort(manifest.mutable_arrays()->begin(), manifest.mutable_arrays()->end(),
            [](const v1::CheckpointArray& a, const v1::CheckpointArray& b) {
              return a.leaf() < b.leaf();
            });
  return manifest;
}

absl::StatusOr<std::string> DecodeChunk(const std::string& compressor, std::string stored,
                                        size_t expected_bytes) {
  if (compressor.empty()) return stored;
  if (compressor != "zstd") {
    return absl::DataLossError(absl::StrCat("unknown chunk compressor \"", compressor, "\""));
  }
  std::string out(expected_bytes, '\0');
  const size_t n = ZSTD_decompress(out.data(), out.size(), stored.data(), stored.size());
  if (ZSTD_isError(n)) {
    return absl::DataLossError(absl::StrCat("zstd: ", ZSTD_getErrorName(n)));
  }
  if (n != expected_bytes) {
    return absl::DataLossError(
        absl::StrCat("decodes to ", n, " bytes, expected ", expected_bytes, " (truncated?)"));
  }
  return out;
}

}  // namespace meshrun::checkpoint
