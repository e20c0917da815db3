// What JAX and orbax.checkpoint write (tests/orbax_written.py in the project's venv: zstd
// chunks, no meshrun manifest), meshrun reads: f32 sharded over two chunks, bf16 and an s32
// scalar, exactly; a corrupted chunk is named; an OCDBT checkpoint is refused by name.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "checkpoint/store.h"

namespace meshrun::checkpoint {
namespace {

namespace fs = std::filesystem;

class OrbaxWrittenTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!fs::exists(MESHRUN_PYTHON)) return;
    root_ = new std::string((fs::temp_directory_path() / "checkpoint_orbax_read_test").string());
    fs::remove_all(*root_);
    const std::string command = absl::StrCat(MESHRUN_PYTHON, " ", MESHRUN_SOURCE_DIR,
                                             "/tests/orbax_written.py values ", *root_,
                                             " >/dev/null 2>&1");
    written_ = std::system(command.c_str()) == 0;
  }
  void SetUp() override {
    if (root_ == nullptr) GTEST_SKIP() << MESHRUN_PYTHON << " is absent (scripts/setup.sh)";
    ASSERT_TRUE(written_) << "tests/orbax_written.py failed";
  }
  static std::string* root_;
  static bool written_;
};
std::string* OrbaxWrittenTest::root_ = nullptr;
bool OrbaxWrittenTest::written_ = false;

const v1::CheckpointArray* Find(const v1::CheckpointManifest& manifest, const std::string& name) {
  for (const v1::CheckpointArray& a : manifest.arrays()) {
    if (a.name() == name) return &a;
  }
  return nullptr;
}

TEST_F(OrbaxWrittenTest, ReadsEveryLeafExactly) {
  auto dir = ResolveCheckpoint(*root_);  // the newest step: Orbax's 3/
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(fs::path(*dir).filename(), "3");
  auto manifest = ReadManifest(*dir);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->step(), 3);
  EXPECT_EQ(manifest->data_position(), 0);
  ASSERT_EQ(manifest->arrays_size(), 3);

  const v1::CheckpointArray* w = Find(*manifest, "state.params.w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->dtype(), "f32");
  EXPECT_EQ(w->compressor(), "zstd");
  EXPECT_EQ(w->chunks_size(), 2);  // one per device's shard
  auto w_values = ReadArray(*dir, *w);
  ASSERT_TRUE(w_values.ok()) << w_values.status();
  ASSERT_EQ(w_values->shape.dims, (std::vector<int64_t>{4, 6}));
  for (int i = 0; i < 24; ++i) {
    float f;
    std::memcpy(&f, w_values->bytes.data() + 4 * i, 4);
    EXPECT_EQ(f, 0.5f * i) << i;
  }

  const v1::CheckpointArray* half = Find(*manifest, "state.params.half");
  ASSERT_NE(half, nullptr);
  EXPECT_EQ(half->dtype(), "bf16");
  auto half_values = ReadArray(*dir, *half);
  ASSERT_TRUE(half_values.ok()) << half_values.status();
  for (int i = 0; i < 8; ++i) {
    uint16_t bits;
    std::memcpy(&bits, half_values->bytes.data() + 2 * i, 2);
    const uint32_t wide = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &wide, 4);
    EXPECT_EQ(f, 0.25f * i - 1.0f) << i;
  }

  const v1::CheckpointArray* step = Find(*manifest, "state.step");
  ASSERT_NE(step, nullptr);
  auto step_value = ReadArray(*dir, *step);
  ASSERT_TRUE(step_value.ok()) << step_value.status();
  int32_t s;
  std::memcpy(&s, step_value->bytes.data(), 4);
  EXPECT_EQ(s, 7);
}

TEST_F(OrbaxWrittenTest, CorruptedChunkIsNamed) {
  const std::string copy = *root_ + "_corrupt";
  fs::remove_all(copy);
  fs::create_directories(copy + "/3");
  fs::copy(*root_ + "/3", copy + "/3", fs::copy_options::recursive);
  fs::resize_file(copy + "/3/params.w/0.1", fs::file_size(copy + "/3/params.w/0.1") / 2);
  auto manifest = ReadManifest(copy + "/3");
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  auto read = ReadArray(copy + "/3", *Find(*manifest, "state.params.w"));
  ASSERT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << read.status();
  EXPECT_NE(read.status().message().find("state.params.w chunk 0.1"), std::string::npos)
      << read.status();
}

TEST_F(OrbaxWrittenTest, OcdbtIsRefusedByName) {
  auto manifest = ReadManifest(*root_ + "/ocdbt");
  ASSERT_EQ(manifest.status().code(), absl::StatusCode::kFailedPrecondition) << manifest.status();
  EXPECT_NE(manifest.status().message().find("use_ocdbt=False"), std::string::npos)
      << manifest.status();
}

TEST_F(OrbaxWrittenTest, OrbaxTempDirectoryIsPartial) {
  const std::string temp = *root_ + "_tmp/4.orbax-checkpoint-tmp-123";
  fs::remove_all(*root_ + "_tmp");
  fs::create_directories(temp);
  fs::copy(*root_ + "/3", temp, fs::copy_options::recursive);
  EXPECT_EQ(ResolveCheckpoint(temp).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ResolveCheckpoint(*root_ + "_tmp").status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace meshrun::checkpoint
