#include "worker/array_batches.h"

#include "absl/strings/str_cat.h"

namespace meshrun::worker {
namespace {

class ArrayFileBatches final : public BatchSource {
 public:
  ArrayFileBatches(std::shared_ptr<const ArrayFile> file, ArrayBatchSpec spec)
      : file_(std::move(file)), spec_(std::move(spec)) {}

  absl::StatusOr<std::vector<runtime::HostArray>> Next() override {
    const absl::string_view record = file_->Record(next_++ % file_->records());
    std::vector<runtime::HostArray> out;
    size_t offset = 0;
    for (const runtime::ArrayShape& shape : spec_.arrays) {
      const size_t share = static_cast<size_t>(shape.ByteSize());
      // Row-major: replica h's rows of the global array are its h-th contiguous block.
      out.push_back({shape, std::string(record.substr(
                                offset + static_cast<size_t>(spec_.replica_index) * share, share))});
      offset += share * static_cast<size_t>(spec_.replica_count);
    }
    return out;
  }
  absl::Status Skip(int64_t consumed) override {
    next_ += consumed;
    return absl::OkStatus();
  }

 private:
  std::shared_ptr<const ArrayFile> file_;
  ArrayBatchSpec spec_;
  int64_t next_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<BatchSource>> MakeArrayFileBatches(
    std::shared_ptr<const ArrayFile> file, ArrayBatchSpec spec) {
  if (spec.replica_count < 1 || spec.replica_index < 0 ||
      spec.replica_index >= spec.replica_count) {
    return absl::InvalidArgumentError(absl::StrCat("replica ", spec.replica_index, " of ",
                                                   spec.replica_count));
  }
  int64_t record = 0;
  for (const runtime::ArrayShape& shape : spec.arrays) record += shape.ByteSize();
  record *= spec.replica_count;
  if (file->records() == 0 || file->Record(0).size() != static_cast<size_t>(record)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "array file ", file->receipt().files.at(0), ": its batches are not the ", record,
        " bytes the job's batch inputs take"));
  }
  return std::make_unique<ArrayFileBatches>(std::move(file), std::move(spec));
}

}  // namespace meshrun::worker
