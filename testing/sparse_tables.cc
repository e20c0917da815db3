#include "testing/sparse_tables.h"

#include "common/status_macros.h"
#include "worker/batch_sources.h"
#include "worker/sparse/plan_batches.h"

namespace meshrun::worker::sparse {

absl::Status AppendPlanTables(std::shared_ptr<const PlanBuilder> builder, int doc_ids_index,
                              runtime::ExampleJob& job) {
  PlanBatches::Config config{.builder = std::move(builder), .doc_ids_index = doc_ids_index};
  const size_t first = job.num_state + job.data_arrays.size();
  for (size_t i = first; i < job.step.inputs.size(); ++i) {
    const std::string& name = job.step.inputs[i].global.name;
    ASSIGN_OR_RETURN(PlanTable table, ParsePlanTable(name.substr(name.find('.') + 1)));
    config.tables.push_back(table);
    job.data_arrays.push_back(job.step.inputs[i]);
  }
  const size_t count = job.batches.size();
  config.inner = MakeCycledBatches(std::move(job.batches));
  ASSIGN_OR_RETURN(std::unique_ptr<PlanBatches> source, PlanBatches::Create(std::move(config)));
  job.batches.clear();
  for (size_t s = 0; s < count; ++s) {
    ASSIGN_OR_RETURN(std::vector<runtime::HostArray> batch, source->Next());
    job.batches.push_back(std::move(batch));
  }
  return absl::OkStatus();
}

}  // namespace meshrun::worker::sparse
