#!/usr/bin/env bash
# Installs everything meshrun needs on Debian 12, idempotently and without questions:
# Debian packages (compilers, gRPC, protobuf, abseil, spdlog, GoogleTest, ...), then the PJRT
# header, XLA's CPU plugin and the project's Python environment (scripts/fetch_pjrt.sh), then the
# main job's token shards from the fortunes package's text (.data/fortunes, docs/data.md).
# A second run installs nothing, downloads nothing and rewrites no shard.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

packages=(
  build-essential cmake ninja-build pkg-config ccache clang
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libspdlog-dev libc-ares-dev libssl-dev libgtest-dev googletest libsqlite3-dev
  libgloo-dev
  python3 python3-venv python3-pip
  fortunes
)
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

PYTHON="${PYTHON:-/usr/bin/python3}" bash "$root/scripts/fetch_pjrt.sh"
"$root/.venv/bin/python" "$root/examples/make_token_shards.py" --out="$root/.data/fortunes"
echo "setup: done"
