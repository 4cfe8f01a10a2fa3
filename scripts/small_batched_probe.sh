#!/usr/bin/env bash
# Build benchmarks/small_batched_probe.cu against the cuBLAS cygemm loads and run it:
#   bash scripts/small_batched_probe.sh [float32|float16|bfloat16|float64|complex|layouts|all ...]
set -euo pipefail
cd "$(dirname "$0")/.."
read -r NVCC INC LIB < <(python3 -c "
import os
from cygemm.bindings import cuda_paths as c
print(c.find_nvcc(), c.header_dir('cublas'), os.path.dirname(c.load_cublas()['cublas']))")
EXE=$(mktemp -d)/small_batched_probe
"$NVCC" -O3 -std=c++17 -arch=sm_${CYGEMM_CUDA_ARCHS:-90} benchmarks/small_batched_probe.cu -o "$EXE" \
    -Iinclude -I"$INC" -L"$LIB" -l:libcublas.so.13 -Xlinker=-rpath="$LIB"
for which in "${@:-all}"; do "$EXE" "$which"; done
