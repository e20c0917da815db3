// Reading and writing checkpoint step directories (docs/checkpoints.md):
//
//   <root>/<step>.meshrun-tmp/   hosts write their chunks here (WriteChunks), then report
//   <root>/<step>/               the coordinator renamed it here after writing the manifest
//       meshrun_checkpoint.json  meshrun's manifest: arrays, chunk sha256s, data position
//       _METADATA, _CHECKPOINT_METADATA, commit_success.txt   what Orbax reads
//       <leaf>/.zarray, <leaf>/<chunk key>                   one zarr v2 array per state leaf
//
// A directory without meshrun_checkpoint.json is not a checkpoint: nothing here restores it.
//
// Thread-safety: free functions; concurrent calls on different steps are safe. Several hosts
// may write into one temp directory at once (each its own chunks; .zarray files are written
// whole to a private name and renamed, so a reader never sees half of one).
// Errors: file errors name the path and the system's reason ("No space left on device").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "meshrun/v1/checkpoint.pb.h"
#include "runtime/types.h"

namespace meshrun::checkpoint {

inline constexpr char kManifestFile[] = "meshrun_checkpoint.json";

std::string StepDir(const std::string& root, int64_t step);
std::string TempStepDir(const std::string& root, int64_t step);

// One block of an array this host writes.
struct Chunk {
  std::string key;          // ChunkKey
  runtime::HostArray data;  // the block, chunk_shape of the array
};
struct ArrayChunks {
  v1::CheckpointArray array;  // name, leaf, dtype, shape, chunk_shape; chunks are filled in
  std::vector<Chunk> chunks;
};

// Writes each array's .zarray and chunk files under `temp_dir` (created if missing) and
// fsyncs them and their directories. Returns the arrays with their chunks' sha256.
// Errors: INVALID_ARGUMENT (a chunk whose bytes do not match chunk_shape), the file errors.
absl::StatusOr<std::vector<v1::CheckpointArray>> WriteChunks(const std::string& temp_dir,
                                                             const std::vector<ArrayChunks>& arrays);

// Commits step `manifest.step()` under `root`: writes the manifest and Orbax's metadata into
// the temp directory, fsyncs, renames it to StepDir and fsyncs `root`. Then keeps the newest
// `keep_last` committed steps (0 = all), deleting older ones. Returns the step directory.
// Errors: FAILED_PRECONDITION (no temp directory for the step), the file errors.
absl::StatusOr<std::string> Commit(const std::string& root, const v1::CheckpointManifest& manifest,
                                   int keep_last);

// Removes a step's temp directory (a failed checkpoint). Missing is fine.
void Discard(const std::string& root, int64_t step);
// Removes every step's temp directory under `root` (a run that ended with checkpoints never
// committed) and returns their steps. Committed steps are untouched.
std::vector<int64_t> DiscardAllTemp(const std::string& root);

// Steps committed under `root`, ascending.
std::vector<int64_t> CommittedSteps(const std::string& root);

// A committed step directory: `path` itself when it holds a manifest (or is an Orbax step named
// explicitly: IsVerified tells), else the newest committed step under it. In a directory
// meshrun writes checkpoints to (one holding a manifest-committed or a temp step), only
// manifest-committed steps count; in a directory only Orbax wrote, Orbax-committed steps do. A
// temp step directory is never restorable, whatever it holds.
// Errors: NOT_FOUND (no such directory), FAILED_PRECONDITION (a temp or partial step
// directory, or a root with no committed step).
absl::StatusOr<std::string> ResolveCheckpoint(const std::string& path);

// True when `step_dir` holds meshrun's manifest, so every chunk is checked against its sha256;
// false for an Orbax checkpoint (restored unverified).
bool IsVerified(const std::string& step_dir);

// Errors: FAILED_PRECONDITION (not committed), INVALID_ARGUMENT (a manifest that does not
// parse), NOT_FOUND.
absl::StatusOr<v1::CheckpointManifest> ReadManifest(const std::string& step_dir);

// The global array from its chunks, each checked against its sha256.
// Errors: DATA_LOSS naming the array and chunk (missing, truncated or changed), the file
// errors.
absl::StatusOr<runtime::HostArray> ReadArray(const std::string& step_dir,
                                             const v1::CheckpointArray& array);

}  // namespace meshrun::checkpoint
