#!/usr/bin/env bash
# Runs deploy/slurm/pipetrain.sbatch for real on this machine, as a one-node allocation
# with two "GPUs": stand-ins for srun and scontrol start the tasks here, the stages use
# --device cpu (PIPETRAIN_STAGE_DEVICE), and a 4-step job on a tiny GPT is submitted.
# Checks that the script brings the cluster up, waits for both stages, submits, exits 0
# when the job succeeds, and leaves no server running.
#   slurm_local_test.sh ROOT BIN_DIR
# Exit 77 (skipped) where this host's name does not resolve (stages advertise it).
set -euo pipefail
root=$(cd "${1:?repository root}" && pwd)
bin=$(cd "${2:?folder of the built binaries}" && pwd)

if ! getent hosts "$(hostname)" >/dev/null; then
  echo "SKIP: this host's name $(hostname) does not resolve; the stages advertise it"
  exit 77
fi

tmp=$(mktemp -d)
cleanup() {
  local pid
  # Servers the script failed to stop: ours carry this test's folder or port in their
  # command line; stop them by pid and fail.
  for pid in $(pgrep -f -- "pipetrain-(coordinator|stage) .*($tmp|:$port( |\$))"); do
    echo "slurm_local_test: pid $pid still runs: $(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null)" >&2
    kill -KILL "$pid" 2>/dev/null || true
    leftover=1
  done
  rm -rf "$tmp"
}
leftover=0
port=$((20000 + RANDOM % 20000))
trap cleanup EXIT

# The stand-ins: srun runs --ntasks(-per-node) copies of the command here, each with its
# SLURM_LOCALID, and passes SIGTERM on to every process of each; scontrol knows one node, this one, at its name.
# (tests/slurm/sbatch_test.sh runs the script on a real Slurm, as root.)
mkdir -p "$tmp/slurm-bin"
cat > "$tmp/slurm-bin/srun" <<'EOF'
#!/usr/bin/env bash
tasks=1
while [[ $# -gt 0 && $1 == -* ]]; do
  case $1 in --ntasks=*|--ntasks-per-node=*) tasks=${1#*=} ;; esac
  shift
done
pids=()
# As slurmstepd does: each task in a process group of its own, a signal to all of it.
trap 'for p in "${pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null; done' TERM INT
for ((i = 0; i < tasks; i++)); do
  SLURM_LOCALID=$i SLURM_PROCID=$i setsid "$@" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do
  wait "$pid" || { s=$?; [ "$s" -gt 128 ] && wait "$pid"; status=1; }
done
exit "$status"
EOF
cat > "$tmp/slurm-bin/scontrol" <<'EOF'
#!/usr/bin/env bash
case "$1 $2" in
  "show hostnames") hostname ;;
  "show node") echo "NodeName=$3 NodeAddr=$3 State=IDLE" ;;
  *) exit 1 ;;
esac
EOF
chmod +x "$tmp/slurm-bin/srun" "$tmp/slurm-bin/scontrol"

for ((i = 0; i < 400; i++)); do echo "In the beginning was the word, and the word was pipelined."; done \
  > "$tmp/corpus.txt"
cat > "$tmp/job.json" <<EOF
{
  "name": "slurm_local_test",
  "model": {"vocab_size": 256, "seq_len": 16, "d_model": 32, "n_heads": 2, "n_layers": 2},
  "pipeline": {"stages": 2, "micro_batches": 2, "schedule": "1f1b"},
  "training": {"steps": 4, "batch_size": 4, "seed": 1, "lr": 0.001},
  "data": {"corpus": "$tmp/corpus.txt"}
}
EOF

status=0
(
  cd "$tmp"
  PATH="$tmp/slurm-bin:$PATH" SLURM_JOB_ID=$$ SLURM_JOB_NUM_NODES=1 \
    SLURM_JOB_NODELIST=$(hostname) SLURM_GPUS_ON_NODE=2 SLURM_SUBMIT_DIR=$tmp \
    PIPETRAIN_BIN=$bin PIPETRAIN_STAGE_DEVICE=cpu PIPETRAIN_PORT=$port \
    PIPETRAIN_STAGE_PORT=$((port + 10)) PIPETRAIN_STATE_DIR=$tmp/state \
    timeout 300 bash "$root/deploy/slurm/pipetrain.sbatch" "$tmp/job.json" --set training.steps=3
) > "$tmp/out.log" 2>&1 || status=$?
cat "$tmp/out.log"
sleep 1  # the servers' last log lines
if [ "$status" -ne 0 ]; then
  echo "slurm_local_test: pipetrain.sbatch exited $status" >&2
  exit 1
fi
for want in "2 stages registered" "SUCCEEDED: 3 of 3 steps"; do
  if ! grep -q "$want" "$tmp/out.log"; then
    echo "slurm_local_test: no '$want' in its output" >&2
    exit 1
  fi
done
if [ ! -f "$tmp/state/jobs.db" ]; then
  echo "slurm_local_test: no job store in PIPETRAIN_STATE_DIR" >&2
  exit 1
fi
cleanup
trap - EXIT
if [ "$leftover" -ne 0 ]; then exit 1; fi
echo "slurm_local_test: OK"
