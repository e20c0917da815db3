#!/usr/bin/env bash
# Configures and builds one build tree. Usage: build.sh <dir> [cmake args...] [-- targets...]
# Without targets it builds them all; the demo names only the binaries and dashboard it runs.
# ccache keys on paths relative to the checkout and ignores the build directory's own path
# (CCACHE_NOHASHDIR: with -g it is hashed by default), so fresh clones and worktrees reuse
# earlier builds; their debug info then names the first checkout's source paths.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="$1"; shift
cmake_args=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do cmake_args+=("$1"); shift; done
[ $# -eq 0 ] || shift   # the "--"; what follows are ninja targets
export CCACHE_BASEDIR="$root"
export CCACHE_NOHASHDIR=1
export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-5G}"
cmake -S "$root" -B "$root/$dir" -G Ninja ${cmake_args[@]+"${cmake_args[@]}"} >/dev/null
echo "build: $dir${*:+ ($*)}"
ninja -C "$root/$dir" -j"$(nproc)" "$@"
