#include "fuzz/fuzz_support.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>

#include "absl/strings/str_cat.h"

namespace meshrun::fuzz {
namespace fs = std::filesystem;
namespace {

std::string& ProcessDir() {
  static std::string dir;
  return dir;
}

void RemoveProcessDir() {
  std::error_code ignored;
  if (!ProcessDir().empty()) fs::remove_all(ProcessDir(), ignored);
}

}  // namespace

std::string ScratchDir(const std::string& name) {
  if (ProcessDir().empty()) {
    const char* tmp = std::getenv("TMPDIR");
    ProcessDir() = absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/meshrun-fuzz-",
                                getpid());
    std::atexit(RemoveProcessDir);
  }
  const std::string dir = ProcessDir() + "/" + name;
  std::error_code ignored;
  fs::remove_all(dir, ignored);
  fs::create_directories(dir);
  return dir;
}

std::vector<std::string> ExampleBundles() {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(MESHRUN_SOURCE_DIR "/examples", ec), end;
       !ec && it != end; it.increment(ec)) {
    if (it->path().filename() == "job.json") out.push_back(it->path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

void WriteFile(const std::string& path, absl::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out.flush()) {
    std::fprintf(stderr, "fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
}

void MaybeWriteSeeds(const std::vector<std::string>& seeds) {
  const char* dir = std::getenv("MESHRUN_FUZZ_SEEDS");
  if (dir == nullptr || *dir == '\0') return;
  if (seeds.empty()) {
    std::fprintf(stderr, "fuzz: no seed (are the examples/ bundles there?)\n");
    std::abort();
  }
  fs::create_directories(dir);
  for (size_t i = 0; i < seeds.size(); ++i) WriteFile(absl::StrCat(dir, "/seed-", i), seeds[i]);
  std::fprintf(stderr, "fuzz: wrote %zu seeds to %s\n", seeds.size(), dir);
  std::exit(0);
}

void QuietLogs() { spdlog::set_level(spdlog::level::off); }

void ExpectDocumentedError(const absl::Status& status, const char* what,
                           std::initializer_list<absl::StatusCode> allowed) {
  if (status.ok()) return;
  if (std::find(allowed.begin(), allowed.end(), status.code()) != allowed.end()) return;
  std::fprintf(stderr, "fuzz: %s answered an undocumented error: %s\n", what,
               status.ToString().c_str());
  std::abort();
}

}  // namespace meshrun::fuzz
