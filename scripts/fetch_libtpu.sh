#!/usr/bin/env bash
# Fetches libtpu, pinned by version and sha256, for compiling to TPU topologies on any host
# (`meshrun compile`, the coordinator's --tpu_compiler_plugin) and for the `tpu` tests:
#
#   ~/.cache/meshrun/downloads/<wheel>   cached download (sha256-checked)
#   .deps/libtpu/<version>/libtpu.so     the plugin of each pinned version
#
# 0.0.30 is the libtpu our JAX pin (0.8.1) pairs with; 0.0.51, the newest, checks the C API's
# struct-size rules against a plugin built with a newer header. Idempotent: a second run
# downloads and rewrites nothing. Needs python3 with pip and sha256sum. See docs/pjrt.md.
set -euo pipefail

# version  wheel  sha256
PINS=(
  "0.0.30 libtpu-0.0.30-cp311-cp311-manylinux_2_31_x86_64.whl b1fc44915dad56c0ceb733311a4d4396b88dc9a1c7c01acd7617da90e7ec22f2"
  "0.0.51 libtpu-0.0.51-cp311-cp311-manylinux_2_31_x86_64.whl ba67ddbfdbac61c8da1fafc26cd51b93e9fe4d298016e2882eb986b1718cba34"
)

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
CACHE="${MESHRUN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/meshrun}/downloads"
step() { echo "fetch_libtpu: $*"; }
die() { echo "fetch_libtpu: ERROR: $*" >&2; exit 1; }

mkdir -p "$CACHE"
for pin in "${PINS[@]}"; do
  read -r version wheel sha256 <<<"$pin"
  dest="$ROOT/.deps/libtpu/$version"
  stamp="$dest/WHEEL_SHA256"
  if [[ -f "$dest/libtpu.so" && -f "$stamp" && "$(cat "$stamp")" == "$sha256" ]]; then
    step "libtpu $version up to date in .deps/libtpu/$version"
    continue
  fi
  cached="$CACHE/$wheel"
  if [[ -f "$cached" ]] && echo "$sha256  $cached" | sha256sum -c --status; then
    step "cached $wheel (sha256 ok)"
  else
    step "downloading libtpu==$version (about 200 MB)"
    tmp="$(mktemp -d "$CACHE/.tmp.XXXXXX")"
    "$PYTHON" -m pip download --quiet --disable-pip-version-check --no-input --no-deps \
      --only-binary=:all: --python-version 3.11 --platform manylinux_2_31_x86_64 \
      --dest "$tmp" "libtpu==$version" || { rm -rf "$tmp"; die "pip download libtpu==$version failed"; }
    [[ -f "$tmp/$wheel" ]] || { rm -rf "$tmp"; die "expected $wheel, got: $(ls "$tmp")"; }
    echo "$sha256  $tmp/$wheel" | sha256sum -c --quiet || { rm -rf "$tmp"; die "sha256 mismatch for $wheel"; }
    mv "$tmp/$wheel" "$cached"
    rm -rf "$tmp"
  fi
  rm -rf "$dest"
  mkdir -p "$dest"
  "$PYTHON" - "$cached" "$dest/libtpu.so" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("libtpu/libtpu.so") as src, open(sys.argv[2], "wb") as out:
    shutil.copyfileobj(src, out)
PY
  chmod 0755 "$dest/libtpu.so"
  echo "$sha256" > "$stamp"
  step "libtpu $version -> .deps/libtpu/$version/libtpu.so"
done
