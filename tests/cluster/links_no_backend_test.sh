#!/usr/bin/env bash
# Fails if the binary given links a compute backend's library (oneDNN, OpenBLAS,
# cuBLAS, cudart), as `ldd` lists them; prints what it found. CTest runs it on
# pipetrain-coordinator, which must plan and drive jobs from common/model alone.
set -euo pipefail
binary=${1:?usage: links_no_backend_test.sh BINARY}
[[ -x $binary ]] || { echo "not an executable: $binary" >&2; exit 2; }
libs=$(ldd "$binary")
# Sanity: ldd must have read the binary (it links gRPC, so the list is never empty).
grep -q 'libgrpc++' <<<"$libs" || { echo "ldd listed no libgrpc++ for $binary:"; echo "$libs"; exit 1; }
if found=$(grep -Ei 'libdnnl|libopenblas|libblas|libcublas|libcudart' <<<"$libs"); then
  echo "$binary links a compute backend's libraries:"
  echo "$found"
  exit 1
fi
echo "$(basename "$binary") links none of oneDNN, OpenBLAS, BLAS, cuBLAS, cudart"
