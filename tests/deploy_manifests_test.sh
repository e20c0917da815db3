#!/usr/bin/env bash
# The GKE manifests (deploy/gke/*.yaml) decode strictly into the official API types
# (deploy/gke/check: k8s.io/api and sigs.k8s.io/jobset, go.sum committed), offline once
# scripts/setup.sh fetched the modules; and a misspelled field in a copy is refused, naming it.
# Usage: deploy_manifests_test.sh <source directory>
# Exits 77 (skipped) when no Go toolchain >= 1.22 is installed.
set -euo pipefail
src=$1
bin=unused
source "$src/tests/cluster_lib.sh"
PATH="$PATH:/usr/local/go/bin"
command -v go >/dev/null || { echo "SKIP: no Go toolchain >= 1.22 (see scripts/setup.sh)"; exit 77; }
go version | grep -Eq 'go1\.(2[2-9]|[3-9][0-9])' || { echo "SKIP: $(go version) is older than 1.22"; exit 77; }
export GOPROXY=off GOFLAGS=-mod=readonly GOTOOLCHAIN=local
cd "$src/deploy/gke/check"
go build -o "$tmp/check" . >"$tmp/build.log" 2>&1 \
  || fail "building the check (run scripts/setup.sh to fetch its modules): $(cat "$tmp/build.log")"
"$tmp/check" "$src/deploy/gke" >"$tmp/ok.txt" 2>&1 || fail "manifests: $(cat "$tmp/ok.txt")"
cat "$tmp/ok.txt"
grep -q "jobset-v6e-8.yaml: 1 documents" "$tmp/ok.txt" || fail "v6e-8 JobSet not checked"
grep -q "jobset-v6e-16.yaml: 1 documents" "$tmp/ok.txt" || fail "v6e-16 JobSet not checked"
# The check is strict: one misspelled field (nodeSelector -> nodeSelecter) fails.
sed 's/nodeSelector:/nodeSelecter:/' "$src/deploy/gke/jobset-v6e-8.yaml" >"$tmp/typo.yaml"
if "$tmp/check" "$tmp/typo.yaml" >"$tmp/typo.txt" 2>&1; then fail "a misspelled field was accepted"; fi
grep -q 'unknown field.*nodeSelecter' "$tmp/typo.txt" || fail "the refusal does not name the field: $(cat "$tmp/typo.txt")"
echo "deploy_manifests_test: all checks passed"
