// limits (issue 16): no server-side reads of client-chosen paths outside --data_root.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "common/path_roots.h"
#include "jobspec/spec_limits.h"

namespace meshrun::jobspec {
namespace {
namespace fs = std::filesystem;

class SpecPathsTest : public testing::Test {
 protected:
  void SetUp() override {
    base_ = fs::temp_directory_path() / ("spec_paths_" + std::to_string(::getpid()));
    fs::create_directories(base_ / "allowed" / "shards");
    fs::create_directories(base_ / "secret");
    std::ofstream(base_ / "secret" / "key.tok") << "x";
    fs::create_directory_symlink(base_ / "secret", base_ / "allowed" / "link");
  }
  void TearDown() override { fs::remove_all(base_); }
  std::string Path(const std::string& rel) const { return (base_ / rel).string(); }
  fs::path base_;
};

TEST_F(SpecPathsTest, RootsMustBeAbsoluteDirectories) {
  EXPECT_FALSE(PathRoots::Create({"relative/dir"}).ok());
  absl::StatusOr<PathRoots> missing = PathRoots::Create({Path("nope")});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("--data_root"), std::string::npos);
  absl::StatusOr<PathRoots> two = PathRoots::FromFlag(Path("allowed") + ",," + Path("allowed"),
                                                      {Path("secret")});
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->roots().size(), 2u);
}

TEST_F(SpecPathsTest, ResolvesOnlyUnderARoot) {
  const PathRoots roots = PathRoots::Create({Path("allowed")}).value();
  EXPECT_TRUE(roots.Resolve(Path("allowed/shards/a.tok"), "f").ok());
  EXPECT_TRUE(roots.Resolve(Path("allowed/not/yet/there"), "f").ok());
  for (const std::string& bad :
       {Path("secret/key.tok"), Path("allowed/../secret/key.tok"), Path("allowed/link/key.tok"),
        Path("allowed2"), std::string("/etc/passwd")}) {
    absl::StatusOr<std::string> r = roots.Resolve(bad, "spec.resume_from");
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("spec.resume_from \"" + bad + "\" is outside"),
              std::string::npos)
        << r.status();
  }
  EXPECT_NE(roots.Resolve("rel/path", "f").status().message().find("not an absolute path"),
            std::string::npos);
}

TEST_F(SpecPathsTest, SpecPathsAreConfined) {
  const PathRoots roots = PathRoots::Create({Path("allowed")}).value();
  v1::JobSpec spec;
  spec.mutable_data()->set_token_shards_glob(Path("allowed/shards/*.tok"));
  EXPECT_TRUE(CheckSpecPaths(spec, roots).ok()) << CheckSpecPaths(spec, roots);
  spec.mutable_data()->set_token_shards_glob(Path("secret/*.tok"));
  absl::Status s = CheckSpecPaths(spec, roots);
  EXPECT_NE(s.message().find("spec.data.token_shards_glob \"" + Path("secret/*.tok") +
                             "\" is outside"),
            std::string::npos)
      << s;
  spec.mutable_data()->set_token_shards_glob(Path("allowed/*/../../secret/*.tok"));
  s = CheckSpecPaths(spec, roots);
  EXPECT_NE(s.message().find("climbs"), std::string::npos) << s;
  spec.mutable_data()->set_token_shards_glob(Path("allowed/link/*.tok"));
  EXPECT_FALSE(CheckSpecPaths(spec, roots).ok());
  spec.mutable_data()->set_synthetic(true);
  spec.mutable_checkpoint()->set_directory(Path("secret"));
  s = CheckSpecPaths(spec, roots);
  EXPECT_NE(s.message().find("spec.checkpoint.directory"), std::string::npos) << s;
  spec.mutable_checkpoint()->set_directory(Path("allowed"));
  spec.set_resume_from("/proc/self");
  s = CheckSpecPaths(spec, roots);
  EXPECT_NE(s.message().find("spec.resume_from"), std::string::npos) << s;
  spec.clear_resume_from();
  spec.mutable_data()->set_array_file(Path("secret/key.tok"));
  s = CheckSpecPaths(spec, roots);
  EXPECT_NE(s.message().find("spec.data.array_file"), std::string::npos) << s;
}

// A worker also opens the example bundle, which the coordinator never reads.
TEST_F(SpecPathsTest, WorkerPathsIncludeTheBundle) {
  const PathRoots roots = PathRoots::Create({Path("allowed")}).value();
  v1::JobSpec spec;
  spec.mutable_data()->set_example_bundle("/etc/passwd");
  EXPECT_TRUE(CheckSpecPaths(spec, roots).ok());
  absl::Status s = CheckWorkerSpecPaths(spec, roots);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("spec.data.example_bundle \"/etc/passwd\" is outside"),
            std::string::npos) << s;
  EXPECT_NE(s.message().find("--data_root="), std::string::npos) << s;
  spec.mutable_data()->set_example_bundle(Path("allowed/shards"));
  EXPECT_TRUE(CheckWorkerSpecPaths(spec, roots).ok());
  spec.mutable_checkpoint()->set_directory(Path("allowed/link/ckpt"));
  EXPECT_FALSE(CheckWorkerSpecPaths(spec, roots).ok());
}

}  // namespace
}  // namespace meshrun::jobspec
