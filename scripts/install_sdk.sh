#!/usr/bin/env bash
# Installs the meshrun Python SDK (python/) into the project venv, with what building it and
# its tests need (grpcio-tools generates the gRPC stubs from proto/ at build time; pytest;
# pandas for Client.export(as_dataframe=True)).
# Idempotent: reinstalls only when python/ or proto/ changed (stamp in .venv). Needs .venv
# (scripts/fetch_pjrt.sh). Used by scripts/setup.sh and the sdk tests.
# MESHRUN_VENV=<dir> installs into another venv instead: .venv-torch (scripts/install_torch.sh),
# which takes the build and test packages from .venv through its .pth file.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${MESHRUN_VENV:-$root/.venv}"
py="$venv/bin/python"
[ -x "$py" ] || { echo "install_sdk: $py absent; run scripts/setup.sh" >&2; exit 1; }
GRPCIO_TOOLS_VERSION=1.85.1   # = python/pyproject.toml build-system pin (sets the floors)
PYTEST_VERSION=9.2.0
PANDAS_VERSION=2.3.3
have() { "$py" -c "import sys; from importlib.metadata import version; \
sys.exit(version(sys.argv[1]) != sys.argv[2])" "$1" "$2" 2>/dev/null; }
if ! have grpcio-tools "$GRPCIO_TOOLS_VERSION" || ! have pytest "$PYTEST_VERSION" ||
   ! have pandas "$PANDAS_VERSION"; then
  echo "install_sdk: installing grpcio-tools==$GRPCIO_TOOLS_VERSION pytest==$PYTEST_VERSION" \
    "pandas==$PANDAS_VERSION"
  "$py" -m pip install --quiet --disable-pip-version-check --no-input --only-binary=:all: \
    "grpcio-tools==$GRPCIO_TOOLS_VERSION" "pytest==$PYTEST_VERSION" "pandas==$PANDAS_VERSION"
fi
stamp="$venv/.meshrun-sdk.sha256"
sum="$(cd "$root" && find python/meshrun python/setup.py python/pyproject.toml proto -type f \
  \( -name '*.py' -o -name '*.proto' -o -name '*.toml' \) -not -path '*/__pycache__/*' \
  | sort | xargs sha256sum | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$sum" ]; then
  # One build of python/ at a time: sdk_python_test and torch_test (ctest -j) install it into
  # .venv and .venv-torch from the same python/build directory.
  exec 9>"${TMPDIR:-/tmp}/meshrun-install-sdk-$(echo "$root" | sha256sum | cut -c1-12).lock"
  flock 9
  [ "$(cat "$stamp" 2>/dev/null)" != "$sum" ] || exit 0   # installed while this one waited
  echo "install_sdk: installing python/ (meshrun) into $(basename "$venv")"
  rm -rf "$root/python/build"
  "$py" -m pip install --quiet --disable-pip-version-check --no-input --no-build-isolation \
    --no-deps "$root/python"
  rm -rf "$root/python/build" "$root/python/meshrun.egg-info"
  echo "$sum" >"$stamp"
fi
