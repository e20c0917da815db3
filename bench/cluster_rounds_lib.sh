# Shared by the benches that start a fresh cluster per round (recovery_bench.sh,
# goodput_bench.sh); source it after setting `bin` and `src`. Adds to tests/cluster_lib.sh a
# per-round process list (`track`, `end_round`), `start_coordinator` and `start_worker`.
source "$src/tests/cluster_lib.sh"
lm="$src/examples/transformer_lm/dp4x2/job.json"
track() { echo "$1" >>"$tmp/round_pids"; }
# Kills the round's processes.
end_round() {
  for p in $(cat "$tmp/round_pids" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
  : >"$tmp/round_pids"
}
trap 'end_round; cleanup' EXIT
# A coordinator for round directory $1, logging to $1/c.log; sets `port`.
start_coordinator() {
  "$bin/meshrun-coordinator" --listen=127.0.0.1:0 --state_dir="$1/c" --data_root="$tmp" \
    --heartbeat_timeout=2s --restart_wait=60s >"$1/c.log" 2>&1 &
  track $!
  await_coordinator "$1/c.log"
}
start_worker() {  # dir, host, index, flags...; prints the pid
  "$bin/meshrun-worker" "$(worker_data_root)" --listen=127.0.0.1:0 --coordinator="127.0.0.1:$port" \
    --host="$2" --worker_index="$3" --cpu_devices=4 --state_dir="$1/$2" "${@:4}" >>"$1/$2.log" 2>&1 &
  track $!
  echo $!
}
