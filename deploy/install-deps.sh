#!/usr/bin/env bash
# Installs every Debian 12 package pipetrain needs to build, test and run. Idempotent
# and quiet: does nothing when all are present. Run as root (or with sudo available).
# The CUDA toolkit is not a Debian package here: the build uses /usr/local/cuda when
# it exists and builds without the CUDA backend otherwise.
#
#   --with-torch   also install Debian's PyTorch (python3-torch, CPU), needed only to
#                  regenerate the golden fixture (tests/testdata/make_gpt_fixture.py);
#                  the build and the test suite do not need it.
set -euo pipefail

with_torch=0
for arg in "$@"; do
  case "$arg" in
    --with-torch) with_torch=1 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "install-deps.sh: unknown option $arg (try --help)" >&2; exit 2 ;;
  esac
done

packages=(
  build-essential cmake pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libopenblas-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev
  libsqlite3-dev libcpp-httplib-dev
  iproute2    # `ip netns`: the multi-host test (tests/multihost) makes network namespaces
  openssl     # deploy/certs/make-dev-certs.sh (TLS certificates; the tests make theirs)
  bible-kjv   # the demo corpus (King James Bible, `bible` command)
)
if [ "$with_torch" -eq 1 ]; then
  packages+=(python3-torch)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

sudo=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then
    sudo=(sudo)
  else
    echo "install-deps.sh: missing packages ${missing[*]}; run this script as root" >&2
    exit 1
  fi
fi
echo "install-deps.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
