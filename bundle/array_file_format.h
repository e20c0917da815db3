// The typed array file's header (docs/data.md; meshrun.data.write_arrays writes it): the 8-byte
// magic "MRARRAYS", a u32 format version, the u32 header size in bytes (a multiple of 64, so
// batches stay aligned), then JSON meshrun.v1.ArrayFileHeader padded with spaces. The bundle's
// own batches (data.file) and --data array files share it; worker/array_file.h checks the rest.
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "meshrun/v1/job.pb.h"

namespace meshrun::bundle {

inline constexpr char kArrayFileMagic[8] = {'M', 'R', 'A', 'R', 'R', 'A', 'Y', 'S'};
inline constexpr uint32_t kArrayFileVersion = 1;

struct ArrayFileHeaderRead {
  v1::ArrayFileHeader header;
  int64_t bytes = 0;  // where the batches start
};

// The header at the start of `file` (the file's bytes, or at least its first 1 MiB), read from
// `path` (named in errors); nullopt for a file without one (written before typed files).
// Errors: INVALID_ARGUMENT (an unknown format version, a size past the file or 1 MiB, JSON
// that is not an ArrayFileHeader), each naming the file and the fix.
absl::StatusOr<std::optional<ArrayFileHeaderRead>> ReadArrayFileHeader(const std::string& path,
                                                                       absl::string_view file);

}  // namespace meshrun::bundle
