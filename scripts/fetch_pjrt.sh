#!/usr/bin/env bash
# Fetches the PJRT C API header and XLA's CPU PJRT plugin from a pinned
# registry wheel, and creates the project venv with the matching JAX.
#
#   ~/.cache/meshrun/downloads/<wheel>            cached download (sha256-checked)
#   .deps/pjrt/include/xla/pjrt/c/pjrt_c_api.h    PJRT C API header
#   .deps/pjrt/lib/xla_cpu_pjrt.so                XLA CPU PJRT plugin
#   .deps/pjrt/MANIFEST                           what was installed, with sha256s
#   .venv/                                        jax + jaxlib, tensorboard, orbax-checkpoint +
#                                                 tensorstore (skip: MESHRUN_SKIP_JAX=1)
#
# Idempotent and non-interactive: a second run downloads nothing and rewrites
# nothing. Needs python3 (with pip), sha256sum. See docs/pjrt.md.
set -euo pipefail

# ---- pins (change together; see docs/pjrt.md) ----
PLUGIN_PKG=xla-cpu-pjrt
PLUGIN_VERSION=0.0.1
PLUGIN_WHEEL=xla_cpu_pjrt-0.0.1-py3-none-manylinux_2_27_x86_64.whl
PLUGIN_WHEEL_SHA256=55837b6b7b47daa717f2d9a5a03563ea0ceaa338d06a81a1e2d3f060d960decc
WHEEL_HEADER=xla_plugins/xla_cpu_pjrt/include/pjrt_c_api.h
WHEEL_PLUGIN=xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so
EXPECTED_API="0.81"          # PJRT_API_MAJOR.PJRT_API_MINOR of the header
JAX_VERSION=0.8.1            # jaxlib 0.8.1 is built at PJRT C API 0.81 too

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
# Outside the checkout, so fresh clones on the same machine reuse the download.
CACHE="${MESHRUN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/meshrun}/downloads"
DEPS="$ROOT/.deps/pjrt"
VENV="$ROOT/.venv"

step() { echo "fetch_pjrt: $*"; }
die() { echo "fetch_pjrt: ERROR: $*" >&2; exit 1; }

command -v "$PYTHON" >/dev/null || die "$PYTHON not found"
command -v sha256sum >/dev/null || die "sha256sum not found"

# ---- 1. download the wheel once, verify its sha256 ----
mkdir -p "$CACHE"
rm -rf "$CACHE"/.tmp.*   # left by an interrupted run
wheel="$CACHE/$PLUGIN_WHEEL"
check_wheel() { echo "$PLUGIN_WHEEL_SHA256  $wheel" | sha256sum -c --status; }
if [[ -f "$wheel" ]] && check_wheel; then
  step "cached $PLUGIN_WHEEL (sha256 ok)"
else
  step "downloading $PLUGIN_PKG==$PLUGIN_VERSION"
  tmp="$(mktemp -d "$CACHE/.tmp.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  "$PYTHON" -m pip download --quiet --disable-pip-version-check --no-input \
    --no-deps --only-binary=:all: --dest "$tmp" "$PLUGIN_PKG==$PLUGIN_VERSION"
  [[ -f "$tmp/$PLUGIN_WHEEL" ]] || die "expected $PLUGIN_WHEEL, got: $(ls "$tmp")"
  echo "$PLUGIN_WHEEL_SHA256  $tmp/$PLUGIN_WHEEL" | sha256sum -c --quiet \
    || die "sha256 mismatch for $PLUGIN_WHEEL"
  mv "$tmp/$PLUGIN_WHEEL" "$wheel"
  rm -rf "$tmp"
  trap - EXIT
  step "downloaded $PLUGIN_WHEEL (sha256 ok)"
fi

# ---- 2. extract header and plugin (skipped when MANIFEST names this wheel) ----
header="$DEPS/include/xla/pjrt/c/pjrt_c_api.h"
plugin="$DEPS/lib/xla_cpu_pjrt.so"
manifest="$DEPS/MANIFEST"
if [[ -f "$manifest" && -f "$header" && -f "$plugin" ]] &&
   grep -qx "wheel_sha256=$PLUGIN_WHEEL_SHA256" "$manifest" &&
   (cd "$DEPS" && grep -E '^[0-9a-f]{64}  ' MANIFEST | sha256sum -c --status); then
  step "extracted files up to date in .deps/pjrt"
else
  step "extracting header and plugin into .deps/pjrt"
  rm -rf "$DEPS"
  mkdir -p "$(dirname "$header")" "$(dirname "$plugin")"
  "$PYTHON" - "$wheel" "$WHEEL_HEADER" "$header" "$WHEEL_PLUGIN" "$plugin" <<'EOF'
import shutil, sys, zipfile
wheel, *pairs = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    for member, dest in zip(pairs[0::2], pairs[1::2]):
        with z.open(member) as src, open(dest, "wb") as out:
            shutil.copyfileobj(src, out)
EOF
  chmod 0644 "$header"
  chmod 0755 "$plugin"
  major="$(sed -n 's/^#define PJRT_API_MAJOR \([0-9]*\).*/\1/p' "$header")"
  minor="$(sed -n 's/^#define PJRT_API_MINOR \([0-9]*\).*/\1/p' "$header")"
  [[ "$major.$minor" == "$EXPECTED_API" ]] ||
    die "header declares PJRT C API $major.$minor, expected $EXPECTED_API"
  {
    echo "package=$PLUGIN_PKG==$PLUGIN_VERSION"
    echo "wheel=$PLUGIN_WHEEL"
    echo "wheel_sha256=$PLUGIN_WHEEL_SHA256"
    echo "pjrt_c_api=$major.$minor"
    (cd "$DEPS" && sha256sum include/xla/pjrt/c/pjrt_c_api.h lib/xla_cpu_pjrt.so)
  } > "$manifest"
  step "header PJRT C API $major.$minor -> ${header#"$ROOT"/}"
  step "plugin -> ${plugin#"$ROOT"/}"
fi

# ---- 3. project venv with the matching JAX ----
if [[ "${MESHRUN_SKIP_JAX:-0}" == "1" ]]; then
  step "MESHRUN_SKIP_JAX=1: skipping .venv"
  exit 0
fi
jax_ok() {
  [[ -x "$VENV/bin/python" ]] && "$VENV/bin/python" - "$JAX_VERSION" <<'EOF' 2>/dev/null
import sys
from importlib.metadata import version
sys.exit(0 if version("jax") == version("jaxlib") == sys.argv[1] else 1)
EOF
}
if jax_ok; then
  step ".venv has jax==$JAX_VERSION jaxlib==$JAX_VERSION"
else
  step "creating .venv with jax==$JAX_VERSION jaxlib==$JAX_VERSION"
  [[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    --no-input --only-binary=:all: "jax==$JAX_VERSION" "jaxlib==$JAX_VERSION"
  jax_ok || die "jax/jaxlib $JAX_VERSION not importable from .venv"
  step ".venv ready"
fi
# TensorBoard's own event reader checks `meshrun export --format=tensorboard` in the tests.
TENSORBOARD_VERSION=2.21.0
tensorboard_ok() {
  "$VENV/bin/python" -c "import sys; from importlib.metadata import version; \
sys.exit(version('tensorboard') != sys.argv[1])" "$TENSORBOARD_VERSION" 2>/dev/null
}
if tensorboard_ok; then
  step ".venv has tensorboard==$TENSORBOARD_VERSION"
else
  step "installing tensorboard==$TENSORBOARD_VERSION into .venv"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    --no-input --only-binary=:all: "tensorboard==$TENSORBOARD_VERSION"
  tensorboard_ok || die "tensorboard $TENSORBOARD_VERSION not importable from .venv"
fi
# The JAX ecosystem's checkpoint readers check meshrun's checkpoints in the tests
# (docs/checkpoints.md); pinned together with JAX so pip never moves it.
ORBAX_VERSION=0.12.8
TENSORSTORE_VERSION=0.1.86
orbax_ok() {
  "$VENV/bin/python" - "$ORBAX_VERSION" "$TENSORSTORE_VERSION" <<'EOF' 2>/dev/null
import sys
from importlib.metadata import version
sys.exit(0 if (version("orbax-checkpoint"), version("tensorstore")) == tuple(sys.argv[1:]) else 1)
EOF
}
if orbax_ok; then
  step ".venv has orbax-checkpoint==$ORBAX_VERSION tensorstore==$TENSORSTORE_VERSION"
else
  step "installing orbax-checkpoint==$ORBAX_VERSION tensorstore==$TENSORSTORE_VERSION into .venv"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
    --only-binary=:all: "orbax-checkpoint==$ORBAX_VERSION" "tensorstore==$TENSORSTORE_VERSION" \
    "jax==$JAX_VERSION" "jaxlib==$JAX_VERSION"
  orbax_ok || die "orbax-checkpoint $ORBAX_VERSION not importable from .venv"
fi
step "done"
