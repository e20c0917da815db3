#!/usr/bin/env bash
# The distribution benchmark with plaintext and with mutual TLS on every link
# (MESHRUN_BENCH_TLS=1), alternating runs in the same invocation. Prints the absolute figures,
# then (higher is better):
#   ratio distribution_tls_vs_plain <best meshrun MB/s with TLS / best without>
# The fan-out benchmark has no TLS mode yet: one process plays both the workers that upload and
# the dashboards that watch, which the access policy gives to two different roles.
# Usage: bench/tls_bench.sh [build directory]   (bench flags via DIST_ARGS)
set -euo pipefail
build=${1:-build}
dist="$build/bench/meshrun_distribution_bench"
dist_args=${DIST_ARGS:---mib 128 --rounds 5}
mbps() { sed -n 's/^meshrun (cache.*median \([0-9.]*\) MB\/s.*/\1/p' | head -1; }
plain=""; tls=""
for _ in 1 2; do  # alternate, so a neighbour's load hits both alike
  plain="$plain $(MESHRUN_BENCH_TLS=0 "$dist" $dist_args 2>/dev/null | mbps)"
  tls="$tls $(MESHRUN_BENCH_TLS=1 "$dist" $dist_args 2>/dev/null | mbps)"
done
best() { tr ' ' '\n' | grep . | sort -g | tail -1; }
p=$(echo $plain | best); t=$(echo $tls | best)
echo "distribution, meshrun path, MB/s: plain$plain (best $p); mutual TLS$tls (best $t)"
awk -v t="$t" -v p="$p" 'BEGIN { printf "ratio distribution_tls_vs_plain %.3f\n", t / p }'
