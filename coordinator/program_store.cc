#include "coordinator/program_store.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace meshrun::coordinator {

absl::StatusOr<std::unique_ptr<ProgramStore>> ProgramStore::Create(Config config) {
  if (config.directory.empty()) {
    return absl::FailedPreconditionError("cannot create the program store: no directory given");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<ContentStore> files,
                   ContentStore::Create({.directory = config.directory,
                                         .suffix = ".stablehlo",
                                         .max_bytes = config.max_bytes,
                                         .keep_recent = config.keep_recent,
                                         .log_name = "program store"}));
  return std::unique_ptr<ProgramStore>(new ProgramStore(std::move(files)));
}

absl::StatusOr<std::map<std::string, std::string>> ProgramStore::Write(const v1::JobSpec& spec) {
  std::map<std::string, std::string> out;
  for (const v1::Program& program : spec.programs()) {
    absl::StatusOr<std::string> sha = files_->Put(program.stablehlo());
    if (!sha.ok()) return absl::InternalError(sha.status().message());
    out[program.role()] = *std::move(sha);
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
  {
    absl::MutexLock lock(&mu_);
    auto job = jobs_.find(job_id);
    if (job != jobs_.end()) {
      if (auto role = job->second.find(program.role()); role != job->second.end()) {
        sha = role->second;
      }
    }
  }
  absl::StatusOr<std::string> bytes =
      sha.empty() ? absl::NotFoundError("not bound") : files_->Read(sha);
  if (bytes.status().code() == absl::StatusCode::kDataLoss) {
    return absl::DataLossError(absl::StrCat("program ", program.role(), " file ",
                                            files_->PathOf(sha),
                                            " no longer matches its sha256; deleted"));
  }
  if (!bytes.ok()) {  // whatever the cause, the remedy is the same
    return absl::NotFoundError(absl::StrCat("program ", program.role(), " of job ", job_id,
                                            " is no longer held by this coordinator; "
                                            "submit the job again"));
  }
  program.set_stablehlo(*std::move(bytes));
  return program;
}

int64_t ProgramStore::bytes() const { return files_->bytes(); }

}  // namespace meshrun::coordinator
