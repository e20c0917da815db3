#include "coordinator/executable_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include <spdlog/spdlog.h>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/durable_file.h"
#include "common/file_sync.h"
#include "common/sha256.h"
#include "common/status_macros.h"

namespace meshrun::coordinator {
namespace {

constexpr absl::string_view kEntrySuffix = ".xexe";
constexpr absl::string_view kTempPrefix = ".tmp.";
constexpr absl::string_view kKeyTag = "meshrun.executable_cache.key.v1";

absl::Status CheckKey(const std::string& key) {
  if (IsSha256Hex(key)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("cache key must be 64 lowercase hex digits (CacheKey()), got \"", key, "\""));
}

void AppendU64(Sha256& hasher, uint64_t value) {
  char bytes[8];
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((value >> (8 * i)) & 0xff);
  hasher.Update(absl::string_view(bytes, sizeof(bytes)));
}

void AppendU32(Sha256& hasher, uint32_t value) {
  char bytes[4];
  for (int i = 0; i < 4; ++i) bytes[i] = static_cast<char>((value >> (8 * i)) & 0xff);
  hasher.Update(absl::string_view(bytes, sizeof(bytes)));
}

void AppendBytes(Sha256& hasher, absl::string_view bytes) {
  AppendU64(hasher, bytes.size());
  hasher.Update(bytes);
}

void SyncDirectory(const std::string& directory) {
  if (const int error = FsyncDirectory(directory); error != 0) {
    spdlog::warn("executable cache: cannot fsync directory {}: {}", directory,
                 std::strerror(error));
  }
}

}  // namespace

std::string CacheKey(absl::string_view program, absl::string_view compile_options,
                     absl::Span<const int32_t> device_assignment,
                     const runtime::RuntimeIdentity& runtime, absl::string_view target) {
  Sha256 hasher;
  AppendBytes(hasher, kKeyTag);
  AppendBytes(hasher, program);
  AppendBytes(hasher, compile_options);
  AppendU64(hasher, device_assignment.size());
  for (int32_t id : device_assignment) AppendU64(hasher, static_cast<uint64_t>(int64_t{id}));
  AppendBytes(hasher, runtime.platform_name);
  AppendBytes(hasher, runtime.platform_version);
  AppendU32(hasher, runtime.pjrt_api_major);
  AppendU32(hasher, runtime.pjrt_api_minor);
  AppendBytes(hasher, runtime.plugin_sha256);
  if (!target.empty()) AppendBytes(hasher, target);
  return hasher.HexDigest();
}

// ---------------------------------------------------------------------------------------
// CachedExecutable

struct CachedExecutable::File {
  explicit File(int fd) : fd(fd) {}
  ~File() { ::close(fd); }
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  const int fd;
};

CachedExecutable::CachedExecutable(std::string key, std::string sha256, uint64_t size,
                                   std::string path, std::shared_ptr<const File> file)
    : key_(std::move(key)),
      sha256_(std::move(sha256)),
      size_(size),
      path_(std::move(path)),
      file_(std::move(file)) {}

absl::StatusOr<std::string> CachedExecutable::ReadAt(uint64_t offset, size_t max_bytes) const {
  if (offset > size_) {
    return absl::OutOfRangeError(
        absl::StrCat("offset ", offset, " is past the end of a ", size_, "-byte executable"));
  }
  std::string out(static_cast<size_t>(std::min<uint64_t>(max_bytes, size_ - offset)), '\0');
  RETURN_IF_ERROR(ReadAt(offset, absl::MakeSpan(out)));
  return out;
}

absl::Status CachedExecutable::ReadAt(uint64_t offset, absl::Span<char> out) const {
  if (offset > size_ || out.size() > size_ - offset) {
    return absl::OutOfRangeError(absl::StrCat("bytes [", offset, ", ", offset + out.size(),
                                              ") are past the end of a ", size_,
                                              "-byte executable"));
  }
  return PreadFull(file_->fd, out.data(), out.size(), offset);
}

absl::StatusOr<std::string> CachedExecutable::ReadAll() const {
  if (size_ > std::string().max_size()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("a ", size_, "-byte executable does not fit in memory; stream it"));
  }
  return ReadAt(0, static_cast<size_t>(size_));
}

absl::Status CachedExecutable::ForEachChunk(
    size_t chunk_bytes, const std::function<absl::Status(absl::string_view)>& sink) const {
  if (chunk_bytes == 0) return absl::InvalidArgumentError("chunk_bytes must be positive");
  std::string buffer(static_cast<size_t>(std::min<uint64_t>(chunk_bytes, size_)), '\0');
  for (uint64_t offset = 0; offset < size_;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk_bytes, size_ - offset));
    RETURN_IF_ERROR(PreadFull(file_->fd, buffer.data(), n, offset));
    RETURN_IF_ERROR(sink(absl::string_view(buffer.data(), n)));
    offset += n;
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------
// ExecutableCache

struct ExecutableCache::Flight {
  absl::Notification done;
  absl::StatusOr<GetOrCompileResult> result =
      absl::InternalError("the compile for this key did not finish");
};

const char* ExecutableCache::OutcomeName(Outcome outcome) {
  switch (outcome) {
    case Outcome::kHit: return "hit";
    case Outcome::kCompiled: return "compiled";
    case Outcome::kJoined: return "joined";
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<ExecutableCache>> ExecutableCache::Create(Config config) {
  if (config.directory.empty()) return absl::InvalidArgumentError("directory must not be empty");
  if (config.clock == nullptr) return absl::InvalidArgumentError("clock must not be null");
  if (config.max_bytes == 0) return absl::InvalidArgumentError("max_bytes must be positive");
  std::error_code error;
  std::filesystem::create_directories(config.directory, error);
  if (error) {
    return ErrnoStatus(error.value(), absl::StrCat("cannot create cache directory ",
                                                   config.directory));
  }
  const std::string lock_path = (std::filesystem::path(config.directory) / ".lock").string();
  const int lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd < 0) return ErrnoStatus(errno, absl::StrCat("cannot open ", lock_path));
  if (::flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    const int lock_error = errno;
    ::close(lock_fd);
    if (lock_error == EWOULDBLOCK) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cache directory ", config.directory, " is in use by another cache object"));
    }
    return ErrnoStatus(lock_error, absl::StrCat("cannot lock ", lock_path));
  }
  std::unique_ptr<ExecutableCache> cache(new ExecutableCache(std::move(config), lock_fd));
  RETURN_IF_ERROR(cache->Load());
  return cache;
}

ExecutableCache::ExecutableCache(Config config, int lock_fd)
    : config_(std::move(config)), lock_fd_(lock_fd) {}

ExecutableCache::~ExecutableCache() { ::close(lock_fd_); }

std::string ExecutableCache::EntryPath(const std::string& key, const std::string& sha256) const {
  return (std::filesystem::path(config_.directory) / absl::StrCat(key, ".", sha256, kEntrySuffix))
      .string();
}

absl::Status ExecutableCache::Load() {
  std::error_code error;
  std::filesystem::directory_iterator it(config_.directory, error);
  if (error) {
    return ErrnoStatus(error.value(), absl::StrCat("cannot list ", config_.directory));
  }
  const absl::Time now = config_.clock->Now();
  absl::MutexLock lock(&mu_);
  for (; it != std::filesystem::directory_iterator(); it.increment(error)) {
    if (error) return ErrnoStatus(error.value(), absl::StrCat("cannot list ", config_.directory));
    const std::string name = it->path().filename().string();
    const std::string path = it->path().string();
    struct stat st;
    if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    const absl::Time mtime = absl::TimeFromTimespec(st.st_mtim);
    if (absl::StartsWith(name, kTempPrefix)) {
      if (now - mtime > config_.stale_temp_age) {
        spdlog::info("executable cache: deleting stale temp file {}", path);
        ::unlink(path.c_str());
      }
      continue;
    }
    // <key 64>.<sha 64>.xexe
    if (name.size() != 64 + 1 + 64 + kEntrySuffix.size() || name[64] != '.' ||
        !absl::EndsWith(name, kEntrySuffix)) {
      continue;
    }
    const std::string key = name.substr(0, 64);
    const std::string sha = name.substr(65, 64);
    if (!IsSha256Hex(key) || !IsSha256Hex(sha)) continue;
    Meta meta{.sha256 = sha, .size = static_cast<uint64_t>(st.st_size), .last_used = mtime};
    auto [existing, inserted] = entries_.emplace(key, meta);
    if (!inserted) {
      // Two versions of one key (a crash between rename and unlink): keep the newer.
      Meta& old = existing->second;
      const bool keep_new = std::tie(meta.last_used, meta.sha256) >
                            std::tie(old.last_used, old.sha256);
      const std::string drop = keep_new ? EntryPath(key, old.sha256) : path;
      spdlog::info("executable cache: deleting superseded entry {}", drop);
      ::unlink(drop.c_str());
      if (!keep_new) continue;
      total_bytes_ -= old.size;
      old = meta;
    }
    total_bytes_ += meta.size;
  }
  EvictLocked("");
  spdlog::info("executable cache: {} entries, {} bytes in {} (max {} bytes)", entries_.size(),
               total_bytes_, config_.directory, config_.max_bytes);
  return absl::OkStatus();
}

void ExecutableCache::EvictLocked(const std::string& keep) {
  while (total_bytes_ > config_.max_bytes) {
    auto victim = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->first == keep) continue;
      // Ties keep map (key) order: the first key seen with the oldest time wins.
      if (victim == entries_.end() || it->second.last_used < victim->second.last_used) {
        victim = it;
      }
    }
    if (victim == entries_.end()) return;
    const std::string path = EntryPath(victim->first, victim->second.sha256);
    spdlog::info("executable cache: evicting {} ({} bytes, last used {})", path,
                 victim->second.size, absl::FormatTime(victim->second.last_used));
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      spdlog::warn("executable cache: cannot delete {}: {}", path, std::strerror(errno));
    }
    total_bytes_ -= victim->second.size;
    entries_.erase(victim);
  }
}

absl::StatusOr<std::optional<CachedExecutable>> ExecutableCache::Lookup(const std::string& key) {
  RETURN_IF_ERROR(CheckKey(key));
  std::string sha;
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(key);
    if (it == entries_.end()) return std::nullopt;
    sha = it->second.sha256;
  }
  const std::string path = EntryPath(key, sha);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int open_error = errno;
    if (open_error != ENOENT) return ErrnoStatus(open_error, absl::StrCat("cannot open ", path));
    // Evicted or replaced since, or removed behind our back: a miss.
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(key);
    if (it != entries_.end() && it->second.sha256 == sha) {
      spdlog::warn("executable cache: entry {} vanished from disk; will recompile", path);
      total_bytes_ -= it->second.size;
      entries_.erase(it);
    }
    return std::nullopt;
  }
  auto file = std::make_shared<const CachedExecutable::File>(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoStatus(errno, absl::StrCat("cannot stat ", path));
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  absl::StatusOr<std::string> actual = Sha256OfFd(fd, size);
  if (!actual.ok() || *actual != sha) {
    DropCorrupt(key, sha, static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino),
                actual.ok() ? absl::StrCat("contents hash to ", *actual)
                            : std::string(actual.status().message()));
    return std::nullopt;
  }
  const absl::Time now = config_.clock->Now();
  if (absl::Status touched = SetMtime(fd, now, path); !touched.ok()) {
    spdlog::warn("executable cache: cannot record use of {}: {}", path, touched.ToString());
  }
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(key);
    if (it != entries_.end() && it->second.sha256 == sha) it->second.last_used = now;
  }
  return CachedExecutable(key, sha, size, path, std::move(file));
}

void ExecutableCache::DropCorrupt(const std::string& key, const std::string& sha256,
                                  uint64_t device, uint64_t inode, const std::string& why) {
  const std::string path = EntryPath(key, sha256);
  spdlog::warn("executable cache: entry {} is corrupt ({}, expected {}); deleted, will recompile",
               path, why, sha256);
  absl::MutexLock lock(&mu_);
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && static_cast<uint64_t>(st.st_dev) == device &&
      static_cast<uint64_t>(st.st_ino) == inode) {
    ::unlink(path.c_str());
  }
  auto it = entries_.find(key);
  if (it != entries_.end() && it->second.sha256 == sha256) {
    total_bytes_ -= it->second.size;
    entries_.erase(it);
  }
}

absl::StatusOr<std::pair<int, std::string>> ExecutableCache::WriteTemp(const std::string& key,
                                                                       absl::string_view bytes,
                                                                       absl::Time mtime) {
  uint64_t serial;
  {
    absl::MutexLock lock(&mu_);
    serial = ++temp_counter_;
  }
  const std::string path =
      (std::filesystem::path(config_.directory) /
       absl::StrCat(kTempPrefix, key, ".", ::getpid(), ".", serial))
          .string();
  ASSIGN_OR_RETURN(const int fd, WriteDurableFile(path, bytes, mtime));
  return std::make_pair(fd, path);
}

absl::StatusOr<CachedExecutable> ExecutableCache::InsertAndOpen(const std::string& key,
                                                                absl::string_view bytes,
                                                                bool keep_unstored) {
  const uint64_t size = bytes.size();
  if (size > config_.max_bytes && !keep_unstored) {
    return absl::ResourceExhaustedError(
        absl::StrCat("a ", size, "-byte executable exceeds the cache's max_bytes ",
                     config_.max_bytes, "; raise max_bytes to cache it"));
  }
  const std::string sha = Sha256Hex(bytes);
  const absl::Time now = config_.clock->Now();
  ASSIGN_OR_RETURN(auto temp, WriteTemp(key, bytes, now));
  auto [fd, temp_path] = temp;
  auto file = std::make_shared<const CachedExecutable::File>(fd);
  if (size > config_.max_bytes) {  // keep_unstored: an anonymous file, gone when closed
    ::unlink(temp_path.c_str());
    return CachedExecutable(key, sha, size, "", std::move(file));
  }
  const std::string path = EntryPath(key, sha);
  {
    absl::MutexLock lock(&mu_);
    if (::rename(temp_path.c_str(), path.c_str()) != 0) {
      absl::Status status = ErrnoStatus(errno, absl::StrCat("rename ", temp_path, " to ", path));
      ::unlink(temp_path.c_str());
      return status;
    }
    auto it = entries_.find(key);
    if (it != entries_.end()) {
      if (it->second.sha256 != sha) ::unlink(EntryPath(key, it->second.sha256).c_str());
      total_bytes_ -= it->second.size;
    }
    entries_[key] = Meta{.sha256 = sha, .size = size, .last_used = now};
    total_bytes_ += size;
    EvictLocked(key);
  }
  SyncDirectory(config_.directory);
  return CachedExecutable(key, sha, size, path, std::move(file));
}

absl::Status ExecutableCache::Insert(const std::string& key, absl::string_view bytes) {
  RETURN_IF_ERROR(CheckKey(key));
  return InsertAndOpen(key, bytes, /*keep_unstored=*/false).status();
}

absl::StatusOr<ExecutableCache::GetOrCompileResult> ExecutableCache::GetOrCompile(
    const std::string& key, const std::function<absl::StatusOr<std::string>()>& compile) {
  RETURN_IF_ERROR(CheckKey(key));
  std::shared_ptr<Flight> flight;
  bool leader = false;
  {
    absl::MutexLock lock(&mu_);
    std::shared_ptr<Flight>& slot = flights_[key];
    if (slot == nullptr) {
      slot = std::make_shared<Flight>();
      leader = true;
    }
    flight = slot;
  }
  if (!leader) {
    flight->done.WaitForNotification();
    absl::StatusOr<GetOrCompileResult> result = flight->result;
    if (result.ok() && result->outcome == Outcome::kCompiled) result->outcome = Outcome::kJoined;
    return result;
  }
  // Publish whatever happened, even if `compile` unwinds, so waiters never hang.
  absl::Cleanup publish = [&] {
    {
      absl::MutexLock lock(&mu_);
      flights_.erase(key);
    }
    flight->done.Notify();
  };
  flight->result = [&]() -> absl::StatusOr<GetOrCompileResult> {
    ASSIGN_OR_RETURN(std::optional<CachedExecutable> found, Lookup(key));
    if (found.has_value()) {
      return GetOrCompileResult{.executable = *std::move(found),
                                .outcome = Outcome::kHit,
                                .compile_time = absl::ZeroDuration(),
                                .stored = true};
    }
    const absl::Time start = config_.clock->Now();
    ASSIGN_OR_RETURN(std::string bytes, compile());
    const absl::Duration compile_time = config_.clock->Now() - start;
    const bool fits = bytes.size() <= config_.max_bytes;
    if (!fits) {
      spdlog::warn("executable cache: {}-byte executable for key {} exceeds max_bytes {}; "
                   "not stored, it will be compiled again next time",
                   bytes.size(), key, config_.max_bytes);
    }
    ASSIGN_OR_RETURN(CachedExecutable executable,
                     InsertAndOpen(key, bytes, /*keep_unstored=*/true));
    return GetOrCompileResult{.executable = std::move(executable),
                              .outcome = Outcome::kCompiled,
                              .compile_time = compile_time,
                              .stored = fits};
  }();
  return flight->result;
}

uint64_t ExecutableCache::Size() const {
  absl::MutexLock lock(&mu_);
  return total_bytes_;
}

size_t ExecutableCache::EntryCount() const {
  absl::MutexLock lock(&mu_);
  return entries_.size();
}

std::vector<ExecutableCache::EntryInfo> ExecutableCache::List() const {
  std::vector<EntryInfo> list;
  {
    absl::MutexLock lock(&mu_);
    list.reserve(entries_.size());
    for (const auto& [key, meta] : entries_) {
      list.push_back({.key = key, .sha256 = meta.sha256, .size = meta.size,
                      .last_used = meta.last_used});
    }
  }
  std::stable_sort(list.begin(), list.end(), [](const EntryInfo& a, const EntryInfo& b) {
    return a.last_used > b.last_used;
  });
  return list;
}

}  // namespace meshrun::coordinator
