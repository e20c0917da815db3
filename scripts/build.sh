#!/usr/bin/env bash
# Configures and builds one build tree. Usage: build.sh <dir> [cmake args...]
# ccache keys on paths relative to the checkout, so fresh clones reuse earlier builds.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="$1"; shift
export CCACHE_BASEDIR="$root"
export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-5G}"
cmake -S "$root" -B "$root/$dir" -G Ninja "$@" >/dev/null
echo "build: $dir"
ninja -C "$root/$dir" -j"$(nproc)"
