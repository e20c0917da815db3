#include "jobspec/array_data.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "jobspec/job_validation.h"
#include "runtime/types.h"

namespace meshrun::jobspec {

absl::StatusOr<std::vector<v1::TensorSpec>> ArrayBatchInputs(const v1::JobSpec& spec) {
  const bool mode_b = IsModeB(spec);
  const v1::Program* program = nullptr;
  const v1::Program* apply = nullptr;
  for (const v1::Program& p : spec.programs()) {
    if (p.role() == (mode_b ? "grad" : "step")) program = &p;
    if (p.role() == "apply") apply = &p;
  }
  if (program == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("data.array_file: the job has no ",
                                                   mode_b ? "grad" : "step", " program"));
  }
  // Mode B: grad's accumulator inputs are apply's inputs after the state.
  const int first = spec.state_count() +
                    (mode_b && apply != nullptr ? apply->inputs_size() - spec.state_count() : 0);
  const int end = program->inputs_size() -
                  (spec.has_sparse_attention()
                       ? static_cast<int>(SparseTableInputs(spec.sparse_attention()).size())
                       : 0);
  if (first >= end) {
    return absl::InvalidArgumentError(
        "data.array_file: the job's program takes no batch input after its state");
  }
  return std::vector<v1::TensorSpec>(program->inputs().begin() + first,
                                     program->inputs().begin() + end);
}

absl::StatusOr<std::vector<worker::BatchArray>> ArrayFileBatch(const v1::JobSpec& spec) {
  ASSIGN_OR_RETURN(std::vector<v1::TensorSpec> inputs, ArrayBatchInputs(spec));
  const int64_t hosts = std::max(1, spec.mesh().host_replicas());
  std::vector<worker::BatchArray> batch;
  for (const v1::TensorSpec& t : inputs) {
    absl::StatusOr<runtime::DType> dtype = runtime::ParseDType(t.dtype());
    if (!dtype.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("batch input ", t.name(), ": dtype \"",
                                                     t.dtype(), "\" is unknown"));
    }
    runtime::ArrayShape shape{*dtype, {t.shape().begin(), t.shape().end()}};
    if (!shape.dims.empty()) shape.dims[0] *= hosts;
    batch.push_back({t.name(), std::move(shape)});
  }
  return batch;
}

absl::StatusOr<v1::DataReceipt> ArrayFileReceipt(const v1::JobSpec& spec) {
  ASSIGN_OR_RETURN(std::vector<worker::BatchArray> batch, ArrayFileBatch(spec));
  absl::StatusOr<std::shared_ptr<const worker::ArrayFile>> file =
      worker::ArrayFile::Open(spec.data().array_file(), batch);
  if (!file.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.data.array_file: ", file.status().message()));
  }
  const worker::DataReceipt& read = (*file)->receipt();
  v1::DataReceipt receipt;
  receipt.add_files(read.files[0]);
  receipt.add_file_sha256(read.sha256);
  receipt.set_bytes(read.bytes);
  receipt.set_sha256(read.sha256);
  receipt.set_unchecked_layout(!(*file)->header().has_value());
  return receipt;
}

}  // namespace meshrun::jobspec
