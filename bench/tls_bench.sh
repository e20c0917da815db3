#!/usr/bin/env bash
# The two mutual-TLS benchmarks, one after the other:
#   meshrun_distribution_bench --tls_vs_ceiling 1: the executable distribution path in plaintext
#     and with mutual TLS, alternating round by round in one process, against the ceiling that
#     the plaintext run's time and CPU and the TLS cipher's measured cost allow (bench/README.md,
#     "The TLS ceiling"); prints the absolute figures, the spread of the per-round ratios and
#       ratio distribution_tls_vs_ceiling <median over rounds of TLS MB/s / ceiling MB/s>
#   meshrun_fanout_bench --tls_vs_plain 1: rounds alternate plaintext and mutual TLS on every
#     link (the uploader with a worker certificate, the watchers with a view one); prints the
#     spread of its per-round ratios and
#       ratio fanout_tls_vs_plain <median over rounds of TLS deliveries/s / plaintext deliveries/s>
# Usage: bench/tls_bench.sh [build directory]   (distribution flags via DIST_ARGS, fan-out flags
#   via FANOUT_ARGS; ONLY=distribution or ONLY=fanout runs one of them)
set -euo pipefail
build=${1:-build}
dist_args=${DIST_ARGS:---mib 128 --rounds 9}
fanout_args=${FANOUT_ARGS:---rounds 9}
only=${ONLY:-}
# gRPC logs a line per TLS handshake (no host-name match: cluster members are checked by their
# certificate identity, rpc/tls_credentials.h); stderr still shows a failure's reason.
quiet() { grep -v 'ssl_transport_security.cc.*No match found for server name' >&2 || true; }
if [ "$only" != fanout ]; then
  # shellcheck disable=SC2086  # DIST_ARGS holds several flags
  "$build/bench/meshrun_distribution_bench" --tls_vs_ceiling 1 $dist_args 2> >(quiet)
fi
if [ "$only" != distribution ]; then
  # shellcheck disable=SC2086  # FANOUT_ARGS holds several flags
  "$build/bench/meshrun_fanout_bench" --tls_vs_plain 1 $fanout_args 2> >(quiet)
fi
