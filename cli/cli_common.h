// What the CLI's commands share (cli/cli_main.cc and its cli_*.cc): the --output choice
// and JSON printing, the coordinator stub from --coordinator, and the exit codes of a failed
// call. Functions that fail end the process with ExitWithError (the CLI is single-threaded).
#pragma once

#include <map>
#include <memory>
#include <string>

#include <google/protobuf/message.h>

#include "absl/flags/declare.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "meshrun/v1/coordinator.grpc.pb.h"

ABSL_DECLARE_FLAG(std::string, coordinator);
ABSL_DECLARE_FLAG(absl::Duration, timeout);
ABSL_DECLARE_FLAG(std::string, output);

namespace meshrun::services {

// Exit codes (also in the CLI's usage): 0 ok, 1 refused or failed call, 2 usage error,
// 3 coordinator unreachable, 4 the followed job ended FAILED or CANCELLED, 5 still running
// after --wait.
constexpr int kExitUsage = 2, kExitUnreachable = 3, kExitJobFailed = 4, kExitStillRunning = 5;

// Whether --output=json; exits 2 when --output is not text, json or textproto.
bool JsonOutput();
// The whole message as proto3 JSON (proto field names) on one line of stdout.
void PrintJson(const google::protobuf::Message& message);
// A flat JSON object of strings on one line of stdout, correctly escaped.
void PrintJsonObject(const std::map<std::string, std::string>& fields);

// A stub for --coordinator; exits 2 when it is not HOST:PORT.
std::unique_ptr<v1::Coordinator::Stub> CoordinatorStub();
// Exits on a failed call: 3 when the coordinator is unreachable (UNAVAILABLE, deadline),
// else 1; the message starts with `what`.
void CheckCall(const grpc::Status& status, const std::string& what);

}  // namespace meshrun::services
