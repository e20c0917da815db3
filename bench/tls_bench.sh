#!/usr/bin/env bash
# The distribution benchmark with plaintext and with mutual TLS on every link
# (MESHRUN_BENCH_TLS=1), alternating runs (which goes first alternates too), PAIRS pairs. Each
# run prints its median meshrun MB/s; a pair's ratio is TLS over plain. Prints the absolute
# figures, the per-pair ratios' median and spread, then (higher is better):
#   ratio distribution_tls_vs_plain <median over pairs of meshrun MB/s with TLS / without>
# Then the fan-out benchmark's own TLS mode (meshrun_fanout_bench --tls_vs_plain 1: rounds
# alternate plaintext and mutual TLS on every link, the uploader with a worker certificate, the
# watchers with a view one), which prints the spread of its per-round ratios and
#   ratio fanout_tls_vs_plain <median over rounds of TLS deliveries/s / plaintext deliveries/s>
# Usage: bench/tls_bench.sh [build directory]   (distribution flags via DIST_ARGS, pairs via
#   PAIRS; fan-out flags via FANOUT_ARGS; ONLY=distribution or ONLY=fanout runs one of them)
set -euo pipefail
build=${1:-build}
dist="$build/bench/meshrun_distribution_bench"
dist_args=${DIST_ARGS:---mib 128 --rounds 3}
pairs=${PAIRS:-5}
fanout_args=${FANOUT_ARGS:---rounds 9}
only=${ONLY:-}
mbps() { sed -n 's/^meshrun (cache.*median \([0-9.]*\) MB\/s.*/\1/p' | head -1; }
run() { MESHRUN_BENCH_TLS=$1 "$dist" $dist_args 2>/dev/null | mbps; }
if [ "$only" != fanout ]; then
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
fi
if [ "$only" != distribution ]; then
  # shellcheck disable=SC2086  # FANOUT_ARGS holds several flags
  "$build/bench/meshrun_fanout_bench" --tls_vs_plain 1 $fanout_args
fi
