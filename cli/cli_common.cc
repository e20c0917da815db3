#include "cli/cli_common.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <cstdio>
#include <cstdlib>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "rpc/binary_setup.h"
#include "rpc/server_support.h"

// $MESHRUN_COORDINATOR, when set, is the default address (as for the Python SDK's Client).
static std::string DefaultCoordinator() {
  const char* env = std::getenv("MESHRUN_COORDINATOR");
  return env != nullptr && *env != '\0' ? env : "127.0.0.1:7070";
}
ABSL_FLAG(std::string, coordinator, DefaultCoordinator(),
          "HOST:PORT of the coordinator (default $MESHRUN_COORDINATOR, else 127.0.0.1:7070)");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(5), "deadline of each call");
ABSL_FLAG(std::string, output, "text",
          "text (tables, default), json (every command: one JSON object per line; the full "
          "messages in proto3 JSON; watch: one line per summary; export: JSON lines, "
          "--format=jsonl) or textproto (get: the manifest as protobuf text, as before)");

namespace meshrun::services {

bool JsonOutput() {
  const std::string output = absl::GetFlag(FLAGS_output);
  if (output != "text" && output != "json" && output != "textproto") {
    ExitWithError("--output=" + output + " is not text, json or textproto", kExitUsage);
  }
  return output == "json";
}

void PrintJson(const google::protobuf::Message& message) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  std::printf("%s\n", json.c_str());
}

void PrintJsonObject(const std::map<std::string, std::string>& fields) {
  google::protobuf::Struct object;
  for (const auto& [key, value] : fields) {
    (*object.mutable_fields())[key].set_string_value(value);
  }
  PrintJson(object);
}

std::unique_ptr<v1::Coordinator::Stub> CoordinatorStub() {
  const std::string address = absl::GetFlag(FLAGS_coordinator);
  if (auto parsed = ParseHostPort("coordinator", address); !parsed.ok()) {
    ExitWithError(std::string(parsed.status().message()), kExitUsage);
  }
  return v1::Coordinator::NewStub(MakeCoordinatorChannel(address));
}

void CheckCall(const grpc::Status& status, const std::string& what) {
  if (status.ok()) return;
  const bool unreachable = status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                           status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
  ExitWithError(absl::StrCat(what, ": ",
                             absl::StatusCodeToString(
                                 static_cast<absl::StatusCode>(status.error_code())),
                             ": ", status.error_message()),
                unreachable ? kExitUnreachable : 1);
}

}  // namespace meshrun::services
