#!/usr/bin/env bash
# On a GPU machine: the large-GEMM benchmark sections once per CYGEMM_TUNING_MODE, each in
# its own process (tuning happens once per process), then cygemm's ratio to the fastest other
# contender per case under each mode. Results and logs in DIR (default $OUT).
#   bash scripts/compare_tuning_modes.sh [DIR] [MODES]     (MODES default: cold,sustained)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-${OUT:-out}}
MODES=${2:-cold,sustained}
mkdir -p "$OUT_DIR"
if ls .whl/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl > /dev/null 2>&1 && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export CYGEMM_CUDA_ARCHS=${CYGEMM_CUDA_ARCHS:-90}
python3 -m pip install --no-build-isolation --no-deps -e . > "$OUT_DIR/build.log" 2>&1 || { tail -30 "$OUT_DIR/build.log"; exit 1; }
for mode in ${MODES//,/ }; do
    echo "== $mode"
    CYGEMM_TUNING_MODE=$mode python3 -m benchmarks --only square,shapes,transposes,batched \
        --out "$OUT_DIR/$mode" > "$OUT_DIR/$mode.log" 2>&1 || tail -20 "$OUT_DIR/$mode.log"
done
python3 - "$OUT_DIR" ${MODES//,/ } <<'PY'
import json, statistics, sys
out, modes = sys.argv[1], sys.argv[2:]
def ratios(mode):
    rows = json.load(open(f"{out}/{mode}/bench.json"))["rows"]
    cases = {}
    for r in rows:
        if r["metric"] == "gpu_ms" and not r.get("floor"):
            cases.setdefault(r["case"], []).append(r)
    got = {}
    for case, rs in cases.items():
        if case.startswith("square") and int(case.split()[1].split("^")[0]) < 1024:
            continue
        ours = [r["value"] for r in rs if r["contender"].startswith("cygemm")]
        other = [r["value"] for r in rs if not r["contender"].startswith("cygemm")]
        if ours and other:
            got[case] = min(other) / min(ours)
    return got
res = {m: ratios(m) for m in modes}
for m, g in res.items():
    v = sorted(g.values())
    print(f"{m:10s} cases {len(v)} median {statistics.median(v):.4f} min {v[0]:.3f} below0.99 {sum(x < 0.99 for x in v)}")
for case in res[modes[0]]:
    print(f"{case:45s} " + " ".join(f"{res[m].get(case, float('nan')):.3f}" for m in modes))
PY
