#!/usr/bin/env bash
# A Slurm cluster of one node on this machine, for tests: munge with a generated key,
# slurmctld and one slurmd (NodeName n1 at 127.0.0.1) declaring GRES gpu:4 backed by
# stand-in device files, so that `sbatch --gpus-per-node=G` schedules as on a GPU site.
# Everything lives in DIR (config, state, spool, logs, pid files) and is stopped by pid.
#
#   source tests/slurm/slurm_cluster.sh
#   slurm_up DIR      # starts the daemons; exports SLURM_CONF; returns 1 (logs printed)
#                     # when the node is not idle within 30 s
#   slurm_down DIR    # cancels every job, stops the daemons by pid
#
# Needs root (slurmd runs tasks as their user) and Debian's slurmctld, slurmd,
# slurm-client and munge (deploy/install-deps.sh installs them).

# A TCP port nobody listens on now.
slurm_free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

slurm_write_config() {
  local dir=$1
  local ctl_port d_port
  ctl_port=$(slurm_free_port)
  d_port=$(slurm_free_port)
  cat > "$dir/slurm.conf" <<CONF
ClusterName=pipetrain-test
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctl_port
SlurmdPort=$d_port
AuthType=auth/munge
AuthInfo=socket=$dir/munge/socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/jobcomp.txt
KillWait=5
NodeName=n1 NodeAddr=127.0.0.1 NodeHostname=localhost CPUs=16 RealMemory=16000 Gres=gpu:4
PartitionName=main Nodes=n1 Default=YES MaxTime=INFINITE State=UP
CONF
  # Stand-ins for /dev/nvidia0-3: the gpu plugin only needs the files to exist.
  echo "NodeName=n1 Name=gpu File=$dir/dev/gpu[0-3]" > "$dir/gres.conf"
}

slurm_print_logs() {
  local dir=$1 f
  for f in "$dir"/munge/log "$dir"/log/*.log; do
    [ -f "$f" ] || continue
    echo "---- $f" >&2
    tail -n 40 "$f" >&2
  done
}

slurm_up() {
  local dir=$1 i
  mkdir -p "$dir"/{state,spool,log,dev,munge,munge-key}
  touch "$dir"/dev/gpu{0,1,2,3}
  # munged wants its socket's folder open to all and its key readable by root only.
  chmod 755 "$dir" "$dir/munge"
  chmod 700 "$dir/munge-key"
  head -c 1024 /dev/urandom > "$dir/munge-key/munge.key"
  chmod 600 "$dir/munge-key/munge.key"
  slurm_write_config "$dir"
  export SLURM_CONF=$dir/slurm.conf
  munged --key-file="$dir/munge-key/munge.key" --socket="$dir/munge/socket" \
    --pid-file="$dir/munge/pid" --log-file="$dir/munge/log" --seed-file="$dir/munge/seed" || {
    slurm_print_logs "$dir"; return 1; }
  slurmctld -f "$SLURM_CONF" || { slurm_print_logs "$dir"; return 1; }
  slurmd -f "$SLURM_CONF" -N n1 || { slurm_print_logs "$dir"; return 1; }
  for ((i = 0; i < 60; i++)); do
    if [ "$(sinfo -h -n n1 -o %t 2>/dev/null)" = "idle" ]; then return 0; fi
    sleep 0.5
  done
  echo "slurm_cluster: node n1 not idle within 30 s: $(sinfo 2>&1)" >&2
  slurm_print_logs "$dir"
  return 1
}

slurm_down() {
  local dir=$1 f pid
  if [ -n "${SLURM_CONF:-}" ] && [ -f "$dir/slurmctld.pid" ]; then
    # Jobs first, while slurmd can still stop their steps (and every process they began).
    scancel --quiet --user=root 2>/dev/null || true
    for _ in $(seq 100); do
      [ -z "$(squeue -h 2>/dev/null)" ] && break
      sleep 0.2
    done
  fi
  for f in "$dir"/slurmd-n1.pid "$dir"/slurmctld.pid "$dir"/munge/pid; do
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    kill -TERM "$pid" 2>/dev/null || continue
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
}
