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
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

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
  return std::unique_ptr<Upload>(
      new Upload(fingerprint, total, temp, PathOf(fingerprint), directory_, fd));
}

ExecutableStore::Upload::Upload(std::string fingerprint, int64_t total, std::string temp_path,
                                std::string final_path, std::string directory, int fd)
    : fingerprint_(std::move(fingerprint)),
      total_(total),
      temp_path_(std::move(temp_path)),
      final_path_(std::move(final_path)),
      directory_(std::move(directory)),
      fd_(fd),
      writer_([this] { WriteLoop(); }) {}

ExecutableStore::Upload::~Upload() {
  if (writer_.joinable()) {
    {
      absl::MutexLock lock(&mu_);
      queue_.clear();  // discarded: not worth writing
    }
    StopWriter();
  }
  if (fd_ >= 0) ::close(fd_);
  if (!done_) ::unlink(temp_path_.c_str());
}

void ExecutableStore::Upload::StopWriter() {
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
  }
  writer_.join();
}

void ExecutableStore::Upload::WriteLoop() {
  // Writeback is started every this many bytes, so the disk works while chunks still arrive.
  constexpr int64_t kWritebackBytes = 8 << 20;
  int64_t written = 0, flushed = 0;
  std::function<void()> wake;
  for (;;) {
    std::string data;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &Upload::HasWork));
      if (queue_.empty()) return;  // closing
      data = std::move(queue_.front());
      queue_.pop_front();
      wake = std::move(wake_);
      wake_ = nullptr;
    }
    if (wake) std::exchange(wake, nullptr)();  // room again: the caller can receive meanwhile
    absl::Status status;
    for (size_t done = 0; done < data.size();) {
      const ssize_t n = ::write(fd_, data.data() + done, data.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        status = absl::InternalError(
            absl::StrCat("write to ", temp_path_, " failed: ", std::strerror(errno)));
        break;
      }
      done += static_cast<size_t>(n);
    }
    if (!status.ok()) {
      {
        absl::MutexLock lock(&mu_);
        write_status_ = std::move(status);
        queue_.clear();
        wake = std::move(wake_);
        wake_ = nullptr;
      }
      if (wake) wake();  // the next Append reports the error
      return;
    }
    hasher_.Update(data);
    written += static_cast<int64_t>(data.size());
    {
      absl::MutexLock lock(&mu_);
      if (spare_.size() < kMaxQueuedChunks) {
        data.clear();  // keeps the capacity
        spare_.push_back(std::move(data));
      }
    }
    if (written - flushed >= kWritebackBytes) {
      // Only starts the writeback (Commit's fsync is what makes the file durable); an error
      // here shows up again there.
      ::sync_file_range(fd_, flushed, written - flushed, SYNC_FILE_RANGE_WRITE);
      flushed = written;
    }
  }
}

absl::Status ExecutableStore::Upload::Check(int64_t offset, size_t size) const {
  if (offset != received_) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk at offset ", offset, " where ", received_, " was expected"));
  }
  if (static_cast<int64_t>(size) > kMaxChunkBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk of ", size, " bytes exceeds the 1 MiB limit"));
  }
  if (received_ + static_cast<int64_t>(size) > total_) {
    return absl::InvalidArgumentError(
        absl::StrCat("more bytes than the announced total_bytes ", total_));
  }
  return absl::OkStatus();
}

absl::Status ExecutableStore::Upload::Append(int64_t offset, absl::string_view data) {
  std::string copy(data);
  return Append(offset, &copy);
}

absl::Status ExecutableStore::Upload::Append(int64_t offset, std::string* data) {
  RETURN_IF_ERROR(Check(offset, data->size()));
  if (!writer_.joinable()) return absl::FailedPreconditionError("upload already committed");
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &Upload::HasRoom));
  RETURN_IF_ERROR(write_status_);
  received_ += static_cast<int64_t>(data->size());
  queue_.push_back(std::move(*data));
  data->clear();
  if (!spare_.empty()) {
    data->swap(spare_.back());
    spare_.pop_back();
  }
  return absl::OkStatus();
}

bool ExecutableStore::Upload::HasRoomOrNotify(std::function<void()> wake) {
  absl::MutexLock lock(&mu_);
  if (HasRoom()) return true;
  wake_ = std::move(wake);
  return false;
}

absl::Status ExecutableStore::Upload::Commit(const std::string& sha256) {
  if (!writer_.joinable()) return absl::FailedPreconditionError("upload already committed");
  StopWriter();
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(write_status_);
  }
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
  const bool flushed = ::fsync(fd_) == 0;
  const bool closed = ::close(fd_) == 0;
  fd_ = -1;
  if (!flushed || !closed) return absl::InternalError(absl::StrCat("cannot flush ", temp_path_));
  if (::rename(temp_path_.c_str(), final_path_.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rename into ", final_path_, ": ",
                                            std::strerror(errno)));
  }
  done_ = true;
  // The rename itself must reach the disk before the executable is acknowledged.
  const int dir = ::open(directory_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  const bool dir_synced = dir >= 0 && ::fsync(dir) == 0;
  if (dir >= 0) ::close(dir);
  if (!dir_synced) {
    return absl::InternalError(absl::StrCat("cannot flush directory ", directory_, ": ",
                                            std::strerror(errno)));
  }
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
