#!/usr/bin/env bash
# CuPy's own tests of cupy.cublas.gemm and cupy.matmul, run against cygemm (tests/peer/route_cupy.py
# routes the calls), on a GPU machine:
#   bash scripts/peer_suites.sh [PEER_DIR] [OUT_DIR]
# PEER_DIR: CuPy v14.2.0's test_cublas.py and test_matmul.py (default: peer/cupy-v14.2.0, an
# ignored folder: copy ../shared/peer/cupy-v14.2.0 there; CuPy's files stay out of the repo).
# Runs each file routed back to CuPy first (the routing's own check), then routed to cygemm; the
# gemm tests also with only their float32 calls routed. Logs: OUT_DIR/peer_*.log.
set -uo pipefail
cd "$(dirname "$0")/.."
PEER=${1:-peer/cupy-v14.2.0}
OUT_DIR=${2:-${OUT:-out}}
mkdir -p "$OUT_DIR"
export PYTHONPATH=tests/peer${PYTHONPATH:+:$PYTHONPATH}
status=0
run() {   # name, pytest arguments...
    local name=$1; shift
    python3 -m pytest -q -p route_cupy -p no:cacheprovider "$@" > "$OUT_DIR/peer_$name.log" 2>&1
    local rc=$?
    echo "$name: $(grep -E '^[0-9]+ (passed|failed)|passed|failed' "$OUT_DIR/peer_$name.log" | tail -1)"
    grep -A8 "route_cupy: calls" "$OUT_DIR/peer_$name.log" | grep -E "\->" | sed 's/^/    /'
    [ $rc = 0 ] || status=1
}
GEMM=(-k "TestGemmAndGeam and test_gemm")
run gemm_via_cupy --route cupy "$PEER/test_cublas.py" "${GEMM[@]}"
run gemm_float32_routed --route-dtypes f "$PEER/test_cublas.py" "${GEMM[@]}"
run gemm_all_routed "$PEER/test_cublas.py" "${GEMM[@]}"
run matmul_via_cupy --route cupy "$PEER/test_matmul.py"
run matmul_all_routed "$PEER/test_matmul.py"
exit $status
