# A cluster in network namespaces (docs/netns_cluster.md). A test starts with
#   set -euo pipefail
#   source "$(dirname "$0")/netns_lib.sh"
#   netns_begin "$@"     # <directory of the binaries> <source directory>
# which sets `bin`, `src` and `lm` (examples/transformer_lm), sources tests/cluster_lib.sh
# (temp dir, `fail`, `wait_for`, ...), exits 77 (skipped) unless namespaces can be made here,
# and writes the token shards of real text the jobs train on (`fortune_shards`).
#
# Each run makes namespaces named mrn-<pid>-<node>: one holding the private bridge `br0`
# (mrn-<pid>-br) and one per node (coordinator, each worker, the CLI), each joined to the
# bridge by a veth pair whose node end is `eth0` with an address in 10.213.0.0/24. That range
# exists only inside these namespaces: nothing is added to the machine's own namespace but the
# namespace names, so two runs never collide (different pids, separate bridges) and the
# host's routes are never touched.
#
# netns_require          exits 77 (skipped) unless this process may create namespaces
# netns_up               creates the bridge namespace (call once)
# netns_node NAME IP     creates node NAME with address IP (10.213.0.x)
# netns_run NAME CMD...  runs CMD inside node NAME
# netns_spawn NAME CMD... &  the same in the background, with `$!` CMD's own pid
# netns_link NAME up|down  the node's link: down cuts it off the bridge (a partition)
# Teardown: every namespace of this run on exit (trap), and at start every mrn-* namespace
# whose run (pid) is gone; processes still inside a namespace are killed before it goes.
netns_prefix="mrn-$$"
netns_begin() {
  bin=$1
  src=$2
  lm="$src/examples/transformer_lm"
  source "$src/tests/cluster_lib.sh"
  # The CLI runs in node cli (this replaces cluster_lib.sh's loopback `cli`).
  cli() { netns_run cli "$bin/meshrun" --coordinator="10.213.0.10:$port" "$@"; }
  netns_require
  fortune_shards
}
netns_require() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "SKIP: network namespaces need root (run as root or skip label netns)"; exit 77
  fi
  command -v ip >/dev/null || { echo "SKIP: iproute2 'ip' absent"; exit 77; }
  if ! ip netns add "$netns_prefix-probe" 2>"$tmp/netns_probe.txt"; then
    echo "SKIP: cannot create a network namespace here: $(cat "$tmp/netns_probe.txt")"; exit 77
  fi
  ip netns del "$netns_prefix-probe"
}
# Deletes namespace $1 after killing every process still inside it.
netns_delete() {
  local p
  for p in $(ip netns pids "$1" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
  ip netns del "$1" 2>/dev/null || true
}
netns_teardown() {
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$netns_prefix-"); do
    netns_delete "$ns"
  done
}
# Leftovers of runs that died without their trap (kill -9): their pid no longer exists.
netns_clean_stale() {
  local ns pid
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep '^mrn-[0-9]*-'); do
    pid=${ns#mrn-}; pid=${pid%%-*}
    kill -0 "$pid" 2>/dev/null || { echo "netns: removing leftover $ns"; netns_delete "$ns"; }
  done
}
netns_up() {
  netns_clean_stale
  exit_hooks+=(netns_teardown)
  ip netns add "$netns_prefix-br"
  ip -n "$netns_prefix-br" link add br0 type bridge
  ip -n "$netns_prefix-br" link set br0 up
}
netns_node() {  # name, address
  local ns="$netns_prefix-$1"
  ip netns add "$ns"
  ip -n "$netns_prefix-br" link add "v-$1" type veth peer name eth0 netns "$ns"
  ip -n "$netns_prefix-br" link set "v-$1" master br0 up
  ip -n "$ns" addr add "$2/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
}
netns_run() { local ns="$netns_prefix-$1"; shift; nsenter --net="/var/run/netns/$ns" -- "$@"; }
# For `netns_spawn NAME CMD... &` only: the background subshell becomes CMD (exec; nsenter
# execs too, where `ip netns exec` would fork), so `$!` is CMD's pid and kill -STOP reaches it.
netns_spawn() { local ns="$netns_prefix-$1"; shift; exec nsenter --net="/var/run/netns/$ns" -- "$@"; }
netns_link() { ip -n "$netns_prefix-$1" link set eth0 "$2"; }
# The usual cluster: nodes coord (10.213.0.10), cli (.2), host-a (.11) and host-b (.12); the
# coordinator started with the given extra flags, `cli` running the CLI in node cli, and
# workers host-a and host-b (4 CPU devices each; pids in worker_pid) registered. Needs `bin`.
# With netns_slices=2 set before, host-a is slice 0 and host-b slice 1 (multislice: each its
# own slice, the megascale coordinator on host-a's address).
declare -A worker_pid
netns_slices=1
netns_cluster() {
  netns_up
  netns_node coord 10.213.0.10
  netns_node cli 10.213.0.2
  netns_node host-a 10.213.0.11
  netns_node host-b 10.213.0.12
  # Plaintext beyond loopback needs --insecure (docs/security.md); these addresses exist only
  # inside the test's own namespaces.
  netns_spawn coord "$bin/meshrun-coordinator" --listen=10.213.0.10:0 --insecure \
    --state_dir="$tmp/coordinator" --data_root="$tmp" "$@" >"$tmp/coordinator.log" 2>&1 &
  pids+=($!)
  await_coordinator "$tmp/coordinator.log"
  local spec host address index slice
  for spec in host-a:10.213.0.11:0 host-b:10.213.0.12:1; do
    IFS=: read -r host address index <<<"$spec"
    if [ "$netns_slices" -gt 1 ]; then
      slice=(--num_slices="$netns_slices" --slice_id="$index" --worker_index=0
             --megascale_coordinator=10.213.0.11)
    else
      slice=(--worker_index="$index")
    fi
    netns_spawn "$host" "$bin/meshrun-worker" "$(worker_data_root)" --listen="$address:0" --insecure \
      --coordinator="10.213.0.10:$port" --host="$host" "${slice[@]}" \
      --cpu_devices=4 --state_dir="$tmp/$host" >"$tmp/$host.log" 2>&1 &
    pids+=($!)
    worker_pid[$host]=$!
  done
  cli workers --expect=2 --wait=30s >"$tmp/workers.txt" || fail "workers did not register"
}
