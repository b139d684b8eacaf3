#!/usr/bin/env bash
# deploy/slurm/pipetrain.sbatch, unchanged, on a real Slurm of three nodes
# (tests/slurm/slurm_cluster.sh: Debian's Slurm with slurmdbd, each node a network
# namespace with GRES gpu:2 on stand-in devices; stages on the cpu device), with TLS and
# the bearer token on:
#   - a 4-stage job on 2 nodes gives the per-step losses of the same job on one stage,
#     and a 2 x 2 (R x K) job those of 2 x 1 on one node, bit for bit; sacct says
#     COMPLETED 0:0;
#   - two jobs on one node at once both train (no port clash);
#   - a job that fails fails its Slurm job: sacct says FAILED, non-zero exit;
#   - a stage SIGKILLed mid-job, and separately a whole node (its slurmd and everything
#     on it), leave the other stages running: pipetrain recovers and the job ends with
#     the 400 losses of the uninterrupted run;
#   - scancel stops every process of the job on every node, and the pipetrain job ends
#     CANCELLED with a checkpoint;
#   - a job sbatch'ed with --requeue and requeued mid-run is resumed from its checkpoint
#     by its next run, with the losses of the uninterrupted run;
#   - after each job no process of it is left on any node.
#
#   bash tests/slurm/sbatch_test.sh BIN_DIR       (as root; exits 77, skipped, elsewhere)
set -euo pipefail
# A step that fails unexpectedly (not through `fail`) says which it was.
trap 'echo "FAIL: line $LINENO: $BASH_COMMAND exited $?" >&2; failed=1' ERR

bin=$(cd "$1" && pwd)
repo=$(cd "$(dirname "$0")/../.." && pwd)
if [ "$(id -u)" != 0 ]; then echo "SKIP: needs root (namespaces; slurmd runs the tasks)"; exit 77; fi
for tool in munged slurmctld slurmd slurmdbd sbatch sacct mariadbd nsenter; do
  if ! command -v "$tool" >/dev/null; then
    echo "SKIP: $tool is not installed (deploy/install-deps.sh installs Slurm, munge, MariaDB)"
    exit 77
  fi
done
if ! ip netns add "ptslprobe$$" 2>/dev/null; then
  echo "SKIP: this process may not make network namespaces"; exit 77
fi
ip netns del "ptslprobe$$"
# shellcheck source=tests/slurm/slurm_cluster.sh
source "$repo/tests/slurm/slurm_cluster.sh"
# shellcheck source=tests/slurm/sbatch_steps.sh
source "$repo/tests/slurm/sbatch_steps.sh"

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
trap 'exit 143' TERM INT

slurm_up "$dir/slurm" 3 2 || fail "the Slurm cluster did not start"
write_job "$dir"
# TLS and the token on every run: each node's certificate names its NodeAddr, where the
# stages on it are reached.
bash "$repo/deploy/certs/make-dev-certs.sh" "$dir/tls" \
  n1="$(slurm_node_addr n1)" n2="$(slurm_node_addr n2)" n3="$(slurm_node_addr n3)" > /dev/null
head -c 24 /dev/urandom | base64 > "$dir/token"
export PIPETRAIN_BIN=$bin PIPETRAIN_STAGE_DEVICE=cpu PIPETRAIN_TLS_DIR=$dir/tls \
  PIPETRAIN_TOKEN_FILE=$dir/token

one=$(run_job one --nodes=1 --gpus-per-node=1 -- --set pipeline.stages=1)
expect_ended one COMPLETED 0:0
[ "$(echo "$one" | wc -l)" = 4 ] || fail "the 1-stage job reported no 4 losses: $one"

four=$(run_job four --nodes=2 --gpus-per-node=2 -- --set pipeline.stages=4)
expect_ended four COMPLETED 0:0
[ "$four" = "$one" ] || fail "4 stages' losses differ from 1 stage's: ${four//$'\n'/ } against ${one//$'\n'/ }"
echo "4 stages on 2 nodes give 1 stage's losses: ${one//$'\n'/ }"

# R x K: the losses of R replicas of one stage each, bit for bit (those of one stage
# differ by the rounding of the regrouped batch; tests/cluster/coordinator_cluster_test.cc).
r1=$(run_job r1 --nodes=1 --gpus-per-node=2 -- --set pipeline.replicas=2 --set pipeline.stages=1)
expect_ended r1 COMPLETED 0:0
[ "$(echo "$r1" | wc -l)" = 4 ] || fail "the 2 x 1 job reported no 4 losses: $r1"
rk=$(run_job rk --nodes=2 --gpus-per-node=2 -- --set pipeline.replicas=2 --set pipeline.stages=2)
expect_ended rk COMPLETED 0:0
[ "$rk" = "$r1" ] || fail "2 x 2 stages' losses differ from 2 x 1's: ${rk//$'\n'/ } against ${r1//$'\n'/ }"
echo "2 replicas x 2 stages on 2 nodes give the losses of 2 x 1 on one node: ${rk//$'\n'/ }"
expect_nothing_left

# Two jobs on one node at once: each on its own GPU, so on its own ports.
run_job shareA --nodes=1 --gpus-per-node=1 --nodelist=n3 -- --set pipeline.stages=1 > "$dir/shareA.losses" &
runner=$!
run_job shareB --nodes=1 --gpus-per-node=1 --nodelist=n3 -- --set pipeline.stages=1 > "$dir/shareB.losses"
wait "$runner"
expect_ended shareA COMPLETED 0:0
expect_ended shareB COMPLETED 0:0
for name in shareA shareB; do
  [ "$(cat "$dir/$name.losses")" = "$one" ] || fail "job $name, sharing node n3, gave other losses"
done
echo "two jobs on node n3 at once both trained"

# A job that fails (a corpus that is not there) fails its Slurm job.
run_job failing --nodes=1 --gpus-per-node=1 -- --set pipeline.stages=1 --set data.corpus="$dir/nope.txt" > /dev/null
expect_ended failing FAILED
echo "a failed job: $(cat "$dir/failing.sacct")"
expect_nothing_left

# Long enough to be running still when the faults below come (a few seconds).
long=(--set training.steps=400 --set checkpoint.every_steps=100)
reference=$(run_job reference --nodes=1 --gpus-per-node=1 -- --set pipeline.stages=1 "${long[@]}")
[ "$(echo "$reference" | wc -l)" = 400 ] || fail "the 400-step reference reported no 400 losses"

# One stage SIGKILLed (a crash): each stage is its own step, so the others stay; its
# step starts it again; pipetrain recovers.
run_job killed --nodes=2 --gpus-per-node=2 --nodelist=n1,n2 -- --set pipeline.stages=4 "${long[@]}" \
  > "$dir/killed.losses" &
runner=$!
await_step killed 3 || { kill "$runner"; fail "the 4-stage job did not reach step 3 within 60 s"; }
kill -KILL "$(processes_on n2 pipetrain-stage | head -n 1)"
wait "$runner"
expect_ended killed COMPLETED 0:0
grep -q "starting it again" "$dir/killed.out.err" || fail "the killed stage was not started again"
grep -q "lost at step" "$dir/killed.out" || fail "the job never lost its killed stage"
same_losses killed "$reference"
echo "a stage killed at step 3 recovered: the 400 losses of the uninterrupted run"
expect_nothing_left

# scancel: every process of the job stops on every node, the pipetrain job ends
# CANCELLED with a checkpoint.
start_job cancelled --nodes=2 --gpus-per-node=2 --nodelist=n1,n2 -- --set pipeline.stages=4 \
  --set training.steps=100000 --set checkpoint.every_steps=100000
await_step cancelled 3 || fail "the job to cancel did not reach step 3 within 60 s"
slurm_in ctl scancel "$(cat "$dir/cancelled.id")"
expect_ended cancelled CANCELLED any
expect_nothing_left
expect_pipetrain_job cancelled CANCELLED
echo "scancel: nothing left, the pipetrain job CANCELLED with $(cat "$dir/cancelled.checkpoint")"

# sbatch --requeue and a requeue mid-job (as a preemption): the job's next run (same
# Slurm job, same state folder) resumes the pipetrain job from the checkpoint its
# coordinator took at the stop: the steps left have the uninterrupted run's losses.
# (A requeued job waits cred_expire, 10 s here, before it runs again.)
start_job requeued --requeue --open-mode=append --nodes=2 --gpus-per-node=2 --nodelist=n1,n2 -- \
  --set pipeline.stages=4 "${long[@]}"
await_step requeued 3 || fail "the job to requeue did not reach step 3 within 60 s"
slurm_in ctl scontrol requeue "$(cat "$dir/requeued.id")"
WITHIN=120 expect_ended requeued COMPLETED 0:0
grep -q "requeued (restart 1): job-000001 continues from its last checkpoint as job-000002" \
  "$dir/requeued.out" ||
  fail "the requeued run did not resume the job: $(grep pipetrain.sbatch "$dir/requeued.out")"
# The output holds both runs: the second's steps are those after the checkpoint.
sed -n '/requeued (restart 1)/,$p' "$dir/requeued.out" > "$dir/requeued.second"
left=$(losses_in "$dir/requeued.second" | wc -l)
if [ "$left" -lt 1 ] || [ "$left" -gt 397 ]; then
  fail "the requeued run ran $left steps, not those after step 3"
fi
losses_in "$dir/requeued.second" > "$dir/requeued.losses"
same_losses requeued "$(tail -n "$left" <<< "$reference")"
echo "requeued after step $((400 - left)): the next run resumed from its checkpoint with the uninterrupted run's losses"
expect_nothing_left

# A node lost (its slurmd and all on it SIGKILLed, as a crash): the job goes on, on the
# stages of the node left.
run_job lost --nodes=2 --gpus-per-node=2 --nodelist=n1,n2 -- --set pipeline.stages=4 "${long[@]}" \
  > "$dir/lost.losses" &
runner=$!
await_step lost 3 || { kill "$runner"; fail "the job on n1 and n2 did not reach step 3 within 60 s"; }
slurm_kill_node n2
wait "$runner"
expect_ended lost COMPLETED 0:0
grep -q "lost at step" "$dir/lost.out" || fail "the job never lost the stages of node n2"
same_losses lost "$reference"
echo "node n2 lost at step 3: the job recovered on n1 with the 400 losses of the uninterrupted run"
expect_nothing_left
echo "PASS"
