#include "rpc/grpc_probe.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/unknown_field_set.h>
#include <grpcpp/generic/generic_stub.h>

#include "absl/status/status.h"
#include "common/grpc_status.h"
#include "rpc/server_support.h"

namespace meshrun::services {
namespace {

using google::protobuf::UnknownField;
using google::protobuf::UnknownFieldSet;

grpc::ByteBuffer ToByteBuffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

std::string FromByteBuffer(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  for (const grpc::Slice& slice : slices) {
    out.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return out;
}

// A length-delimited string field, encoded by hand.
std::string StringField(int number, const std::string& value) {
  std::string out;
  google::protobuf::io::StringOutputStream stream(&out);
  google::protobuf::io::CodedOutputStream coded(&stream);
  coded.WriteTag(static_cast<uint32_t>(number << 3 | 2));
  coded.WriteVarint32(static_cast<uint32_t>(value.size()));
  coded.WriteString(value);
  return out;
}

// UnknownFieldSet is not copyable, hence the unique_ptr.
absl::StatusOr<std::unique_ptr<UnknownFieldSet>> Parse(const std::string& bytes,
                                                       const char* what) {
  auto fields = std::make_unique<UnknownFieldSet>();
  if (!fields->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::DataLossError(std::string("cannot parse the ") + what + " answer");
  }
  return fields;
}

// Waits for the single outstanding operation on `cq`.
bool Await(grpc::CompletionQueue& cq) {
  void* tag = nullptr;
  bool ok = false;
  return cq.Next(&tag, &ok) && ok;
}

void DrainQueue(grpc::CompletionQueue& cq) {
  cq.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq.Next(&tag, &ok)) {
  }
}

}  // namespace

absl::StatusOr<std::string> CheckHealth(const std::shared_ptr<grpc::Channel>& channel,
                                        const std::string& service, absl::Duration timeout) {
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  auto context = ContextWithTimeout(timeout);
  const grpc::ByteBuffer request =
      ToByteBuffer(service.empty() ? std::string() : StringField(1, service));
  grpc::ByteBuffer response;
  grpc::Status status;
  auto call = stub.PrepareUnaryCall(context.get(), "/grpc.health.v1.Health/Check", request, &cq);
  call->StartCall();
  call->Finish(&response, &status, nullptr);
  Await(cq);
  DrainQueue(cq);
  if (!status.ok()) return FromGrpcStatus(status);
  auto fields = Parse(FromByteBuffer(response), "health");
  if (!fields.ok()) return fields.status();
  uint64_t serving = 0;  // absent field = UNKNOWN
  for (int i = 0; i < (*fields)->field_count(); ++i) {
    const UnknownField& field = (*fields)->field(i);
    if (field.number() == 1 && field.type() == UnknownField::TYPE_VARINT) serving = field.varint();
  }
  switch (serving) {
    case 1: return std::string("SERVING");
    case 2: return std::string("NOT_SERVING");
    case 3: return std::string("SERVICE_UNKNOWN");
    default: return std::string("UNKNOWN");
  }
}

absl::StatusOr<std::vector<std::string>> ListServicesByReflection(
    const std::shared_ptr<grpc::Channel>& channel, absl::Duration timeout) {
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  auto context = ContextWithTimeout(timeout);
  auto call = stub.PrepareCall(
      context.get(), "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  grpc::ByteBuffer response;
  grpc::Status status;
  call->StartCall(nullptr);
  bool ok = Await(cq);
  if (ok) {
    call->Write(ToByteBuffer(StringField(7, "*")), nullptr);  // list_services
    ok = Await(cq);
  }
  if (ok) {
    call->WritesDone(nullptr);
    ok = Await(cq);
  }
  bool got_response = false;
  if (ok) {
    call->Read(&response, nullptr);
    got_response = Await(cq);
  }
  call->Finish(&status, nullptr);
  Await(cq);
  DrainQueue(cq);
  if (!status.ok()) return FromGrpcStatus(status);
  if (!got_response) return absl::DataLossError("reflection sent no answer");

  auto top = Parse(FromByteBuffer(response), "reflection");
  if (!top.ok()) return top.status();
  std::vector<std::string> names;
  for (int i = 0; i < (*top)->field_count(); ++i) {
    const UnknownField& field = (*top)->field(i);
    if (field.number() != 6 || field.type() != UnknownField::TYPE_LENGTH_DELIMITED) continue;
    auto list = Parse(field.length_delimited(), "reflection list");
    if (!list.ok()) return list.status();
    for (int j = 0; j < (*list)->field_count(); ++j) {
      if ((*list)->field(j).number() != 1) continue;
      auto entry =
          Parse((*list)->field(j).length_delimited(), "reflection entry");
      if (!entry.ok()) return entry.status();
      for (int k = 0; k < (*entry)->field_count(); ++k) {
        if ((*entry)->field(k).number() == 1) names.push_back((*entry)->field(k).length_delimited());
      }
    }
  }
  return names;
}

}  // namespace meshrun::services
