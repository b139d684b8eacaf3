#!/usr/bin/env bash
# A Slurm cluster of several nodes on this machine, for tests. Each host is a Linux
# network namespace with its own address on a private bridge (the bridge in a namespace
# of its own: the machine's interfaces and routes are never touched):
#   ctl  10.214.0.1   MariaDB, slurmdbd (accounting: sacct), slurmctld
#   nI   10.214.0.1I  slurmd of node nI, GRES gpu:G backed by stand-in device nodes, so
#                     that `sbatch --gpus-per-node` schedules as on a GPU site
# munged runs in ctl with a generated key (its socket is a file every namespace sees).
# Node names resolve nowhere: nodes reach each other at their NodeAddr. Everything
# lives in DIR (config, database, state, spool, logs, pid files) and is stopped by pid.
#
#   source tests/slurm/slurm_cluster.sh
#   slurm_up DIR NODES GPUS  # starts it; exports SLURM_CONF; returns 1 (logs printed)
#                            # when a daemon does not start or a node is not idle in 60 s
#   slurm_in HOST CMD...     # runs CMD on host ctl or nI (clients: sbatch, sacct, ...)
#   slurm_kill_node HOST     # SIGKILLs every process on host nI (a node crash)
#   slurm_down DIR           # cancels every job, stops the daemons, removes the hosts
#
# Needs root (network namespaces; slurmd runs tasks as their user) and Debian's
# slurmctld, slurmd, slurmdbd, slurm-client, munge and mariadb-server
# (deploy/install-deps.sh installs them).

SLURM_NS=ptsl$$-  # namespaces of this run: ptsl<pid>-sw, -ctl, -n1 ...
SLURM_SUBNET=10.214.0

slurm_ns() { echo "$SLURM_NS$1"; }
# nsenter, not `ip netns exec`: that one also remounts /sys, hiding the cgroup tree
# slurmd needs.
slurm_in() {
  local host=$1
  shift
  nsenter --net="/run/netns/$(slurm_ns "$host")" "$@"
}
slurm_node_addr() { echo "$SLURM_SUBNET.1${1#n}"; }

# Namespaces an earlier run left (its process gone: a crash, a ctest timeout): the
# processes in them killed by pid, then the namespaces deleted.
slurm_remove_leftovers() {
  local ns owner pid
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep '^ptsl[0-9]*-' || true); do
    owner=${ns#ptsl}
    owner=${owner%%-*}
    kill -0 "$owner" 2>/dev/null && continue
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
}

# Host $1 with address $2 on the bridge; $3 its bridge port's name.
slurm_add_host() {
  local ns sw
  ns=$(slurm_ns "$1")
  sw=$(slurm_ns sw)
  ip netns add "$ns" &&
    ip -n "$sw" link add "$3" type veth peer name eth0 netns "$ns" &&
    ip -n "$sw" link set "$3" master br0 &&
    ip -n "$sw" link set "$3" up &&
    ip -n "$ns" addr add "$2/24" dev eth0 &&
    ip -n "$ns" link set eth0 up &&
    ip -n "$ns" link set lo up
}

slurm_network_up() {
  local nodes=$1 i sw
  sw=$(slurm_ns sw)
  ip netns add "$sw" && ip -n "$sw" link add br0 type bridge && ip -n "$sw" link set br0 up ||
    return 1
  slurm_add_host ctl "$SLURM_SUBNET.1" vctl || return 1
  for ((i = 1; i <= nodes; i++)); do
    slurm_add_host "n$i" "$(slurm_node_addr "n$i")" "vn$i" || return 1
  done
}

slurm_write_config() {
  local dir=$1 nodes=$2 gpus=$3 i names=""
  cat > "$dir/slurm.conf" <<CONF
ClusterName=pipetrain-test
SlurmctldHost=localhost($SLURM_SUBNET.1)
AuthType=auth/munge
AuthInfo=socket=$dir/munge/socket,cred_expire=10
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
SlurmdTimeout=10
KillWait=30
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePass=$dir/munge/socket
JobRequeue=1
CONF
  : > "$dir/gres.conf"
  for ((i = 1; i <= nodes; i++)); do
    echo "NodeName=n$i NodeAddr=$(slurm_node_addr "n$i") CPUs=16 RealMemory=16000 Gres=gpu:$gpus" \
      >> "$dir/slurm.conf"
    # Stand-ins for /dev/nvidia*: character devices of the driver's major number (the
    # gpu plugin takes nothing else; nothing opens them), from which Slurm sets
    # CUDA_VISIBLE_DEVICES and SLURM_JOB_GPUS as on a GPU node.
    mkdir -p "$dir/dev/n$i"
    for ((g = 0; g < gpus; g++)); do mknod "$dir/dev/n$i/gpu$g" c 195 "$g"; done
    echo "NodeName=n$i Name=gpu File=$dir/dev/n$i/gpu[0-$((gpus - 1))]" >> "$dir/gres.conf"
    names+=${names:+,}n$i
  done
  echo "PartitionName=main Nodes=$names Default=YES MaxTime=INFINITE State=UP" >> "$dir/slurm.conf"
  # slurmdbd wants its file beside slurm.conf, owned by SlurmUser, readable by it alone.
  cat > "$dir/slurmdbd.conf" <<CONF
AuthType=auth/munge
AuthInfo=socket=$dir/munge/socket
DbdHost=localhost
SlurmUser=root
PidFile=$dir/slurmdbd.pid
LogFile=$dir/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=3306
StorageUser=slurm
StoragePass=pipetrain-test
StorageLoc=slurm_acct_db
CONF
  chmod 600 "$dir/slurmdbd.conf"
}

slurm_print_logs() {
  local dir=$1 f
  for f in "$dir"/munge/log "$dir"/log/*.log; do
    [ -f "$f" ] || continue
    echo "---- $f" >&2
    tail -n 40 "$f" >&2
  done
}

# $1: what did not start; prints the logs; returns 1.
slurm_start_failed() {
  echo "slurm_cluster: $1 did not start" >&2
  slurm_print_logs "$SLURM_DIR"
  return 1
}

# Waits up to $2 seconds for command $1 (a string) to succeed.
slurm_wait_for() {
  local deadline=$((SECONDS + $2))
  until eval "$1" > /dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.1
  done
}

# MariaDB in host ctl, on its own 127.0.0.1:3306, for slurmdbd.
slurm_database_up() {
  local dir=$1
  mkdir -p "$dir/db"
  mariadb-install-db --datadir="$dir/db" --user=root --auth-root-authentication-method=normal \
    --skip-test-db > "$dir/log/mariadb-install.log" 2>&1 || return 1
  slurm_in ctl mariadbd --no-defaults --datadir="$dir/db" --socket="$dir/db.sock" \
    --pid-file="$dir/mariadb.pid" --bind-address=127.0.0.1 --port=3306 --user=root \
    --log-error="$dir/log/mariadb.log" --skip-log-bin --innodb-buffer-pool-size=32M \
    --innodb-flush-log-at-trx-commit=0 > /dev/null 2>&1 &
  disown  # the caller's `wait` is not for the database
  slurm_wait_for "mariadb --no-defaults -S '$dir/db.sock' -u root -e 'select 1'" 30 || return 1
  mariadb --no-defaults -S "$dir/db.sock" -u root -e "
    CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY 'pipetrain-test';
    CREATE USER 'slurm'@'localhost' IDENTIFIED BY 'pipetrain-test';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"
}

slurm_up() {
  local dir=$1 nodes=$2 gpus=$3 i
  SLURM_DIR=$dir
  slurm_remove_leftovers
  mkdir -p "$dir"/{state,log,munge,munge-key}
  for ((i = 1; i <= nodes; i++)); do mkdir -p "$dir/spool/n$i"; done
  # munged wants its socket's folder open to all and its key readable by root only.
  chmod 755 "$dir" "$dir/munge"
  chmod 700 "$dir/munge-key"
  head -c 1024 /dev/urandom > "$dir/munge-key/munge.key"
  chmod 600 "$dir/munge-key/munge.key"
  slurm_write_config "$dir" "$nodes" "$gpus"
  export SLURM_CONF=$dir/slurm.conf
  slurm_network_up "$nodes" || slurm_start_failed "the network of namespaces" || return 1
  slurm_in ctl munged --key-file="$dir/munge-key/munge.key" --socket="$dir/munge/socket" \
    --pid-file="$dir/munge/pid" --log-file="$dir/munge/log" --seed-file="$dir/munge/seed" ||
    slurm_start_failed munged || return 1
  slurm_database_up "$dir" || slurm_start_failed MariaDB || return 1
  slurm_in ctl slurmdbd || slurm_start_failed slurmdbd || return 1
  slurm_wait_for "slurm_in ctl sacctmgr -i -n list cluster" 30 || slurm_start_failed slurmdbd ||
    return 1
  slurm_in ctl sacctmgr -i add cluster pipetrain-test > /dev/null || slurm_start_failed sacctmgr ||
    return 1
  slurm_in ctl slurmctld || slurm_start_failed slurmctld || return 1
  for ((i = 1; i <= nodes; i++)); do
    slurm_in "n$i" slurmd -N "n$i" || slurm_start_failed "slurmd of n$i" || return 1
  done
  if ! slurm_wait_for "[ \"\$(slurm_in ctl sinfo -h -o %t | sort -u)\" = idle ]" 60; then
    echo "slurm_cluster: the nodes are not idle within 60 s: $(slurm_in ctl sinfo -N 2>&1)" >&2
    slurm_print_logs "$dir"
    return 1
  fi
}

slurm_kill_node() {
  local pid
  for pid in $(ip netns pids "$(slurm_ns "$1")"); do kill -KILL "$pid" 2>/dev/null || true; done
}

# Stops the process whose pid is in file $1: SIGTERM, then SIGKILL after 5 s.
slurm_stop_pidfile() {
  local pid
  [ -f "$1" ] || return 0
  pid=$(cat "$1")
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
}

slurm_down() {
  local dir=$1 f ns pid
  if [ -f "$dir/slurmctld.pid" ]; then
    # Jobs first, while slurmd can still stop their steps (and every process they began).
    slurm_in ctl scancel --quiet --user=root 2>/dev/null || true
    slurm_wait_for "[ -z \"\$(slurm_in ctl squeue -h)\" ]" 40 || true
  fi
  for f in "$dir"/slurmd-n*.pid "$dir"/slurmctld.pid "$dir"/slurmdbd.pid "$dir"/mariadb.pid \
    "$dir"/munge/pid; do
    slurm_stop_pidfile "$f"
  done
  # What is left in the hosts (none should be), then the hosts.
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$SLURM_NS" || true); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
}
