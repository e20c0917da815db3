// PlanBatches against the exported block-sparse example (examples/transformer_lm/sparse_dp1):
// the tables the worker appends have exactly the dtypes and shapes the step program declares,
// batch 0's tables equal the exporter's (reference.json plan_batch0, built by the exporter's
// mirror of the planner), and bad document ids are refused naming the row.
#include "worker/sparse/plan_batches.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "worker/batch_sources.h"
#include "bundle/example_job.h"

namespace meshrun::worker::sparse {
namespace {

const std::string kDir = std::string(MESHRUN_SOURCE_DIR) + "/examples/transformer_lm/sparse_dp1";

google::protobuf::Struct ReadJson(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  google::protobuf::Struct root;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(text.str(), &root).ok()) << path;
  return root;
}

double Num(const google::protobuf::Struct& s, const std::string& key) {
  return s.fields().at(key).number_value();
}

struct Example {
  runtime::ExampleJob job;
  MaskContract contract;
  std::vector<PlanTable> tables;  // in step input order
  int doc_ids_index = -1;
};

Example LoadSparseExample() {
  Example e;
  e.job = runtime::LoadExampleJob(kDir + "/job.json").value();
  const auto sparse = ReadJson(kDir + "/job.json").fields().at("sparse_attention").struct_value();
  e.contract.seq_len = static_cast<int32_t>(Num(sparse, "seq_len"));
  e.contract.causal = sparse.fields().at("causal").bool_value();
  e.contract.window = LocalWindow{static_cast<int32_t>(Num(sparse, "window_left")),
                                  static_cast<int32_t>(Num(sparse, "window_right"))};
  e.contract.block_q = static_cast<int32_t>(Num(sparse, "block_q"));
  e.contract.block_kv = static_cast<int32_t>(Num(sparse, "block_kv"));
  e.contract.max_grid_width = static_cast<int32_t>(Num(sparse, "max_grid_width"));
  e.contract.heads_per_plan = static_cast<int32_t>(Num(sparse, "heads_per_plan"));
  for (size_t i = 0; i < e.job.data_arrays.size(); ++i) {
    if (e.job.data_arrays[i].global.name == "batch.doc_ids") e.doc_ids_index = static_cast<int>(i);
  }
  // The plan tables are the step inputs after the state and the data arrays.
  for (size_t i = e.job.num_state + e.job.data_arrays.size(); i < e.job.step.inputs.size(); ++i) {
    const std::string& name = e.job.step.inputs[i].global.name;
    e.tables.push_back(ParsePlanTable(name.substr(name.find('.') + 1)).value());
  }
  return e;
}

std::unique_ptr<PlanBatches> MakeSource(const Example& e,
                                        std::vector<std::vector<runtime::HostArray>> batches) {
  auto builder = PlanBuilder::Create(e.contract);
  EXPECT_TRUE(builder.ok()) << builder.status();
  return PlanBatches::Create({.inner = MakeCycledBatches(std::move(batches)),
                              .builder = std::move(*builder),
                              .doc_ids_index = e.doc_ids_index,
                              .tables = e.tables})
      .value();
}

TEST(PlanBatchesTest, TablesMatchTheStepAndTheExporter) {
  const Example e = LoadSparseExample();
  ASSERT_GE(e.doc_ids_index, 0);
  ASSERT_EQ(e.tables.size(), 5u);
  auto source = MakeSource(e, e.job.batches);
  const size_t first = e.job.num_state + e.job.data_arrays.size();
  std::vector<std::string> previous_block_masks;
  for (size_t step = 0; step < e.job.batches.size(); ++step) {
    auto batch = source->Next();
    ASSERT_TRUE(batch.ok()) << batch.status();
    ASSERT_EQ(batch->size() + e.job.num_state, e.job.step.inputs.size());
    for (size_t i = 0; i < batch->size(); ++i) {
      // Same dtype and shape as the step declares, every batch: no recompile.
      EXPECT_EQ((*batch)[i].shape, e.job.step.inputs[e.job.num_state + i].global.shape)
          << e.job.step.inputs[e.job.num_state + i].global.name << " at step " << step;
      EXPECT_EQ((*batch)[i].bytes.size(), static_cast<size_t>((*batch)[i].shape.ByteSize()));
    }
    // block_mask is the first table.
    previous_block_masks.push_back((*batch)[first - e.job.num_state].bytes);

    if (step != 0) continue;
    // Batch 0 against the exporter's tables, entry by entry.
    const auto golden =
        ReadJson(kDir + "/reference.json").fields().at("plan_batch0").struct_value();
    for (size_t t = 0; t < e.tables.size(); ++t) {
      if (e.tables[t] == PlanTable::kPartialMasks) continue;
      const runtime::HostArray& table = (*batch)[first - e.job.num_state + t];
      ASSERT_EQ(table.shape.dtype, runtime::DType::kU8);  // every index fits a byte here
      std::vector<int> flat;
      for (const auto& row : golden.fields().at(PlanTableName(e.tables[t])).list_value().values()) {
        for (const auto& r : row.list_value().values()) {
          for (const auto& v : r.list_value().values()) {
            flat.push_back(static_cast<int>(v.number_value()));
          }
        }
      }
      ASSERT_EQ(flat.size(), table.bytes.size()) << PlanTableName(e.tables[t]);
      for (size_t i = 0; i < flat.size(); ++i) {
        EXPECT_EQ(static_cast<uint8_t>(table.bytes[i]), flat[i])
            << PlanTableName(e.tables[t]) << "[" << i << "]";
      }
    }
  }
  // The document boundaries move: consecutive batches have different block masks somewhere.
  int changes = 0;
  for (size_t s = 1; s < previous_block_masks.size(); ++s) {
    changes += previous_block_masks[s] != previous_block_masks[s - 1];
  }
  EXPECT_GT(changes, 0);
}

TEST(PlanBatchesTest, RefusesBadDocIdsNamingTheRow) {
  const Example e = LoadSparseExample();
  std::vector<runtime::HostArray> batch = e.job.batches[0];
  runtime::HostArray& doc_ids = batch[e.doc_ids_index];
  // Row 3's first token claims a document after all the others.
  const int32_t late = 1000;
  std::memcpy(doc_ids.bytes.data() + 3 * e.contract.seq_len * sizeof(int32_t), &late, sizeof(late));
  auto status = MakeSource(e, {batch})->Next().status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("row 3"), std::string::npos) << status;
  EXPECT_NE(status.message().find("non-decreasing"), std::string::npos) << status;

  std::vector<runtime::HostArray> wrong = e.job.batches[0];
  wrong[e.doc_ids_index].shape.dims[1] = 32;
  status = MakeSource(e, {wrong})->Next().status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("seq_len"), std::string::npos) << status;
}

TEST(PlanTablesTest, LayoutWidensIndexTypesWithTheContract) {
  MaskContract c{.seq_len = 131072, .block_q = 256, .block_kv = 256, .max_grid_width = 512};
  EXPECT_EQ(LayoutOf(c, PlanTable::kDataNext, 2).dtype, "u16");   // 511 kv blocks
  EXPECT_EQ(LayoutOf(c, PlanTable::kMaskNext, 2).dtype, "u32");   // 512 * 512 - 1
  EXPECT_EQ(LayoutOf(c, PlanTable::kGridWidth, 2).dtype, "u16");  // 512
  EXPECT_EQ(LayoutOf(c, PlanTable::kBlockMask, 2).dims, (std::vector<int64_t>{2, 512, 512}));
  EXPECT_EQ(ParsePlanTable("grid_width").value(), PlanTable::kGridWidth);
  EXPECT_EQ(ParsePlanTable("data_next_t").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace meshrun::worker::sparse
