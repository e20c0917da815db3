// Keepalive on every long-lived gRPC stream, prompt reconnection to a restarted peer (issue 16,
// faults), and the heartbeat schedule workers share (issue 30). Thread-safety: the functions keep no state; safe to call concurrently.
#pragma once

#include <grpcpp/channel.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/support/channel_arguments.h>

#include "absl/time/time.h"

namespace meshrun::services {

// Clients ping a connection that carries a call after kKeepaliveTime of silence and drop it
// when no answer comes within kKeepaliveTimeout, so a stream whose peer vanished (power loss,
// partition: no FIN) fails within ~40 s instead of hanging until TCP gives up. Pings only
// while calls are open (an idle channel costs nothing).
inline constexpr absl::Duration kKeepaliveTime = absl::Seconds(30);
inline constexpr absl::Duration kKeepaliveTimeout = absl::Seconds(10);

// The client side of the above (every channel MakeChannel creates).
void AddClientKeepalive(grpc::ChannelArguments& args);

// The server side: the server pings its clients on the same schedule (a watcher or uploader
// that vanished frees its stream), and accepts the clients' pings at that rate (gRPC's default
// would answer them with GOAWAY "too_many_pings").
void AddServerKeepalive(grpc::ServerBuilder& builder);

// When `channel` is in TRANSIENT_FAILURE (its peer was down, it is backing off before the next
// attempt), asks it to reconnect now and waits up to `wait` for the attempt, so a call to a
// worker restarted at the same address reaches the new process instead of failing at once
// with "Connection refused". A no-op (no wait) for a channel in any other state.
void ReconnectIfFailing(grpc::Channel& channel, absl::Duration wait);

// The latest heartbeat tick at or before `t`: ticks fall on multiples of interval / 20 (at most
// 1 s) since the Unix epoch. A worker sends its next beat at HeartbeatTick(now + interval), so
// beats come at most `interval` apart and the beats of a large fleet reach the coordinator in
// bunches, one per tick: a bunch costs it one wake-up where beats spread evenly cost one each
// (about a third of the CPU per beat at 1024 hosts, docs/scale.md). Hosts whose clocks
// disagree only bunch less well. `interval` must be positive.
absl::Time HeartbeatTick(absl::Time t, absl::Duration interval);

}  // namespace meshrun::services
