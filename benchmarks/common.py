"""Timing and reporting shared by the benchmark scripts (CUDA events, medians, environment)."""
import datetime
import json
import os
import statistics
import subprocess
import time


def environment(cp):
    import cygemm
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    v = cygemm.versions()
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": props["name"].decode() if isinstance(props["name"], bytes) else props["name"],
        "driver": nvidia_smi("driver_version"),
        "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(),
        "cuda_driver_api": cp.cuda.runtime.driverGetVersion(),
        "cublasLt": v["cublasLt"],
        "cupy": cp.__version__,
        "clocks_sm_mem_mhz": nvidia_smi("clocks.sm,clocks.mem"),
        "CUPY_TF32": os.environ.get("CUPY_TF32"),
    }


def nvidia_smi(query):
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip()
    except Exception as exc:  # absent tool: recorded, not fatal
        return f"unavailable ({exc})"


def host_us_per_call(fn, sync, calls=5000, reps=7, warmup=300):
    """Wall time per call over `calls` back-to-back calls with one sync at the end; median of reps."""
    for _ in range(warmup):
        fn()
    sync()
    per = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        per.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(per), min(per), max(per)


def interleaved_host_us(exe, ours, sync, rounds=5):
    """Host us/call of the C++ floor (program `exe`, argument "host") and of each of `ours`
    (name -> fn), measured in alternating rounds so that both see the same machine state.
    Returns {floor case: [per-round us]}, {name: [per-round us]}."""
    floors, mine = {}, {name: [] for name in ours}
    for _ in range(rounds):
        for r in run_floor(exe, "host"):
            floors.setdefault((r["case"], r.get("math")), []).append(r["us"])
        for name, fn in ours.items():
            mine[name].append(host_us_per_call(fn, sync, calls=3000, reps=3)[0])
    return floors, mine


def gpu_ms(cp, fn, stream, reps=20, warmup=3):
    """CUDA-event time of fn() on `stream`; median (min, max) of reps after warm-up."""
    for _ in range(warmup):
        fn()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for _ in range(reps):
        start.record(stream)
        fn()
        end.record(stream)
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end))
    return statistics.median(times), min(times), max(times)


def build_floor(src, exe):
    """Compile the C++ cuBLAS floor program with the toolkit and cuBLAS cygemm was built with."""
    from cygemm import _build_config as cfg
    nvcc = os.path.join(os.path.dirname(cfg.CUDA_INCLUDE), "bin", "nvcc")
    names = sorted(os.listdir(cfg.CUBLAS_LIB), key=len)
    libs = [f"-l:{next(n for n in names if n.startswith(p))}" for p in ("libcublas.so", "libcublasLt.so")]
    cmd = [nvcc, "-O2", "-std=c++17", src, "-o", exe, f"-I{cfg.CUBLAS_INCLUDE}", f"-L{cfg.CUBLAS_LIB}",
           *libs, f"-Xlinker=-rpath={cfg.CUBLAS_LIB}"]
    subprocess.run(cmd, check=True)
    return exe


def run_floor(exe, *args):
    out = subprocess.run([exe, *args], capture_output=True, text=True, check=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]
