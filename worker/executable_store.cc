#include "worker/executable_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace meshrun::worker {
namespace {

constexpr char kSuffix[] = ".xexe";

bool IsFingerprint(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ExecutableStore>> ExecutableStore::Create(
    const std::string& directory) {
  std::error_code ec;
  std::filesystem::create_directories(directory, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create executable store ", directory, ": ", ec.message()));
  }
  // Temp files of transfers cut short by a crash.
  for (const auto& entry : std::filesystem::directory_iterator(directory, ec)) {
    if (absl::StrContains(entry.path().filename().string(), ".partial.")) {
      std::filesystem::remove(entry.path(), ec);
    }
  }
  return std::unique_ptr<ExecutableStore>(new ExecutableStore(directory));
}

std::string ExecutableStore::PathOf(const std::string& fingerprint) const {
  return absl::StrCat(directory_, "/", fingerprint, kSuffix);
}

absl::StatusOr<std::unique_ptr<ExecutableStore::Upload>> ExecutableStore::Begin(
    const std::string& fingerprint, int64_t total) {
  if (!IsFingerprint(fingerprint)) {
    return absl::InvalidArgumentError(
        absl::StrCat("fingerprint \"", fingerprint, "\" is not a lowercase hex sha256"));
  }
  if (total <= 0) return absl::InvalidArgumentError("total_bytes must be positive");
  static std::atomic<int64_t> counter{0};
  const std::string temp = absl::StrCat(directory_, "/", fingerprint, ".partial.", getpid(), ".",
                                        counter.fetch_add(1));
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("cannot create ", temp, ": ", std::strerror(errno)));
  }
  return std::unique_ptr<Upload>(new Upload(fingerprint, total, temp, PathOf(fingerprint), fd));
}

ExecutableStore::Upload::Upload(std::string fingerprint, int64_t total, std::string temp_path,
                                std::string final_path, int fd)
    : fingerprint_(std::move(fingerprint)),
      total_(total),
      temp_path_(std::move(temp_path)),
      final_path_(std::move(final_path)),
      fd_(fd) {}

ExecutableStore::Upload::~Upload() {
  if (fd_ >= 0) ::close(fd_);
  if (!done_) ::unlink(temp_path_.c_str());
}

absl::Status ExecutableStore::Upload::Append(int64_t offset, absl::string_view data) {
  if (offset != received_) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk at offset ", offset, " where ", received_, " was expected"));
  }
  if (static_cast<int64_t>(data.size()) > kMaxChunkBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk of ", data.size(), " bytes exceeds the 1 MiB limit"));
  }
  if (received_ + static_cast<int64_t>(data.size()) > total_) {
    return absl::InvalidArgumentError(
        absl::StrCat("more bytes than the announced total_bytes ", total_));
  }
  size_t written = 0;
  while (written < data.size()) {
    const ssize_t n = ::write(fd_, data.data() + written, data.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::InternalError(absl::StrCat("write failed: ", std::strerror(errno)));
    written += static_cast<size_t>(n);
  }
  hasher_.Update(data);
  received_ += static_cast<int64_t>(data.size());
  return absl::OkStatus();
}

absl::Status ExecutableStore::Upload::Commit(const std::string& sha256) {
  if (received_ != total_) {
    return absl::DataLossError(
        absl::StrCat("transfer truncated: received ", received_, " of ", total_, " bytes"));
  }
  const std::string digest = hasher_.HexDigest();
  if (digest != sha256 || digest != fingerprint_) {
    return absl::DataLossError(absl::StrCat("checksum mismatch: received bytes hash to ", digest,
                                            ", announced ", sha256, ", fingerprint ",
                                            fingerprint_));
  }
  if (::fsync(fd_) != 0 || ::close(fd_) != 0) {
    fd_ = -1;
    return absl::InternalError(absl::StrCat("cannot flush ", temp_path_));
  }
  fd_ = -1;
  if (::rename(temp_path_.c_str(), final_path_.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rename into ", final_path_, ": ",
                                            std::strerror(errno)));
  }
  done_ = true;
  return absl::OkStatus();
}

bool ExecutableStore::Has(const std::string& fingerprint) const {
  return IsFingerprint(fingerprint) && std::filesystem::exists(PathOf(fingerprint));
}

absl::StatusOr<std::string> ExecutableStore::Read(const std::string& fingerprint) const {
  if (!Has(fingerprint)) {
    return absl::NotFoundError(absl::StrCat("executable ", fingerprint, " is not held here"));
  }
  std::ifstream in(PathOf(fingerprint), std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  std::string contents = bytes.str();
  if (Sha256Hex(contents) != fingerprint) {
    std::filesystem::remove(PathOf(fingerprint));
    return absl::DataLossError(
        absl::StrCat("executable ", fingerprint, " was corrupted on disk; deleted"));
  }
  return contents;
}

std::vector<std::string> ExecutableStore::Fingerprints() const {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(directory_, ec)) {
    const std::string name = entry.path().filename().string();
    if (absl::EndsWith(name, kSuffix)) {
      const std::string fp = name.substr(0, name.size() - std::strlen(kSuffix));
      if (IsFingerprint(fp)) out.push_back(fp);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace meshrun::worker
