#include "worker/sparse/plan_batches.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace meshrun::worker::sparse {

absl::StatusOr<std::unique_ptr<PlanBatches>> PlanBatches::Create(Config config) {
  if (config.inner == nullptr) {
    return absl::InvalidArgumentError("PlanBatches needs an inner source");
  }
  if (config.builder == nullptr) return absl::InvalidArgumentError("PlanBatches needs a builder");
  if (config.doc_ids_index < 0) return absl::InvalidArgumentError("doc_ids_index is negative");
  if (config.tables.empty()) return absl::InvalidArgumentError("PlanBatches appends no tables");
  return std::unique_ptr<PlanBatches>(new PlanBatches(std::move(config)));
}

absl::StatusOr<std::vector<runtime::HostArray>> PlanBatches::Next() {
  ASSIGN_OR_RETURN(std::vector<runtime::HostArray> batch, config_.inner->Next());
  const absl::Time start = absl::Now();
  const MaskContract& contract = config_.builder->contract();
  if (config_.doc_ids_index >= static_cast<int>(batch.size())) {
    return absl::InvalidArgumentError(absl::StrCat("the batch has ", batch.size(),
                                                   " arrays; doc_ids should be array ",
                                                   config_.doc_ids_index));
  }
  const runtime::HostArray& doc_ids = batch[config_.doc_ids_index];
  if (doc_ids.shape.dtype != runtime::DType::kS32 || doc_ids.shape.dims.size() != 2 ||
      doc_ids.shape.dims[1] != contract.seq_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "doc_ids must be s32 [rows, ", contract.seq_len, "] (seq_len of the sparse contract)"));
  }
  const int64_t rows = doc_ids.shape.dims[0];
  std::vector<TableLayout> layouts;
  std::vector<std::string> bytes;
  for (PlanTable t : config_.tables) {
    layouts.push_back(LayoutOf(contract, t, rows));
    bytes.emplace_back(layouts.back().row_bytes() * rows, '\0');
  }
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int32_t> row(contract.seq_len);
    std::memcpy(row.data(), doc_ids.bytes.data() + r * contract.seq_len * sizeof(int32_t),
                row.size() * sizeof(int32_t));
    absl::StatusOr<BlockPlan> plan = config_.builder->Build(row);
    if (!plan.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch.doc_ids row ", r, ": ", plan.status().message()));
    }
    for (size_t t = 0; t < config_.tables.size(); ++t) {
      RETURN_IF_ERROR(WriteTableRow(*plan, config_.tables[t],
                                    bytes[t].data() + r * layouts[t].row_bytes()));
    }
  }
  for (size_t t = 0; t < config_.tables.size(); ++t) {
    ASSIGN_OR_RETURN(runtime::DType dtype, runtime::ParseDType(layouts[t].dtype));
    batch.push_back({{dtype, layouts[t].dims}, std::move(bytes[t])});
  }
  if (config_.metrics != nullptr) config_.metrics->AddTime(kPlanTime, absl::Now() - start);
  return batch;
}

}  // namespace meshrun::worker::sparse
