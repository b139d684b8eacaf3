#!/usr/bin/env bash
# Installs every Debian 12 package pipetrain needs to build, test and run. Idempotent
# and quiet: does nothing when all are present. Run as root (or with sudo available).
# The CUDA toolkit is not a Debian package here: the build uses /usr/local/cuda when
# it exists and builds without the CUDA backend otherwise.
set -euo pipefail

packages=(
  build-essential cmake pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libopenblas-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev
  libsqlite3-dev libcpp-httplib-dev
  bible-kjv   # the demo corpus (King James Bible, `bible` command)
)

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
