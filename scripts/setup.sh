#!/usr/bin/env bash
# Installs everything meshrun needs on Debian 12, idempotently and without questions:
# Debian packages (compilers, gRPC, protobuf, abseil, spdlog, GoogleTest, ...), then the PJRT
# header, XLA's CPU plugin and the project's Python environment (scripts/fetch_pjrt.sh), the
# main job's token shards from the fortunes package's text (.data/fortunes, docs/data.md), and
# the web dashboard's pinned npm packages (npm ci in web/, from web/package-lock.json), and
# torch + torchax for meshrun.torch in .venv-torch (scripts/install_torch.sh), and libtpu to
# compile for TPU topologies on any host (scripts/fetch_libtpu.sh; MESHRUN_SKIP_LIBTPU=1 skips).
# A second run installs nothing, downloads nothing and rewrites no shard.
#
#   scripts/setup.sh          everything, for the tests (scripts/test.sh, .ci/run)
#   scripts/setup.sh --demo   only what scripts/demo.sh runs: the Debian packages the build
#                             needs, the PJRT header and CPU plugin, the token shards and the
#                             dashboard's npm packages. No JAX venv, SDK, Go modules, torch,
#                             libtpu or test-only tools (clang, chromium, promtool, buildah,
#                             curl, libFuzzer); a later run without --demo adds them.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mode=full
case "${1:-}" in
  "") ;;
  --demo) mode=demo ;;
  *) echo "usage: scripts/setup.sh [--demo]" >&2; exit 2 ;;
esac

# What the build and the demo need. GoogleTest too: the demo builds only its binaries, but in
# the same tree, configured as the tests configure it, so the test command builds the rest.
packages=(
  build-essential cmake ninja-build pkg-config ccache
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libspdlog-dev libc-ares-dev libssl-dev libgtest-dev googletest libsqlite3-dev
  libgloo-dev libcpp-httplib-dev
  python3 python3-pip
  fortunes
)
# Checkpoints: zstd, to read the chunks Orbax compresses (checkpoint/orbax_read.cc).
packages+=(libzstd-dev)
# Node.js: Debian's, unless a node with npm is already installed (the dashboard's bundler).
command -v npm >/dev/null 2>&1 || packages+=(nodejs npm)
# The token shards need numpy: the demo takes Debian's rather than the JAX venv's, unless a
# full set-up already made that venv.
shard_python="$root/.venv/bin/python"
if [ "$mode" = demo ] && ! "$shard_python" -c 'import numpy' 2>/dev/null; then
  packages+=(python3-numpy)
  shard_python=/usr/bin/python3
fi
if [ "$mode" = full ]; then
  # For the tests only: the venvs; clang (thread-safety build, sanitizers); chromium (the
  # dashboard's browser tests); curl (the shell tests' HTTP calls).
  packages+=(python3-venv clang chromium curl)
  # multihost (issue 18): buildah, to build and run the container image from scratch without
  # a registry (deploy/container/build_image.sh, container_test).
  packages+=(buildah)
  # sdk (issue 17): promtool, from Debian's prometheus package (no separate promtool package
  # in Debian 12), checks a live /metrics in sdk_promtool_test. Where systemd runs, the
  # package also enables a Prometheus server on :9090 (`systemctl disable --now prometheus`
  # stops it).
  packages+=(prometheus)
  # fuzz (issue 16): libFuzzer's runtime for Debian's clang 14 (fuzz/, scripts/fuzz.sh).
  packages+=(libclang-rt-14-dev)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: Debian packages present"
fi

# The demo needs the header and the plugin, not the JAX venv (its bundle is committed).
skip_jax="${MESHRUN_SKIP_JAX:-0}"
[ "$mode" = full ] || skip_jax=1
MESHRUN_SKIP_JAX="$skip_jax" PYTHON="${PYTHON:-/usr/bin/python3}" bash "$root/scripts/fetch_pjrt.sh"
# libtpu, to compile for TPU topologies on this host (meshrun compile, the tpu tests): about
# 400 MB downloaded once into ~/.cache/meshrun. The demo skips it.
if [ "$mode" = full ] && [ "${MESHRUN_SKIP_LIBTPU:-0}" != 1 ]; then
  PYTHON="${PYTHON:-/usr/bin/python3}" bash "$root/scripts/fetch_libtpu.sh"
fi
"$shard_python" "$root/examples/make_token_shards.py" --out="$root/.data/fortunes"

# The dashboard's npm packages (uPlot, esbuild, playwright-core), reinstalled only when
# package-lock.json changed. The build bundles them (web/CMakeLists.txt).
stamp="$root/web/node_modules/.meshrun-lock.sha256"
lock_sum="$(sha256sum "$root/web/package-lock.json" | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$lock_sum" ]; then
  echo "setup: npm ci in web/"
  (cd "$root/web" && npm ci --no-audit --no-fund --loglevel=error)
  echo "$lock_sum" >"$stamp"
else
  echo "setup: web/node_modules present"
fi
if [ "$mode" = demo ]; then
  echo "setup: done (the demo's part; without --demo it adds what the tests need)"
  exit 0
fi
# multihost (issue 18): the Go modules of the GKE manifest check (deploy/gke/check, go.sum
# committed), fetched once so its test runs offline. Needs Go >= 1.22 (Debian 12's golang-go
# is 1.19): uses `go` on PATH or /usr/local/go; without one the deploy_manifests_test skips.
go_bin="$(command -v go || true)"
if [ -z "$go_bin" ] && [ -x /usr/local/go/bin/go ]; then go_bin=/usr/local/go/bin/go; fi
if [ -n "$go_bin" ] && "$go_bin" version | grep -Eq 'go1\.(2[2-9]|[3-9][0-9])'; then
  (cd "$root/deploy/gke/check" && GOTOOLCHAIN=local GOFLAGS=-mod=readonly "$go_bin" mod download)
  echo "setup: Go modules of deploy/gke/check present"
else
  echo "setup: no Go >= 1.22; deploy_manifests_test will be skipped"
fi
# --- sdk (issue 17): the meshrun Python SDK (python/) in .venv, reinstalled when it changes.
bash "$root/scripts/install_sdk.sh"
# --- torch (issue 26): pinned torch + torchax in a second venv, .venv-torch, for meshrun.torch
# and its tests (scripts/install_torch.sh: why a second venv; about 4.1 GB downloaded once into
# ~/.cache/meshrun, a rerun downloads nothing), with the SDK. MESHRUN_SKIP_TORCH=1 skips it.
bash "$root/scripts/install_torch.sh"
if [ "${MESHRUN_SKIP_TORCH:-0}" != 1 ]; then
  MESHRUN_VENV="$root/.venv-torch" bash "$root/scripts/install_sdk.sh"
fi
echo "setup: done"
