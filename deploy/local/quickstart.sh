#!/usr/bin/env bash
# The newcomer's first command: installs the dependencies, builds pipetrain, starts a
# local cluster (a coordinator and 4 stage servers on 127.0.0.1), and trains
# examples/tiny-gpt.json through it: a small GPT on the King James Bible, 4 pipeline
# stages with the 1F1B schedule, followed to the end with a progress bar. Then it
# prints the loss curve and a sample of text from the trained model, writes the
# timeline of the last steps, and stops the cluster.
set -euo pipefail
cd "$(dirname "$0")/../.."

bash deploy/install-deps.sh
jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$jobs" --target pipetrain pipetrain-coordinator pipetrain-stage pipetrain-bench

# The corpus: the whole King James Bible from Debian's bible-kjv (4.4 MB of text). The
# job holds out its last 5% for the validation loss.
if [ ! -s build/kjv.txt ]; then
  bible -f 'gen1:1-rev22:21' > build/kjv.txt
fi

run_dir=build/quickstart-cluster
deploy/local/cluster.sh down --run-dir "$run_dir" >/dev/null 2>&1 || true
rm -rf "$run_dir/state"
deploy/local/cluster.sh up --stages 4 --port 0 --run-dir "$run_dir"
trap 'deploy/local/cluster.sh down --run-dir "$run_dir"' EXIT
export PIPETRAIN_ADDRESS
PIPETRAIN_ADDRESS=$(cat "$run_dir/address")

echo
echo "== The plan (costs for a CPU: 20 GFLOP/s, 1 GB/s links)"
build/bin/pipetrain plan examples/tiny-gpt.json --device-flops 0.02 --link-gbps 1 | head -12
echo
echo "== Training examples/tiny-gpt.json on the cluster"
build/bin/pipetrain submit examples/tiny-gpt.json
id=$(build/bin/pipetrain list | awk 'NR == 2 { print $1 }')
echo
echo "== Loss every 25 steps (random bytes would score ln 256 = 5.545)"
build/bin/pipetrain status "$id" --json | awk '
  /"step":/ { gsub(/[^0-9]/, "", $2); step = $2 }
  /^ *"loss":/ && step % 25 == 0 { sub(/,/, "", $2); printf "step %4d  loss %.3f\n", step, $2 }'
echo
echo "== A sample from the trained model (pipetrain generate, in-process on the cpu)"
# The job's final checkpoint folder (one file a stage and an index), which generate
# reads as one whole-model checkpoint.
checkpoint_dir=$(build/bin/pipetrain status "$id" --json |
  awk -F'"' '/"checkpoint_dir":/ && !seen { print $4; seen = 1 }')
build/bin/pipetrain generate --checkpoint "$checkpoint_dir" --prompt "And God said" \
  --tokens 120 --temperature 0.8 --top-k 20 --seed 1
build/bin/pipetrain timeline "$id" --out build/tiny-gpt-trace.json --steps 3
echo
echo "Job records stay in $run_dir/state (jobs.db) after the cluster stops; checkpoints in"
echo "$run_dir/state/checkpoints/$id/ (safetensors, Hugging Face GPT-2 names). The timeline"
echo "of the last steps is build/tiny-gpt-trace.json (open it in https://ui.perfetto.dev)."
echo "Next: docs/USAGE.md, or deploy/local/cluster.sh up and build/bin/pipetrain --help"
