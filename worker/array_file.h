// Array-batch files (docs/data.md, written by meshrun.data.write_arrays): batch after batch,
// each the job's batch inputs in order, raw little-endian row-major, no header. The layout
// (each record's size) comes from the job, not the file. No RPC, no runtime: the coordinator
// checks the file and takes its receipt at submit, the worker's batch source reads it.
//
// Thread-safety: ArrayFile is immutable after Open and safe to share between threads.
// Memory: the file is memory-mapped read-only, never loaded whole; Open hashes it in pieces and
// drops each piece from the resident set after it; a batch touches only its record's pages.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/token_shards.h"

namespace meshrun::worker {

class ArrayFile {
 public:
  // Maps `path`, whose size must be a positive multiple of `record_bytes` (> 0).
  // Errors: NOT_FOUND (no such file), INVALID_ARGUMENT (empty, or not whole records: the
  // message names the file, its size and the record size), DATA_LOSS (cannot map).
  static absl::StatusOr<std::shared_ptr<const ArrayFile>> Open(const std::string& path,
                                                               int64_t record_bytes);
  ~ArrayFile();
  ArrayFile(const ArrayFile&) = delete;
  ArrayFile& operator=(const ArrayFile&) = delete;

  int64_t records() const { return records_; }
  // Record `index` (0 <= index < records()), a view into the mapping.
  absl::string_view Record(int64_t index) const;
  // files = {path}, its bytes and sha256 (tokens and documents 0).
  const DataReceipt& receipt() const { return receipt_; }

 private:
  ArrayFile() = default;
  void* base_ = nullptr;
  size_t size_ = 0;
  int64_t record_bytes_ = 0;
  int64_t records_ = 0;
  DataReceipt receipt_;
};

}  // namespace meshrun::worker
