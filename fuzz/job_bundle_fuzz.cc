// The bundle reader (bundle/job_bundle.h, bundle/example_job.h) on any job.json:
// the input replaces job.json in a private copy of an example bundle's directory, so the
// programs and data files it names exist. Seeds: every example's job.json. Property: no crash,
// no hang, a refusal is INVALID_ARGUMENT or NOT_FOUND.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "fuzz/fuzz_support.h"
#include "bundle/job_bundle.h"

namespace {
std::string& JobJson() {
  static std::string path;
  return path;
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  using namespace meshrun;
  namespace fs = std::filesystem;
  fuzz::QuietLogs();
  const std::vector<std::string> bundles = fuzz::ExampleBundles();
  std::vector<std::string> seeds;
  for (const std::string& bundle : bundles) {
    std::ifstream in(bundle, std::ios::binary);
    seeds.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  fuzz::MaybeWriteSeeds(seeds);
  if (bundles.empty()) return 0;
  // transformer_lm/dp1 when there, else the first: its files, copied once.
  std::string source = bundles.front();
  for (const std::string& b : bundles) {
    if (b.find("transformer_lm/dp1/") != std::string::npos) source = b;
  }
  const std::string dir = fuzz::ScratchDir("bundle/model/variant");
  for (const auto& entry : fs::directory_iterator(fs::path(source).parent_path())) {
    fs::copy(entry.path(), dir + "/" + entry.path().filename().string());
  }
  // The model's data.bin sits one level up.
  const fs::path data = fs::path(source).parent_path().parent_path() / "data.bin";
  if (fs::exists(data)) fs::copy(data, fs::path(dir).parent_path() / "data.bin");
  JobJson() = dir + "/job.json";
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace meshrun;
  if (JobJson().empty()) return 0;
  fuzz::WriteFile(JobJson(), {reinterpret_cast<const char*>(data), size});
  const absl::StatusOr<v1::JobSpec> spec = client::JobSpecFromBundle(JobJson(), {});
  fuzz::ExpectDocumentedError(spec.status(), "JobSpecFromBundle",
                              {absl::StatusCode::kInvalidArgument, absl::StatusCode::kNotFound});
  return 0;
}
