// limits (issue 16): program bytes live on disk, not in the job table.
#include "coordinator/program_store.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

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

}  // namespace
}  // namespace meshrun::coordinator
