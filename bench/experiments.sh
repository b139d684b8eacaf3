#!/usr/bin/env bash
# Reproduces every figure of docs/EXPERIMENTS.md: GPipe's two experiments (stages vs the
# largest model that trains, stages vs speed) and where a stage's time goes, measured
# and predicted, on the quickstart's model. Run from anywhere:
#
#   bash bench/experiments.sh                 # everything (about 15 minutes on 2 cores)
#   ONLY=quickstart bash bench/experiments.sh # one part: model-size, replicas, scaling,
#                                             # quickstart, precision
#
# Installs the dependencies (gnuplot-nox among them; SKIP_DEPS=1 skips that), builds,
# writes the raw figures (JSON, tables, traces) to build/experiments/ and the plots to
# docs/images/, and prints each benchmark's summary as it goes. Every run starts its own
# processes on 127.0.0.1 and stops them.
set -euo pipefail
cd "$(dirname "$0")/.."

data=${EXPERIMENTS_DIR:-build/experiments}
images=docs/images
only=${ONLY:-all}
case "$only" in all|model-size|replicas|scaling|quickstart|precision) ;; *)
  echo "experiments.sh: ONLY must be all, model-size, replicas, scaling, quickstart or precision (got '$only')" >&2
  exit 2 ;;
esac
wanted() { [ "$only" = all ] || [ "$only" = "$1" ]; }
say() { printf '\n== %s\n' "$*"; }

[ "${SKIP_DEPS:-0}" = 1 ] || bash deploy/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" --target pipetrain pipetrain-coordinator pipetrain-stage \
  pipetrain-bench
mkdir -p "$data" "$images"
bin=build/bin
job_of() { grep -oE 'job-[0-9]+' "$1" | head -1; }  # the job id a submit printed
plot() {  # plot SCRIPT DATA OUT TITLE (no apostrophe: gnuplot reads it in quotes)
  gnuplot -e "data='$2'; out='$3'; title_text='$4'" "bench/plots/$1"
  echo "wrote $3"
}

if wanted model-size; then
  say "1. Stages vs model size (real stage servers, each under the same --memory-limit)"
  PIPETRAIN_BENCH_DATA_OUT="$data/model_size.dat" "$bin/pipetrain-bench" model-size |
    tee "$data/model_size.txt"
  plot model_size.gp "$data/model_size.dat" "$images/model_size.png" \
    "Largest GPT that trains, K stages of the same memory"
fi

if wanted replicas; then
  say "1b. Copies vs model size (R copies of one stage splitting the optimizer, same --memory-limit)"
  PIPETRAIN_BENCH_MODEL_SIZE_FAMILIES=depth PIPETRAIN_BENCH_DATA_OUT="$data/model_size_replicas.dat" \
    "$bin/pipetrain-bench" model-size --replicas 1,2,4 | tee "$data/model_size_replicas.txt"
  gnuplot -e "data='$data/model_size_replicas.dat'; out='$images/model_size_replicas.png'; \
title_text='Copies vs model size: R copies of one stage, 128 MiB each, optimizer split'; \
letter='R'; xname='copies R of one stage (optimizer split among them)'; families='depth'" \
    bench/plots/model_size.gp
  echo "wrote $images/model_size_replicas.png"
fi

if wanted scaling; then
  say "2. Stages vs speed (emulated devices, real stage processes and links)"
  PIPETRAIN_BENCH_DATA_OUT="$data/scaling.dat" "$bin/pipetrain-bench" scaling |
    tee "$data/scaling.txt"
  python3 bench/plots/experiment_data.py scaling "$data/scaling.dat" "$data/scaling_lines.dat"
  plot scaling.gp "$data/scaling_lines.dat" "$images/scaling.png" \
    "Speedup over one stage at the same M (emulated devices)"
fi

if wanted quickstart; then
  say "3. The quickstart's model on 4 CPU stages: where the time goes, measured and predicted"
  [ -s build/kjv.txt ] || bible -f 'gen1:1-rev22:21' > build/kjv.txt
  run_dir=build/experiments-cluster
  deploy/local/cluster.sh down --run-dir "$run_dir" >/dev/null 2>&1 || true
  rm -rf "$run_dir/state"
  deploy/local/cluster.sh up --stages 4 --port 0 --run-dir "$run_dir"
  trap 'deploy/local/cluster.sh down --run-dir "$run_dir"' EXIT
  export PIPETRAIN_ADDRESS
  PIPETRAIN_ADDRESS=$(cat "$run_dir/address")
  # The time breakdown of the same model under three schedules; the 1F1B job's measured
  # costs predict the other two before they run (`plan --costs-from`).
  triples=()
  for schedule in 1f1b gpipe zb-h1; do
    if [ "$schedule" != 1f1b ]; then
      "$bin/pipetrain" plan examples/tiny-gpt.json --costs-from "$id_1f1b" \
        --schedule "$schedule" --json > "$data/whatif_$schedule.json"
    fi
    "$bin/pipetrain" submit examples/tiny-gpt.json --set "pipeline.schedule=$schedule" \
      --set training.steps=40 --set data.validate_every_steps=0 --set checkpoint.every_steps=0 \
      > "$data/submit_$schedule.txt"
    id=$(job_of "$data/submit_$schedule.txt")
    [ "$schedule" != 1f1b ] || id_1f1b=$id
    "$bin/pipetrain" timeline "$id" --breakdown --steps 20 | tee "$data/breakdown_$schedule.txt"
    "$bin/pipetrain" timeline "$id" --breakdown --steps 20 --json > "$data/breakdown_$schedule.json"
    "$bin/pipetrain" status "$id" --json > "$data/status_$schedule.json"
    if [ "$schedule" != 1f1b ]; then
      triples+=("$schedule=$data/whatif_$schedule.json,$data/breakdown_$schedule.json,$data/status_$schedule.json")
    fi
  done
  echo "predicted from the 1F1B job's costs, against each schedule's own run:"
  python3 bench/plots/experiment_data.py whatif "$data/whatif.dat" "${triples[@]}"
  python3 bench/plots/experiment_data.py breakdown "$data/breakdown.dat" \
    "gpipe=$data/breakdown_gpipe.json" "1f1b=$data/breakdown_1f1b.json" \
    "zb-h1=$data/breakdown_zb-h1.json"
  plot breakdown.gp "$data/breakdown.dat" "$images/breakdown.png" \
    "Where the time of each stage goes (tiny-gpt, 4 CPU stages, M = 8, mean of 20 steps)"

  # The quickstart job itself: the bubble of every step against its fitted prediction,
  # and the last step's Gantt beside the prediction from the job's measured costs.
  "$bin/pipetrain" submit examples/tiny-gpt.json | tee "$data/quickstart.txt"
  id=$(job_of "$data/quickstart.txt")
  "$bin/pipetrain" status "$id" --json > "$data/quickstart_status.json"
  "$bin/pipetrain" timeline "$id" --out "$data/measured_trace.json" --steps 1
  "$bin/pipetrain" plan examples/tiny-gpt.json --costs-from "$id" \
    --trace "$data/predicted_trace.json" > "$data/quickstart_plan.txt"
  head -1 "$data/quickstart_plan.txt"
  python3 bench/plots/experiment_data.py gantt "$data/measured_trace.json" \
    "$data/predicted_trace.json" "$data/gantt.dat"
  plot gantt.gp "$data/gantt.dat" "$images/gantt.png" \
    "The last step of the quickstart job (1F1B, 4 CPU stages): measured, and predicted from its costs"
  python3 bench/plots/experiment_data.py bubble "$data/quickstart_status.json" "$data/bubble.dat"
  plot bubble.gp "$data/bubble.dat" "$images/bubble.png" \
    "The bubble of every step of the quickstart job: measured and predicted"
  # The target: within 0.05 on every step once the prediction is fitted (after step 5).
  awk '!/^#/ && $1 >= 5 && $3 != "NaN" { d = $2 - $3; if (d < 0) d = -d; n++; s += d;
         if (d > m) m = d; if (d > 0.05) over++ }
       END { printf "fitted vs measured bubble, steps 5-%d: mean |difference| %.3f, largest %.3f, %d of %d steps over 0.05\n", $1, s / n, m, over, n }' \
    "$data/bubble.dat" | tee "$data/bubble_agreement.txt"
fi
if wanted precision; then
  say "5. The quickstart job in fp32 and in bf16 (training.precision), on 4 CPU stages"
  [ -s build/kjv.txt ] || bible -f 'gen1:1-rev22:21' > build/kjv.txt
  run_dir=build/experiments-precision
  deploy/local/cluster.sh down --run-dir "$run_dir" >/dev/null 2>&1 || true
  rm -rf "$run_dir/state"
  deploy/local/cluster.sh up --stages 4 --port 0 --run-dir "$run_dir"
  (
    trap 'deploy/local/cluster.sh down --run-dir "$run_dir" >/dev/null' EXIT
    PIPETRAIN_ADDRESS=$(cat "$run_dir/address")
    export PIPETRAIN_ADDRESS
    for p in fp32 bf16; do
      "$bin/pipetrain" submit examples/tiny-gpt.json --set "training.precision=$p" \
        > "$data/precision_$p.txt"
      "$bin/pipetrain" status "$(job_of "$data/precision_$p.txt")" --json \
        > "$data/precision_$p.json"
    done
  )
  python3 bench/plots/experiment_data.py precision "$data/precision_fp32.json" \
    "$data/precision_bf16.json" "$data/precision.dat" | tee "$data/precision_summary.txt"
  plot precision.gp "$data/precision.dat" "$images/precision.png" \
    "The quickstart job (4 CPU stages, 300 steps) in fp32 and in bf16"
fi
say "done: figures in $images/, raw data in $data/"
