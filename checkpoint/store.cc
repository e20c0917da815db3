#include "checkpoint/store.h"

#include <fcntl.h>
#include <unistd.h>

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "checkpoint/layout.h"
#include "checkpoint/orbax_read.h"
#include "common/file_sync.h"
#include "common/sha256.h"
#include "common/status_macros.h"

namespace meshrun::checkpoint {
namespace {

namespace fs = std::filesystem;

constexpr char kTempSuffix[] = ".meshrun-tmp";

absl::Status FileError(const std::string& what, const std::string& path, int error) {
  return absl::UnavailableError(absl::StrCat(what, " ", path, ": ", std::strerror(error)));
}

enum class Sync { kNow, kLater };

// Writes `bytes` to `path`. kNow fsyncs it before returning; kLater only starts its write-back,
// and the caller fsyncs it later (SyncFile), so that many files share the disk's flushes.
absl::Status WriteFile(const std::string& path, absl::string_view bytes, Sync sync) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return FileError("creating", path, errno);
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int error = errno;
      ::close(fd);
      return FileError("writing", path, error);
    }
    done += static_cast<size_t>(n);
  }
  const int sync_error = sync == Sync::kNow ? FsyncInPieces(fd)
                         : ::sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE) == 0 ? 0
                                                                                   : errno;
  ::close(fd);
  if (sync_error != 0) return FileError("fsyncing", path, sync_error);
  return absl::OkStatus();
}

absl::Status WriteFileSynced(const std::string& path, absl::string_view bytes) {
  return WriteFile(path, bytes, Sync::kNow);
}

absl::Status SyncFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return FileError("opening", path, errno);
  const int error = ::fsync(fd) == 0 ? 0 : errno;
  ::close(fd);
  if (error != 0) return FileError("fsyncing", path, error);
  return absl::OkStatus();
}

// Whole-file write under a private name, then rename: readers and other writers of the same
// file never see half of it. Synced later (SyncFile on `path`).
absl::Status ReplaceFile(const std::string& path, absl::string_view bytes) {
  const std::string temp = absl::StrCat(path, ".", ::getpid(), ".tmp");
  RETURN_IF_ERROR(WriteFile(temp, bytes, Sync::kLater));
  if (::rename(temp.c_str(), path.c_str()) != 0) return FileError("renaming to", path, errno);
  return absl::OkStatus();
}

absl::Status MakeDirs(const std::string& path) {
  std::error_code error;
  fs::create_directories(path, error);
  if (error) {
    return absl::UnavailableError(absl::StrCat("creating ", path, ": ", error.message()));
  }
  return absl::OkStatus();
}

absl::Status SyncDir(const std::string& path) {
  if (int error = FsyncDirectory(path); error != 0) return FileError("fsyncing", path, error);
  return absl::OkStatus();
}

// fsyncs every file and directory, from up to kSyncThreads threads at once. Each fsync of a
// freshly written file waits for the disk (a journal commit; on ext4 without a journal, as on
// the build machine, its inode's and directory's blocks and a cache flush): one after another
// 111 of them took 10x the writes themselves, issued together their I/O and flushes overlap.
// Returns the first error.
constexpr size_t kSyncThreads = 16;
absl::Status SyncAll(const std::vector<std::string>& files, const std::vector<std::string>& dirs) {
  std::atomic<size_t> next{0};
  absl::Mutex mu;
  absl::Status first = absl::OkStatus();
  const size_t total = files.size() + dirs.size();
  auto work = [&] {
    for (size_t i = next++; i < total; i = next++) {
      absl::Status status =
          i < files.size() ? SyncFile(files[i]) : SyncDir(dirs[i - files.size()]);
      if (!status.ok()) {
        absl::MutexLock lock(&mu);
        if (first.ok()) first = std::move(status);
      }
    }
  };
  std::vector<std::thread> threads;
  for (size_t t = 1; t < std::min(kSyncThreads, total); ++t) threads.emplace_back(work);
  work();
  for (std::thread& thread : threads) thread.join();
  return first;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool IsStepName(const std::string& name, int64_t* step) {
  return !name.empty() && std::all_of(name.begin(), name.end(), ::isdigit) &&
         absl::SimpleAtoi(name, step);
}

}  // namespace

std::string StepDir(const std::string& root, int64_t step) {
  return (fs::path(root) / absl::StrCat(step)).string();
}

std::string TempStepDir(const std::string& root, int64_t step) {
  return (fs::path(root) / absl::StrCat(step, kTempSuffix)).string();
}

absl::StatusOr<std::vector<v1::CheckpointArray>> WriteChunks(
    const std::string& temp_dir, const std::vector<ArrayChunks>& arrays) {
  std::vector<v1::CheckpointArray> written;
  for (const ArrayChunks& entry : arrays) {
    int64_t chunk_elements = 1;
    for (int64_t n : entry.array.chunk_shape()) chunk_elements *= n;
    for (const Chunk& chunk : entry.chunks) {
      if (chunk.data.shape.NumElements() != chunk_elements) {
        return absl::InvalidArgumentError(absl::StrCat(
            entry.array.name(), " chunk ", chunk.key, " holds ", chunk.data.shape.NumElements(),
            " elements, its chunk shape ", chunk_elements));
      }
    }
  }
  // The checksums are computed on a thread of their own while this one writes.
  std::vector<std::vector<std::string>> digests(arrays.size());
  std::thread hasher([&] {
    for (size_t a = 0; a < arrays.size(); ++a) {
      for (const Chunk& chunk : arrays[a].chunks) {
        digests[a].push_back(Sha256Hex(chunk.data.bytes));
      }
    }
  });
  // Every file is written first and synced after, all at once (SyncAll): one fsync per file
  // right after its write would wait for a journal commit each time.
  std::vector<std::string> files, dirs;
  absl::Status status = [&]() -> absl::Status {
    RETURN_IF_ERROR(MakeDirs(temp_dir));
    for (const ArrayChunks& entry : arrays) {
      const std::string dir = (fs::path(temp_dir) / entry.array.leaf()).string();
      RETURN_IF_ERROR(MakeDirs(dir));
      dirs.push_back(dir);
      ASSIGN_OR_RETURN(std::string zarray, ZarrArrayJson(entry.array));
      files.push_back((fs::path(dir) / ".zarray").string());
      RETURN_IF_ERROR(ReplaceFile(files.back(), zarray));
      for (const Chunk& chunk : entry.chunks) {
        files.push_back((fs::path(dir) / chunk.key).string());
        RETURN_IF_ERROR(WriteFile(files.back(), chunk.data.bytes, Sync::kLater));
      }
    }
    dirs.push_back(temp_dir);
    return SyncAll(files, dirs);
  }();
  hasher.join();
  RETURN_IF_ERROR(status);
  for (size_t a = 0; a < arrays.size(); ++a) {
    v1::CheckpointArray out = arrays[a].array;
    out.clear_chunks();
    for (size_t c = 0; c < arrays[a].chunks.size(); ++c) {
      v1::CheckpointChunk* record = out.add_chunks();
      record->set_key(arrays[a].chunks[c].key);
      record->set_sha256(digests[a][c]);
      record->set_bytes(static_cast<int64_t>(arrays[a].chunks[c].data.bytes.size()));
    }
    written.push_back(std::move(out));
  }
  return written;
}

absl::StatusOr<std::string> Commit(const std::string& root,
                                   const v1::CheckpointManifest& manifest, int keep_last) {
  const std::string temp = TempStepDir(root, manifest.step());
  if (!fs::is_directory(temp)) {
    return absl::FailedPreconditionError(
        absl::StrCat("no checkpoint was written for step ", manifest.step(), " (", temp, ")"));
  }
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(manifest, &json, options).ok()) {
    return absl::InternalError("the checkpoint manifest does not print as JSON");
  }
  const int64_t now = absl::ToUnixNanos(absl::Now());
  RETURN_IF_ERROR(WriteFileSynced((fs::path(temp) / "_METADATA").string(),
                                  OrbaxTreeMetadataJson(manifest)));
  RETURN_IF_ERROR(WriteFileSynced((fs::path(temp) / "_CHECKPOINT_METADATA").string(),
                                  OrbaxStepMetadataJson(now, now)));
  RETURN_IF_ERROR(WriteFileSynced((fs::path(temp) / "commit_success.txt").string(),
                                  absl::StrCat("meshrun committed step ", manifest.step(), "\n")));
  // The manifest last: its presence is what makes the directory a checkpoint.
  RETURN_IF_ERROR(WriteFileSynced((fs::path(temp) / kManifestFile).string(), json));
  RETURN_IF_ERROR(SyncDir(temp));
  const std::string final_dir = StepDir(root, manifest.step());
  std::error_code error;
  fs::remove_all(final_dir, error);  // a step saved twice (a resumed job): the newer wins
  if (::rename(temp.c_str(), final_dir.c_str()) != 0) {
    return FileError("renaming to", final_dir, errno);
  }
  RETURN_IF_ERROR(SyncDir(root));
  if (keep_last > 0) {
    std::vector<int64_t> steps = CommittedSteps(root);
    for (size_t i = 0; i + keep_last < steps.size(); ++i) {
      fs::remove_all(StepDir(root, steps[i]), error);
    }
  }
  return final_dir;
}

void Discard(const std::string& root, int64_t step) {
  std::error_code error;
  fs::remove_all(TempStepDir(root, step), error);
}

std::vector<int64_t> DiscardAllTemp(const std::string& root) {
  std::vector<int64_t> steps;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(root, error)) {
    const std::string name = entry.path().filename().string();
    int64_t step = 0;
    if (entry.is_directory() && absl::EndsWith(name, kTempSuffix) &&
        IsStepName(name.substr(0, name.size() - std::strlen(kTempSuffix)), &step)) {
      steps.push_back(step);
    }
  }
  for (int64_t step : steps) Discard(root, step);
  std::sort(steps.begin(), steps.end());
  return steps;
}

std::vector<int64_t> CommittedSteps(const std::string& root) {
  std::vector<int64_t> steps;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(root, error)) {
    int64_t step = 0;
    if (entry.is_directory() && IsStepName(entry.path().filename().string(), &step) &&
        fs::exists(entry.path() / kManifestFile)) {
      steps.push_back(step);
    }
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

namespace {

// Whether `root` holds a temp step directory (one meshrun is writing, or abandoned).
bool HoldsTempStep(const std::string& root) {
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(root, error)) {
    if (entry.path().filename().string().find(kTempSuffix) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<std::string> ResolveCheckpoint(const std::string& path) {
  if (!fs::is_directory(path)) {
    return absl::NotFoundError(absl::StrCat(path, " is not a directory"));
  }
  const std::string name = fs::path(path).filename().string();
  if (name.find(kTempSuffix) != std::string::npos) {  // whatever it holds: never committed
    return absl::FailedPreconditionError(absl::StrCat(
        path, " is a checkpoint being written (or abandoned), never committed; use a committed "
        "step"));
  }
  if (fs::exists(fs::path(path) / kManifestFile)) return path;
  if (std::string item = OrbaxItemDir(path); !item.empty()) return item;  // named explicitly
  int64_t step = 0;
  if (IsStepName(name, &step)) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, " is a partial checkpoint (no ", kManifestFile,
        "): its hosts never all reported, so it was not committed; use an earlier step"));
  }
  std::vector<int64_t> steps = CommittedSteps(path);
  // In a directory only Orbax wrote (a CheckpointManager's), Orbax-committed steps count; in
  // meshrun's own, a step without a manifest was not committed by meshrun.
  if (steps.empty() && !HoldsTempStep(path)) {
    std::error_code error;
    for (const auto& entry : fs::directory_iterator(path, error)) {
      if (entry.is_directory() && IsStepName(entry.path().filename().string(), &step) &&
          !OrbaxItemDir(entry.path().string()).empty()) {
        steps.push_back(step);
      }
    }
  }
  std::sort(steps.begin(), steps.end());
  if (steps.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " holds no committed checkpoint (no <step>/", kManifestFile,
                     ", nor an Orbax <step>/_METADATA)"));
  }
  return ResolveCheckpoint(StepDir(path, steps.back()));
}

bool IsVerified(const std::string& step_dir) {
  std::error_code error;
  return fs::exists(fs::path(step_dir) / kManifestFile, error);
}

absl::StatusOr<v1::CheckpointManifest> ReadManifest(const std::string& step_dir) {
  ASSIGN_OR_RETURN(std::string resolved, ResolveCheckpoint(step_dir));
  if (resolved != step_dir) {
    return absl::FailedPreconditionError(absl::StrCat(step_dir, " is not a step directory"));
  }
  if (!fs::exists(fs::path(step_dir) / kManifestFile)) return ManifestFromOrbax(step_dir);
  ASSIGN_OR_RETURN(std::string json, ReadFile((fs::path(step_dir) / kManifestFile).string()));
  v1::CheckpointManifest manifest;
  if (!google::protobuf::util::JsonStringToMessage(json, &manifest).ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(step_dir, "/", kManifestFile, " is not a meshrun checkpoint manifest"));
  }
  return manifest;
}

absl::StatusOr<runtime::HostArray> ReadArray(const std::string& step_dir,
                                             const v1::CheckpointArray& array) {
  ASSIGN_OR_RETURN(runtime::DType dtype, runtime::ParseDType(array.dtype()));
  const std::vector<int64_t> dims(array.shape().begin(), array.shape().end());
  const std::vector<int64_t> chunk(array.chunk_shape().begin(), array.chunk_shape().end());
  if (chunk.size() != dims.size()) {
    return absl::DataLossError(absl::StrCat(array.name(), ": chunk_shape and shape differ in rank"));
  }
  runtime::HostArray out{{dtype, dims}, {}};
  out.bytes.assign(static_cast<size_t>(out.shape.ByteSize()), '\0');
  const int64_t element = runtime::DTypeByteSize(dtype);
  int64_t chunk_bytes = element;
  for (int64_t n : chunk) chunk_bytes *= n;
  std::set<std::string> seen;
  // A checkpoint Orbax wrote (no meshrun manifest): no sha256 to check, and zarr v2's padded
  // edge chunks (orbax_read.h).
  const bool foreign = !fs::exists(fs::path(step_dir) / kManifestFile);
  for (const v1::CheckpointChunk& c : array.chunks()) {
    const std::string where = absl::StrCat("array ", array.name(), " chunk ", c.key(), " (",
                                           step_dir, "/", array.leaf(), "/", c.key(), ")");
    absl::StatusOr<std::string> bytes = ReadFile((fs::path(step_dir) / array.leaf() / c.key()).string());
    if (!bytes.ok()) return absl::DataLossError(absl::StrCat(where, " is missing"));
    if (!array.compressor().empty()) {
      bytes = DecodeChunk(array.compressor(), *std::move(bytes), static_cast<size_t>(chunk_bytes));
      if (!bytes.ok()) {
        return absl::DataLossError(absl::StrCat(where, ": ", bytes.status().message()));
      }
    }
    if (static_cast<int64_t>(bytes->size()) != chunk_bytes) {
      return absl::DataLossError(absl::StrCat(where, " holds ", bytes->size(), " bytes, expected ",
                                              chunk_bytes, " (truncated?)"));
    }
    if (!foreign && Sha256Hex(*bytes) != c.sha256()) {
      return absl::DataLossError(absl::StrCat(where, " does not match its sha256: corrupted"));
    }
    std::vector<int64_t> start, size = chunk;
    if (!dims.empty()) {
      std::vector<std::string> parts = absl::StrSplit(c.key(), '.');
      if (parts.size() != dims.size()) return absl::DataLossError(where + ": malformed key");
      for (size_t i = 0; i < dims.size(); ++i) {
        int64_t g = 0;
        // zarr v2 pads an edge chunk to the full chunk shape; meshrun's chunks tile exactly.
        if (!absl::SimpleAtoi(parts[i], &g) || g < 0 || g * chunk[i] >= dims[i] ||
            (!foreign && (g + 1) * chunk[i] > dims[i])) {
          return absl::DataLossError(where + ": key outside the array");
        }
        start.push_back(g * chunk[i]);
        size[i] = std::min(chunk[i], dims[i] - start[i]);
      }
    }
    CopyBlock(bytes->data(), chunk, std::vector<int64_t>(dims.size(), 0), out.bytes.data(), dims,
              start, size, element);
    seen.insert(c.key());
  }
  int64_t expected = 1;
  for (size_t i = 0; i < dims.size(); ++i) {
    expected *= chunk[i] == 0 ? 0 : (dims[i] + chunk[i] - 1) / chunk[i];
  }
  if (static_cast<int64_t>(seen.size()) != expected) {
    return absl::DataLossError(absl::StrCat("array ", array.name(), " has ", seen.size(),
                                            " of its ", expected, " chunks in ", step_dir));
  }
  return out;
}

}  // namespace meshrun::checkpoint
