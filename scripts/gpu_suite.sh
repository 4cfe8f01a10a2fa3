#!/usr/bin/env bash
# On a GPU machine, in one call: build cygemm, run the whole test suite (GPU tests
# included) and the benchmarks. Logs and results go to $1 (default: $OUT, else ./out).
#   bash scripts/gpu_suite.sh [DIR] [--quick]   (--quick: tests only)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-${OUT:-out}}
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1
export CYGEMM_CUDA_ARCHS=${CYGEMM_CUDA_ARCHS:-90}   # the device is an H200; one arch builds fastest

{ date -u; nvidia-smi; python3 -c "import sys, cupy; print(sys.version); print('cupy', cupy.__version__)"; } \
    > "$OUT_DIR/env.txt" 2>&1
echo "== build"
if ! python3 -m pip install --no-build-isolation --no-deps -e . > "$OUT_DIR/build.log" 2>&1; then
    tail -40 "$OUT_DIR/build.log"; exit 1
fi
echo "== tests"
python3 -m pytest -q -rs -p no:cacheprovider tests 2>&1 | tee "$OUT_DIR/tests.log" | grep -vE '^\.+|^s+' | tail -40
status=${PIPESTATUS[0]}
if [ "${2:-}" != "--quick" ]; then
    echo "== benchmarks"
    for b in gemm fused; do
        CUBLASLT_LOG_LEVEL=1 python3 benchmarks/bench_$b.py --out "$OUT_DIR" > "$OUT_DIR/bench_$b.log" 2>&1 || { tail -30 "$OUT_DIR/bench_$b.log"; status=1; }
        sed -n "/^GPU /,\$p" "$OUT_DIR/bench_$b.log"
    done
fi
exit $status
