#!/usr/bin/env bash
# Build the quantize probe in several variants at once, then run each.
cd "$(dirname "$0")/.." 2>/dev/null || true
NV=${NVCC:-/usr/local/cuda/bin/nvcc}
declare -A V=(
  [A_pipe0_min4]="-DCYGEMM_Q_PIPE=0 -DCYGEMM_Q_MIN=4 -DCYGEMM_Q_BLOCKS_MIN=3"
  [B_pipe0_min8]="-DCYGEMM_Q_PIPE=0 -DCYGEMM_Q_MIN=8 -DCYGEMM_Q_BLOCKS_MIN=4"
  [C_pipe1_min2]="-DCYGEMM_Q_PIPE=1 -DCYGEMM_Q_MIN=2 -DCYGEMM_Q_BLOCKS_MIN=2"
  [D_pipe1_min3]="-DCYGEMM_Q_PIPE=1 -DCYGEMM_Q_MIN=3 -DCYGEMM_Q_BLOCKS_MIN=2"
  [E_pipe0_min8_t2]="-DCYGEMM_Q_PIPE=0 -DCYGEMM_Q_MIN=8 -DCYGEMM_Q_BLOCKS_MIN=4 -DCYGEMM_Q_TILE_LOADS=2"
  [F_pipe1_min4_t2]="-DCYGEMM_Q_PIPE=1 -DCYGEMM_Q_MIN=4 -DCYGEMM_Q_BLOCKS_MIN=2 -DCYGEMM_Q_TILE_LOADS=2"
)
for k in "${!V[@]}"; do
  $NV -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -Icygemm/include -Icygemm ${V[$k]} -Xptxas -v \
      benchmarks/quantize_probe.cu -o /tmp/probe_$k > /tmp/probe_$k.ptxas 2>&1 &
done
wait
for k in $(echo "${!V[@]}" | tr ' ' '\n' | sort); do
  echo "== $k: ${V[$k]}  (spill bytes, bf16 kernels: $(grep -A2 'nv_bfloat16' /tmp/probe_$k.ptxas | grep -o '[0-9]* bytes spill stores' | awk '{s+=$1} END {print s+0}'))"
  /tmp/probe_$k || echo "failed"
done
