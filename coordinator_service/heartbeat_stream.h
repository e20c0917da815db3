// StreamHeartbeats' server side, on an executor of its own: one thread drives every worker's
// liveness stream from a completion queue of its own (gRPC's async API), so no launch, transfer,
// telemetry commit or slow call on gRPC's callback threads can delay a beat, and a host is
// declared dead only on its own silence. A beat costs one message read and one ack write on the
// stream, where a unary Heartbeat costs a whole call (docs/scale.md).
//
// Each beat is judged as a Heartbeat call is (CoordinatorRpcHandler::Heartbeat: the registry's
// fence, then job progress for hang detection; it takes the registry's lock for one host and
// blocks on nothing). An accepted beat that asks for it (`ack`) is acknowledged with an empty
// HeartbeatResponse (one write in flight; beats judged meanwhile are acknowledged after it);
// the first refused beat ends the stream with its error, which is how the worker learns it was
// fenced or forgotten.
// Every beat must name the stream's first host and incarnation (INVALID_ARGUMENT); with TLS a
// worker may beat only for the host its certificate names (PERMISSION_DENIED); each stream
// holds a slot of `slots` (RESOURCE_EXHAUSTED past --max_upload_streams).
//
// Lifetime: construct before the server starts (it needs the server's queue), call Run on a
// thread of its own after; Run returns once the server has shut down and ShutdownQueue drained
// the queue. `handler` and `slots` must outlive Run. Thread-safety: the streams are Run's;
// ShutdownQueue may be called from any thread (gRPC aborts the process when an operation
// starts on a shut-down queue, so every start is checked against it under one lock).
#pragma once

#include <functional>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "coordinator_service/coordinator_rpc_handler.h"
#include "meshrun/v1/coordinator.pb.h"
#include "rpc/identity_slots.h"

namespace meshrun::services {

class HeartbeatStreams {
 public:
  using Stream = grpc::ServerAsyncReaderWriter<v1::HeartbeatResponse, v1::HeartbeatRequest>;
  // The service's RequestStreamHeartbeats: asks for the next stream, `tag` on `queue`.
  using RequestFn = std::function<void(grpc::ServerContext*, Stream*,
                                       grpc::ServerCompletionQueue* queue, void* tag)>;

  HeartbeatStreams(RequestFn request, grpc::ServerCompletionQueue* queue,
                   CoordinatorRpcHandler* handler, IdentitySlots* slots)
      : request_(std::move(request)), queue_(queue), handler_(handler), slots_(slots) {}

  // Serves streams until the queue is shut down (after the server: CoordinatorServer::Drain).
  void Run();
  // Shuts the queue down, once the server has: Run then drains it and returns. No stream
  // operation starts afterwards.
  void ShutdownQueue();

 private:
  class Call;
  void RequestNext();  // asks for the next worker's stream, unless the queue is shut down
  // Runs `start` (which starts one operation on the queue) unless the queue is shut down;
  // false when it did not.
  bool StartOp(const std::function<void()>& start);
  bool QueueShutDown() const;
  const RequestFn request_;
  grpc::ServerCompletionQueue* const queue_;
  CoordinatorRpcHandler* const handler_;
  IdentitySlots* const slots_;
  mutable absl::Mutex mu_;
  bool queue_shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace meshrun::services
