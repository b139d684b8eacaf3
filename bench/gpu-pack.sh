#!/usr/bin/env bash
# Packs the GPU tests and pipetrain-bench for a lent GPU machine. Runs HERE (the build
# machine), because the GPU machine has CUDA, cmake and ninja but none of the gRPC,
# protobuf, Abseil, oneDNN or OpenBLAS libraries, and nothing can be installed there.
#
# Two steps (see docs/GPU.md):
#   1. here, in the repository root of the checkout that will call the device tool:
#        bash bench/gpu-pack.sh
#      configures a CUDA build in build-gpu/, builds every test labelled `gpu` and
#      pipetrain-bench, and copies them with every shared library they need (except the
#      CUDA toolkit's and the C/C++ runtime) into .gpu/gpu-pack.tar.gz (git-ignored;
#      compressed because oneDNN and OpenBLAS are 38 and 35 MiB and the tool carries at
#      most 64 MiB).
#   2. the device tool's run, with carry [".gpu"] and command `bash bench/gpu.sh`.
#
# Environment: JOBS (parallel build jobs, default 2), PACK_DIR (default .gpu), BUILD_DIR
# (default build-gpu; `build` reuses the main build, which has CUDA on wherever nvcc is).
set -euo pipefail
cd "$(dirname "$0")/.."

jobs=${JOBS:-2}
pack=${PACK_DIR:-.gpu}
build=${BUILD_DIR:-build-gpu}
stage="$build/pack"  # bin/ and lib/ before compression

# Every pipetrain_test(...) or pipetrain_binaries_test(...) call in the tests' CMake
# files whose LABELS include gpu.
mapfile -t test_cmake_files < <(find tests -name CMakeLists.txt -not -path 'tests/fuzz/*' | sort)
gpu_tests=$(awk '
  /pipetrain_(binaries_)?test\(/ { call = ""; inside = 1 }
  inside { call = call " " $0 }
  inside && /\)/ {
    inside = 0
    if (call ~ /LABELS[^)]*[ ]gpu([ )]|$)/) {
      sub(/.*pipetrain_(binaries_)?test\([ ]*/, "", call); split(call, w, /[ ]+/); print w[1]
    }
  }' "${test_cmake_files[@]}")
if [[ -z "$gpu_tests" ]]; then
  echo "gpu-pack: found no test labelled gpu in tests/**/CMakeLists.txt" >&2
  exit 1
fi
# The backend conformance suite runs in the CPU suite too (its cuda cases skip there),
# so it carries no gpu label; on the GPU machine its cuda cases are the point.
gpu_tests+=$'\n'backend_conformance_test
# Likewise generation's key-value cache decoder: its cuda case checks the cached logits
# (Copy2D, Softmax on the device) against the full forward.
gpu_tests+=$'\n'kv_cache_decoder_test
echo "gpu-pack: gpu tests: ${gpu_tests//$'\n'/ }"
# cuda_cluster_test starts the real binaries (PIPETRAIN_BIN_DIR points it at the pack's).
programs="pipetrain pipetrain-coordinator pipetrain-stage pipetrain-bench"

cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DPIPETRAIN_WITH_CUDA=ON
# shellcheck disable=SC2086
cmake --build "$build" -j "$jobs" --target $programs $gpu_tests

rm -rf "$stage" "$pack"
mkdir -p "$stage/bin" "$stage/lib" "$pack"
bins=()
for t in $gpu_tests $programs; do
  cp "$build/bin/$t" "$stage/bin/"
  bins+=("$stage/bin/$t")
done

# Shared libraries from ldd (it lists the transitive ones too), minus what the GPU
# machine brings itself: the CUDA toolkit (same version there) and the C/C++ runtime.
is_system_lib() {
  case "$(basename "$1")" in
    linux-vdso.so*|ld-linux*.so*|libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*| \
    libstdc++.so*|libgcc_s.so*|libcuda.so*) return 0 ;;
  esac
  case "$1" in
    /usr/local/cuda*|*/cuda/*|*/cuda-[0-9]*) return 0 ;;
  esac
  return 1
}
missing=0
while read -r name arrow path _; do
  if [[ "$arrow" == "=>" && "$path" == "not" ]]; then
    echo "gpu-pack: $name is not found here" >&2
    missing=1
    continue
  fi
  [[ "$arrow" == "=>" && -f "$path" ]] || continue
  is_system_lib "$path" && continue
  cp -L "$path" "$stage/lib/$name"
done < <(ldd "${bins[@]}" | grep '=>' | sort -u)
[[ $missing == 0 ]] || exit 1

# Symbols are not needed to run; they are most of the size.
strip --strip-unneeded "$stage"/bin/* "$stage"/lib/* 2>/dev/null || true
tar -C "$stage" -czf "$pack/gpu-pack.tar.gz" bin lib

echo "gpu-pack: binaries: $(cd "$stage/bin" && echo *)"
echo "gpu-pack: libraries: $(find "$stage/lib" -mindepth 1 -maxdepth 1 | wc -l), $(du -sm "$stage" | cut -f1) MiB unpacked"
size_mib=$(du -sm "$pack" | cut -f1)
echo "gpu-pack: $pack/gpu-pack.tar.gz makes $pack ${size_mib} MiB (the device tool carries at most 64 MiB with the tree)"
if (( size_mib > 60 )); then
  echo "gpu-pack: $pack is over 60 MiB; the device tool may refuse it" >&2
  exit 1
fi
echo "gpu-pack: next: the device tool's run with carry [\"$pack\"] and command 'bash bench/gpu.sh'"
