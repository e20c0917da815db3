#include "coordinator/program_store.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/lru.h"
#include "common/sha256.h"
#include "common/status_macros.h"

namespace meshrun::coordinator {
namespace {
constexpr char kSuffix[] = ".stablehlo";
}  // namespace

absl::StatusOr<std::unique_ptr<ProgramStore>> ProgramStore::Create(Config config) {
  std::error_code error;
  std::filesystem::create_directories(config.directory, error);
  if (error || !std::filesystem::is_directory(config.directory)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot create the program store ", config.directory, ": ", error.message()));
  }
  auto store = std::unique_ptr<ProgramStore>(new ProgramStore(std::move(config)));
  absl::MutexLock lock(&store->mu_);
  for (const auto& entry : std::filesystem::directory_iterator(store->config_.directory, error)) {
    const std::string name = entry.path().filename().string();
    struct stat st;
    if (absl::EndsWith(name, kSuffix) && ::stat(entry.path().c_str(), &st) == 0) {
      store->uses_[name.substr(0, name.size() - std::strlen(kSuffix))] = {
          static_cast<int64_t>(st.st_size), absl::TimeFromTimespec(st.st_mtim)};
    } else if (absl::StrContains(name, ".partial")) {
      std::filesystem::remove(entry.path(), error);  // a write a crash cut short
    }
  }
  return store;
}

std::string ProgramStore::PathOf(const std::string& sha256) const {
  return absl::StrCat(config_.directory, "/", sha256, kSuffix);
}

absl::StatusOr<std::map<std::string, std::string>> ProgramStore::Write(const v1::JobSpec& spec) {
  std::map<std::string, std::string> out;
  for (const v1::Program& program : spec.programs()) {
    const std::string sha = Sha256Hex(program.stablehlo());
    out[program.role()] = sha;
    absl::MutexLock lock(&mu_);
    if (auto it = uses_.find(sha); it != uses_.end()) {
      it->second.last = absl::Now();
      continue;
    }
    const std::string temp = PathOf(sha) + ".partial";
    {
      std::ofstream out_file(temp, std::ios::binary | std::ios::trunc);
      out_file.write(program.stablehlo().data(),
                     static_cast<std::streamsize>(program.stablehlo().size()));
      if (!out_file.good()) {
        std::filesystem::remove(temp);
        return absl::InternalError(absl::StrCat("cannot write ", temp, ": ",
                                                std::strerror(errno)));
      }
    }
    std::error_code error;
    std::filesystem::rename(temp, PathOf(sha), error);
    if (error) return absl::InternalError(absl::StrCat("cannot write ", PathOf(sha)));
    uses_[sha] = {static_cast<int64_t>(program.stablehlo().size()), absl::Now()};
    EvictLocked();
  }
  return out;
}

v1::JobSpec ProgramStore::Stripped(v1::JobSpec spec) {
  for (v1::Program& program : *spec.mutable_programs()) program.clear_stablehlo();
  return spec;
}

void ProgramStore::Bind(const std::string& job_id, std::map<std::string, std::string> programs) {
  absl::MutexLock lock(&mu_);
  jobs_[job_id] = std::move(programs);
}

void ProgramStore::Release(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  jobs_.erase(job_id);
}

absl::StatusOr<v1::Program> ProgramStore::Read(const std::string& job_id, v1::Program program) {
  if (!program.stablehlo().empty()) return program;
  std::string sha;
  std::ifstream in;
  {
    absl::MutexLock lock(&mu_);
    auto job = jobs_.find(job_id);
    if (job != jobs_.end()) {
      if (auto role = job->second.find(program.role()); role != job->second.end()) {
        sha = role->second;
      }
    }
    auto it = uses_.find(sha);
    if (it != uses_.end()) {
      it->second.last = absl::Now();
      in.open(PathOf(sha), std::ios::binary);
    }
  }
  if (!in.is_open()) {
    return absl::NotFoundError(absl::StrCat("program ", program.role(), " of job ", job_id,
                                            " is no longer held by this coordinator; "
                                            "submit the job again"));
  }
  std::stringstream bytes;
  bytes << in.rdbuf();
  if (Sha256Hex(bytes.str()) != sha) {
    absl::MutexLock lock(&mu_);
    std::filesystem::remove(PathOf(sha));
    uses_.erase(sha);
    return absl::DataLossError(absl::StrCat("program ", program.role(), " file ", PathOf(sha),
                                            " no longer matches its sha256; deleted"));
  }
  program.set_stablehlo(bytes.str());
  return program;
}

void ProgramStore::EvictLocked() {
  for (const std::string& sha :
       LruEvictions(uses_, config_.max_bytes, absl::Now() - config_.keep_recent)) {
    std::error_code error;
    std::filesystem::remove(PathOf(sha), error);
    uses_.erase(sha);
  }
}

int64_t ProgramStore::bytes() const {
  absl::MutexLock lock(&mu_);
  int64_t total = 0;
  for (const auto& [sha, use] : uses_) total += use.bytes;
  return total;
}

}  // namespace meshrun::coordinator
