#include "worker_service/array_batch_source.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "jobspec/array_data.h"
#include "worker/array_batches.h"
#include "worker/array_file.h"

namespace meshrun::services {

absl::StatusOr<std::unique_ptr<worker::BatchSource>> ArrayFileBatchesFor(
    const v1::JobManifest& manifest, int replica_index) {
  const v1::JobSpec& spec = manifest.spec();
  ASSIGN_OR_RETURN(std::vector<v1::TensorSpec> inputs, jobspec::ArrayBatchInputs(spec));
  ASSIGN_OR_RETURN(std::vector<worker::BatchArray> file_batch, jobspec::ArrayFileBatch(spec));
  ASSIGN_OR_RETURN(std::shared_ptr<const worker::ArrayFile> file,
                   worker::ArrayFile::Open(spec.data().array_file(), file_batch));
  if (file->receipt().sha256 != manifest.data_receipt().sha256()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "data.array_file ", spec.data().array_file(), " reads sha256 ", file->receipt().sha256,
        " here, the job's data receipt says ", manifest.data_receipt().sha256(),
        ": the file differs between hosts or changed"));
  }
  worker::ArrayBatchSpec batch{.replica_index = replica_index,
                               .replica_count = std::max(1, spec.mesh().host_replicas())};
  for (const v1::TensorSpec& t : inputs) {
    ASSIGN_OR_RETURN(runtime::DType dtype, runtime::ParseDType(t.dtype()));
    batch.arrays.push_back({dtype, {t.shape().begin(), t.shape().end()}});
  }
  return worker::MakeArrayFileBatches(std::move(file), std::move(batch));
}

}  // namespace meshrun::services
