// The on-disk layout of a meshrun checkpoint (docs/checkpoints.md): block arithmetic over a
// mesh, zarr v2 array metadata, and the Orbax metadata files that let orbax.checkpoint open a
// step directory. Plain functions on values; no I/O.
//
// A state array is stored global, chunked by the shard one mesh partition holds: the chunk at
// grid coordinates (c0, c1, ...) is the file "c0.c1..." ("0" for a scalar) holding that block's
// bytes, row-major, little-endian, uncompressed.
//
// Thread-safety: pure functions; safe from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "meshrun/v1/checkpoint.pb.h"
#include "runtime/types.h"

namespace meshrun::checkpoint {

// Where a block sits in a global array.
struct Block {
  std::vector<int64_t> start;
  std::vector<int64_t> size;
};

// The block mesh partition `partition` (row-major over `mesh_shape`) holds of an array of
// global shape `dims` split per dimension over `sharding` (mesh axis, "" = not split; may be
// shorter than `dims`).
// Errors: INVALID_ARGUMENT (an unknown axis, a dimension the axis size does not divide, a
// partition outside the mesh).
absl::StatusOr<Block> BlockOf(const std::vector<int64_t>& dims,
                              const std::vector<std::string>& sharding,
                              const std::vector<std::string>& mesh_axes,
                              const std::vector<int64_t>& mesh_shape, int64_t partition);

// zarr's name for a chunk of `chunk_shape` starting at `start`: "i.j..." ("0" for a scalar).
std::string ChunkKey(const std::vector<int64_t>& start, const std::vector<int64_t>& chunk_shape);

// Copies the block `size` at `src_start` of `src` (global dims `src_dims`) to `dst_start` of
// `dst` (dims `dst_dims`). Element size `element` bytes. The caller checks the bounds.
void CopyBlock(const char* src, const std::vector<int64_t>& src_dims,
               const std::vector<int64_t>& src_start, char* dst,
               const std::vector<int64_t>& dst_dims, const std::vector<int64_t>& dst_start,
               const std::vector<int64_t>& size, int64_t element);

// The pytree path of a state input: its name without a leading "state." ("state.opt.m.w1" ->
// "opt.m.w1"), which is the directory Orbax gives the leaf {"opt": {"m": {"w1": ...}}}.
std::string LeafOf(const std::string& state_name);

// zarr v2's dtype string ("<f4", "bfloat16", "<i4", "|u1", "|b1", ...).
// Errors: INVALID_ARGUMENT (a dtype zarr v2 cannot name).
absl::StatusOr<std::string> ZarrDType(runtime::DType dtype);
absl::StatusOr<runtime::DType> ParseZarrDType(const std::string& zarr_dtype);

// The .zarray file of `array`.
absl::StatusOr<std::string> ZarrArrayJson(const v1::CheckpointArray& array);

// What a .zarray says, for reading arrays others wrote.
struct ZarrArray {
  runtime::DType dtype = runtime::DType::kInvalid;
  std::vector<int64_t> shape;
  std::vector<int64_t> chunks;
  std::string compressor;  // "" (none) or "zstd"
};
// Errors: INVALID_ARGUMENT naming the field (not zarr v2, a compressor other than none or
// zstd, a filter, Fortran order, a "/" dimension separator, an unknown dtype).
absl::StatusOr<ZarrArray> ParseZarrArray(const std::string& json);

// Orbax's tree metadata (_METADATA) for the manifest's arrays, and its step metadata
// (_CHECKPOINT_METADATA).
std::string OrbaxTreeMetadataJson(const v1::CheckpointManifest& manifest);
std::string OrbaxStepMetadataJson(int64_t init_unix_nanos, int64_t commit_unix_nanos);

}  // namespace meshrun::checkpoint
