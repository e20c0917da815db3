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

// The global batch the records below hold: s32 [4, 3] and u8 [4].
const std::vector<BatchArray> kBatch = {{"batch.x", ArrayShape{DType::kS32, {4, 3}}},
                                        {"batch.y", ArrayShape{DType::kU8, {4}}}};

// A typed file's header (docs/data.md) before `payload`: prefix, JSON padded to 64 bytes.
std::string Typed(const std::string& arrays_json, int64_t batches, const std::string& payload,
                  uint32_t version = 1) {
  std::string json = "{\"arrays\": [" + arrays_json + "], \"batches\": " +
                     std::to_string(batches) + ", \"payload_sha256\": \"" +
                     Sha256Hex(payload) + "\"}";
  const uint32_t size = static_cast<uint32_t>((16 + json.size() + 63) / 64 * 64);
  json.resize(size - 16, ' ');
  std::string out("MRARRAYS", 8);
  out.append(reinterpret_cast<const char*>(&version), 4);  // little-endian host
  out.append(reinterpret_cast<const char*>(&size), 4);
  return out + json + payload;
}

constexpr char kXY[] =
    R"({"name": "batch.x", "dtype": "s32", "shape": [4, 3]},)"
    R"({"name": "batch.y", "dtype": "u8", "shape": [4]})";

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
  absl::StatusOr<std::shared_ptr<const ArrayFile>> file = ArrayFile::Open(path_, kBatch);
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
  absl::StatusOr<std::shared_ptr<const ArrayFile>> file = ArrayFile::Open(path_, kBatch);
  ASSERT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(file.status().message().find("105 bytes"), std::string::npos) << file.status();
  EXPECT_NE(file.status().message().find("52 bytes"), std::string::npos) << file.status();
  EXPECT_NE(file.status().message().find("batch.y u8[4]"), std::string::npos) << file.status();
  Write("");
  EXPECT_EQ(ArrayFile::Open(path_, kBatch).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ArrayFile::Open(path_ + ".absent", kBatch).status().code(), absl::StatusCode::kNotFound);

  Write(Records(1));
  file = ArrayFile::Open(path_, kBatch);
  ASSERT_TRUE(file.ok());
  // The layout the job declares must be the file's record size.
  EXPECT_FALSE(MakeArrayFileBatches(*file, {.arrays = {ArrayShape{DType::kS32, {2, 3}}}}).ok());
}

TEST_F(ArrayBatchesTest, ReadsATypedFileAfterItsHeader) {
  const std::string payload = Records(3);
  const std::string bytes = Typed(kXY, 3, payload);
  Write(bytes);
  absl::StatusOr<std::shared_ptr<const ArrayFile>> file = ArrayFile::Open(path_, kBatch);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_TRUE((*file)->header().has_value());
  EXPECT_EQ((*file)->records(), 3);
  EXPECT_EQ((*file)->Record(1), payload.substr(52, 52));
  EXPECT_EQ((*file)->receipt().sha256, Sha256Hex(bytes));  // the receipt covers the whole file
  Write(Records(3));
  file = ArrayFile::Open(path_, kBatch);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_FALSE((*file)->header().has_value());  // headerless: loads, layout unchecked
}

// Each way a typed file can disagree with the program is refused, naming what differs.
TEST_F(ArrayBatchesTest, RefusesTypedFilesThatDisagreeWithTheProgram) {
  const std::string payload = Records(2);
  const std::string swapped =
      R"({"name": "batch.y", "dtype": "u8", "shape": [4]},)"
      R"({"name": "batch.x", "dtype": "s32", "shape": [4, 3]})";
  const std::string f32 =
      R"({"name": "batch.x", "dtype": "f32", "shape": [4, 3]},)"
      R"({"name": "batch.y", "dtype": "u8", "shape": [4]})";
  const std::string shape =
      R"({"name": "batch.x", "dtype": "s32", "shape": [3, 4]},)"
      R"({"name": "batch.y", "dtype": "u8", "shape": [4]})";
  const std::string extra = std::string(kXY) + R"(,{"name": "batch.z", "dtype": "u8", "shape": [1]})";
  struct Case {
    std::string bytes;
    absl::StatusCode code;
    std::vector<std::string> says;
  };
  for (const Case& c : std::vector<Case>{
           {Typed(swapped, 2, payload), absl::StatusCode::kInvalidArgument,
            {"array 0 is \"batch.y\"", "input 0 is \"batch.x\"", "another order"}},
           {Typed(f32, 2, payload), absl::StatusCode::kInvalidArgument,
            {"\"batch.x\" is f32[4,3] in the file", "takes s32[4,3]"}},
           {Typed(shape, 2, payload), absl::StatusCode::kInvalidArgument,
            {"\"batch.x\" is s32[3,4]", "takes s32[4,3]"}},
           {Typed(extra, 2, payload), absl::StatusCode::kInvalidArgument,
            {"holds 3 arrays per batch", "\"batch.z\"", "takes 2"}},
           {Typed(kXY, 3, payload), absl::StatusCode::kInvalidArgument,
            {"holds 104 bytes of batches", "says 3 batches of 52 bytes", "truncated"}},
           {Typed(kXY, 2, payload).substr(0, Typed(kXY, 2, payload).size() - 4),
            absl::StatusCode::kInvalidArgument, {"holds 100 bytes", "truncated"}},
           {Typed(kXY, 2, payload, 2), absl::StatusCode::kInvalidArgument,
            {"format version 2", "reads version 1"}},
           {Typed(kXY, 2, payload).replace(Typed(kXY, 2, payload).size() - 1, 1, "!"),
            absl::StatusCode::kDataLoss,
            {"hash to sha256", "corrupt"}},
           {Typed("{\"nope\": 1}", 2, payload), absl::StatusCode::kInvalidArgument,
            {"not a valid ArrayFileHeader"}},
       }) {
    Write(c.bytes);
    absl::StatusOr<std::shared_ptr<const ArrayFile>> file = ArrayFile::Open(path_, kBatch);
    ASSERT_EQ(file.status().code(), c.code) << file.status();
    for (const std::string& part : c.says) {
      EXPECT_NE(file.status().message().find(part), std::string::npos)
          << part << " not in: " << file.status();
    }
  }
}

}  // namespace
}  // namespace meshrun::worker
