#include "worker/array_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/sha256.h"

namespace meshrun::worker {

absl::StatusOr<std::shared_ptr<const ArrayFile>> ArrayFile::Open(const std::string& path,
                                                                 int64_t record_bytes) {
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
  if (size == 0 || size % record_bytes != 0) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(
        "array file ", path, " holds ", size, " bytes, not a positive multiple of the ",
        record_bytes, " bytes one batch of the job's batch inputs takes (meshrun.data."
        "write_arrays writes the inputs in the step's order, batch after batch)"));
  }
  void* mapped = mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);  // the mapping keeps the file
  if (mapped == MAP_FAILED) return absl::DataLossError(absl::StrCat("cannot map array file ", path));
  std::shared_ptr<ArrayFile> file(new ArrayFile());
  file->base_ = mapped;
  file->size_ = static_cast<size_t>(size);
  file->record_bytes_ = record_bytes;
  file->records_ = size / record_bytes;
  // The receipt's hash, in pieces, each dropped from the resident set after use.
  constexpr size_t kPiece = 16 << 20;
  Sha256 hash;
  const char* bytes = static_cast<const char*>(mapped);
  for (size_t at = 0; at < file->size_; at += kPiece) {
    const size_t n = std::min(kPiece, file->size_ - at);
    hash.Update(absl::string_view(bytes + at, n));
    madvise(const_cast<char*>(bytes) + at, n, MADV_DONTNEED);
  }
  file->receipt_.files = {path};
  file->receipt_.bytes = size;
  file->receipt_.sha256 = hash.HexDigest();
  file->receipt_.file_sha256 = {file->receipt_.sha256};
  return std::shared_ptr<const ArrayFile>(std::move(file));
}

ArrayFile::~ArrayFile() {
  if (base_ != nullptr) munmap(base_, size_);
}

absl::string_view ArrayFile::Record(int64_t index) const {
  return absl::string_view(static_cast<const char*>(base_) + index * record_bytes_,
                           static_cast<size_t>(record_bytes_));
}

}  // namespace meshrun::worker
