#!/usr/bin/env bash
# A pipetrain cluster on this machine: one coordinator and K stage servers on 127.0.0.1,
# their logs and pids in the run folder.
#   deploy/local/cluster.sh up     [--stages K] [--port P] [--device D] [--run-dir DIR] [--secure]
#                                  [--data-root DIR]...
#   deploy/local/cluster.sh status [--run-dir DIR]
#   deploy/local/cluster.sh down   [--run-dir DIR]
# `up` waits until every stage has registered and prints the address to use; `down`
# stops exactly the processes `up` started (by pid), gracefully, then forcibly.
set -euo pipefail
cd "$(dirname "$0")/../.."

usage() {
  sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'
  echo "Options: --stages K (default 4), --port P for the coordinator (default 7400, 0 = any"
  echo "free port), --threads T compute threads per stage (default: cores / K, at least 1),"
  echo "--device D for every stage (default cpu; emulated:RATE runs no arithmetic, e.g."
  echo "emulated:1e11; emulated:RATE@NAME stages share one emulated device; D1,D2,... gives the"
  echo "stages these devices in turn), --run-dir DIR (default build/local-cluster), --secure: mutual TLS and a bearer token"
  echo "(certificates and token made in DIR/certs, DIR/token). Binaries come from"
  echo "\$PIPETRAIN_BIN (default build/bin). --data-root DIR (repeatable): jobs may read only"
  echo "files under DIR (and the run's checkpoints); without it, files under this repository's"
  echo "folder (the coordinator's working folder) and the run's state; --data-root / for any."
}

cmd=${1:-}
[ $# -gt 0 ] && shift
stages=4 port=7400 run_dir=build/local-cluster threads=0 secure=0 device=cpu
data_roots=()
while [ $# -gt 0 ]; do
  case "$1" in
    --stages) stages=${2:?--stages needs a number}; shift 2 ;;
    --port) port=${2:?--port needs a number}; shift 2 ;;
    --threads) threads=${2:?--threads needs a number}; shift 2 ;;
    --device) device=${2:?--device needs cpu, cuda:N or emulated:RATE}; shift 2 ;;
    --run-dir) run_dir=${2:?--run-dir needs a folder}; shift 2 ;;
    --secure) secure=1; shift ;;
    --data-root) data_roots+=(--data-root "${2:?--data-root needs a folder}"); shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "cluster.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
bin=${PIPETRAIN_BIN:-build/bin}

# With --secure: every process gets its certificate and the token; the CLI reads the env.
server_security=()
use_security() {
  local c=$run_dir/certs
  server_security=(--tls-cert "$c/127.0.0.1.pem" --tls-key "$c/127.0.0.1-key.pem"
                   --tls-ca "$c/ca.pem" --token-file "$run_dir/token")
  export PIPETRAIN_TLS_CERT=$c/client.pem PIPETRAIN_TLS_KEY=$c/client-key.pem
  export PIPETRAIN_TLS_CA=$c/ca.pem
  PIPETRAIN_TOKEN=$(cat "$run_dir/token")
  export PIPETRAIN_TOKEN
}

alive() {  # alive PIDFILE: the pid in it runs one of our binaries
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q pipetrain-
}

wait_for_line() {  # wait_for_line FILE PATTERN SECONDS: prints the first matching line
  local i
  for ((i = 0; i < $3 * 10; i++)); do
    if grep -m1 "$2" "$1" 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  return 1
}

down() {
  local f pid n
  for f in "$run_dir"/pids/*.pid; do
    [ -e "$f" ] || continue
    if alive "$f"; then kill -TERM "$(cat "$f")" 2>/dev/null || true; fi
  done
  for ((n = 0; n < 100; n++)); do
    local any=0
    for f in "$run_dir"/pids/*.pid; do [ -e "$f" ] && alive "$f" && any=1; done
    [ $any = 0 ] && break
    sleep 0.1
  done
  for f in "$run_dir"/pids/*.pid; do
    [ -e "$f" ] || continue
    if alive "$f"; then
      pid=$(cat "$f")
      echo "cluster.sh: $(basename "$f" .pid) (pid $pid) did not stop in 10 s; killing it" >&2
      kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$f"
  done
}

case "$cmd" in
  up)
    for b in pipetrain pipetrain-coordinator pipetrain-stage; do
      [ -x "$bin/$b" ] || { echo "cluster.sh: $bin/$b not found; build first (see README.md)" >&2; exit 1; }
    done
    if alive "$run_dir/pids/coordinator.pid"; then
      echo "cluster.sh: already up ($(cat "$run_dir/address")); 'deploy/local/cluster.sh down' first" >&2
      exit 1
    fi
    mkdir -p "$run_dir/pids" "$run_dir/logs"
    rm -f "$run_dir"/pids/*.pid
    [ "$threads" -gt 0 ] || threads=$(( $(nproc) / stages )); [ "$threads" -gt 0 ] || threads=1
    rm -rf "$run_dir/certs" "$run_dir/token"
    if [ "$secure" = 1 ]; then
      deploy/certs/make-dev-certs.sh "$run_dir/certs" 127.0.0.1 > /dev/null
      (umask 077; head -c 24 /dev/urandom | base64 > "$run_dir/token")
      use_security
    fi
    "$bin/pipetrain-coordinator" --listen "127.0.0.1:$port" --state-dir "$run_dir/state" \
      --http 127.0.0.1:0 ${server_security[@]+"${server_security[@]}"} \
      ${data_roots[@]+"${data_roots[@]}"} \
      > "$run_dir/logs/coordinator.log" 2>&1 &
    echo $! > "$run_dir/pids/coordinator.pid"
    if ! line=$(wait_for_line "$run_dir/logs/coordinator.log" "coordinator listening on" 30); then
      echo "cluster.sh: the coordinator did not start; its log:" >&2
      cat "$run_dir/logs/coordinator.log" >&2
      down; exit 1
    fi
    address=${line##* }
    http=$(grep -m1 "http listening on" "$run_dir/logs/coordinator.log" | sed 's/.* //')
    echo "$address" > "$run_dir/address"
    IFS=, read -r -a devices <<< "$device"
    for ((i = 0; i < stages; i++)); do
      "$bin/pipetrain-stage" --listen 127.0.0.1:0 --device "${devices[i % ${#devices[@]}]}" --threads "$threads" \
        --coordinator "$address" ${server_security[@]+"${server_security[@]}"} \
        > "$run_dir/logs/stage-$i.log" 2>&1 &
      echo $! > "$run_dir/pids/stage-$i.pid"
    done
    for ((n = 0; n < 300; n++)); do
      idle=$("$bin/pipetrain" cluster --json --address "$address" 2>/dev/null | grep -o '"IDLE"' | wc -l || true)
      [ "$idle" -ge "$stages" ] && break
      sleep 0.1
    done
    if [ "$idle" -lt "$stages" ]; then
      echo "cluster.sh: only $idle of $stages stages registered within 30 s; logs in $run_dir/logs" >&2
      down; exit 1
    fi
    echo "pipetrain cluster up: coordinator $address (HTTP API http://$http/api/jobs), $stages stages"
    echo "  logs and pids in $run_dir; stop it with: deploy/local/cluster.sh down"
    if [ "$address" != "127.0.0.1:7400" ]; then echo "  export PIPETRAIN_ADDRESS=$address"; fi
    if [ "$secure" = 1 ]; then
      echo "  mutual TLS and a bearer token are on; for the CLI:"
      echo "  export PIPETRAIN_TLS_CERT=$PIPETRAIN_TLS_CERT PIPETRAIN_TLS_KEY=$PIPETRAIN_TLS_KEY \\"
      echo "         PIPETRAIN_TLS_CA=$PIPETRAIN_TLS_CA PIPETRAIN_TOKEN=\$(cat $run_dir/token)"
    fi
    ;;
  status)
    if ! alive "$run_dir/pids/coordinator.pid"; then echo "pipetrain cluster: down"; exit 1; fi
    echo "pipetrain cluster: coordinator $(cat "$run_dir/address")"
    if [ -f "$run_dir/token" ]; then use_security; fi
    "$bin/pipetrain" cluster --address "$(cat "$run_dir/address")"
    ;;
  down)
    down
    echo "pipetrain cluster: down"
    ;;
  *)
    usage >&2; exit 2 ;;
esac
