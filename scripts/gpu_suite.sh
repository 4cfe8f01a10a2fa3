#!/usr/bin/env bash
# On a GPU machine, in one call: build cygemm, run the whole test suite (GPU tests
# included), compute-sanitizer over the kernel tests, and the benchmark suite.
# Results go to DIR (default: $OUT, else ./out); the logs are packed into DIR/logs.tar.gz
# (the device tool brings back only a few files).
#   bash scripts/gpu_suite.sh [DIR] [STAGES]
# TESTS: the test paths (default: tests); TEST_TIMEOUT: seconds the tests may take (default: no limit). STAGES: a comma list of tests, firstcall, compare, sanitize, peer, probe, bench, bench-quick, bench-host
# (default tests,sanitize,bench); BENCH_ONLY=a,b limits the benchmark sections. firstcall: the first-call, plan-count and thread-stall
# measurements (their tests, with their printed figures); probe: the small-matrix kernel's launch
# shapes against cuBLAS (benchmarks/small_batched_probe.cu; PROBE: its parts, default all) into
# DIR/small_batched_probe.txt, with its rows as JSON; compare: this tree against
# COMPARE_WITH (default 9579766) and this tree again built beside it, interleaved (benchmarks/compare_builds.py).
# The GPU property tests run CYGEMM_GPU_PROPERTY_EXAMPLES examples each (default here 500).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-${OUT:-out}}
STAGES=",${2:-tests,sanitize,bench},"
mkdir -p "$OUT_DIR"
LOGS=$(mktemp -d)
trap 'tar -czf "$OUT_DIR/logs.tar.gz" -C "$LOGS" . 2>/dev/null' EXIT
export PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_PREALLOCATE=false     # JAX shares the GPU with CuPy and torch in the tests
export CYGEMM_GPU_PROPERTY_EXAMPLES=${CYGEMM_GPU_PROPERTY_EXAMPLES:-500}
export CYGEMM_CUDA_ARCHS=${CYGEMM_CUDA_ARCHS:-90}   # the device is an H200; one arch builds fastest
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)

{ date -u; nvidia-smi; python3 -c "import sys, cupy; print(sys.version); print('cupy', cupy.__version__)";
  python3 -m pip list 2>/dev/null | grep -iE "^(cupy|cuda-pathfinder|nvidia-cublas|setuptools|cython|torch|numpy) "; } \
    > "$LOGS/env.txt" 2>&1
# Wheels carried in .whl/ (nvmath-python for the benchmarks: the image lacks it).
if ls .whl/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl > "$LOGS/wheels.log" 2>&1 && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
echo "== build"
if ! { python3 setup.py build_ext --inplace -j "$(nproc)" && python3 -m pip install --no-build-isolation --no-deps -e .; } \
        > "$LOGS/build.log" 2>&1; then
    tail -40 "$LOGS/build.log"; exit 1
fi
status=0
if [[ $STAGES == *,tests,* ]]; then
    echo "== tests"
    timeout "${TEST_TIMEOUT:-0}" python3 -m pytest -q -rs -p no:cacheprovider --durations=12 ${TESTS:-tests} 2>&1 | tee "$LOGS/tests.log" \
        | grep -vE '^[.sF]+ *(\[ *[0-9]+%\])?$' | tail -60
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
    echo "== the Cython consumer example, as the README builds and runs it"
    if (cd examples/cython_consumer && python3 -m pip install -q --no-build-isolation --no-deps . \
            > "$LOGS/consumer.log" 2>&1 && cd /tmp && python3 "$OLDPWD/check.py"); then :; else
        tail -20 "$LOGS/consumer.log"; status=1
    fi
fi
if [[ $STAGES == *,firstcall,* ]]; then
    echo "== first calls, plan count, thread stalls (figures printed by their tests)"
    python3 -m pytest -q -s -p no:cacheprovider tests/engine/test_plans.py tests/engine/test_tuning.py \
        -k "bounded or second_process or stalls or appended" 2>&1 | tee "$LOGS/firstcall.log" \
        | grep -E "plans after|first call ms|first forward_into|passed|failed|Error" | tail -20
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
if [[ $STAGES == *,compare,* ]]; then
    echo "== this tree against ${COMPARE_WITH:-9579766}, interleaved"
    # (this tree built a second time joins the rounds: the A/A ratio says what the method reads)
    if git rev-parse --git-dir > /dev/null 2>&1; then git ls-files -z cygemm setup.py include | tar --null -T - -cf /tmp/cygemm_same.tar
    else tar --exclude='*.so' --exclude='*.c' --exclude='*.cpp' --exclude=__pycache__ -cf /tmp/cygemm_same.tar cygemm setup.py include; fi
    if bash scripts/build_renamed.sh "${COMPARE_WITH:-9579766}" /tmp/cygemm_old > "$LOGS/compare_build.log" 2>&1 &&
            bash scripts/build_renamed.sh /tmp/cygemm_same.tar /tmp/cygemm_same cygemm_same >> "$LOGS/compare_build.log" 2>&1; then
        PYTHONPATH=/tmp/cygemm_old:/tmp/cygemm_same${PYTHONPATH:+:$PYTHONPATH} python3 -m benchmarks.compare_builds --out "$OUT_DIR" \
            2>&1 | tee "$LOGS/compare.log" | tail -30
        [ "${PIPESTATUS[0]}" = 0 ] || status=1
    else
        tail -20 "$LOGS/compare_build.log"; status=1
    fi
fi
if [[ $STAGES == *,sanitize,* ]]; then
    # Our kernels run in every fused forward/backward test (and in the graph tests); the
    # long-running reliability tests (64-bit sizes, soak, replays, threads, properties)
    # are left out. racecheck looks at shared memory, which the backward's column sum, the
    # transposed FP8 quantize kernels and the small-matrix kernel (its staging, both stages'
    # buffers) use. On the H200: 405 tests in 24 s under memcheck, 169 in 24 s under racecheck
    # (before the small-matrix kernel's layouts joined both). The MoE tests with offsets on the
    # GPU run under memcheck too: cygemm's table kernel and cuBLASLt's grouped matmul it feeds.
    MEMCHECK_K='not past_int32 and not soak and not 10k and not threads and not property and not digits'
    RACECHECK_K='backward'
    echo "== compute-sanitizer memcheck"
    timeout 300 "$SAN" --tool memcheck --error-exitcode 99 --print-limit 20 \
        python3 -m pytest -q -p no:cacheprovider tests/dense/test_layer.py tests/properties/test_reliability.py tests/engine/test_graph.py \
        tests/dense/test_elementwise.py tests/fp8/test_scaled.py tests/fp8/test_scales.py \
        tests/engine/test_small_batched.py tests/grouped/test_moe.py tests/grouped/test_lt_grouped.py \
        "tests/engine/test_streams_devices.py::test_one_row_out_and_z_out_of_row_stride_0_or_1" \
        "tests/engine/test_streams_devices.py::test_graph_replayed_on_another_stream_while_eager_work_runs_on_the_capture_stream" \
        "tests/engine/test_streams_devices.py::test_per_head_results_written_into_one_interleaved_buffer" \
        -k "$MEMCHECK_K" \
        > "$LOGS/memcheck.log" 2>&1
    rc=$?; grep -E "ERROR SUMMARY|passed|failed" "$LOGS/memcheck.log" | tail -3; echo "memcheck rc=$rc"
    [ $rc = 0 ] || status=1
    echo "== compute-sanitizer racecheck"
    timeout 200 "$SAN" --tool racecheck --error-exitcode 99 --print-limit 20 \
        python3 -m pytest -q -p no:cacheprovider tests/dense/test_layer.py -k "$RACECHECK_K" \
        > "$LOGS/racecheck.log" 2>&1 &&
    timeout 200 "$SAN" --tool racecheck --error-exitcode 99 --print-limit 20 \
        python3 -m pytest -q -p no:cacheprovider tests/fp8/test_scales.py -k "definitions" \
        >> "$LOGS/racecheck.log" 2>&1 &&
    timeout 300 "$SAN" --tool racecheck --error-exitcode 99 --print-limit 20 \
        python3 -m pytest -q -p no:cacheprovider tests/engine/test_small_batched.py -k "layouts and float32" \
        >> "$LOGS/racecheck.log" 2>&1
    rc=$?; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|passed|failed" "$LOGS/racecheck.log" | tail -3; echo "racecheck rc=$rc"
    [ $rc = 0 ] || status=1
fi
if [[ $STAGES == *,peer,* ]]; then
    # CuPy's own gemm and matmul tests with the calls routed to cygemm (CuPy's files: copy
    # ../shared/peer/cupy-v14.2.0 into the ignored peer/ and carry it to the GPU machine).
    echo "== CuPy's tests routed to cygemm"
    bash scripts/peer_suites.sh "${PEER_DIR:-peer/cupy-v14.2.0}" "$LOGS" || status=1
fi
if [[ $STAGES == *,probe,* ]]; then
    echo "== the small-matrix kernel's launch shapes (probe)"
    # shellcheck disable=SC2086
    if bash scripts/small_batched_probe.sh ${PROBE:-all} > "$OUT_DIR/small_batched_probe.txt" 2> "$LOGS/probe.err"; then
        started=$(sed -n 's/^started \(....-..-..T..:..\).*/\1/p' "$OUT_DIR/small_batched_probe.txt")
        python3 benchmarks/probe_table.py "$OUT_DIR/small_batched_probe.txt" --json "$OUT_DIR/small_batched_probe.json" \
            --date "$started" || status=1
        grep -E "^GPU|started|best" "$OUT_DIR/small_batched_probe.txt" | tail -40
    else
        tail -20 "$LOGS/probe.err" "$OUT_DIR/small_batched_probe.txt"; status=1
    fi
fi
if [[ $STAGES == *,bench,* || $STAGES == *,bench-quick,* || $STAGES == *,bench-host,* ]]; then
    echo "== benchmarks"
    quick=""; [[ $STAGES == *,bench-quick,* ]] && quick="--quick"
    [[ $STAGES == *,bench-host,* ]] && quick="--only host"
    [[ -n ${BENCH_ONLY:-} ]] && quick="$quick --only $BENCH_ONLY"      # e.g. BENCH_ONLY=fp8,grouped
    CUBLASLT_LOG_LEVEL=1 python3 -m benchmarks --out "$OUT_DIR" $quick 2>&1 | tee "$LOGS/bench.log" \
        | grep -v '^\s*\[' | tail -60
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
exit $status
