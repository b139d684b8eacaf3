#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/, clang with ASan and UBSan, in build-fuzz)
# and runs each for a bounded time on a copy of its seed corpus (the checked-in corpus
# never grows here). Fails on any crash, leak, timeout, out-of-memory or sanitizer
# report, naming the target and the reproducer. CI runs it from tests/run.sh.
#
#   tests/fuzz/run.sh [SECONDS] [TARGET...]   SECONDS per target (default 20, or
#                                             $PIPETRAIN_FUZZ_SECONDS); all targets
#                                             unless some are named (e.g. schedule)
# Targets run $(nproc) at a time. gpt2_bpe runs only where the GPT-2 vocabulary is
# installed (deploy/install-deps.sh). Reproduce a failure with
#   build-fuzz/bin/NAME_fuzz REPRODUCER
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD

seconds=${1:-${PIPETRAIN_FUZZ_SECONDS:-20}}
# A fixed seed by default, so that a fresh checkout repeats what CI ran (set
# PIPETRAIN_FUZZ_SEED=0 for libFuzzer's own, time-based one when exploring).
seed=${PIPETRAIN_FUZZ_SEED:-1}
shift || true
targets=("$@")
build_targets=("${targets[@]/%/_fuzz}")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(frame job_spec schedule safetensors checkpoint token_file gpt2_bpe configure)
  build_targets=(pipetrain-fuzz)  # one make run: its targets build in parallel
fi

launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DPIPETRAIN_FUZZ=ON -DPIPETRAIN_WITH_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "${launcher[@]}" >/dev/null
cmake --build build-fuzz -j "$(nproc)" --target "${build_targets[@]}"

vocab=${PIPETRAIN_TOKENIZER_DIR:-/usr/local/share/pipetrain/gpt2}
runs=$root/build-fuzz/fuzz-runs
rm -rf "$runs"
mkdir -p "$runs"

# Runs one target; its log, corpus copy and artifacts go under $runs/NAME.
run_one() {
  local name=$1 dir=$runs/$1
  mkdir -p "$dir/corpus" "$dir/artifacts"
  cp -r "$root/tests/fuzz/corpus/$name/." "$dir/corpus/"
  # -timeout: one input taking longer is a hang; -rss_limit_mb: a hostile size that
  # is allocated is a bug too. UBSan already aborts (-fno-sanitize-recover).
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$root/build-fuzz/bin/${name}_fuzz" -max_total_time="$seconds" -rss_limit_mb=2048 \
      -seed="$seed" -timeout=10 -print_final_stats=1 -print_funcs=0 -artifact_prefix="$dir/artifacts/" "$dir/corpus" \
      >"$dir/log" 2>&1
}

declare -A pids=()
active=()
for name in "${targets[@]}"; do
  if [ "$name" = gpt2_bpe ] && { [ ! -r "$vocab/encoder.json" ] || [ ! -r "$vocab/vocab.bpe" ]; }; then
    echo "fuzz: skipping gpt2_bpe: no GPT-2 vocabulary in $vocab (deploy/install-deps.sh)"
    continue
  fi
  # At most $(nproc) at once.
  while [ "$(jobs -rp | wc -l)" -ge "$(nproc)" ]; do sleep 1; done
  echo "fuzz: $name for ${seconds}s"
  run_one "$name" &
  pids[$name]=$!
  active+=("$name")
done

failed=0
for name in "${active[@]}"; do
  if wait "${pids[$name]}"; then
    echo "fuzz: $name clean ($(grep -o 'stat::number_of_executed_units: [0-9]*' \
      "$runs/$name/log" | awk '{print $2}') runs)"
  else
    failed=1
    echo "fuzz: $name FAILED; log $runs/$name/log" >&2
    tail -n 40 "$runs/$name/log" >&2
    for f in "$runs/$name"/artifacts/*; do
      [ -e "$f" ] || continue
      echo "fuzz: $name reproducer: $f (run build-fuzz/bin/${name}_fuzz $f)" >&2
    done
  fi
done
exit "$failed"
