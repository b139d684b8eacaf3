#!/bin/bash
# The quickstart's job (examples/tiny-gpt.json: 4 cpu stages, 1f1b, M=8) with the
# stages' same-host path on (--same-host-transport auto, the default) and off, in one
# run, alternating: the median step time after the first 5 of 40 steps, per round.
# Usage: bench/same_host_quickstart.sh [ROUNDS]   (from the repository root, after a build)
set -euo pipefail
rounds=${1:-3}
bin=${PIPETRAIN_BIN:-build/bin}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Stages that keep every byte on the stream: the same binaries behind a wrapper.
mkdir -p "$work/off"
ln -s "$(realpath "$bin/pipetrain")" "$work/off/pipetrain"
ln -s "$(realpath "$bin/pipetrain-coordinator")" "$work/off/pipetrain-coordinator"
printf '#!/bin/sh\nexec %q --same-host-transport off "$@"\n' "$(realpath "$bin/pipetrain-stage")" \
  > "$work/off/pipetrain-stage"
chmod +x "$work/off/pipetrain-stage"
cat docs/*.md README.md > "$work/corpus.txt"  # any English text will do
for round in $(seq "$rounds"); do
  for mode in auto off; do
    run=$work/$mode-$round
    mode_bin=$bin; [ "$mode" = off ] && mode_bin=$work/off
    out=$(PIPETRAIN_BIN=$mode_bin deploy/local/cluster.sh up --port 0 --run-dir "$run" \
          --data-root "$work" 2>&1)
    PIPETRAIN_ADDRESS=$(echo "$out" | sed -n 's/.*export PIPETRAIN_ADDRESS=//p')
    export PIPETRAIN_ADDRESS
    python3 - "$run" "$work/corpus.txt" <<'PY'
import json, sys
run, corpus = sys.argv[1], sys.argv[2]
s = json.load(open('examples/tiny-gpt.json'))
s['training']['steps'] = 40
s['data'] = {'corpus': corpus, 'validate_every_steps': 0}
s['checkpoint'] = {'every_steps': 0}
json.dump(s, open(run + '/job.json', 'w'))
PY
    "$bin/pipetrain" submit "$run/job.json" > /dev/null
    "$bin/pipetrain" status job-000001 --json > "$run/status.json"
    python3 - "$run/status.json" "$mode" "$round" <<'PY'
import json, statistics, sys
s = json.load(open(sys.argv[1]))
t = [h['step_time_s'] for h in s['history'][5:]]
print('round %s %-4s %s median step %.1f ms' % (sys.argv[3], sys.argv[2], s['state'],
                                                1e3 * statistics.median(t)))
PY
    PIPETRAIN_BIN=$mode_bin deploy/local/cluster.sh down --run-dir "$run" > /dev/null 2>&1
  done
done
