#!/usr/bin/env bash
# Configures and builds one build tree. Usage: build.sh <dir> [cmake args...]
# ccache keys on paths relative to the checkout and ignores the build directory's own path
# (CCACHE_NOHASHDIR: with -g it is hashed by default), so fresh clones and worktrees reuse
# earlier builds; their debug info then names the first checkout's source paths.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="$1"; shift
export CCACHE_BASEDIR="$root"
export CCACHE_NOHASHDIR=1
export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-5G}"
cmake -S "$root" -B "$root/$dir" -G Ninja "$@" >/dev/null
echo "build: $dir"
ninja -C "$root/$dir" -j"$(nproc)"
