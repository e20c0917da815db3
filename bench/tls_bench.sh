#!/usr/bin/env bash
# The distribution benchmark with plaintext and with mutual TLS on every link
# (MESHRUN_BENCH_TLS=1), alternating runs (which goes first alternates too), PAIRS pairs. Each
# run prints its median meshrun MB/s; a pair's ratio is TLS over plain. Prints the absolute
# figures, the per-pair ratios' median and spread, then (higher is better):
#   ratio distribution_tls_vs_plain <median over pairs of meshrun MB/s with TLS / without>
# The fan-out benchmark has no TLS mode yet: one process plays both the workers that upload and
# the dashboards that watch, which the access policy gives to two different roles.
# Usage: bench/tls_bench.sh [build directory]   (bench flags via DIST_ARGS, pairs via PAIRS)
set -euo pipefail
build=${1:-build}
dist="$build/bench/meshrun_distribution_bench"
dist_args=${DIST_ARGS:---mib 128 --rounds 3}
pairs=${PAIRS:-5}
mbps() { sed -n 's/^meshrun (cache.*median \([0-9.]*\) MB\/s.*/\1/p' | head -1; }
run() { MESHRUN_BENCH_TLS=$1 "$dist" $dist_args 2>/dev/null | mbps; }
plain=""; tls=""; ratios=""
for i in $(seq "$pairs"); do  # alternate, so a neighbour's load hits both alike
  if (( i % 2 )); then p=$(run 0); t=$(run 1); else t=$(run 1); p=$(run 0); fi
  plain="$plain $p"; tls="$tls $t"
  ratios="$ratios $(awk -v t="$t" -v p="$p" 'BEGIN { printf "%.4f", t / p }')"
done
median() { tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END {
  print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
range() { tr ' ' '\n' | grep . | sort -g | sed -n '1p;$p' | paste -sd' '; }
echo "distribution, meshrun path, MB/s: plain$plain (median $(echo $plain | median));" \
  "mutual TLS$tls (median $(echo $tls | median))"
read -r lo hi <<<"$(echo $ratios | range)"
echo "per-pair TLS/plain:$ratios: median $(echo $ratios | median) (min $lo, max $hi, $pairs pairs)"
echo "ratio distribution_tls_vs_plain $(echo $ratios | median)"
