#!/usr/bin/env bash
# Runs the GPU tests and `pipetrain-bench cuda` on a lent GPU machine. Runs THERE, from
# the repository root, with the .gpu/ folder made by bench/gpu-pack.sh carried along;
# it unpacks .gpu/gpu-pack.tar.gz under /tmp and runs from there.
#
# Two steps (see docs/GPU.md):
#   1. here: bash bench/gpu-pack.sh          (builds and packs into .gpu/gpu-pack.tar.gz)
#   2. the device tool's run, with carry [".gpu"] and command `bash bench/gpu.sh`
#
# Writes into $OUT (the device tool brings it back; at most 8 files): gtest-xml.tar.gz (one
# gtest XML per test binary), gpu.log (everything printed), cuda_bench.json,
# cuda_train.json and cuda_ipc.json. Prints a summary table last. Exit status: 1 if any
# test failed or did not run, 2 if only a bench failed, 0 otherwise. SANITIZE=1 bash
# bench/gpu.sh adds a compute-sanitizer memcheck run.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

pack=${PACK_DIR:-.gpu}
OUT=${OUT:-/tmp/pipetrain-gpu-out}
mkdir -p "$OUT"
log="$OUT/gpu.log"
: >"$log"
say() { echo "$@" | tee -a "$log"; }

if [[ -f "$pack/gpu-pack.tar.gz" ]]; then
  unpacked=$(mktemp -d /tmp/pipetrain-gpu.XXXXXX)
  tar -C "$unpacked" -xzf "$pack/gpu-pack.tar.gz" || { say "gpu.sh: cannot unpack"; exit 1; }
  pack=$unpacked
fi
if [[ ! -d "$pack/bin" ]]; then
  say "gpu.sh: no $pack/gpu-pack.tar.gz: run bench/gpu-pack.sh here first and carry .gpu"
  exit 1
fi
cuda_dirs=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
  [[ -d "$d" ]] && cuda_dirs="$cuda_dirs:$d"
done
pack_lib="$(cd "$pack" && pwd)/lib"
export LD_LIBRARY_PATH="$pack_lib$cuda_dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# If the toolkit there lacks cuBLAS or NCCL (218 MiB: never packed), PyTorch's pip
# packages carry the same major version.
if ldd "$pack/bin/pipetrain-bench" 2>&1 | grep -q "lib\(cu\|nccl\).*not found"; then
  for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
    found=$(find / -xdev -name "$lib" -path "*nvidia*" 2>/dev/null | head -n 1)
    [[ -n "$found" ]] && LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$found")"
  done
  export LD_LIBRARY_PATH
fi

# The packed tests start the packed binaries (cuda_cluster_test), and the cuda-train
# bench runs bench/torch_compute_bench.py from this tree under the machine's PyTorch.
PIPETRAIN_BIN_DIR="$(cd "$pack" && pwd)/bin"
PIPETRAIN_BENCH_DIR="$(pwd)/bench"
PIPETRAIN_PYTHON="$(command -v python3 || echo /usr/bin/python3)"
export PIPETRAIN_BIN_DIR PIPETRAIN_BENCH_DIR PIPETRAIN_PYTHON
export PYTHONUNBUFFERED=1

say "== nvidia-smi"
nvidia-smi 2>&1 | tee -a "$log" || say "nvidia-smi failed"

say "== libraries"
if ldd "$pack"/bin/* 2>&1 | grep -q "not found"; then
  ldd "$pack"/bin/* 2>&1 | grep "not found" | sort -u | tee -a "$log"
  say "gpu.sh: some shared libraries are missing (see above)"
fi

declare -a rows=()
failed=0
tlog=$(mktemp)
xml_dir=$(mktemp -d)
# TESTS (a glob, default *_test) and BENCHES (default "cuda cuda-train cuda-ipc") pick what runs,
# for a second, shorter run after a fix.
for t in "$pack"/bin/${TESTS:-*_test}; do
  name=$(basename "$t")
  say "== $name"
  limit=120
  [[ $name == cuda_cluster_test ]] && limit=${CLUSTER_LIMIT:-260}
  timeout "$limit" "$t" --gtest_output="xml:$xml_dir/$name.xml" 2>&1 | tee "$tlog" >>"$log"
  rc=${PIPESTATUS[0]}
  tail -n 40 "$tlog"
  passed=$(grep -c '^\[       OK \]' "$tlog")
  fails=$(grep -c '^\[  FAILED  \] .*(' "$tlog")
  skipped=$(grep -c '^\[  SKIPPED \] .*(' "$tlog")
  status=ok
  if [[ $rc != 0 ]]; then
    status="FAILED (exit $rc)"
    failed=1
  fi
  rows+=("$(printf '%-28s %-18s %6s %6s %7s' "$name" "$status" "$passed" "$fails" "$skipped")")
done

# SANITIZE=1: also run the backend tests under compute-sanitizer's memcheck (out-of-
# bounds and misaligned accesses in kernels; many times slower).
if [[ "${SANITIZE:-0}" == 1 ]]; then
  sanitizer=$(command -v compute-sanitizer)
  for candidate in /usr/local/cuda/bin/compute-sanitizer \
      /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
    [[ -z "$sanitizer" && -x "$candidate" ]] && sanitizer=$candidate
  done
  say "== compute-sanitizer memcheck: cuda_backend_test"
  if [[ -n "$sanitizer" ]]; then
    timeout 400 "$sanitizer" --tool memcheck --error-exitcode 9 \
      "$pack/bin/cuda_backend_test" --gtest_brief=1 2>&1 | tee "$tlog" >>"$log"
    rc=${PIPESTATUS[0]}
    tail -n 20 "$tlog"
    status=ok
    if [[ $rc != 0 ]]; then status="FAILED (exit $rc)"; failed=1; fi
    rows+=("$(printf '%-28s %-18s' "memcheck cuda_backend_test" "$status")")
  else
    rows+=("$(printf '%-28s %-18s' "memcheck cuda_backend_test" "no compute-sanitizer")")
  fi
fi

benches=" ${BENCHES-cuda cuda-train cuda-ipc} "
bench_rc=0
train_rc=0
if [[ $benches == *" cuda "* ]]; then
  say "== pipetrain-bench cuda"
  timeout 120 "$pack/bin/pipetrain-bench" cuda --json >"$OUT/cuda_bench.json" 2>>"$log"
  bench_rc=$?
  cat "$OUT/cuda_bench.json" >>"$log"
fi
if [[ $benches == *" cuda-train "* ]]; then
  say "== pipetrain-bench cuda-train"
  timeout "${TRAIN_LIMIT:-200}" "$pack/bin/pipetrain-bench" cuda-train --json \
    >"$OUT/cuda_train.json" 2>>"$log"
  train_rc=$?
  cat "$OUT/cuda_train.json" >>"$log"
fi
[[ $train_rc != 0 ]] && bench_rc=$train_rc
tar -C "$xml_dir" -czf "$OUT/gtest-xml.tar.gz" . 2>>"$log"
# The same-host path between GPUs: two processes on GPU 0 through a CUDA IPC ring.
ipc_json="$OUT/cuda_ipc.json"
if [[ $benches == *" cuda-ipc "* ]]; then
  say "== pipetrain-bench cuda-ipc"
  timeout 90 "$pack/bin/pipetrain-bench" cuda-ipc --json >"$ipc_json" 2>>"$log"
  ipc_rc=$?
  cat "$ipc_json" >>"$log"
  [[ $ipc_rc != 0 && $bench_rc == 0 ]] && bench_rc=$ipc_rc
fi

echo
say "== summary"
say "$(printf '%-28s %-18s %6s %6s %7s' test-binary status passed failed skipped)"
for r in "${rows[@]}"; do say "$r"; done
for f in cuda_bench cuda_train cuda_ipc; do
  json="$OUT/$f.json"
  if [[ -s "$json" ]]; then
    # One figure a line: "name value".
    sed -e 's/[{}]//g' -e 's/","/"\n"/g' -e 's/,"/\n"/g' "$json" |
      sed -e 's/"//g' -e 's/:/  /' | tee -a "$log"
  else
    say "$f: no figures (see gpu.log)"
  fi
done
[[ $bench_rc != 0 ]] && say "a pipetrain-bench run FAILED (exit $bench_rc); see gpu.log"
if [[ $failed != 0 ]]; then exit 1; fi
if [[ $bench_rc != 0 ]]; then exit 2; fi
exit 0
