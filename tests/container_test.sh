#!/usr/bin/env bash
# The container (docs/deploy.md, "Container"): without any container registry, buildah builds
# meshrun's runtime image from scratch (deploy/container/build_image.sh: this build's
# `cmake --install` prefix plus the Debian 12 shared libraries its binaries link, and XLA's
# CPU PJRT plugin), then runs the image twice on the host network with `buildah run`
# (chroot isolation: podman's OCI runtime cannot set rlimits inside this machine's own
# container): a coordinator and a worker with 8 CPU devices. The host's CLI reaches them: gRPC
# health SERVING, the dashboard served from the image, the worker registered with its devices,
# and the MLP job trained to SUCCEEDED inside the image. Image and containers live in a
# private storage root under the test's temp dir (vfs driver) and are gone afterwards.
# Usage: container_test.sh <build directory> <source directory>
# Exits 77 (skipped) when buildah is absent (scripts/setup.sh installs it).
set -euo pipefail
build=$1
src=$2
bin="$build/bin"
source "$src/tests/cluster_lib.sh"
command -v buildah >/dev/null || { echo "SKIP: buildah absent (scripts/setup.sh installs it)"; exit 77; }
store=(--root "$tmp/storage" --runroot "$tmp/run" --storage-driver vfs)
# Every process below the given pids. buildah's chroot isolation runs the image's command two
# forks below `buildah run`, with its root in a directory of buildah's own, so only the process
# tree tells which are ours (a root-directory match let them outlive the test).
descendants() {
  local -A parent=()
  local stat fields ppid
  for stat in /proc/[0-9]*/stat; do
    read -r fields <"$stat" 2>/dev/null || continue
    fields=${fields##*) }  # after "(command name)", which may hold spaces: state ppid ...
    read -r _ ppid _ <<<"$fields"
    parent[${stat//[!0-9]/}]=$ppid
  done
  local queue=("$@") p child
  while [ ${#queue[@]} -gt 0 ]; do
    p=${queue[0]}
    queue=("${queue[@]:1}")
    for child in "${!parent[@]}"; do
      if [ "${parent[$child]}" = "$p" ]; then echo "$child"; queue+=("$child"); fi
    done
  done
}
stop_containers() {
  local p
  for p in $(descendants "${pids[@]}"); do kill -9 "$p" 2>/dev/null || true; done
  buildah "${store[@]}" rm --all >/dev/null 2>&1 || true
  buildah "${store[@]}" rmi --all --force >/dev/null 2>&1 || true
}
exit_hooks+=(stop_containers)

prefix="$tmp/prefix"
cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" 2>&1 || fail "cmake --install failed"
plugin=$(sed -n 's/^MESHRUN_PJRT_PLUGIN:FILEPATH=//p' "$build/CMakeCache.txt")
[ -f "$plugin" ] || fail "no PJRT plugin at '$plugin'"
image="localhost/meshrun-test:$$"
start=$(date +%s.%N)
bash "$src/deploy/container/build_image.sh" "$prefix" "$image" "$plugin" -- "${store[@]}" \
  >"$tmp/build.log" 2>&1 || fail "image build failed: $(cat "$tmp/build.log")"
built=$(date +%s.%N)
echo "$(tail -1 "$tmp/build.log") in $(awk -v a="$start" -v b="$built" 'BEGIN { printf "%.1f", b - a }') s"

run() {  # name, command...: a working container of the image, the command run inside it
  local ctr
  ctr=$(buildah "${store[@]}" from --name "mrn-$$-$1" "$image")
  shift
  # The job's data files are read by the worker at the paths the CLI submitted: mount them.
  buildah "${store[@]}" run --isolation chroot --network host \
    --volume "$src/examples:$src/examples:ro" "$ctr" -- "$@"
}
run coordinator meshrun-coordinator --listen=127.0.0.1:0 --http_listen=127.0.0.1:0 \
  --pjrt_plugin= --state_dir=/var/lib/meshrun/coordinator >"$tmp/coordinator.log" 2>&1 &
pids+=($!)
await_coordinator "$tmp/coordinator.log"
"$bin/meshrun" health "127.0.0.1:$port" >"$tmp/health.txt" 2>&1 \
  || fail "containerized coordinator not healthy: $(cat "$tmp/health.txt")"
grep -q SERVING "$tmp/health.txt" || fail "health: $(cat "$tmp/health.txt")"
http_port=$(sed -n 's/.*HTTP on port \([0-9]*\).*/\1/p' "$tmp/coordinator.log" | head -1)
if [ -f "$prefix/share/meshrun/web/index.html" ]; then
  curl -fsS "http://127.0.0.1:$http_port/" >"$tmp/index.html" || fail "dashboard not served"
  cmp -s "$tmp/index.html" "$prefix/share/meshrun/web/index.html" || fail "/ is not the image's index.html"
fi
run worker meshrun-worker --listen=127.0.0.1:0 --coordinator="127.0.0.1:$port" \
  --host=container-0 --cpu_devices=8 --state_dir=/var/lib/meshrun/worker \
  --data_root="$src/examples" \
  --pjrt_plugin="/usr/local/lib/meshrun/$(basename "$plugin")" >"$tmp/worker.log" 2>&1 &
pids+=($!)
cli workers --expect=1 --wait=60s >"$tmp/workers.txt" || fail "the containerized worker did not register"
grep -q "^container-0 .*ALIVE" "$tmp/workers.txt" || fail "workers: $(cat "$tmp/workers.txt")"
cli submit "$src/examples/mlp_classifier/dp8/job.json" --steps=20 --cadence=10 --follow --output=textproto \
  --wait=120s >"$tmp/job.txt" || fail "the job did not succeed: $(cat "$tmp/job.txt")"
grep -q "state: JOB_STATE_SUCCEEDED" "$tmp/job.txt" || fail "job: $(cat "$tmp/job.txt")"
echo "containers: coordinator healthy, worker container-0 registered, $(field job_id <"$tmp/job.txt") SUCCEEDED"
echo "container_test: all checks passed"
