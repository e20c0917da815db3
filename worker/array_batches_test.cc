#include "worker/array_batches.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "common/sha256.h"

namespace meshrun::worker {
namespace {

using runtime::ArrayShape;
using runtime::DType;

class ArrayBatchesTest : public ::testing::Test {
 protected:
  void SetUp() override { path_ = "/tmp/array_batches_test_" + std::to_string(getpid()); }
  void TearDown() override { unlink(path_.c_str()); }
  void Write(const std::string& bytes) { std::ofstream(path_, std::ios::binary) << bytes; }
  std::string path_;
};

// Records of two arrays: s32 [2 x 2 rows, 3] then u8 [2 x 2 rows] (two host replicas), each
// element its record number * 100 + its position, so every byte says where it came from.
std::string Records(int n) {
  std::string out;
  for (int r = 0; r < n; ++r) {
    for (int i = 0; i < 12; ++i) {
      const int32_t v = r * 100 + i;
      out.append(reinterpret_cast<const char*>(&v), 4);
    }
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(r * 10 + i));
  }
  return out;
}

TEST_F(ArrayBatchesTest, CyclesRecordsAndTakesThisReplicasRows) {
  const std::string bytes = Records(3);
  Write(bytes);
  absl::StatusOr<std::shared_ptr<const ArrayFile>> file = ArrayFile::Open(path_, 52);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->records(), 3);
  EXPECT_EQ((*file)->receipt().sha256, Sha256Hex(bytes));
  EXPECT_EQ((*file)->receipt().bytes, 156);
  absl::StatusOr<std::unique_ptr<BatchSource>> source = MakeArrayFileBatches(
      *file, {.arrays = {ArrayShape{DType::kS32, {2, 3}}, ArrayShape{DType::kU8, {2}}},
              .replica_index = 1,
              .replica_count = 2});
  ASSERT_TRUE(source.ok()) << source.status();
  ASSERT_TRUE((*source)->Skip(2).ok());
  for (int record : {2, 0, 1}) {
    absl::StatusOr<std::vector<runtime::HostArray>> batch = (*source)->Next();
    ASSERT_TRUE(batch.ok()) << batch.status();
    ASSERT_EQ(batch->size(), 2u);
    const auto* ints = reinterpret_cast<const int32_t*>((*batch)[0].bytes.data());
    ASSERT_EQ((*batch)[0].bytes.size(), 24u);
    for (int i = 0; i < 6; ++i) EXPECT_EQ(ints[i], record * 100 + 6 + i);  // rows 2, 3
    EXPECT_EQ((*batch)[1].bytes, std::string({static_cast<char>(record * 10 + 2),
                                              static_cast<char>(record * 10 + 3)}));
  }
}

TEST_F(ArrayBatchesTest, RefusesFilesThatAreNotWholeBatches) {
  Write(Records(2) + "x");
  absl::StatusOr<std::shared_ptr<const ArrayFile>> file = ArrayFile::Open(path_, 52);
  ASSERT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(file.status().message().find("105 bytes"), std::string::npos) << file.status();
  EXPECT_NE(file.status().message().find("52 bytes"), std::string::npos) << file.status();
  Write("");
  EXPECT_EQ(ArrayFile::Open(path_, 52).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ArrayFile::Open(path_ + ".absent", 52).status().code(), absl::StatusCode::kNotFound);

  Write(Records(1));
  file = ArrayFile::Open(path_, 52);
  ASSERT_TRUE(file.ok());
  // The layout the job declares must be the file's record size.
  EXPECT_FALSE(MakeArrayFileBatches(*file, {.arrays = {ArrayShape{DType::kS32, {2, 3}}}}).ok());
}

}  // namespace
}  // namespace meshrun::worker
