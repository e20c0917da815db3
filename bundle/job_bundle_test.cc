#include "bundle/job_bundle.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "common/path_roots.h"

namespace meshrun::client {
namespace {

namespace fs = std::filesystem;

void Write(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// A minimal bundle: what a run needs and nothing else (no reference, no compile options).
constexpr char kBundle[] = R"({
 "name": "tiny",
 "mesh": {"axes": ["data"], "shape": [2], "device_ids": [0, 1]},
 "programs": {
  "init": {"file": "init.mlirbc", "inputs": [{"name": "seed", "dtype": "u32"}],
           "outputs": [{"name": "state.w", "dtype": "bf16", "shape": [4], "sharding": [null],
                        "shard_shape": [4]}]},
  "step": {"file": "step.mlirbc",
           "inputs": [{"name": "state.w", "dtype": "bf16", "shape": [4], "sharding": [null],
                       "shard_shape": [4]},
                      {"name": "batch.x", "dtype": "f32", "shape": [8, 3],
                       "sharding": ["data", null], "shard_shape": [4, 3]}],
           "outputs": [{"name": "state.w", "dtype": "bf16", "shape": [4], "sharding": [null],
                        "shard_shape": [4]},
                       {"name": "metrics.loss", "dtype": "f32"},
                       {"name": "metrics.attn", "dtype": "f32", "shape": [2, 3]}],
           "donated_inputs": [0]}
 },
 "seed": 7,
 "telemetry": [{"name": "loss", "output": "metrics.loss", "combine": "mean"},
               {"name": "attn", "output": "metrics.attn", "shape": [2, 3], "combine": "max",
                "caption": "layer x head"}]
})";

class JobBundleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("job_bundle_test_" + std::to_string(getpid()));
    fs::create_directories(dir_);
    Write(dir_ / "init.mlirbc", "init-code");
    Write(dir_ / "step.mlirbc", "step-code");
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Bundle(const std::string& text) {
    Write(dir_ / "job.json", text);
    return (dir_ / "job.json").string();
  }
  static std::string Replace(std::string text, const std::string& from, const std::string& to) {
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return text.replace(at, from.size(), to);
  }
  fs::path dir_;
};

TEST_F(JobBundleTest, BundleWithoutTestFixturesBecomesAJobSpec) {
  absl::StatusOr<v1::JobSpec> spec =
      JobSpecFromBundle(Bundle(kBundle), {.steps = 5, .telemetry_cadence = 1});
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "tiny");
  ASSERT_EQ(spec->programs_size(), 2);
  EXPECT_EQ(spec->programs(1).role(), "step");
  EXPECT_EQ(spec->programs(1).stablehlo(), "step-code");
  // null sharding entries are "" (not split), one per dimension.
  ASSERT_EQ(spec->programs(1).inputs(1).sharding_size(), 2);
  EXPECT_EQ(spec->programs(1).inputs(1).sharding(0), "data");
  EXPECT_EQ(spec->programs(1).inputs(1).sharding(1), "");
  EXPECT_EQ(spec->state_count(), 1);
  EXPECT_EQ(spec->mesh().data_parallel(), 2);
  EXPECT_EQ(spec->data().seed(), 7);
  EXPECT_EQ(spec->data().example_bundle(), fs::absolute(dir_ / "job.json").string());
  ASSERT_EQ(spec->telemetry_size(), 2);
  EXPECT_EQ(spec->telemetry(1).combine(), v1::COMBINE_MAX);
  EXPECT_EQ(spec->telemetry(1).caption(), "layer x head");
}

TEST_F(JobBundleTest, UnmappedMeshAxisIsRefusedByName) {
  absl::StatusOr<v1::JobBundle> bundle =
      ReadJobBundle(Bundle(Replace(kBundle, R"("axes": ["data"])", R"("axes": ["rows"])")));
  ASSERT_EQ(bundle.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bundle.status().message().find("mesh.axes"), std::string::npos) << bundle.status();
  EXPECT_NE(bundle.status().message().find("\"rows\""), std::string::npos) << bundle.status();
}

TEST_F(JobBundleTest, ErrorsNameTheField) {
  struct Case {
    std::string from, to, field;
  };
  for (const Case& c : std::vector<Case>{
           {R"("seed": 7)", R"("seed": "seven")", "seed"},
           {R"("name": "tiny",)", R"("name": "tiny", "nmae": 1,)", "nmae"},
           {R"("file": "step.mlirbc")", R"("file": "")", "programs.step.file"},
           {R"("file": "step.mlirbc")", R"("file": "missing.mlirbc")", "programs.step.file"},
           {R"("combine": "max")", R"("combine": "median")", "telemetry[1].combine"},
           {R"("donated_inputs": [0])", R"("donated_inputs": [9])", "programs.step.donated_inputs"},
           {R"("shape": [2], "device_ids")", R"("shape": [2, 1], "device_ids")", "mesh.shape"},
       }) {
    absl::StatusOr<v1::JobSpec> spec = JobSpecFromBundle(Bundle(Replace(kBundle, c.from, c.to)), {});
    ASSERT_FALSE(spec.ok()) << c.to;
    EXPECT_NE(spec.status().message().find(c.field), std::string::npos)
        << c.field << ": " << spec.status();
  }
  EXPECT_EQ(ReadJobBundle((dir_ / "absent.json").string()).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(JobBundleTest, DataOverrideTellsArrayFilesFromTokenShards) {
  const std::string path = Bundle(kBundle);
  Write(dir_ / "batches.bin", std::string(96, '\1'));
  Write(dir_ / "corpus-00000.tok", std::string("MRTOKSHD") + std::string(40, '\0'));
  absl::StatusOr<v1::JobSpec> arrays = JobSpecFromBundle(path, {.data = (dir_ / "batches.bin").string()});
  ASSERT_TRUE(arrays.ok()) << arrays.status();
  EXPECT_EQ(arrays->data().array_file(), (dir_ / "batches.bin").string());
  absl::StatusOr<v1::JobSpec> tokens =
      JobSpecFromBundle(path, {.data = (dir_ / "corpus-*.tok").string()});
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ(tokens->data().token_shards_glob(), (dir_ / "corpus-*.tok").string());
  absl::StatusOr<v1::JobSpec> one_shard =
      JobSpecFromBundle(path, {.data = (dir_ / "corpus-00000.tok").string()});
  ASSERT_TRUE(one_shard.ok()) << one_shard.status();
  EXPECT_TRUE(one_shard->data().has_token_shards_glob());
}

// Every bundle examples/ holds (today's job.json layout) reads as a typed JobBundle.
TEST(CommittedBundles, ReadUnchanged) {
  int read = 0;
  for (const auto& entry : fs::recursive_directory_iterator(MESHRUN_SOURCE_DIR "/examples")) {
    if (entry.path().filename() != "job.json") continue;
    absl::StatusOr<v1::JobSpec> spec = JobSpecFromBundle(entry.path().string(), {});
    ASSERT_TRUE(spec.ok()) << entry.path() << ": " << spec.status();
    for (const v1::Program& p : spec->programs()) {
      for (const v1::TensorSpec& t : p.inputs()) {
        EXPECT_EQ(t.sharding_size(), t.shape_size()) << entry.path() << " " << t.name();
      }
    }
    ++read;
  }
  EXPECT_GE(read, 10);
}

// A server reading a client's bundle (the worker, --data_root) resolves each file the bundle
// names, joined to its directory, and refuses one that climbs or links out of the roots.
TEST_F(JobBundleTest, FilesOutsideTheRootsAreRefusedNamingFieldAndRoot) {
  const fs::path root = dir_ / "root";
  const fs::path bundle = root / "bundle";
  fs::create_directories(bundle / "sub");
  Write(bundle / "init.mlirbc", "init-code");
  Write(dir_ / "outside.txt", "secret");
  fs::create_directories(dir_ / "outside_dir");
  Write(dir_ / "outside_dir" / "step.mlirbc", "secret");
  fs::create_symlink(dir_ / "outside.txt", bundle / "link.mlirbc");
  fs::create_symlink(dir_ / "outside_dir", bundle / "linked_dir");
  fs::create_symlink(bundle / "init.mlirbc", root / "inside_link.mlirbc");
  const std::string job_json = (bundle / "job.json").string();
  absl::StatusOr<PathRoots> roots = PathRoots::Create({root.string()});
  ASSERT_TRUE(roots.ok()) << roots.status();
  const std::string canonical_root = fs::canonical(root).string();

  for (const char* file : {"../../outside.txt", "link.mlirbc", "linked_dir/step.mlirbc",
                           "sub/../../../outside.txt", "/../../outside.txt"}) {
    absl::StatusOr<std::string> read =
        ReadBundleFile(job_json, file, "programs.init.file", &*roots);
    ASSERT_FALSE(read.ok()) << file << " was read: " << *read;
    EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument) << read.status();
    const std::string message(read.status().message());
    EXPECT_NE(message.find("programs.init.file"), std::string::npos) << message;
    EXPECT_NE(message.find("is outside"), std::string::npos) << message;
    EXPECT_NE(message.find(canonical_root), std::string::npos) << message;
    EXPECT_NE(message.find("--data_root"), std::string::npos) << message;
  }
  // Inside the root, however it is named, it is read.
  for (const char* file : {"init.mlirbc", "sub/../init.mlirbc", "../inside_link.mlirbc"}) {
    absl::StatusOr<std::string> read = ReadBundleFile(job_json, file, "programs.init.file",
                                                      &*roots);
    ASSERT_TRUE(read.ok()) << file << ": " << read.status();
    EXPECT_EQ(*read, "init-code");
  }
  // A client reading its own bundle (no roots) follows what the bundle names.
  absl::StatusOr<std::string> own = ReadBundleFile(job_json, "link.mlirbc", "programs.init.file");
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_EQ(*own, "secret");
}

}  // namespace
}  // namespace meshrun::client
