// What meshrun writes, orbax.checkpoint reads: f32 chunked over a mesh, bf16 and an s32 scalar,
// restored by tests/checkpoint_check.py in the project's venv with no meshrun code.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "checkpoint/layout.h"
#include "checkpoint/store.h"

namespace meshrun::checkpoint {
namespace {

namespace fs = std::filesystem;
using runtime::DType;
using runtime::HostArray;

ArrayChunks Whole(const std::string& leaf, const std::string& dtype, HostArray data) {
  ArrayChunks entry;
  entry.array.set_name("state." + leaf);
  entry.array.set_leaf(leaf);
  entry.array.set_dtype(dtype);
  for (int64_t n : data.shape.dims) {
    entry.array.add_shape(n);
    entry.array.add_chunk_shape(n);
  }
  entry.chunks.push_back({ChunkKey(std::vector<int64_t>(data.shape.dims.size(), 0),
                                   data.shape.dims),
                          std::move(data)});
  return entry;
}

TEST(OrbaxTest, OrbaxRestoresWhatMeshrunWrote) {
  if (!fs::exists(MESHRUN_PYTHON)) GTEST_SKIP() << MESHRUN_PYTHON << " is absent (scripts/setup.sh)";
  const std::string root = (fs::temp_directory_path() / "checkpoint_orbax_test").string();
  fs::remove_all(root);
  fs::create_directories(root);

  // params.w f32 [4, 6] = 0.5 * i, in two chunks of [4, 3] (a model-parallel split).
  std::vector<float> w(24);
  for (int i = 0; i < 24; ++i) w[i] = 0.5f * i;
  ArrayChunks sharded;
  sharded.array.set_name("state.params.w");
  sharded.array.set_leaf("params.w");
  sharded.array.set_dtype("f32");
  for (int64_t n : {4, 6}) sharded.array.add_shape(n);
  for (int64_t n : {4, 3}) sharded.array.add_chunk_shape(n);
  for (int64_t col : {0, 3}) {
    HostArray block{{DType::kF32, {4, 3}}, std::string(48, '\0')};
    CopyBlock(reinterpret_cast<const char*>(w.data()), {4, 6}, {0, col}, block.bytes.data(),
              {4, 3}, {0, 0}, {4, 3}, 4);
    sharded.chunks.push_back({ChunkKey({0, col}, {4, 3}), std::move(block)});
  }
  // params.half bf16 [8] = 0.25 * i - 1 (exact in bf16): the upper 16 bits of the f32.
  std::vector<uint16_t> half(8);
  for (int i = 0; i < 8; ++i) {
    const float f = 0.25f * i - 1.0f;
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    half[i] = static_cast<uint16_t>(bits >> 16);
  }
  std::vector<ArrayChunks> arrays = {
      std::move(sharded), Whole("params.half", "bf16", HostArray::From<uint16_t>(DType::kBF16, {8}, half)),
      Whole("step", "s32", HostArray::From<int32_t>(DType::kS32, {}, {7}))};
  auto written = WriteChunks(TempStepDir(root, 1), arrays);
  ASSERT_TRUE(written.ok()) << written.status();
  v1::CheckpointManifest manifest;
  manifest.set_step(1);
  for (auto& array : *written) *manifest.add_arrays() = array;
  auto dir = Commit(root, manifest, 0);
  ASSERT_TRUE(dir.ok()) << dir.status();

  const std::string command = absl::StrCat(MESHRUN_PYTHON, " ", MESHRUN_SOURCE_DIR,
                                           "/tests/checkpoint_check.py values ", *dir, " 2>&1");
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
}

}  // namespace
}  // namespace meshrun::checkpoint
