#!/usr/bin/env bash
# The GKE manifests (deploy/gke/*.yaml) decode strictly into the official API types
# (deploy/gke/check: k8s.io/api and sigs.k8s.io/jobset, go.sum committed), offline once
# scripts/setup.sh fetched the modules; and a misspelled field in a copy is refused, naming it.
# What the pods run is checked against the built binaries (deploy/gke/check/args.go): every
# flag of a meshrun command line (container and exec probe) is one its binary's --helpfull
# lists, no server listens beyond loopback without --tls_cert/--tls_key/--tls_ca (it would
# refuse to start), no kubelet gRPC probe targets a TLS server, every $(VAR) is defined, every
# certificate, token and state path lies in a volume mount. Copies with one such fault each
# (a stale flag, a plaintext wildcard listen, ...) are refused, naming it.
# Usage: deploy_manifests_test.sh <source directory> <directory of the binaries>
# Exits 77 (skipped) when no Go toolchain >= 1.22 is installed.
set -euo pipefail
src=$1
bin=$2
source "$src/tests/cluster_lib.sh"
PATH="$PATH:/usr/local/go/bin"
command -v go >/dev/null || { echo "SKIP: no Go toolchain >= 1.22 (see scripts/setup.sh)"; exit 77; }
go version | grep -Eq 'go1\.(2[2-9]|[3-9][0-9])' || { echo "SKIP: $(go version) is older than 1.22"; exit 77; }
for b in meshrun meshrun-coordinator meshrun-worker; do
  [ -x "$bin/$b" ] || fail "$bin/$b absent: build it (ninja -C build $b)"
done
export GOPROXY=off GOFLAGS=-mod=readonly GOTOOLCHAIN=local
cd "$src/deploy/gke/check"
go build -o "$tmp/check" . >"$tmp/build.log" 2>&1 \
  || fail "building the check (run scripts/setup.sh to fetch its modules): $(cat "$tmp/build.log")"
"$tmp/check" -flags "$bin" "$src/deploy/gke" >"$tmp/ok.txt" 2>&1 || fail "manifests: $(cat "$tmp/ok.txt")"
cat "$tmp/ok.txt"
grep -q "jobset-v6e-8.yaml: 1 documents" "$tmp/ok.txt" || fail "v6e-8 JobSet not checked"
grep -q "jobset-v6e-16.yaml: 1 documents" "$tmp/ok.txt" || fail "v6e-16 JobSet not checked"
# A container and its two exec probes each, in every pod template.
for f in coordinator jobset-v6e-8 jobset-v6e-16; do
  grep -q "$f.yaml: 3 meshrun command lines" "$tmp/ok.txt" || fail "$f: not every command line checked"
done
# refused FILE SED-EXPRESSION PATTERN: the manifest changed by the expression fails the check
# with a message matching the pattern.
n=0
refused() {
  n=$((n + 1))
  sed "$2" "$src/deploy/gke/$1" >"$tmp/bad$n.yaml"
  cmp -s "$tmp/bad$n.yaml" "$src/deploy/gke/$1" && fail "'$2' changes nothing in $1"
  if "$tmp/check" -flags "$bin" "$tmp/bad$n.yaml" >"$tmp/bad$n.txt" 2>&1; then
    fail "$1 with '$2' was accepted"
  fi
  grep -q -- "$3" "$tmp/bad$n.txt" || fail "$1 with '$2': unclear refusal: $(cat "$tmp/bad$n.txt")"
  echo "refused as it should: $1 with '$2': $(cat "$tmp/bad$n.txt")"
}
# The schema is strict: one misspelled field (nodeSelector -> nodeSelecter) fails.
refused jobset-v6e-8.yaml 's/nodeSelector:/nodeSelecter:/' 'unknown field.*nodeSelecter'
# A stale or misspelled flag, in a container and in a probe.
refused coordinator.yaml 's/--hang_timeout=/--hang_timout=/' 'meshrun-coordinator has no flag --hang_timout'
refused jobset-v6e-16.yaml 's/"--timeout=4s"/"--deadline=4s"/' 'meshrun has no flag --deadline'
# The wildcard listen without TLS (secure by default refuses it), or with --insecure.
refused coordinator.yaml '/- --tls_/d' 'listen=\[::\]:7070 in plaintext'
refused jobset-v6e-8.yaml 's/- --tls_ca=.*/- --insecure/' 'insecure'
# Kubelet's gRPC probe speaks plaintext to a TLS-only server.
refused coordinator.yaml \
  '/readinessProbe:/,/periodSeconds/{/exec:/,/"health"/d};/readinessProbe:/a\            grpc: {port: 7070}' \
  'gRPC probes are plaintext'
# An undefined $(VAR), and a certificate or tokens path outside every mount.
refused jobset-v6e-8.yaml 's/$(MESHRUN_HOST).key/$(MESHRUN_HOSTNAME).key/' 'uses $(MESHRUN_HOSTNAME)'
refused coordinator.yaml 's#/etc/meshrun/tokens/tokens#/etc/meshrun/token/tokens#' 'lies in no volume mount'
echo "deploy_manifests_test: all checks passed"
