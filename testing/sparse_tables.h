// Plan tables for the example jobs of examples/ (tests and benches only): what the worker's
// PlanBatches appends to each batch of a block-sparse step, appended to an ExampleJob so an
// ExampleRunner runs the sparse step as the worker does.
#pragma once

#include <memory>

#include "absl/status/status.h"
#include "bundle/example_job.h"
#include "worker/sparse/block_plan.h"

namespace meshrun::worker::sparse {

// Gives an example job (examples/, its batches holding doc_ids at
// `doc_ids_index`) the plan tables its step takes after the data arrays, built by PlanBatches
// with `builder`: each batch gets them appended and data_arrays gets the step's table inputs,
// so an ExampleRunner runs the sparse step as the worker does. Errors: InvalidArgument when a
// trailing step input is not a plan table; PlanBatches' errors. On error `job` may be partly
// changed.
absl::Status AppendPlanTables(std::shared_ptr<const PlanBuilder> builder, int doc_ids_index,
                              runtime::ExampleJob& job);

}  // namespace meshrun::worker::sparse
