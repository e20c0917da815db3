#include "worker/executable_store.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/crc32c.h"
#include "common/durable_file.h"
#include "common/status_macros.h"

namespace meshrun::worker {

absl::StatusOr<std::unique_ptr<ExecutableStore>> ExecutableStore::Create(
    const std::string& directory, Limits limits) {
  if (directory.empty()) {
    return absl::FailedPreconditionError("cannot create executable store: no directory given");
  }
  // Temp files left by a crash: transfers cut short, and committed ones not yet flushed. A
  // file that hashes to its fingerprint is the executable: kept. Anything else goes.
  ASSIGN_OR_RETURN(std::unique_ptr<ContentStore> files,
                   ContentStore::Create({.directory = directory,
                                         .suffix = ".xexe",
                                         .max_bytes = limits.max_bytes,
                                         .keep_recent = limits.keep_recent,
                                         .recover_temp_files = true,
                                         .log_name = "executable store"}));
  return std::unique_ptr<ExecutableStore>(new ExecutableStore(std::move(files), limits));
}

ExecutableStore::ExecutableStore(std::unique_ptr<ContentStore> files, Limits limits)
    : files_(std::move(files)), limits_(limits), flusher_([this] { FlushLoop(); }) {}

int64_t ExecutableStore::DurableBytes() const { return files_->bytes(); }

ExecutableStore::~ExecutableStore() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  flusher_.join();
}

void ExecutableStore::Publish(const std::string& fingerprint, const std::string& temp_path) {
  absl::MutexLock lock(&mu_);
  if (pending_.count(fingerprint) > 0 || files_->Has(fingerprint)) {
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
      auto it = pending_.find(fp);
      if (it == pending_.end()) continue;  // Read found it corrupt and dropped it
      temp = it->second;
      flushing_ = true;
    }
    // Readers find the bytes at the temp path until Install renames it, then in files_.
    const absl::Status installed = files_->Install(fp, temp);
    absl::MutexLock lock(&mu_);
    auto still = pending_.find(fp);
    if (still != pending_.end() && still->second == temp) {
      if (!installed.ok()) {
        spdlog::error("executable store: cannot make {} durable ({}); dropped, so it must be "
                      "sent again", fp.substr(0, 12), installed.ToString());
      }
      pending_.erase(still);
    }  // else Read found it corrupt and dropped it meanwhile
    flushing_ = false;
  }
}

void ExecutableStore::Flush() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &ExecutableStore::AllDurable));
}

absl::StatusOr<std::unique_ptr<ExecutableStore::Upload>> ExecutableStore::Begin(
    const std::string& fingerprint, int64_t total, Verify verify) {
  if (!IsSha256Hex(fingerprint)) {
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
  const std::string temp = files_->TempPath(fingerprint);
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
  absl::MutexLock lock(&mu_);
  return pending_.count(fingerprint) > 0 || files_->Has(fingerprint);
}

absl::StatusOr<std::string> ExecutableStore::Read(const std::string& fingerprint) const {
  if (!IsSha256Hex(fingerprint)) {
    return absl::NotFoundError(absl::StrCat("executable ", fingerprint, " is not held here"));
  }
  std::ifstream in;
  {
    absl::MutexLock lock(&mu_);
    // If the flusher has renamed it meanwhile, files_ has it.
    if (auto it = pending_.find(fingerprint); it != pending_.end()) in.open(it->second, std::ios::binary);
  }
  absl::StatusOr<std::string> contents;
  if (in.is_open()) {
    std::stringstream bytes;
    bytes << in.rdbuf();
    contents = bytes.str();
    if (Sha256Hex(*contents) != fingerprint) contents = absl::DataLossError("corrupt");
  } else {
    contents = files_->Read(fingerprint);
  }
  if (contents.status().code() == absl::StatusCode::kDataLoss) {
    // The flusher may have installed the file since it was opened: drop it wherever it is now.
    absl::MutexLock lock(&mu_);
    if (auto it = pending_.find(fingerprint); it != pending_.end()) {
      ::unlink(it->second.c_str());
      pending_.erase(it);
    }
    files_->Remove(fingerprint);
    return absl::DataLossError(
        absl::StrCat("executable ", fingerprint, " was corrupted on disk; deleted"));
  }
  if (contents.status().code() == absl::StatusCode::kNotFound) {
    return absl::NotFoundError(absl::StrCat("executable ", fingerprint, " is not held here"));
  }
  return contents;
}

std::vector<std::string> ExecutableStore::Fingerprints() const {
  std::vector<std::string> out = files_->List();
  absl::MutexLock lock(&mu_);
  for (const auto& [fp, temp] : pending_) {
    if (!std::binary_search(out.begin(), out.end(), fp)) out.push_back(fp);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace meshrun::worker
