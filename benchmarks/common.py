"""Timing, the C++ floor and the environment record shared by the benchmark suite."""
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
L2_BYTES = 50 << 20          # H100/H200 L2; below it several operand sets are rotated


def environment(cp, extra=None):
    import cygemm
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    name = props["name"]
    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": name.decode() if isinstance(name, bytes) else name,
        "driver": nvidia_smi("driver_version"),
        "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(),
        "cuda_driver_api": cp.cuda.runtime.driverGetVersion(),
        "cublasLt": cygemm.versions()["cublasLt"],
        "cupy": cp.__version__,
        "python": sys.version.split()[0],
        "CUPY_TF32": os.environ.get("CUPY_TF32"),
    }
    env.update(extra or {})
    return env


def nvidia_smi(query):
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip()
    except Exception as exc:  # absent tool: recorded, not fatal
        return f"unavailable ({exc})"


def clocks():
    return nvidia_smi("clocks.sm,clocks.mem,clocks.max.sm,temperature.gpu,power.draw")


_SPIN_SRC = r"""
extern "C" __global__ void spin(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}
"""
_spin = None


def spin(cp, stream, us):
    """Keep the GPU busy for `us` microseconds on `stream` (a one-thread sleeping kernel)."""
    global _spin
    if _spin is None:
        _spin = cp.RawKernel(_SPIN_SRC, "spin")
    _spin((1,), (1,), (cp.uint64(int(us * 1000)),), stream=stream)


def gpu_ms(cp, calls, stream, inner=1, reps=30, warmup=3, warm_s=0.05):
    """CUDA-event time per call: `inner` calls (cycling through `calls`, a list of
    zero-argument callables over rotated operand sets) between two events on `stream`.
    A sleeping kernel queued first holds the GPU while the host enqueues the events and
    the calls, so that the time is the GPU's alone: no launch gaps, whatever the caller's
    host overhead (measured apart, by host_us). Returns (median, min, max) over reps."""
    if callable(calls):
        calls = [calls]
    n = len(calls)
    # Warm-up: at least `warmup` calls and warm_s seconds, so that clocks have ramped up.
    t0, i = time.perf_counter(), 0
    while i < max(warmup, n) or time.perf_counter() - t0 < warm_s:
        calls[i % n]()
        i += 1
        if i % 8 == 0:
            stream.synchronize()
    stream.synchronize()
    # Host time to enqueue `inner` calls, measured: the sleep must outlast it.
    t1 = time.perf_counter()
    for j in range(inner):
        calls[j % n]()
    enqueue_us = (time.perf_counter() - t1) * 1e6
    stream.synchronize()
    sleep_us = min(20000.0, 2 * enqueue_us + 50)
    start, end = cp.cuda.Event(), cp.cuda.Event()
    times, j = [], 0
    for _ in range(reps):
        spin(cp, stream, sleep_us)
        start.record(stream)
        for _ in range(inner):
            calls[j % n]()
            j += 1
        end.record(stream)
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end) / inner)
    return statistics.median(times), min(times), max(times)


def host_us(fn, sync, calls=3000, reps=3, warmup=300):
    """Wall time per call over `calls` back-to-back calls with one sync at the end."""
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
    return statistics.median(per)


def build_floor(exe):
    """Compile cublas_floor.cu with the toolkit and cuBLAS cygemm was built with; start it."""
    from cygemm.bindings import cuda_paths as _cuda_paths
    nvcc = _cuda_paths.find_nvcc()
    libs = _cuda_paths.load_cublas()          # the very files cygemm runs on
    lib_dir = os.path.dirname(libs["cublas"])
    arch = os.environ.get("CYGEMM_CUDA_ARCHS", "90").split(";")[0]
    cmd = [nvcc, "-O2", "-std=c++17", f"-arch=sm_{arch}", os.path.join(HERE, "cublas_floor.cu"), "-o", exe,
           f"-I{_cuda_paths.header_dir('cublas')}", f"-L{lib_dir}", "-l:libcublas.so.13",
           "-l:libcublasLt.so.13", f"-Xlinker=-rpath={lib_dir}"]
    subprocess.run(cmd, check=True)
    return Floor(exe)


class Floor:
    """The C++ floor as a persistent process: a case line in, its value out, so that the
    suite can interleave the floor with the Python contenders, round by round."""

    def __init__(self, exe):
        self.proc = subprocess.Popen([exe], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)

    def __call__(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        out = self.proc.stdout.readline()
        if not out.startswith("{"):
            raise RuntimeError(f"cublas_floor failed on {line!r} (exit {self.proc.poll()})")
        return json.loads(out).get("value")

    def free(self):
        self("free")

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def run_floor(floor, lines):
    """{line: value} for several case lines ("gemm 64 64 64 tf32 0 0 host")."""
    return {line: floor(line) for line in lines}


def write_probe_results(path, rows):
    """A probe's rows as JSON, with the date, the GPU and cygemm's versions (the probes run
    outside the suite's recorder: ktail_cost, batch_invariant_cost)."""
    import cupy as cp
    import cygemm
    with open(path, "w") as f:
        json.dump({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "versions": cygemm.versions(),
                   "gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "rows": rows}, f, indent=1)
