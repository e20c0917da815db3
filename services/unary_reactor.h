// The one line every unary callback-API method needs: run the handler, finish with its status.
#pragma once

#include <grpcpp/grpcpp.h>

#include "common/grpc_status.h"

namespace meshrun::services {

template <typename Handler>
grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* context, Handler&& handler) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(handler()));
  return reactor;
}

}  // namespace meshrun::services
