#!/usr/bin/env bash
# deploy/slurm/pipetrain.sbatch, unchanged, on a real Slurm (tests/slurm/slurm_cluster.sh:
# Debian's Slurm, one node with GRES gpu:4 on stand-in devices, stages on the cpu device):
# a 4-stage job asked for as `sbatch --nodes=1 --gpus-per-node=4` trains and gives the
# per-step losses of the same job on one stage (`--gpus-per-node=1`), bit for bit; the
# Slurm job's exit code is the pipetrain job's (0 when it succeeded, non-zero when it
# failed); no process of a job is left after it ends.
#
#   bash tests/slurm/sbatch_test.sh BIN_DIR       (as root; exits 77, skipped, elsewhere)
set -euo pipefail

bin=$(cd "$1" && pwd)
repo=$(cd "$(dirname "$0")/../.." && pwd)
if [ "$(id -u)" != 0 ]; then echo "SKIP: needs root (slurmd runs the job's tasks)"; exit 77; fi
for tool in munged slurmctld slurmd sbatch squeue; do
  if ! command -v "$tool" >/dev/null; then
    echo "SKIP: $tool is not installed (deploy/install-deps.sh installs Slurm and munge)"; exit 77
  fi
done
# shellcheck source=tests/slurm/slurm_cluster.sh
source "$repo/tests/slurm/slurm_cluster.sh"

dir=$(mktemp -d /tmp/pipetrain-slurm-test.XXXXXX)
chmod 755 "$dir"  # munged checks every folder above its socket
failed=0
# shellcheck disable=SC2317  # called by the EXIT trap
finish() {
  # An sbatch -W still waiting (a failure mid-run) would hold ctest's pipe open.
  pkill -TERM -f -- "--output=$dir/" 2>/dev/null || true
  slurm_down "$dir/slurm"
  if [ "$failed" != 0 ]; then slurm_print_logs "$dir/slurm"; fi
  rm -rf "$dir"
}
trap finish EXIT
fail() { echo "FAIL: $*" >&2; failed=1; exit 1; }

slurm_up "$dir/slurm" || fail "the Slurm cluster did not start"
# A corpus and a small job in a folder every node sees (one node: this one).
python3 - "$dir/corpus.txt" <<'PY'
import random, sys
random.seed(7)
words = "the of and to in that is was he for it with as his on be at by i this had not".split()
open(sys.argv[1], "w").write(" ".join(random.choice(words) for _ in range(20000)))
PY
cat > "$dir/job.json" <<JSON
{"name": "slurm-test",
 "model": {"vocab_size": 256, "seq_len": 16, "d_model": 32, "n_heads": 2, "n_layers": 4},
 "pipeline": {"stages": 1, "micro_batches": 4, "schedule": "1f1b"},
 "training": {"steps": 4, "batch_size": 8, "seed": 7, "lr": 0.01},
 "data": {"corpus": "$dir/corpus.txt"},
 "checkpoint": {"every_steps": 2}}
JSON

# The losses of the steps in submit's JSON events in file $1, one a line.
losses_in() {
  [ -f "$1" ] || return 0
  grep '^{' "$1" | python3 -c '
import json, sys
for line in sys.stdin:
    step = json.loads(line).get("step") or {}
    if "loss" in step: print(repr(step["loss"]))' || true
}

# Runs the job under sbatch -W; prints its losses. $1: a name for this run, $2: GPUs per
# node, the rest: submit flags. The Slurm job's exit code goes to $dir/NAME.code, its
# output to $dir/NAME.out.
run() {
  local name=$1 gpus=$2 out code=0
  shift 2
  out=$dir/$name.out
  (cd "$dir" && PIPETRAIN_BIN=$bin PIPETRAIN_STAGE_DEVICE=cpu PIPETRAIN_PORT=$(slurm_free_port) \
    PIPETRAIN_STAGE_PORT=$STAGE_PORT sbatch -W --quiet --nodes=1 --gpus-per-node="$gpus" \
    --output="$out" --error="$out.err" "$repo/deploy/slurm/pipetrain.sbatch" job.json --json \
    "$@") || code=$?
  echo "$code" > "$dir/$name.code"
  losses_in "$out"
}
STAGE_PORT=$(slurm_free_port)

one=$(run one 1 --set pipeline.stages=1)
[ "$(cat "$dir/one.code")" = 0 ] || { cat "$dir"/one.out*; fail "the 1-stage job's sbatch exited $(cat "$dir/one.code")"; }
[ "$(echo "$one" | wc -l)" = 4 ] || { cat "$dir"/one.out*; fail "the 1-stage job reported no 4 losses: $one"; }
four=$(run four 4 --set pipeline.stages=4)
[ "$(cat "$dir/four.code")" = 0 ] || { cat "$dir"/four.out*; fail "the 4-stage job's sbatch exited $(cat "$dir/four.code")"; }
[ "$four" = "$one" ] || fail "4 stages' losses differ from 1 stage's: ${four//$'\n'/ } against ${one//$'\n'/ }"
echo "4 stages under Slurm give 1 stage's losses: ${one//$'\n'/ }"

# A job that fails (a corpus that is not there) fails the Slurm job.
run failing 1 --set pipeline.stages=1 --set data.corpus="$dir/nope.txt" > /dev/null
[ "$(cat "$dir/failing.code")" != 0 ] || fail "a failed pipetrain job ended its Slurm job with exit 0"
echo "a failed job exits $(cat "$dir/failing.code")"

# A stage killed mid-job (SIGKILL, as a crash): the other stages stay (each stage is its
# own step), its step starts it again, pipetrain recovers, and the losses are those of
# the uninterrupted run.
long=(--set training.steps=30 --set checkpoint.every_steps=10)
reference=$(run reference 1 --set pipeline.stages=1 "${long[@]}")
[ "$(echo "$reference" | wc -l)" = 30 ] || fail "the 30-step reference reported: $reference"
run killed 4 --set pipeline.stages=4 "${long[@]}" > "$dir/killed.losses" &
runner=$!
victim=""
for ((i = 0; i < 600; i++)); do  # 60 s
  if [ "$(losses_in "$dir/killed.out" | wc -l)" -ge 3 ]; then
    victim=$(pgrep -f -- "pipetrain-stage .*--listen 0.0.0.0:$((STAGE_PORT + 2))" | head -n 1)
    break
  fi
  sleep 0.1
done
[ -n "$victim" ] || { kill "$runner"; fail "the 4-stage job did not reach step 3 within 60 s"; }
kill -KILL "$victim"
wait "$runner"
[ "$(cat "$dir/killed.code")" = 0 ] || { cat "$dir"/killed.out*; fail "the job with a killed stage exited $(cat "$dir/killed.code")"; }
grep -q "starting it again" "$dir/killed.out.err" || fail "the killed stage was not started again"
[ "$(cat "$dir/killed.losses")" = "$reference" ] ||
  fail "a killed stage changed the losses: $(paste -d' ' "$dir/killed.losses" - <<< "$reference" | head -40)"
echo "a stage killed at step 3 recovered: the 30 losses of the uninterrupted run"

# Nothing the jobs started is left: ours have the test's folder (the coordinator's state)
# or stage ports in their command lines (other tests may run servers from $bin too).
ports="$STAGE_PORT|$((STAGE_PORT + 1))|$((STAGE_PORT + 2))|$((STAGE_PORT + 3))"
left=$(pgrep -f -- "pipetrain-(stage|coordinator) .*($dir/|0\.0\.0\.0:($ports)( |\$))" || true)
[ -z "$left" ] || fail "processes left after the jobs: $(ps -o pid,args -p "$left" 2>/dev/null)"
echo "PASS"
