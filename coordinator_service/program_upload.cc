#include "coordinator_service/program_upload.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/protocol.h"
#include "jobspec/spec_limits.h"

namespace meshrun::services {
namespace {

class ProgramUpload final : public grpc::ServerReadReactor<v1::ProgramChunk> {
 public:
  ProgramUpload(coordinator::ProgramStore* store, v1::UploadProgramResponse* response,
                absl::StatusOr<IdentitySlots::Slot> slot)
      : store_(store), response_(response) {
    if (!slot.ok()) {
      Finish(ToGrpcStatus(slot.status()));
      return;
    }
    slot_ = std::move(*slot);
    StartRead(&chunk_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client's last write: install what came
      if (upload_ == nullptr) {
        return End(absl::InvalidArgumentError("the upload carried no chunk"));
      }
      absl::StatusOr<std::string> sha = upload_->Finish();
      if (!sha.ok()) return End(sha.status());
      response_->set_sha256(*sha);
      response_->set_bytes(total_bytes_);
      return End(absl::OkStatus());
    }
    if (static_cast<int64_t>(chunk_.data().size()) > kMaxProgramChunkBytes) {
      return End(absl::InvalidArgumentError(absl::StrCat(
          "a chunk carries ", chunk_.data().size(), " bytes; at most ", kMaxProgramChunkBytes)));
    }
    if (upload_ == nullptr) {
      if (chunk_.total_bytes() > jobspec::SpecLimits::kMaxProgramBytes) {
        return End(absl::InvalidArgumentError(absl::StrCat(
            "total_bytes ", chunk_.total_bytes(), " is over the program limit of ",
            jobspec::SpecLimits::kMaxProgramBytes, " bytes")));
      }
      absl::StatusOr<std::unique_ptr<coordinator::ProgramStore::Upload>> upload =
          store_->StartUpload(chunk_.sha256(), chunk_.total_bytes());
      if (!upload.ok()) return End(upload.status());
      upload_ = *std::move(upload);
      total_bytes_ = chunk_.total_bytes();
    }
    if (absl::Status s = upload_->Append(chunk_.data()); !s.ok()) return End(s);
    StartRead(&chunk_);
  }

  void OnDone() override { delete this; }

 private:
  void End(const absl::Status& status) {
    upload_.reset();  // an unfinished upload's temp file goes now, not when gRPC is done
    Finish(ToGrpcStatus(status));
  }

  coordinator::ProgramStore* const store_;
  v1::UploadProgramResponse* const response_;
  IdentitySlots::Slot slot_;
  v1::ProgramChunk chunk_;
  std::unique_ptr<coordinator::ProgramStore::Upload> upload_;
  int64_t total_bytes_ = 0;
};

}  // namespace

grpc::ServerReadReactor<v1::ProgramChunk>* StartProgramUpload(
    coordinator::ProgramStore* store, v1::UploadProgramResponse* response,
    absl::StatusOr<IdentitySlots::Slot> slot) {
  return new ProgramUpload(store, response, std::move(slot));
}

}  // namespace meshrun::services
