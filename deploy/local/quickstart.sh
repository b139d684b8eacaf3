#!/usr/bin/env bash
# The newcomer's first command: installs dependencies, builds pipetrain and shows what
# was built. (Once the coordinator lands, this starts a local cluster and trains a
# small GPT on the King James Bible.)
set -euo pipefail
cd "$(dirname "$0")/../.."

bash deploy/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)"
echo
for b in pipetrain pipetrain-coordinator pipetrain-stage pipetrain-bench; do
  build/bin/$b --version
done
echo
echo "Built into build/bin/. Next: build/bin/pipetrain --help"
