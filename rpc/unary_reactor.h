// The one line every unary callback-API method needs: run the handler, finish with its status.
// Handlers that wait (disk, calls to workers, a job's end) use FinishUnaryOffThread, so that
// gRPC's callback threads stay free for heartbeats and cheap calls.
#pragma once

#include <utility>

#include <grpcpp/grpcpp.h>

#include "common/background_tasks.h"
#include "common/grpc_status.h"

namespace meshrun::services {

template <typename Handler>
grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* context, Handler&& handler) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(handler()));
  return reactor;
}

// Runs `handler` (returning absl::Status) on a thread of `tasks` and finishes the call from
// there; the callback thread returns at once. The request, response and context stay valid
// until the reactor finished; anything else `handler` uses must outlive `tasks`.
template <typename Handler>
grpc::ServerUnaryReactor* FinishUnaryOffThread(grpc::CallbackServerContext* context,
                                               BackgroundTasks& tasks, Handler handler) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  tasks.Run([reactor, handler = std::move(handler)]() mutable {
    reactor->Finish(ToGrpcStatus(handler()));
  });
  return reactor;
}

}  // namespace meshrun::services
