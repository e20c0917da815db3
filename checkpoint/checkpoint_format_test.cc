// The checkpoint format on real files: blocks over a mesh, a write / commit / read round trip
// on another mesh, and what restore refuses (partial steps, corrupted or truncated chunks).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "checkpoint/layout.h"
#include "checkpoint/store.h"

namespace meshrun::checkpoint {
namespace {

namespace fs = std::filesystem;
using runtime::DType;
using runtime::HostArray;

std::string FreshDir(const std::string& name) {
  const std::string dir = (fs::temp_directory_path() / ("checkpoint_test_" + name)).string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

TEST(LayoutTest, BlockOfFollowsTheMeshCoordinates) {
  // mesh (data=2, model=2); w [4, 6] split ("", "model").
  auto block = BlockOf({4, 6}, {"", "model"}, {"data", "model"}, {2, 2}, 3);
  ASSERT_TRUE(block.ok()) << block.status();
  EXPECT_EQ(block->start, (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(block->size, (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(ChunkKey(block->start, block->size), "0.1");
  EXPECT_EQ(ChunkKey({}, {}), "0");
  EXPECT_EQ(BlockOf({5}, {"data"}, {"data"}, {2}, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BlockOf({4}, {"expert"}, {"data"}, {2}, 0).status().message(),
            "mesh axis \"expert\" is not one of the mesh's (data)");
  EXPECT_EQ(LeafOf("state.opt.m.w1"), "opt.m.w1");
}

TEST(LayoutTest, ZarrMetadataRoundTrips) {
  v1::CheckpointArray array;
  array.set_name("state.params.w");
  array.set_leaf("params.w");
  array.set_dtype("bf16");
  for (int64_t n : {4, 6}) array.add_shape(n);
  for (int64_t n : {4, 3}) array.add_chunk_shape(n);
  auto json = ZarrArrayJson(array);
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_NE(json->find("\"dtype\":\"bfloat16\""), std::string::npos) << *json;
  auto parsed = ParseZarrArray(*json);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->dtype, DType::kBF16);
  EXPECT_EQ(parsed->shape, (std::vector<int64_t>{4, 6}));
  EXPECT_EQ(parsed->chunks, (std::vector<int64_t>{4, 3}));
  auto zstd = ParseZarrArray(R"({"zarr_format":2,"compressor":{"id":"zstd","level":1},)"
                             R"("dtype":"<f4","shape":[2],"chunks":[2]})");
  ASSERT_TRUE(zstd.ok()) << zstd.status();
  EXPECT_EQ(zstd->compressor, "zstd");
  EXPECT_EQ(ParseZarrArray(R"({"zarr_format":2,"compressor":{"id":"blosc"},"dtype":"<f4",)"
                           R"("shape":[2],"chunks":[2]})")
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);

  v1::CheckpointManifest manifest;
  *manifest.add_arrays() = array;
  manifest.mutable_arrays(0)->set_leaf("step");
  const std::string tree = OrbaxTreeMetadataJson(manifest);
  EXPECT_NE(tree.find("\"('step',)\""), std::string::npos) << tree;
}

// Writes a [4, 6] f32 array as a (data=2, model=2) mesh holds it ("", "model"): two distinct
// shards, each written once although two partitions hold it.
std::vector<ArrayChunks> TwoShards(const HostArray& global) {
  ArrayChunks entry;
  entry.array.set_name("state.params.w");
  entry.array.set_leaf("params.w");
  entry.array.set_dtype("f32");
  for (int64_t n : global.shape.dims) entry.array.add_shape(n);
  for (int64_t n : {4, 3}) entry.array.add_chunk_shape(n);
  for (int64_t col : {0, 3}) {
    HostArray block{{DType::kF32, {4, 3}}, std::string(4 * 3 * 4, '\0')};
    CopyBlock(global.bytes.data(), {4, 6}, {0, col}, block.bytes.data(), {4, 3}, {0, 0}, {4, 3},
              4);
    entry.chunks.push_back({ChunkKey({0, col}, {4, 3}), std::move(block)});
  }
  return {entry};
}

TEST(StoreTest, WriteCommitReadRoundTrip) {
  const std::string root = FreshDir("round_trip");
  std::vector<float> values(24);
  for (int i = 0; i < 24; ++i) values[i] = 0.5f * i;
  const HostArray global = HostArray::From<float>(DType::kF32, {4, 6}, values);
  auto written = WriteChunks(TempStepDir(root, 10), TwoShards(global));
  ASSERT_TRUE(written.ok()) << written.status();
  ASSERT_EQ((*written)[0].chunks_size(), 2);

  // Not committed yet: refused by name.
  EXPECT_EQ(ResolveCheckpoint(TempStepDir(root, 10)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ResolveCheckpoint(root).status().code(), absl::StatusCode::kFailedPrecondition);

  v1::CheckpointManifest manifest;
  manifest.set_job_id("job-1");
  manifest.set_step(10);
  manifest.set_data_position(10);
  *manifest.add_arrays() = (*written)[0];
  auto dir = Commit(root, manifest, 0);
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(*dir, StepDir(root, 10));
  EXPECT_TRUE(fs::exists(*dir + "/_METADATA"));
  EXPECT_TRUE(fs::exists(*dir + "/params.w/.zarray"));
  EXPECT_FALSE(fs::exists(TempStepDir(root, 10)));

  auto resolved = ResolveCheckpoint(root);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  auto read = ReadManifest(*resolved);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->data_position(), 10);
  auto array = ReadArray(*resolved, read->arrays(0));
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(array->As<float>(), values);
}

// Checkpoint trust (issue 29, item 5): in a directory meshrun writes to, only steps it
// committed (with a manifest) count; a step without one restores only when named, and then
// unverified; a temp step directory never restores, even holding Orbax's _METADATA.
TEST(StoreTest, OnlyCommittedStepsCountInMeshrunsOwnDirectory) {
  const std::string root = FreshDir("trust");
  auto written = WriteChunks(TempStepDir(root, 10),
                             TwoShards(HostArray::From<float>(DType::kF32, {4, 6},
                                                              std::vector<float>(24, 1.0f))));
  ASSERT_TRUE(written.ok()) << written.status();
  v1::CheckpointManifest manifest;
  manifest.set_step(10);
  *manifest.add_arrays() = (*written)[0];
  ASSERT_TRUE(Commit(root, manifest, 0).ok());
  for (const std::string& copy : {StepDir(root, 20), TempStepDir(root, 30)}) {
    fs::copy(StepDir(root, 10), copy, fs::copy_options::recursive);
    fs::remove(copy + "/meshrun_checkpoint.json");
    ASSERT_TRUE(fs::exists(copy + "/_METADATA"));
  }
  auto newest = ResolveCheckpoint(root);
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ(*newest, StepDir(root, 10)) << "step 20 has no manifest: meshrun never committed it";
  EXPECT_TRUE(IsVerified(*newest));
  auto named = ResolveCheckpoint(StepDir(root, 20));
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_FALSE(IsVerified(*named));
  const absl::Status temp = ResolveCheckpoint(TempStepDir(root, 30)).status();
  EXPECT_EQ(temp.code(), absl::StatusCode::kFailedPrecondition) << temp;
  EXPECT_NE(temp.message().find("never committed"), std::string::npos) << temp;
}

TEST(StoreTest, CorruptionAndTruncationNameTheChunk) {
  const std::string root = FreshDir("corrupt");
  std::vector<float> values(24, 1.0f);
  auto written = WriteChunks(TempStepDir(root, 5),
                             TwoShards(HostArray::From<float>(DType::kF32, {4, 6}, values)));
  ASSERT_TRUE(written.ok()) << written.status();
  v1::CheckpointManifest manifest;
  manifest.set_step(5);
  *manifest.add_arrays() = (*written)[0];
  auto dir = Commit(root, manifest, 0);
  ASSERT_TRUE(dir.ok()) << dir.status();
  {
    std::fstream f(*dir + "/params.w/0.1", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(7);
    f.put('\x5a');
  }
  auto flipped = ReadArray(*dir, manifest.arrays(0));
  EXPECT_EQ(flipped.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(flipped.status().message().find("array state.params.w chunk 0.1"), std::string::npos)
      << flipped.status();
  fs::resize_file(*dir + "/params.w/0.0", 10);
  auto truncated = ReadArray(*dir, manifest.arrays(0));
  EXPECT_EQ(truncated.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(truncated.status().message().find("chunk 0.0"), std::string::npos)
      << truncated.status();
}

TEST(StoreTest, RetentionKeepsTheNewestAfterCommit) {
  const std::string root = FreshDir("retention");
  std::vector<float> values(24, 2.0f);
  for (int64_t step : {10, 20, 30}) {
    auto written = WriteChunks(TempStepDir(root, step),
                               TwoShards(HostArray::From<float>(DType::kF32, {4, 6}, values)));
    ASSERT_TRUE(written.ok()) << written.status();
    v1::CheckpointManifest manifest;
    manifest.set_step(step);
    *manifest.add_arrays() = (*written)[0];
    ASSERT_TRUE(Commit(root, manifest, 2).ok());
  }
  EXPECT_EQ(CommittedSteps(root), (std::vector<int64_t>{20, 30}));
}

}  // namespace
}  // namespace meshrun::checkpoint
