#!/usr/bin/env bash
# Times cygemm's FP8 quantize kernels from C++ against a copy (benchmarks/quantize_probe.cu), on
# the GPU machine: bash scripts/quantize_probe.sh ["-DNAME=VALUE ..." ...]. Each argument is one
# variant's extra nvcc flags (none: the kernels as they are); the variants build in parallel.
set -uo pipefail
cd "$(dirname "$0")/.."
NV=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[ $# -eq 0 ] && set -- ""
i=0
for flags in "$@"; do
    $NV -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -Iinclude -Icygemm $flags \
        benchmarks/quantize_probe.cu -o /tmp/quantize_probe_$i > /tmp/quantize_probe_$i.log 2>&1 &
    i=$((i + 1))
done
wait
i=0
for flags in "$@"; do
    echo "== variant $i: ${flags:-(as built)}"
    /tmp/quantize_probe_$i || { tail -5 /tmp/quantize_probe_$i.log; echo "failed"; }
    i=$((i + 1))
done
