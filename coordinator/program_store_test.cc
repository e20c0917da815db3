// limits (issue 16): program bytes live on disk, not in the job table.
#include "coordinator/program_store.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "common/sha256.h"

namespace meshrun::coordinator {
namespace {

std::string Dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/program_store_test/" + name;
  std::filesystem::remove_all(dir);
  return dir;
}

v1::JobSpec Spec(const std::string& step_bytes) {
  v1::JobSpec spec;
  spec.add_programs()->set_role("init");
  spec.mutable_programs(0)->set_stablehlo("module @init {}");
  spec.add_programs()->set_role("step");
  spec.mutable_programs(1)->set_stablehlo(step_bytes);
  return spec;
}

TEST(ProgramStoreTest, KeepsBytesOutOfTheSpecAndGivesThemBack) {
  const std::string dir = Dir("roundtrip");
  auto store = ProgramStore::Create({.directory = dir}).value();
  const std::string big(1 << 20, 's');
  const v1::JobSpec spec = Spec(big);
  store->Bind("job-1", store->Write(spec).value());
  const v1::JobSpec stored = ProgramStore::Stripped(spec);
  EXPECT_LT(stored.ByteSizeLong(), 100u) << "the spec holds no program bytes";
  EXPECT_EQ(store->Read("job-1", stored.programs(1)).value().stablehlo(), big);
  // The same bytes twice are stored once.
  store->Bind("job-2", store->Write(spec).value());
  EXPECT_EQ(store->bytes(), static_cast<int64_t>(big.size() + 15));
  // A released job's programs are not read back.
  store->Release("job-2");
  EXPECT_EQ(store->Read("job-2", stored.programs(1)).status().code(),
            absl::StatusCode::kNotFound);
  // A corrupted file is refused and dropped.
  std::filesystem::path file;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (std::filesystem::file_size(entry.path()) == big.size()) file = entry.path();
  }
  std::ofstream(file) << "tampered";
  EXPECT_EQ(store->Read("job-1", stored.programs(1)).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(store->Read("job-1", stored.programs(1)).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(store->Read("job-1", stored.programs(0)).value().stablehlo(), "module @init {}");
}

TEST(ProgramStoreTest, EvictsLeastRecentlyUsedPastTheCap) {
  auto store = ProgramStore::Create({.directory = Dir("cap"),
                                     .max_bytes = 3000,
                                     .keep_recent = absl::ZeroDuration()})
                   .value();
  store->Bind("a", store->Write(Spec(std::string(2000, 'a'))).value());
  store->Bind("b", store->Write(Spec(std::string(2000, 'b'))).value());
  EXPECT_LE(store->bytes(), 3000);
  const v1::JobSpec stripped = ProgramStore::Stripped(Spec(""));
  const absl::StatusOr<v1::Program> gone = store->Read("a", stripped.programs(1));
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(gone.status().message().find("submit the job again"), std::string::npos);
  EXPECT_TRUE(store->Read("b", stripped.programs(1)).ok());
}


// security (issue 27): programs arrive ahead of their job in chunks, and only whole, verified
// uploads become entries a spec may name.
TEST(ProgramStoreUploadTest, AVerifiedUploadIsWhatASpecNames) {
  const std::string dir = Dir("upload");
  auto store = ProgramStore::Create({.directory = dir}).value();
  const std::string bytes = std::string(3 << 20, 'p') + "end";
  const std::string sha = Sha256Hex(bytes);

  v1::JobSpec spec = Spec("");
  spec.mutable_programs(1)->set_stablehlo_sha256(sha);
  absl::StatusOr<std::map<std::string, std::string>> early = store->Write(spec);
  EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(early.status().message().find("programs[1].stablehlo_sha256"), std::string::npos)
      << early.status();

  auto upload = store->StartUpload(sha, static_cast<int64_t>(bytes.size())).value();
  for (size_t at = 0; at < bytes.size(); at += 1 << 20) {
    ASSERT_TRUE(upload->Append(absl::string_view(bytes).substr(at, 1 << 20)).ok());
  }
  EXPECT_EQ(upload->Finish().value(), sha);
  std::map<std::string, std::string> bound = store->Write(spec).value();
  EXPECT_EQ(bound["step"], sha);
  store->Bind("job-1", bound);
  const v1::JobSpec stored = ProgramStore::Stripped(spec);
  EXPECT_TRUE(stored.programs(1).stablehlo_sha256().empty());
  const v1::Program read = store->Read("job-1", stored.programs(1)).value();
  EXPECT_EQ(read.stablehlo(), bytes);
  EXPECT_TRUE(read.stablehlo_sha256().empty());
}

TEST(ProgramStoreUploadTest, ABadUploadLeavesNothing) {
  const std::string dir = Dir("bad-upload");
  auto store = ProgramStore::Create({.directory = dir}).value();
  const std::string bytes = "module @step {}";
  const std::string sha = Sha256Hex(bytes);
  EXPECT_EQ(store->StartUpload("ABC", 10).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->StartUpload(sha, 0).status().code(), absl::StatusCode::kInvalidArgument);
  {  // more bytes than announced
    auto upload = store->StartUpload(sha, 4).value();
    EXPECT_EQ(upload->Append(bytes).code(), absl::StatusCode::kInvalidArgument);
  }
  {  // fewer
    auto upload = store->StartUpload(sha, static_cast<int64_t>(bytes.size())).value();
    ASSERT_TRUE(upload->Append(bytes.substr(0, 3)).ok());
    EXPECT_EQ(upload->Finish().status().code(), absl::StatusCode::kInvalidArgument);
  }
  {  // other bytes than the sha256 announced
    auto upload = store->StartUpload(sha, static_cast<int64_t>(bytes.size())).value();
    ASSERT_TRUE(upload->Append("module @evil {}").ok());
    absl::StatusOr<std::string> finished = upload->Finish();
    EXPECT_EQ(finished.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(finished.status().message().find(sha), std::string::npos) << finished.status();
  }
  {  // abandoned half-way
    auto upload = store->StartUpload(sha, static_cast<int64_t>(bytes.size())).value();
    ASSERT_TRUE(upload->Append(bytes.substr(0, 3)).ok());
  }
  EXPECT_EQ(store->bytes(), 0);
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "no entry and no temp file";
  v1::JobSpec spec = Spec("");
  spec.mutable_programs(1)->set_stablehlo_sha256(sha);
  EXPECT_EQ(store->Write(spec).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace meshrun::coordinator
