"""cygemm's benchmark suite: cygemm against cp.matmul, PyTorch, nvmath-python and a C++
cuBLAS floor, in one process and one run.

    python -m benchmarks [--out DIR] [--quick] [--only host,square,...]

Writes DIR/bench.json (every measurement and the environment), DIR/RESULTS.md and
DIR/*.png (regenerate both from the JSON with `python -m benchmarks.report DIR`), and
prints the ratios that matter last. GPU times: CUDA events after warm-up, median of
repeats; host times: wall time per call over thousands of back-to-back calls, one sync.
Progress: a line per step, with the seconds so far and the section's number among those run,
e.g. ``[  12.3s] section 3/15, step 4: square: square 1024^3 tf32``.

This module is the command line only; each section lives in its own module (SECTIONS).
"""
import os

os.environ.setdefault("CUPY_TF32", "1")    # cp.matmul's float32 default is TF32, as cygemm's

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import cupy as cp  # noqa: E402

import cygemm  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import contenders as C  # noqa: E402
import cuda_graph  # noqa: E402
import dense  # noqa: E402
import fp8_scales  # noqa: E402
import gemms  # noqa: E402
import hopper  # noqa: E402
import moe  # noqa: E402
import host  # noqa: E402
import matmul_section  # noqa: E402
import reproducibility  # noqa: E402
import small_batched  # noqa: E402
import training  # noqa: E402
import wide_dtypes  # noqa: E402
from common import build_floor, clocks, environment  # noqa: E402
from recorder import Recorder  # noqa: E402

# Every section, in the order they run: name -> function(R, s, floor). "host" runs in two
# halves: host_section (this entry) before torch is imported, host_section_late at its turn.
SECTIONS = {
    "host": host.host_section,
    "ceilings": gemms.ceilings_section,
    "square": gemms.square_section,
    "shapes": gemms.shapes_section,
    "transposes": gemms.transposes_section,
    "batched": gemms.batched_section,
    "matmul": matmul_section.matmul_section,
    "fused": dense.fused_section,
    "mlp": dense.mlp_section,
    "graph": cuda_graph.graph_section,
    "train": training.train_section,
    "backend": training.backend_section,
    "fp8": hopper.fp8_section,
    "fp8_scales": fp8_scales.fp8_scales_section,
    "grouped": hopper.grouped_section,
    "moe": moe.moe_section,
    "elementwise": hopper.elementwise_section,
    "determinism": reproducibility.determinism_section,
    "dtypes": wide_dtypes.dtypes_section,
    "small_batched": small_batched.small_batched_section,
}


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="cygemm against cp.matmul, PyTorch, nvmath-python and a C++ cuBLAS floor, in one "
                    "process and one run. Needs a GPU, CuPy and nvcc; torch and nvmath-python are used "
                    "when importable.")
    ap.add_argument("--out", default=os.environ.get("OUT") or "benchmark-results",
                    help="folder for bench.json, RESULTS.md and the plots (default: ./benchmark-results; "
                         "the committed results are in benchmarks/results)")
    ap.add_argument("--quick", action="store_true", help="a run under a minute: fewer sizes and rounds")
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"comma list of {list(SECTIONS)}")
    args = ap.parse_args(argv)
    reason = cygemm.gpu_unavailable_reason()
    if reason:
        ap.exit(1, f"python -m benchmarks needs a GPU: {reason}\n")
    only = [x for x in args.only.split(",") if x]
    bad = set(only) - set(SECTIONS)
    if bad:
        ap.error(f"--only: unknown sections {sorted(bad)}; expected some of {list(SECTIONS)}")
    os.makedirs(args.out, exist_ok=True)
    R = Recorder(args.quick)
    clocks_before = clocks()
    order = [name for name in SECTIONS if name in only]      # numbered in the progress lines
    R.start("setup")
    R.progress("building the C++ floor")
    floor = R.floor = build_floor(os.path.join(tempfile.mkdtemp(), "cublas_floor"))
    s = cp.cuda.Stream(non_blocking=True)
    late = None
    if "host" in only:      # before torch is imported: its threads made host timings noisier
        R.start("host", order.index("host") + 1, len(order))
        late = SECTIONS["host"](R, s, floor)
    R.start("setup")
    R.progress("importing torch and nvmath-python")
    C.import_optional()
    interrupted = None
    try:
        for name, section in SECTIONS.items():
            if name not in only:
                continue
            R.start(name, order.index(name) + 1, len(order))
            if name == "host":      # its second half: the contenders that need torch / nvmath
                host.host_section_late(R, s, floor, *late)
            else:
                section(R, s, floor)
    except KeyboardInterrupt:       # (SIGINT, as `timeout -s INT` sends): what was measured is kept
        interrupted = R.section
        print(f"interrupted in {interrupted}: writing the rows measured so far", flush=True)
    env = environment(cp, dict(C.versions(), clocks_before=clocks_before, clocks_after=clocks(),
                               quick=args.quick, sections=only, seconds=round(time.time() - R.t0, 1),
                               interrupted=interrupted))
    floor.close()
    path = os.path.join(args.out, "bench.json")
    with open(path, "w") as f:
        json.dump({"environment": env, "rows": R.rows, "tuning": cygemm.tuning.tuning_entries()}, f, indent=1)
    R.start("report")
    R.progress(f"wrote {path}")
    import report
    report.write(args.out)


if __name__ == "__main__":
    main()
