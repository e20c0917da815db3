// Reading checkpoints JAX/Orbax itself wrote (docs/checkpoints_from_jax.md): Orbax's
// PyTreeCheckpointHandler with use_ocdbt=False writes one zarr v2 array per leaf,
// zstd-compressed by default, plus _METADATA (the tree) and no meshrun manifest. These
// functions describe such a directory as a CheckpointManifest so the ordinary restore path
// (ReadArray, the worker's RestoreState, submit's validation) reads it.
//
// Differences from a meshrun checkpoint: no sha256 per chunk (chunks carry an empty sha256 and
// are checked for size only), no data position (0: the resumed job starts its data source from
// the beginning), the step is the directory's name when it is a number (or its parent's, for
// CheckpointManager's <root>/<step>/<item>/), else 0.
//
// Thread-safety: free functions; safe from any thread.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "meshrun/v1/checkpoint.pb.h"

namespace meshrun::checkpoint {

// The Orbax item directory of `path` (the directory holding _METADATA and one directory per
// leaf): `path` itself, or its only subdirectory that is one (CheckpointManager's "default",
// "state", ...). Empty when there is none, or when `path` is an Orbax temporary directory
// (".orbax-checkpoint-tmp"), which is not committed.
std::string OrbaxItemDir(const std::string& path);

// The manifest of the Orbax item directory `item_dir`: each leaf of _METADATA with its .zarray.
// Array names are "state." + the leaf path ("params.w1" -> "state.params.w1").
// Errors: FAILED_PRECONDITION (not an Orbax item directory, or one written with OCDBT or
// zarr3: "save with use_ocdbt=False"), INVALID_ARGUMENT naming the file and field (a _METADATA
// or .zarray meshrun cannot read: a compressor other than zstd, an unknown dtype).
absl::StatusOr<v1::CheckpointManifest> ManifestFromOrbax(const std::string& item_dir);

// The raw bytes of a chunk file stored with `compressor` ("" = none, "zstd"), which must be
// `expected_bytes` long once decoded.
// Errors: DATA_LOSS (a frame that does not decode, or decodes to another size).
absl::StatusOr<std::string> DecodeChunk(const std::string& compressor, std::string stored,
                                        size_t expected_bytes);

}  // namespace meshrun::checkpoint
