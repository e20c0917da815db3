#include "coordinator/program_store.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/durable_file.h"
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

ProgramStore::Upload::Upload(ContentStore* files, std::string sha256, int64_t total_bytes)
    : files_(files),
      sha256_(std::move(sha256)),
      total_bytes_(total_bytes),
      temp_path_(files->TempPath(sha256_)) {}

ProgramStore::Upload::~Upload() {
  if (file_ != nullptr) std::fclose(file_);
  if (!finished_) {
    std::error_code ec;
    std::filesystem::remove(temp_path_, ec);
  }
}

absl::Status ProgramStore::Upload::Append(absl::string_view bytes) {
  if (file_ == nullptr || finished_) {
    return absl::FailedPreconditionError("the upload has ended");
  }
  if (received_ + static_cast<int64_t>(bytes.size()) > total_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the upload carries more than the ", total_bytes_, " bytes its first chunk announced"));
  }
  if (std::fwrite(bytes.data(), 1, bytes.size(), file_) != bytes.size()) {
    return absl::InternalError(
        absl::StrCat("cannot write ", temp_path_, ": ", std::strerror(errno)));
  }
  hash_.Update(bytes);
  received_ += static_cast<int64_t>(bytes.size());
  return absl::OkStatus();
}

absl::StatusOr<std::string> ProgramStore::Upload::Finish() {
  if (file_ == nullptr || finished_) {
    return absl::FailedPreconditionError("the upload has ended");
  }
  if (received_ != total_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat("the upload ended after ", received_,
                                                   " bytes; its first chunk announced ",
                                                   total_bytes_));
  }
  if (const std::string got = hash_.HexDigest(); got != sha256_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the uploaded bytes have sha256 ", got, ", not the announced ", sha256_));
  }
  const bool flushed = std::fclose(file_) == 0;
  file_ = nullptr;
  if (!flushed) {
    return absl::InternalError(
        absl::StrCat("cannot write ", temp_path_, ": ", std::strerror(errno)));
  }
  finished_ = true;  // Install takes the temp file, whatever it answers
  if (absl::Status s = files_->Install(sha256_, temp_path_); !s.ok()) {
    return absl::InternalError(s.message());
  }
  return sha256_;
}

absl::StatusOr<std::unique_ptr<ProgramStore::Upload>> ProgramStore::StartUpload(
    const std::string& sha256, int64_t total_bytes) {
  if (!IsSha256Hex(sha256)) {
    return absl::InvalidArgumentError(
        "the first chunk's sha256 must be the program's sha256: 64 lowercase hex digits");
  }
  if (total_bytes < 1) {
    return absl::InvalidArgumentError(
        "the first chunk's total_bytes must be the program's size, at least 1 byte");
  }
  std::unique_ptr<Upload> upload(new Upload(files_.get(), sha256, total_bytes));
  upload->file_ = std::fopen(upload->temp_path_.c_str(), "wbx");
  if (upload->file_ == nullptr) {
    return absl::InternalError(
        absl::StrCat("cannot create ", upload->temp_path_, ": ", std::strerror(errno)));
  }
  return upload;
}

absl::StatusOr<std::map<std::string, std::string>> ProgramStore::Write(const v1::JobSpec& spec) {
  std::map<std::string, std::string> out;
  for (int i = 0; i < spec.programs_size(); ++i) {
    const v1::Program& program = spec.programs(i);
    if (program.stablehlo().empty() && !program.stablehlo_sha256().empty()) {
      if (!files_->Has(program.stablehlo_sha256())) {
        return absl::FailedPreconditionError(absl::StrCat(
            "programs[", i, "].stablehlo_sha256 ", program.stablehlo_sha256(),
            " is not held by this coordinator: upload the program (UploadProgram) before "
            "submitting the job"));
      }
      out[program.role()] = program.stablehlo_sha256();
      continue;
    }
    absl::StatusOr<std::string> sha = files_->Put(program.stablehlo());
    if (!sha.ok()) return absl::InternalError(sha.status().message());
    out[program.role()] = *std::move(sha);
  }
  return out;
}

v1::JobSpec ProgramStore::Stripped(v1::JobSpec spec) {
  for (v1::Program& program : *spec.mutable_programs()) {
    program.clear_stablehlo();
    program.clear_stablehlo_sha256();
  }
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
  program.clear_stablehlo_sha256();
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
