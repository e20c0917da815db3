#!/usr/bin/env bash
# Builds the meshrun Python SDK (python/) as a wheel and an sdist, for machines without this
# checkout: `pip install meshrun-<version>-py3-none-any.whl`.
#
#   scripts/build_sdk.sh [out_dir]     default build/sdk; prints the two paths it wrote
#
# The wheel carries the gRPC stubs generated from proto/; the sdist carries the protos (under
# proto/ beside setup.py) and builds on its own. The wheel is built from the unpacked sdist, so a
# wheel here proves the sdist is complete. Both are built in a temporary copy of python/, so
# nothing (python/build/, *.egg-info) is left in the checkout. Uses .venv's setuptools and the
# pinned grpcio-tools (scripts/install_sdk.sh); MESHRUN_VENV=<dir> picks another venv.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$root/build/sdk}"
py="${MESHRUN_VENV:-$root/.venv}/bin/python"
die() { echo "build_sdk: $*" >&2; exit 1; }
[ -x "$py" ] || die "$py absent; run scripts/setup.sh (or scripts/install_sdk.sh)"

# The stubs carry the generator's version and the package's grpcio/protobuf floors follow from
# it, so build only with the grpcio-tools that pyproject.toml pins.
pin=$(sed -n 's/.*"grpcio-tools==\([0-9.]*\)".*/\1/p' "$root/python/pyproject.toml")
[ -n "$pin" ] || die "python/pyproject.toml pins no grpcio-tools==<version> in build-system"
have=$("$py" -c 'from importlib.metadata import version; print(version("grpcio-tools"))' \
  2>/dev/null || true)
[ "$have" = "$pin" ] || die "$(basename "$(dirname "$(dirname "$py")")") has grpcio-tools" \
  "'${have:-none}', python/pyproject.toml pins $pin; run scripts/install_sdk.sh (same MESHRUN_VENV)"

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
src="$stage/src"
mkdir -p "$src/proto/meshrun/v1" "$stage/sdist" "$stage/unpacked" "$stage/wheel"
cp "$root/python/pyproject.toml" "$root/python/setup.py" "$root/python/MANIFEST.in" "$src/"
tar -C "$root/python" --exclude=__pycache__ -cf - meshrun | tar -C "$src" -xf -
cp "$root"/proto/meshrun/v1/*.proto "$src/proto/meshrun/v1/"

# The PEP 517 hooks of setuptools itself: no extra build tool in .venv, no download.
build() {  # build <hook> <source dir> <out dir>
  (cd "$2" && "$py" -c 'import sys; from setuptools import build_meta as b
getattr(b, sys.argv[1])(sys.argv[2])' "$1" "$3") >"$stage/$1.log" 2>&1 ||
    { cat "$stage/$1.log" >&2; die "$1 failed (log above)"; }
}
build build_sdist "$src" "$stage/sdist"
sdist=$(ls "$stage"/sdist/meshrun-*.tar.gz)
tar -C "$stage/unpacked" -xzf "$sdist"
build build_wheel "$(ls -d "$stage"/unpacked/meshrun-*)" "$stage/wheel"
wheel=$(ls "$stage"/wheel/meshrun-*.whl)

# A wheel without its stubs would install and then fail at `import meshrun`.
"$py" - "$wheel" <<'EOF' || die "the wheel lacks the generated stubs"
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
sys.exit(not {"meshrun/v1/coordinator_pb2.py", "meshrun/v1/coordinator_pb2_grpc.py"} <= set(names))
EOF

mkdir -p "$out"
cp "$sdist" "$wheel" "$out/"
echo "$out/$(basename "$wheel")"
echo "$out/$(basename "$sdist")"
