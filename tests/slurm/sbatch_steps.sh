#!/usr/bin/env bash
# shellcheck disable=SC2034,SC2154  # dir, repo, bin and failed are the test's
# The steps tests/slurm/sbatch_test.sh is made of: submitting deploy/slurm/pipetrain.sbatch
# to the test cluster (tests/slurm/slurm_cluster.sh) and checking what Slurm, the job's
# output and the nodes say afterwards. Expects $dir (the test's folder, every node sees
# it), $repo, $bin and $failed from the test. Every wait has a deadline.

fail() { echo "FAIL: $*" >&2; failed=1; exit 1; }

# A corpus and a small job in $1.
write_job() {
  python3 - "$1/corpus.txt" <<'PY'
import random, sys
random.seed(7)
words = "the of and to in that is was he for it with as his on be at by i this had not".split()
open(sys.argv[1], "w").write(" ".join(random.choice(words) for _ in range(20000)))
PY
  cat > "$1/job.json" <<JSON
{"name": "slurm-test",
 "model": {"vocab_size": 256, "seq_len": 16, "d_model": 32, "n_heads": 2, "n_layers": 4},
 "pipeline": {"stages": 1, "micro_batches": 4, "schedule": "1f1b"},
 "training": {"steps": 4, "batch_size": 8, "seed": 7, "lr": 0.01},
 "data": {"corpus": "$1/corpus.txt"},
 "checkpoint": {"every_steps": 2}}
JSON
}

# The loss of each step in the JSON events of file $1, one a line in step order; a step
# run again (after a restart from a checkpoint older than it) counts with its last loss.
losses_in() {
  [ -f "$1" ] || return 0
  grep '^{' "$1" | python3 -c '
import json, sys
losses = {}
for line in sys.stdin:
    step = json.loads(line).get("step") or {}
    if "loss" in step: losses[int(step["step"])] = step["loss"]
for s in sorted(losses): print(repr(losses[s]))' || true
}

# sbatch of the script from $dir: $1 a name for this job, then sbatch flags, --, submit
# flags. The Slurm job id goes to $dir/NAME.id, its output to $dir/NAME.out(.err).
# Waits for the job to end (sbatch -W) when WAIT=1; the exit code goes to $dir/NAME.code.
submit_job() {
  local name=$1 code=0 flags=()
  shift
  while [ $# -gt 0 ] && [ "$1" != -- ]; do flags+=("$1"); shift; done
  shift
  [ "${WAIT:-0}" = 1 ] && flags+=(-W)
  (cd "$dir" && slurm_in ctl sbatch --parsable "${flags[@]}" --output="$dir/$name.out" \
    --error="$dir/$name.out.err" "$repo/deploy/slurm/pipetrain.sbatch" job.json --json "$@" \
    > "$dir/$name.id") || code=$?
  echo "$code" > "$dir/$name.code"
}

# Runs a job to its end (flags as submit_job's); prints its losses.
run_job() {
  WAIT=1 submit_job "$@"
  losses_in "$dir/$1.out"
}

# Submits a job and returns at once.
start_job() {
  WAIT=0 submit_job "$@"
  [ "$(cat "$dir/$1.code")" = 0 ] || fail "sbatch of job $1 exited $(cat "$dir/$1.code")"
}

# Waits up to 60 s for job $1 to report step $2.
await_step() {
  local deadline=$((SECONDS + 60))
  until [ "$(losses_in "$dir/$1.out" | wc -l)" -ge "$2" ]; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.1
  done
}

# Slurm job $1 has ended (within $WITHIN seconds, default 60) and sacct says state $2
# and exit code $3 (any: whatever; none given: any but 0:0). "STATE EXIT" goes to
# $dir/NAME.sacct.
expect_ended() {
  local name=$1 id line state code deadline=$((SECONDS + ${WITHIN:-60}))
  id=$(cut -d';' -f1 < "$dir/$name.id")
  while :; do
    # The last record: a job that lost a node (--no-kill) has one RESIZING before it.
    line=$(slurm_in ctl sacct -X -n -P -j "$id" -o State,ExitCode 2>/dev/null | tail -n 1 || true)
    state=${line%%|*}
    state=${state%% *}  # "CANCELLED by 0"
    code=${line#*|}
    case "$state" in PENDING | RUNNING | REQUEUED | RESIZING | COMPLETING | "") ;; *) break ;; esac
    [ "$SECONDS" -lt "$deadline" ] || fail "Slurm job $name ($id) did not end in time: $line"
    sleep 0.2
  done
  echo "$state $code" > "$dir/$name.sacct"
  if [ "$state" != "$2" ] || { [ -n "${3:-}" ] && [ "$3" != any ] && [ "$code" != "$3" ]; } ||
    { [ -z "${3:-}" ] && [ "$code" = 0:0 ]; }; then
    cat "$dir/$name".out* >&2 || true
    fail "sacct says job $name ($id) is $state with exit $code, not $2 ${3:-(non-zero)}"
  fi
}

# Pids of processes named $2 on host $1.
processes_on() {
  local pid
  for pid in $(ip netns pids "$(slurm_ns "$1")" 2>/dev/null); do
    [ "$(cat "/proc/$pid/comm" 2>/dev/null || true)" = "$2" ] && echo "$pid"
  done
  return 0
}

# No process on any node but its slurmd (after up to 30 s for slurmstepd to finish).
expect_nothing_left() {
  local deadline=$((SECONDS + 30)) host pid left
  while :; do
    left=""
    for host in n1 n2 n3; do
      for pid in $(ip netns pids "$(slurm_ns "$host")" 2>/dev/null); do
        [ "$(cat "/proc/$pid/comm" 2>/dev/null || true)" = slurmd ] && continue
        left+="$host: $({ tr '\0' ' ' < "/proc/$pid/cmdline"; } 2>/dev/null || true)"$'\n'
      done
    done
    [ -z "$left" ] && return 0
    [ "$SECONDS" -lt "$deadline" ] || fail "processes left on the nodes: $left"
    sleep 0.2
  done
}

# Job $1's losses are the lines of $2.
same_losses() {
  [ "$(cat "$dir/$1.losses")" = "$2" ] && return 0
  fail "job $1's $(wc -l < "$dir/$1.losses") losses differ from the uninterrupted run's \
$(wc -l <<< "$2"), first at: $(diff <(cat "$dir/$1.losses") - <<< "$2" | head -n 6)"
}

# The pipetrain job of Slurm job $1 is in state $2 with a checkpoint on disk, as a
# coordinator started afterwards on its state folder says. The checkpoint goes to
# $dir/NAME.checkpoint.
expect_pipetrain_job() {
  local name=$1 id state_dir pid port="" deadline=$((SECONDS + 30)) json
  id=$(cut -d';' -f1 < "$dir/$name.id")
  state_dir=$dir/pipetrain-state-$id
  "$bin/pipetrain-coordinator" --state-dir "$state_dir" --listen 127.0.0.1:0 \
    > "$dir/$name.coordinator" 2>&1 &
  pid=$!
  until [ -n "$port" ]; do
    port=$(sed -n 's/^coordinator listening on 127.0.0.1:\([0-9]*\)$/\1/p' "$dir/$name.coordinator")
    [ "$SECONDS" -lt "$deadline" ] || { kill "$pid"; fail "no coordinator on $state_dir"; }
    sleep 0.1
  done
  json=$("$bin/pipetrain" list --json --address "127.0.0.1:$port" --token-file "$dir/token") ||
    { kill "$pid"; fail "pipetrain list on $state_dir failed"; }
  kill -TERM "$pid"
  wait "$pid" || true
  echo "$json" | python3 -c '
import json, sys
jobs = json.load(sys.stdin).get("jobs", [])
if len(jobs) != 1: sys.exit("expected one job, got %d" % len(jobs))
job = jobs[0]
if job.get("state") != sys.argv[1]: sys.exit("state %s (%s), not %s" % (job.get("state"), job.get("reason"), sys.argv[1]))
print(job.get("checkpointDir") or job.get("checkpoint_dir") or "")' "$2" > "$dir/$name.checkpoint" ||
    fail "the pipetrain job of $name: $(cat "$dir/$name.checkpoint") ($json)"
  [ -d "$(cat "$dir/$name.checkpoint")" ] ||
    fail "the pipetrain job of $name names no checkpoint on disk: '$(cat "$dir/$name.checkpoint")'"
}
