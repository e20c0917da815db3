#include "worker/executable_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <spdlog/spdlog.h>
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
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/crc32c.h"
#include "common/file_sync.h"
#include "common/lru.h"
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

// fsyncs the file at `path`, its data in pieces (common/file_sync.h). Returns 0 or an errno.
int SyncFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  const int error = FsyncInPieces(fd);
  ::close(fd);
  return error;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ExecutableStore>> ExecutableStore::Create(
    const std::string& directory, Limits limits) {
  std::error_code ec;
  std::filesystem::create_directories(directory, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create executable store ", directory, ": ", ec.message()));
  }
  auto store = std::unique_ptr<ExecutableStore>(new ExecutableStore(directory, limits));
  // Temp files left by a crash: transfers cut short, and committed ones not yet flushed. A
  // file that hashes to its fingerprint is the executable: kept. Anything else goes.
  bool kept = false;
  for (const auto& entry : std::filesystem::directory_iterator(directory, ec)) {
    const std::string name = entry.path().filename().string();
    const size_t mark = name.find(".partial.");
    if (mark == std::string::npos) continue;
    const std::string fp = name.substr(0, mark);
    const std::string final_path = store->PathOf(fp);
    // Hashed only when it could be kept.
    if (IsFingerprint(fp) && !std::filesystem::exists(final_path) &&
        Sha256File(entry.path().string()).value_or("") == fp &&
        SyncFile(entry.path().string()) == 0 &&
        ::rename(entry.path().c_str(), final_path.c_str()) == 0) {
      spdlog::info("executable store: kept {} (committed before a restart)", fp.substr(0, 12));
      kept = true;
    } else {
      std::filesystem::remove(entry.path(), ec);
    }
  }
  if (const int error = kept ? FsyncDirectory(directory) : 0; error != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot flush executable store ", directory, ": ", std::strerror(error)));
  }
  // What is held, oldest use first by modification time (Read refreshes it).
  absl::MutexLock lock(&store->mu_);
  for (const auto& entry : std::filesystem::directory_iterator(directory, ec)) {
    const std::string name = entry.path().filename().string();
    if (!absl::EndsWith(name, kSuffix)) continue;
    const std::string fp = name.substr(0, name.size() - std::strlen(kSuffix));
    struct stat st;
    if (!IsFingerprint(fp) || ::stat(entry.path().c_str(), &st) != 0) continue;
    store->uses_[fp] = {static_cast<int64_t>(st.st_size), absl::TimeFromTimespec(st.st_mtim)};
  }
  store->EvictLocked();
  return store;
}

ExecutableStore::ExecutableStore(std::string directory, Limits limits)
    : directory_(std::move(directory)), limits_(limits), flusher_([this] { FlushLoop(); }) {}

void ExecutableStore::EvictLocked() {
  for (const std::string& fp :
       LruEvictions(uses_, limits_.max_bytes, absl::Now() - limits_.keep_recent)) {
    spdlog::info("executable store: evicted {} ({} bytes; the store keeps {} bytes)",
                 fp.substr(0, 12), uses_[fp].bytes, limits_.max_bytes);
    ::unlink(PathOf(fp).c_str());
    uses_.erase(fp);
  }
}

int64_t ExecutableStore::DurableBytes() const {
  absl::MutexLock lock(&mu_);
  int64_t total = 0;
  for (const auto& [fp, use] : uses_) total += use.bytes;
  return total;
}

ExecutableStore::~ExecutableStore() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  flusher_.join();
}

void ExecutableStore::Publish(const std::string& fingerprint, const std::string& temp_path) {
  absl::MutexLock lock(&mu_);
  if (pending_.count(fingerprint) > 0 || std::filesystem::exists(PathOf(fingerprint))) {
    ::unlink(temp_path.c_str());  // a second copy of what is held
    return;
  }
  pending_[fingerprint] = temp_path;
  to_flush_.push_back(fingerprint);
}

void ExecutableStore::FlushLoop() {
  for (;;) {
    std::string fp, temp;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &ExecutableStore::HasFlushWork));
      if (to_flush_.empty()) return;  // stopping, everything flushed
      fp = std::move(to_flush_.front());
      to_flush_.pop_front();
      temp = pending_[fp];
      flushing_ = true;
    }
    // Readers find the bytes at the temp path until the rename, made under mu_.
    int error = SyncFile(temp);
    {
      absl::MutexLock lock(&mu_);
      auto still = pending_.find(fp);
      if (still == pending_.end() || still->second != temp) {
        flushing_ = false;  // Read found it corrupt and dropped it meanwhile
        continue;
      }
      if (error == 0 && ::rename(temp.c_str(), PathOf(fp).c_str()) != 0) error = errno;
      if (error != 0) {
        spdlog::error("executable store: cannot make {} durable ({}); dropped, so it must be "
                      "sent again", fp.substr(0, 12), std::strerror(error));
        ::unlink(temp.c_str());
      } else {
        std::error_code size_error;
        const auto size = std::filesystem::file_size(PathOf(fp), size_error);
        uses_[fp] = {size_error ? 0 : static_cast<int64_t>(size), absl::Now()};
      }
      pending_.erase(fp);
      EvictLocked();
    }
    if (const int dir_error = FsyncDirectory(directory_); dir_error != 0) {
      spdlog::error("executable store: cannot flush directory {}: {}", directory_,
                    std::strerror(dir_error));
    }
    absl::MutexLock lock(&mu_);
    flushing_ = false;
  }
}

void ExecutableStore::Flush() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &ExecutableStore::AllDurable));
}

std::string ExecutableStore::PathOf(const std::string& fingerprint) const {
  return absl::StrCat(directory_, "/", fingerprint, kSuffix);
}

absl::StatusOr<std::unique_ptr<ExecutableStore::Upload>> ExecutableStore::Begin(
    const std::string& fingerprint, int64_t total, Verify verify) {
  if (!IsFingerprint(fingerprint)) {
    return absl::InvalidArgumentError(
        absl::StrCat("fingerprint \"", fingerprint, "\" is not a lowercase hex sha256"));
  }
  if (total <= 0) return absl::InvalidArgumentError("total_bytes must be positive");
  if (total > limits_.max_executable_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("total_bytes ", total, " is over the ",
                                                   limits_.max_executable_bytes,
                                                   " bytes this worker accepts"));
  }
  if (uploads_.fetch_add(1) >= limits_.max_uploads) {
    uploads_.fetch_sub(1);
    return absl::ResourceExhaustedError(absl::StrCat(
        limits_.max_uploads, " executable uploads are in progress here; retry later"));
  }
  static std::atomic<int64_t> counter{0};
  const std::string temp = absl::StrCat(directory_, "/", fingerprint, ".partial.", getpid(), ".",
                                        counter.fetch_add(1));
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    uploads_.fetch_sub(1);
    return absl::InternalError(absl::StrCat("cannot create ", temp, ": ", std::strerror(errno)));
  }
  return std::unique_ptr<Upload>(
      new Upload(this, fingerprint, total, temp, fd, verify == Verify::kOnReceive));
}

ExecutableStore::Upload::Upload(ExecutableStore* store, std::string fingerprint, int64_t total,
                                std::string temp_path, int fd, bool hash)
    : store_(store),
      fingerprint_(std::move(fingerprint)),
      total_(total),
      temp_path_(std::move(temp_path)),
      hash_(hash),
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
  store_->uploads_.fetch_sub(1);
}

void ExecutableStore::Upload::StopWriter() {
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
  }
  writer_.join();
}

void ExecutableStore::Upload::WriteLoop() {
  std::function<void()> wake;
  for (;;) {
    Chunk chunk;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &Upload::HasWork));
      if (queue_.empty()) return;  // closing
      chunk = std::move(queue_.front());
      queue_.pop_front();
      wake = std::move(wake_);
      wake_ = nullptr;
    }
    if (wake) std::exchange(wake, nullptr)();  // room again: the caller can receive meanwhile
    std::string& data = chunk.data;
    absl::Status status;
    if (chunk.crc32c.has_value()) {
      if (const uint32_t crc = Crc32c(data); crc != *chunk.crc32c) {
        status = absl::DataLossError(absl::StrFormat(
            "chunk at offset %d was corrupted in transit: its bytes have CRC-32C %08x, the "
            "chunk announced %08x",
            chunk.offset, crc, *chunk.crc32c));
      }
    }
    for (size_t done = 0; status.ok() && done < data.size();) {
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
    if (hash_) hasher_.Update(data);
    {
      absl::MutexLock lock(&mu_);
      if (spare_.size() < kMaxQueuedChunks) {
        data.clear();  // keeps the capacity
        spare_.push_back(std::move(data));
      }
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

absl::Status ExecutableStore::Upload::Append(int64_t offset, absl::string_view data,
                                             std::optional<uint32_t> crc32c) {
  std::string copy(data);
  return Append(offset, &copy, crc32c);
}

absl::Status ExecutableStore::Upload::Append(int64_t offset, std::string* data,
                                             std::optional<uint32_t> crc32c) {
  RETURN_IF_ERROR(Check(offset, data->size()));
  if (!writer_.joinable()) return absl::FailedPreconditionError("upload already committed");
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &Upload::HasRoom));
  RETURN_IF_ERROR(write_status_);
  received_ += static_cast<int64_t>(data->size());
  queue_.push_back(Chunk{offset, std::move(*data), crc32c});
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
  if (!hash_) {  // Verify::kOnRead: the transport vouches for the bytes, Read for the name
    if (sha256 != fingerprint_) {
      return absl::DataLossError(absl::StrCat("announced sha256 ", sha256,
                                              " is not the fingerprint ", fingerprint_));
    }
  } else if (const std::string digest = hasher_.HexDigest();
             digest != sha256 || digest != fingerprint_) {
    return absl::DataLossError(absl::StrCat("checksum mismatch: received bytes hash to ", digest,
                                            ", announced ", sha256, ", fingerprint ",
                                            fingerprint_));
  }
  const bool closed = ::close(fd_) == 0;
  fd_ = -1;
  if (!closed) {
    return absl::InternalError(absl::StrCat("cannot write ", temp_path_, ": ",
                                            std::strerror(errno)));
  }
  done_ = true;
  store_->Publish(fingerprint_, temp_path_);
  return absl::OkStatus();
}

bool ExecutableStore::Has(const std::string& fingerprint) const {
  if (!IsFingerprint(fingerprint)) return false;
  absl::MutexLock lock(&mu_);
  return pending_.count(fingerprint) > 0 || std::filesystem::exists(PathOf(fingerprint));
}

absl::StatusOr<std::string> ExecutableStore::Read(const std::string& fingerprint) const {
  std::ifstream in;
  std::string path;
  if (IsFingerprint(fingerprint)) {
    absl::MutexLock lock(&mu_);  // opened before the flusher can rename it
    auto it = pending_.find(fingerprint);
    path = it != pending_.end() ? it->second : PathOf(fingerprint);
    in.open(path, std::ios::binary);
    if (auto use = uses_.find(fingerprint); use != uses_.end()) use->second.last = absl::Now();
  }
  if (!in.is_open()) {
    return absl::NotFoundError(absl::StrCat("executable ", fingerprint, " is not held here"));
  }
  std::stringstream bytes;
  bytes << in.rdbuf();
  std::string contents = bytes.str();
  if (Sha256Hex(contents) != fingerprint) {
    // The flusher may have renamed the file since it was opened: drop it wherever it is now.
    absl::MutexLock lock(&mu_);
    if (auto it = pending_.find(fingerprint); it != pending_.end()) {
      ::unlink(it->second.c_str());
      pending_.erase(it);
    }
    ::unlink(PathOf(fingerprint).c_str());
    uses_.erase(fingerprint);
    return absl::DataLossError(
        absl::StrCat("executable ", fingerprint, " was corrupted on disk; deleted"));
  }
  return contents;
}

std::vector<std::string> ExecutableStore::Fingerprints() const {
  std::vector<std::string> out;
  std::error_code ec;
  absl::MutexLock lock(&mu_);
  for (const auto& [fp, temp] : pending_) out.push_back(fp);
  for (const auto& entry : std::filesystem::directory_iterator(directory_, ec)) {
    const std::string name = entry.path().filename().string();
    if (absl::EndsWith(name, kSuffix)) {
      const std::string fp = name.substr(0, name.size() - std::strlen(kSuffix));
      if (IsFingerprint(fp) && pending_.count(fp) == 0) out.push_back(fp);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace meshrun::worker
