// Array-batch files (docs/data.md, written by meshrun.data.write_arrays): batch after batch,
// each the job's batch inputs in order, raw little-endian row-major. A typed file starts with a
// header (bundle/array_file_format.h) naming each array, its dtype and shape, the batch count
// and the payload's sha256; Open checks all of it against the arrays the program takes. A file without a header (written before typed files) is read
// as before, its layout taken on trust from the job, and says so (typed() false).
// No RPC, no runtime: the coordinator checks the file and takes its receipt at submit, the
// worker's batch source reads it.
//
// Thread-safety: ArrayFile is immutable after Open and safe to share between threads.
// Memory: the file is memory-mapped read-only, never loaded whole; Open hashes it in pieces and
// drops each piece from the resident set after it; a batch touches only its record's pages.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "bundle/array_file_format.h"
#include "meshrun/v1/job.pb.h"
#include "runtime/types.h"
#include "worker/token_shards.h"

namespace meshrun::worker {

// One array of a batch as the program takes it (the global batch: every host's rows).
struct BatchArray {
  std::string name;  // the program's input name, e.g. "batch.tokens"
  runtime::ArrayShape shape;
};

class ArrayFile {
 public:
  // Maps `path` as batches of `batch` (not empty). A typed file must declare exactly these
  // arrays (names, dtypes, shapes, in order), hold the batch count its header gives and match
  // its checksum; a headerless file must be a positive multiple of one batch's bytes.
  // Errors: NOT_FOUND (no such file); INVALID_ARGUMENT naming the file and what differs (an
  // array the program does not take, in another order, of another dtype or shape; an unknown
  // format version; a malformed header; empty, truncated or trailing bytes); DATA_LOSS (the
  // payload's sha256 is not the header's, or the file cannot be mapped).
  static absl::StatusOr<std::shared_ptr<const ArrayFile>> Open(const std::string& path,
                                                               const std::vector<BatchArray>& batch);
  ~ArrayFile();
  ArrayFile(const ArrayFile&) = delete;
  ArrayFile& operator=(const ArrayFile&) = delete;

  int64_t records() const { return records_; }
  // Record `index` (0 <= index < records()), a view into the mapping.
  absl::string_view Record(int64_t index) const;
  // files = {path}, the whole file's bytes and sha256 (tokens and documents 0).
  const DataReceipt& receipt() const { return receipt_; }
  // The header of a typed file; nullopt for a headerless one, whose layout was not checked.
  const std::optional<v1::ArrayFileHeader>& header() const { return header_; }

 private:
  ArrayFile() = default;
  void* base_ = nullptr;
  size_t size_ = 0;
  int64_t payload_offset_ = 0;  // the header's bytes; 0 without one
  int64_t record_bytes_ = 0;
  int64_t records_ = 0;
  DataReceipt receipt_;
  std::optional<v1::ArrayFileHeader> header_;
};

}  // namespace meshrun::worker
