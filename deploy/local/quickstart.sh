#!/usr/bin/env bash
# The newcomer's first command: installs the dependencies, builds pipetrain, and runs
# the main job that exists today: the pipeline plan of examples/tiny-gpt.json (4
# stages, 1F1B), then the same small GPT trained for real on the King James Bible on
# this machine (`pipetrain train-local`, the single-process reference the pipeline is
# held to) and scored on held-out text. Once the coordinator lands, this starts a
# local cluster and trains the job through it instead.
set -euo pipefail
cd "$(dirname "$0")/../.."

bash deploy/install-deps.sh
jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$jobs" --target pipetrain pipetrain-coordinator pipetrain-stage pipetrain-bench

# The corpus: the whole King James Bible from Debian's bible-kjv (4.4 MB of text); the
# last 200 kB are held out for evaluation.
if [ ! -s build/kjv.txt ]; then
  bible -f 'gen1:1-rev22:21' > build/kjv.txt
fi
head -c -200000 build/kjv.txt > build/kjv-train.txt
tail -c 200000 build/kjv.txt > build/kjv-heldout.txt

model='{"vocab_size":256,"seq_len":64,"d_model":128,"n_heads":4,"n_layers":4}'
echo
echo "== The plan: examples/tiny-gpt.json on 4 stages (costs for a CPU: 20 GFLOP/s, 1 GB/s links)"
build/bin/pipetrain plan examples/tiny-gpt.json --device-flops 0.02 --link-gbps 1 | head -20
echo
echo "== Training it on this machine (300 steps of 16 x 64 tokens)"
build/bin/pipetrain train-local --model "$model" --text build/kjv-train.txt --steps 300 \
  --batch 16 --lr 3e-3 --seed 1 --threads "$jobs" --save build/tiny-gpt.safetensors \
  | awk 'NR == 1 || /^step +[0-9]+\/300/ && ($2 ~ /^(1|25|50|100|150|200|250|300)\//) || /^done/'
echo
echo "== Held-out loss (random bytes would score ln 256 = 5.545)"
build/bin/pipetrain eval --checkpoint build/tiny-gpt.safetensors --text build/kjv-heldout.txt --batch 64
echo
echo "Checkpoint: build/tiny-gpt.safetensors (Hugging Face GPT-2 names). Next: build/bin/pipetrain --help"
