#include "common/content_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include <spdlog/spdlog.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/durable_file.h"
#include "common/file_sync.h"
#include "common/lru.h"
#include "common/sha256.h"
#include "common/status_macros.h"

namespace meshrun {
namespace {

constexpr char kTempMark[] = ".partial";

// Closes a descriptor when it goes out of scope.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() { ::close(fd_); }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  const int fd_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ContentStore>> ContentStore::Create(Config config) {
  if (config.directory.empty()) return absl::InvalidArgumentError("directory must not be empty");
  if (config.suffix.empty() || absl::StrContains(config.suffix, kTempMark)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "suffix \"", config.suffix, "\" must be non-empty and not contain \"", kTempMark, "\""));
  }
  if (config.clock == nullptr) return absl::InvalidArgumentError("clock must not be null");
  std::error_code error;
  std::filesystem::create_directories(config.directory, error);
  if (error || !std::filesystem::is_directory(config.directory)) {
    return absl::FailedPreconditionError(absl::StrCat("cannot create ", config.log_name, " ",
                                                      config.directory, ": ", error.message()));
  }
  std::unique_ptr<ContentStore> store(new ContentStore(std::move(config)));
  RETURN_IF_ERROR(store->Load());
  return store;
}

absl::Status ContentStore::Load() {
  const std::string& dir = config_.directory;
  // Temp files first, so a recovered one is indexed below as the entry it became.
  std::error_code ec;
  bool recovered = false;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!absl::StrContains(name, kTempMark)) continue;
    if (config_.recover_temp_files && RecoverTemp(name, entry.path().string())) {
      recovered = true;
    } else {
      std::filesystem::remove(entry.path(), ec);  // a write a crash cut short
    }
  }
  if (const int error = recovered ? FsyncDirectory(dir) : 0; error != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot flush ", config_.log_name, " ", dir, ": ", std::strerror(error)));
  }
  absl::MutexLock lock(&mu_);
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!absl::EndsWith(name, config_.suffix)) continue;
    const std::string sha = name.substr(0, name.size() - config_.suffix.size());
    struct stat st;
    if (!IsSha256Hex(sha) || ::stat(entry.path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
      continue;
    }
    entries_[sha] = {static_cast<int64_t>(st.st_size), absl::TimeFromTimespec(st.st_mtim)};
  }
  EvictLocked(config_.clock->Now());
  return absl::OkStatus();
}

bool ContentStore::RecoverTemp(const std::string& name, const std::string& path) {
  const std::string sha = name.substr(0, name.find(kTempMark));
  const std::string final_path = PathOf(sha);
  // Hashed only when it could be kept.
  if (!IsSha256Hex(sha) || std::filesystem::exists(final_path) ||
      Sha256File(path).value_or("") != sha || FsyncFile(path) != 0 ||
      ::rename(path.c_str(), final_path.c_str()) != 0) {
    return false;
  }
  spdlog::info("{}: kept {} (committed before a restart)", config_.log_name, sha.substr(0, 12));
  return true;
}

std::string ContentStore::PathOf(const std::string& sha256) const {
  return absl::StrCat(config_.directory, "/", sha256, config_.suffix);
}

std::string ContentStore::TempPath(const std::string& sha256) {
  return absl::StrCat(config_.directory, "/", sha256, kTempMark, ".", ::getpid(), ".",
                      temp_counter_.fetch_add(1));
}

void ContentStore::SyncDirectory() const {
  if (const int error = FsyncDirectory(config_.directory); error != 0) {
    spdlog::error("{}: cannot flush directory {}: {}", config_.log_name, config_.directory,
                  std::strerror(error));
  }
}

absl::StatusOr<std::string> ContentStore::Put(absl::string_view bytes) {
  std::string sha = Sha256Hex(bytes);
  const absl::Time now = config_.clock->Now();
  {
    absl::MutexLock lock(&mu_);
    if (auto it = entries_.find(sha); it != entries_.end()) {
      it->second.last = now;
      // Best effort: only the order after a restart depends on it.
      if (const int fd = ::open(PathOf(sha).c_str(), O_RDONLY | O_CLOEXEC); fd >= 0) {
        SetMtime(fd, now, PathOf(sha)).IgnoreError();
        ::close(fd);
      }
      return sha;
    }
  }
  const std::string temp = TempPath(sha);
  ASSIGN_OR_RETURN(const int fd, WriteDurableFile(temp, bytes, now));
  ::close(fd);
  {
    absl::MutexLock lock(&mu_);
    if (::rename(temp.c_str(), PathOf(sha).c_str()) != 0) {
      absl::Status status =
          ErrnoStatus(errno, absl::StrCat("rename ", temp, " to ", PathOf(sha)));
      ::unlink(temp.c_str());
      return status;
    }
    AddLocked(sha, static_cast<int64_t>(bytes.size()), now);
  }
  SyncDirectory();
  return sha;
}

absl::Status ContentStore::Install(const std::string& sha256, const std::string& temp_path) {
  if (!IsSha256Hex(sha256)) {
    ::unlink(temp_path.c_str());
    return absl::InvalidArgumentError(
        absl::StrCat("\"", sha256, "\" is not a lowercase hex sha256"));
  }
  const absl::Time now = config_.clock->Now();
  struct stat st;
  {
    const int fd = ::open(temp_path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus(errno, absl::StrCat("cannot open ", temp_path));
    FdCloser closer(fd);
    absl::Status status = SetMtime(fd, now, temp_path);
    if (status.ok() && ::fstat(fd, &st) != 0) {
      status = ErrnoStatus(errno, absl::StrCat("cannot stat ", temp_path));
    }
    if (const int error = status.ok() ? FsyncInPieces(fd) : 0; error != 0) {
      status = ErrnoStatus(error, absl::StrCat("fsync ", temp_path));
    }
    if (!status.ok()) {
      ::unlink(temp_path.c_str());
      return status;
    }
  }
  {
    absl::MutexLock lock(&mu_);
    const std::string path = PathOf(sha256);
    if (::rename(temp_path.c_str(), path.c_str()) != 0) {
      absl::Status status = ErrnoStatus(errno, absl::StrCat("rename ", temp_path, " to ", path));
      ::unlink(temp_path.c_str());
      return status;
    }
    AddLocked(sha256, static_cast<int64_t>(st.st_size), now);
  }
  SyncDirectory();
  return absl::OkStatus();
}

void ContentStore::AddLocked(const std::string& sha256, int64_t bytes, absl::Time now) {
  entries_[sha256] = {bytes, now};
  EvictLocked(now);
}

void ContentStore::EvictLocked(absl::Time now) {
  for (const std::string& sha :
       LruEvictions(entries_, config_.max_bytes, now - config_.keep_recent)) {
    spdlog::info("{}: evicted {} ({} bytes; the store keeps {} bytes)", config_.log_name,
                 sha.substr(0, 12), entries_[sha].bytes, config_.max_bytes);
    ::unlink(PathOf(sha).c_str());
    entries_.erase(sha);
  }
}

absl::StatusOr<std::string> ContentStore::Read(const std::string& sha256) {
  if (!IsSha256Hex(sha256)) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", sha256, "\" is not a lowercase hex sha256"));
  }
  const std::string path = PathOf(sha256);
  {
    absl::MutexLock lock(&mu_);
    if (entries_.count(sha256) == 0) {
      return absl::NotFoundError(absl::StrCat(sha256, " is not held in ", config_.directory));
    }
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int open_error = errno;
    if (open_error == ENOENT) {  // evicted meanwhile, or deleted behind the store's back
      absl::MutexLock lock(&mu_);
      if (!std::filesystem::exists(path)) entries_.erase(sha256);
    }
    return ErrnoStatus(open_error, absl::StrCat("cannot open ", path));
  }
  FdCloser closer(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoStatus(errno, absl::StrCat("cannot stat ", path));
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size > std::string().max_size()) {
    return absl::ResourceExhaustedError(absl::StrCat(path, " is too big to read into memory"));
  }
  std::string contents(static_cast<size_t>(size), '\0');
  absl::Status read = PreadFull(fd, contents.data(), contents.size(), 0);
  if (read.ok() && Sha256Hex(contents) != sha256) {
    read = absl::DataLossError("its contents hash to something else");
  }
  const absl::Time now = config_.clock->Now();
  absl::MutexLock lock(&mu_);
  if (!read.ok()) {
    // Only the file that was read: a good copy may have replaced it since.
    struct stat now_st;
    if (::stat(path.c_str(), &now_st) == 0 && now_st.st_dev == st.st_dev &&
        now_st.st_ino == st.st_ino) {
      ::unlink(path.c_str());
      entries_.erase(sha256);
    }
    spdlog::warn("{}: {} is corrupt ({}); deleted", config_.log_name, path,
                 std::string(read.message()));
    return absl::DataLossError(
        absl::StrCat(path, " no longer matches its sha256 (", read.message(), "); deleted"));
  }
  if (auto it = entries_.find(sha256); it != entries_.end()) {
    it->second.last = now;
    SetMtime(fd, now, path).IgnoreError();  // best effort, as in Put
  }
  return contents;
}

bool ContentStore::Has(const std::string& sha256) const {
  absl::MutexLock lock(&mu_);
  return entries_.count(sha256) > 0;
}

bool ContentStore::Remove(const std::string& sha256) {
  if (!IsSha256Hex(sha256)) return false;
  absl::MutexLock lock(&mu_);
  ::unlink(PathOf(sha256).c_str());  // also a file the index does not know
  return entries_.erase(sha256) > 0;
}

std::vector<std::string> ContentStore::List() const {
  std::vector<std::string> out;
  absl::MutexLock lock(&mu_);
  out.reserve(entries_.size());
  for (const auto& [sha, use] : entries_) out.push_back(sha);  // map order: sorted
  return out;
}

int64_t ContentStore::bytes() const {
  absl::MutexLock lock(&mu_);
  int64_t total = 0;
  for (const auto& [sha, use] : entries_) total += use.bytes;
  return total;
}

}  // namespace meshrun
