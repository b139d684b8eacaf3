#!/usr/bin/env bash
# Sets up and runs the whole test suite: installs dependencies, configures, builds on
# every core and runs CTest without the `gpu` label, printing output on failure, then
# every fuzz target for a bounded time (tests/fuzz/run.sh, in build-fuzz; seconds per
# target from $PIPETRAIN_FUZZ_SECONDS). GPU tests run with bench/gpu.sh on a machine
# that has one; the sanitizer build of the suite is tests/sanitize.sh (too slow for CI).
set -euo pipefail
cd "$(dirname "$0")/.."

bash deploy/install-deps.sh
jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$jobs"
(cd build && ctest -LE gpu --output-on-failure -j "$jobs" --timeout 600)
bash tests/fuzz/run.sh
