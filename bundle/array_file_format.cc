#include "bundle/array_file_format.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace meshrun::bundle {
namespace {

constexpr int64_t kPrefixBytes = 16;          // magic, version, header bytes
constexpr int64_t kMaxHeaderBytes = 1 << 20;  // far above any batch's JSON

uint32_t LittleEndian32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

}  // namespace

absl::StatusOr<std::optional<ArrayFileHeaderRead>> ReadArrayFileHeader(const std::string& path,
                                                                       absl::string_view file) {
  const int64_t size = static_cast<int64_t>(file.size());
  if (size < kPrefixBytes ||
      std::memcmp(file.data(), kArrayFileMagic, sizeof(kArrayFileMagic)) != 0) {
    return std::nullopt;
  }
  const uint32_t version = LittleEndian32(file.data() + 8);
  if (version != kArrayFileVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        "array file ", path, " has format version ", version, "; this meshrun reads version ",
        kArrayFileVersion, " (write it with this meshrun's meshrun.data.write_arrays)"));
  }
  const int64_t header_bytes = LittleEndian32(file.data() + 12);
  if (header_bytes <= kPrefixBytes || header_bytes > std::min(size, kMaxHeaderBytes)) {
    return absl::InvalidArgumentError(absl::StrCat("array file ", path, ": its header claims ",
                                                   header_bytes, " bytes of a ", size,
                                                   "-byte file; the file is truncated or corrupt"));
  }
  ArrayFileHeaderRead read{.bytes = header_bytes};
  const std::string json(file.substr(kPrefixBytes, header_bytes - kPrefixBytes));
  if (auto s = google::protobuf::util::JsonStringToMessage(json, &read.header); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("array file ", path, ": its header is not a ",
                                                   "valid ArrayFileHeader: ", s.message().as_string()));
  }
  return read;
}

}  // namespace meshrun::bundle
