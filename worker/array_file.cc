#include "worker/array_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/sha256.h"
#include "common/status_macros.h"

namespace meshrun::worker {
namespace {

std::string Describe(const v1::ArrayFileHeader::Array& a) {
  return absl::StrCat(a.dtype(), "[", absl::StrJoin(a.shape(), ","), "]");
}

std::string Names(const std::vector<std::string>& names) {
  return absl::StrCat("\"", absl::StrJoin(names, "\", \""), "\"");
}

// The header's arrays against the program's, in order, each named when it differs.
absl::Status CheckLayout(const std::string& path, const v1::ArrayFileHeader& header,
                         const std::vector<BatchArray>& batch) {
  std::vector<std::string> in_file, taken;
  for (const auto& a : header.arrays()) in_file.push_back(a.name());
  for (const BatchArray& a : batch) taken.push_back(a.name);
  const std::string fix =
      "write the batches with the structure the program was exported with (meshrun.data."
      "write_arrays takes the same pytree as the example batch)";
  if (in_file.size() != taken.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "array file ", path, " holds ", in_file.size(), " arrays per batch (", Names(in_file),
        "); the program takes ", taken.size(), " (", Names(taken), "): ", fix));
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    const v1::ArrayFileHeader::Array& file = header.arrays(static_cast<int>(i));
    if (file.name() != batch[i].name) {
      const bool elsewhere = std::find(taken.begin(), taken.end(), file.name()) != taken.end();
      return absl::InvalidArgumentError(absl::StrCat(
          "array file ", path, ": array ", i, " is \"", file.name(), "\" but the program's batch "
          "input ", i, " is \"", batch[i].name, "\"",
          elsewhere ? " (the file holds the arrays in another order: file "
                    : " (the program takes no such array: file ",
          Names(in_file), ", program ", Names(taken), "): ", fix));
    }
    const std::string want = runtime::ToString(batch[i].shape);
    if (Describe(file) != want) {
      return absl::InvalidArgumentError(absl::StrCat(
          "array file ", path, ": array \"", file.name(), "\" is ", Describe(file),
          " in the file; the program takes ", want, ": write it as ", want));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<const ArrayFile>> ArrayFile::Open(
    const std::string& path, const std::vector<BatchArray>& batch) {
  int64_t record_bytes = 0;
  for (const BatchArray& a : batch) record_bytes += a.shape.ByteSize();
  if (record_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("array file ", path, ": the job's batch inputs "
                                                   "take ", record_bytes, " bytes"));
  }
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("array file ", path, " cannot be opened"));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat("array file ", path, " is not a regular file"));
  }
  const int64_t size = st.st_size;
  if (size == 0) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat("array file ", path, " is empty"));
  }
  void* mapped = mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);  // the mapping keeps the file
  if (mapped == MAP_FAILED) return absl::DataLossError(absl::StrCat("cannot map array file ", path));
  std::shared_ptr<ArrayFile> file(new ArrayFile());  // unmaps on every return below
  file->base_ = mapped;
  file->size_ = static_cast<size_t>(size);
  file->record_bytes_ = record_bytes;
  const char* bytes = static_cast<const char*>(mapped);
  ASSIGN_OR_RETURN(std::optional<bundle::ArrayFileHeaderRead> header,
                   bundle::ReadArrayFileHeader(path, absl::string_view(bytes, size)));
  if (header.has_value()) {
    RETURN_IF_ERROR(CheckLayout(path, header->header, batch));
    file->payload_offset_ = header->bytes;
    file->header_ = std::move(header->header);
  }
  const int64_t payload = size - file->payload_offset_;
  if (file->header_.has_value()) {
    const int64_t batches = file->header_->batches();
    if (batches < 1 || payload != batches * record_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "array file ", path, " holds ", payload, " bytes of batches; its header says ", batches,
          " batches of ", record_bytes, " bytes (", batches * record_bytes,
          "): the file is truncated or has trailing bytes"));
    }
  } else if (payload % record_bytes != 0) {
    std::vector<std::string> arrays;
    for (const BatchArray& a : batch) {
      arrays.push_back(absl::StrCat(a.name, " ", runtime::ToString(a.shape)));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "array file ", path, " holds ", size, " bytes, not whole batches of the ", record_bytes,
        " bytes one batch of the program's inputs takes (", absl::StrJoin(arrays, ", "),
        "); it has no header to say what it holds: write it again with meshrun.data."
        "write_arrays, which records each array's name, dtype and shape"));
  }
  file->records_ = payload / record_bytes;
  // The receipt's hash over the whole file and, for a typed file, the payload's (checked
  // against its header), in pieces, each dropped from the resident set after use.
  constexpr int64_t kPiece = 16 << 20;
  const bool typed = file->header_.has_value();
  Sha256 whole, body;
  for (int64_t at = 0; at < size; at += kPiece) {
    const int64_t n = std::min(kPiece, size - at);
    whole.Update(absl::string_view(bytes + at, n));
    const int64_t from = std::max(at, file->payload_offset_);
    if (typed && from < at + n) body.Update(absl::string_view(bytes + from, at + n - from));
    madvise(const_cast<char*>(bytes) + at, n, MADV_DONTNEED);
  }
  if (typed) {
    const std::string sha = body.HexDigest();
    if (sha != file->header_->payload_sha256()) {
      return absl::DataLossError(absl::StrCat(
          "array file ", path, ": its batches hash to sha256 ", sha, ", its header says ",
          file->header_->payload_sha256(), ": the file is corrupt or changed after it was written"));
    }
  }
  file->receipt_.files = {path};
  file->receipt_.bytes = size;
  file->receipt_.sha256 = whole.HexDigest();
  file->receipt_.file_sha256 = {file->receipt_.sha256};
  return std::shared_ptr<const ArrayFile>(std::move(file));
}

ArrayFile::~ArrayFile() {
  if (base_ != nullptr) munmap(base_, size_);
}

absl::string_view ArrayFile::Record(int64_t index) const {
  return absl::string_view(
      static_cast<const char*>(base_) + payload_offset_ + index * record_bytes_,
      static_cast<size_t>(record_bytes_));
}

}  // namespace meshrun::worker
