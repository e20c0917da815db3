#include "rpc/channel_health.h"

#include <grpc/grpc.h>

#include <algorithm>

#include "absl/time/clock.h"

namespace meshrun::services {
namespace {
int Millis(absl::Duration d) { return static_cast<int>(absl::ToInt64Milliseconds(d)); }
}  // namespace

void AddClientKeepalive(grpc::ChannelArguments& args) {
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, Millis(kKeepaliveTime));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, Millis(kKeepaliveTimeout));
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);  // a quiet stream keeps being checked
}

void AddServerKeepalive(grpc::ServerBuilder& builder) {
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, Millis(kKeepaliveTime));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, Millis(kKeepaliveTimeout));
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // Clients ping every kKeepaliveTime; accept down to half of it (clock skew, retries).
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             Millis(kKeepaliveTime / 2));
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);  // 0: never GOAWAY for pings
}

void ReconnectIfFailing(grpc::Channel& channel, absl::Duration wait) {
  grpc_connectivity_state state = channel.GetState(/*try_to_connect=*/false);
  if (state != GRPC_CHANNEL_TRANSIENT_FAILURE) return;
  grpc::experimental::ChannelResetConnectionBackoff(&channel);
  const absl::Time give_up = absl::Now() + wait;
  while (state != GRPC_CHANNEL_READY && absl::Now() < give_up) {
    if (!channel.WaitForStateChange(state, absl::ToChronoTime(give_up))) break;
    state = channel.GetState(/*try_to_connect=*/true);
  }
}

absl::Time HeartbeatTick(absl::Time t, absl::Duration interval) {
  const absl::Duration tick = std::min(interval / 20, absl::Seconds(1));
  if (tick <= absl::ZeroDuration()) return t;
  return absl::UnixEpoch() + absl::Floor(t - absl::UnixEpoch(), tick);
}

}  // namespace meshrun::services
