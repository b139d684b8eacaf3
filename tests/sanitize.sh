#!/usr/bin/env bash
# The unit and integration tests built with AddressSanitizer and UndefinedBehaviorSanitizer
# (gcc, in build-sanitize) and run there: a check to run before a submission, too slow
# for CI on 2 cores (the whole suite instrumented). Any sanitizer report fails its test.
#
#   tests/sanitize.sh                 every test but the `gpu` and `browser` labels (ctest)
#   tests/sanitize.sh --only REGEX    only the test binaries whose names match REGEX
#                                     (e.g. 'safetensors|job_spec'), each run directly
# PIPETRAIN_SANITIZE_JOBS sets the build's and ctest's parallelism (default nproc).
set -euo pipefail
cd "$(dirname "$0")/.."

jobs=${PIPETRAIN_SANITIZE_JOBS:-$(nproc)}
flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPIPETRAIN_WITH_CUDA=OFF \
  -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" "${launcher[@]}" >/dev/null

only=""
if [ $# -gt 0 ]; then
  if [ "$1" != --only ] || [ $# -ne 2 ]; then
    echo "usage: tests/sanitize.sh [--only REGEX]" >&2
    exit 2
  fi
  only=$2
fi

# halt_on_error: a report fails the test at once. Leaks count (detect_leaks).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:halt_on_error=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

if [ -z "$only" ]; then
  cmake --build build-sanitize -j "$jobs"
  cd build-sanitize
  exec ctest -LE "gpu|browser" --output-on-failure -j "$jobs" --timeout 1200
fi

mapfile -t tests < <(find tests -name CMakeLists.txt -not -path 'tests/fuzz/*' -print0 |
  xargs -0 sed -n 's/^ *pipetrain_\(binaries_\)\{0,1\}test(\([a-z0-9_]*\) .*/\2/p' |
  grep -E "$only" || true)
if [ ${#tests[@]} -eq 0 ]; then
  echo "sanitize: no test binary in tests/**/CMakeLists.txt matches '$only'" >&2
  exit 2
fi
# A test that starts the real binaries depends on them (add_dependencies), so they build too.
cmake --build build-sanitize -j "$jobs" --target "${tests[@]}"
failed=()
cd build-sanitize/tests
for t in "${tests[@]}"; do
  echo "sanitize: $t"
  if ! "../bin/$t"; then failed+=("$t"); fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "sanitize: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "sanitize: ${#tests[@]} test binaries clean: ${tests[*]}"
