#!/usr/bin/env bash
# The deployment files' checks that run an outside tool (CTest label `deploy`); each exits
# 77, which CTest reports as skipped, with a message when its tool is missing.
#   deploy_check.sh shellcheck ROOT    every script in deploy/, tests/ and bench/
#   deploy_check.sh yamllint ROOT      the Kubernetes manifests (tests/deploy/yamllint.yaml)
#   deploy_check.sh systemd ROOT COORDINATOR_BIN STAGE_BIN
#                                      systemd-analyze verify on the units, their
#                                      /usr/local/bin binaries replaced by the built ones
#   deploy_check.sh kustomize ROOT     kubectl kustomize deploy/k8s, then the structural
#                                      checks of check_manifests.py on its output
set -euo pipefail

check=${1:?check name}
root=${2:?repository root}
cd "$root"

need() {  # need TOOL PACKAGE: skip unless TOOL is on PATH
  if ! command -v "$1" >/dev/null 2>&1; then
    echo "SKIP: $1 is not installed (Debian package $2; deploy/install-deps.sh installs it)"
    exit 77
  fi
}

case "$check" in
  shellcheck)
    need shellcheck shellcheck
    mapfile -t scripts < <(find deploy tests bench -type f \( -name '*.sh' -o -name '*.sbatch' \) | sort)
    echo "shellcheck on ${#scripts[@]} scripts: ${scripts[*]}"
    shellcheck --external-sources "${scripts[@]}"
    echo "shellcheck: OK"
    ;;
  yamllint)
    need yamllint yamllint
    yamllint --strict -c tests/deploy/yamllint.yaml deploy/k8s
    echo "yamllint deploy/k8s: OK"
    ;;
  systemd)
    need systemd-analyze systemd
    coordinator=${3:?coordinator binary} stage=${4:?stage binary}
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    # The units as installed, but running the binaries built here: systemd-analyze verify
    # checks that ExecStart's program exists and is executable.
    for unit in deploy/systemd/*.service; do
      sed -e "s#/usr/local/bin/pipetrain-coordinator#$coordinator#g" \
          -e "s#/usr/local/bin/pipetrain-stage#$stage#g" "$unit" > "$tmp/$(basename "$unit")"
    done
    if grep -n "/usr/local/bin/" "$tmp"/*.service; then
      echo "systemd: a unit runs a /usr/local/bin program this check does not know" >&2
      exit 1
    fi
    # The template is verified as instance 0; verify prints problems (unknown keys, bad
    # values) as warnings and still exits 0, so any line about our units fails the check.
    out=$(cd "$tmp" && systemd-analyze verify --man=no ./pipetrain-coordinator.service \
      ./pipetrain-stage@0.service 2>&1) && status=0 || status=$?
    [ -z "$out" ] || echo "$out"
    if [ "$status" -ne 0 ] || grep -q pipetrain <<<"$out"; then
      echo "systemd-analyze verify: FAILED" >&2
      exit 1
    fi
    echo "systemd-analyze verify pipetrain-coordinator.service pipetrain-stage@0.service: OK"
    ;;
  kustomize)
    if ! command -v kubectl >/dev/null 2>&1; then
      echo "SKIP: kubectl is not installed (not a Debian package: see https://kubernetes.io/docs/tasks/tools/)"
      exit 77
    fi
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    kubectl kustomize deploy/k8s > "$tmp/rendered.yaml"
    echo "kubectl kustomize deploy/k8s: $(grep -c '^kind:' "$tmp/rendered.yaml") objects"
    python3 tests/deploy/check_manifests.py --root . --rendered "$tmp/rendered.yaml"
    ;;
  *)
    echo "deploy_check.sh: unknown check '$check'" >&2
    exit 2
    ;;
esac
