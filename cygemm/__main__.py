"""python -m cygemm: a short self-check. Without a GPU it says so and checks the build only.

python -m cygemm info: what cygemm runs with (versions, libraries, GPUs, settings), for bug reports.
"""
import os
import sys
import time

import numpy as np

import cygemm


def _lt(lt):
    return f"{lt // 10000}.{lt // 100 % 100}.{lt % 100}"


def _verified_line(v):
    verified = ", ".join(_lt(x) for x in v["cublasLt_verified"])
    if v["cublasLt"] in v["cublasLt_verified"]:
        return f"cuBLAS verified: this release's promises were measured on cuBLASLt {verified}, the one loaded"
    return (f"cuBLAS not verified: this release was measured on cuBLASLt {verified}; the loaded {_lt(v['cublasLt'])} "
            "is checked at first use (the K-tail guard or its fix, batch_invariant, the grouped matmul), see the errors page")


_FEATURE_WORDS = {"grouped_gemm": "grouped GEMMs with the group sizes on the GPU",
                  "batch_invariance": "cuBLASLt's batch-invariance flag",
                  "stream_heuristic": "the stream-aware heuristic",
                  "ktail_fixed": "the split-K K-tail fix by NVIDIA's notes (confirmed at first use)"}


def _features_lines(v):
    """One line per feature of the loaded cuBLAS beyond 13.1: yes, or no and why."""
    return [f"  {_FEATURE_WORDS[name]}: " + ("yes" if f["usable"] else f"no: {f['why_not']}")
            for name, f in v["features"].items()]


def main():
    v = cygemm.versions()
    lt = v["cublasLt"]
    driver = f"driver supports CUDA {_version(v['cuda_driver'])}" if v["cuda_driver"] else "no driver found"
    print(f"cygemm {cygemm.__version__}: CUDA runtime {_version(v['cuda_runtime'])}, {driver}, "
          f"cuBLASLt {_lt(lt)} (python -m cygemm info: more). {_verified_line(v)}")
    print(f"What cuBLASLt {_lt(lt)} gives beyond 13.1:")
    print("\n".join(_features_lines(v)))
    reason = cygemm.gpu_unavailable_reason()
    if reason:
        print(f"No GPU here: {reason}. Checking what works without one (every GEMM needs a GPU):")
        ok = _check_without_gpu()
        print("self-check without a GPU", "passed" if ok else "FAILED")
        return 0 if ok else 1
    import cupy as cp
    n = cp.cuda.runtime.getDeviceCount()
    name = cp.cuda.runtime.getDeviceProperties(0)["name"]
    name = name.decode() if isinstance(name, bytes) else name
    print(f"GPU: {name} ({n} device(s)), CuPy {cp.__version__}")
    rng = np.random.default_rng()
    ok = True
    for dtype, math, bound in [("float32", "tf32", 2e-3), ("float32", "fp32", 1e-5), ("float16", "tf32", 1e-2)]:
        a = rng.standard_normal((257, 129)).astype(dtype)
        b = rng.standard_normal((129, 65)).astype(dtype)
        out = cp.full((257, 65), cp.nan, dtype)
        cygemm.gemm(cp.asarray(a), cp.asarray(b), out, math=math)
        ref = a.astype(np.float64) @ b.astype(np.float64)
        err = np.linalg.norm(out.get() - ref) / np.linalg.norm(ref)
        ok &= bool(err < bound)
        print(f"  gemm {dtype:8s} {math}: rel. error {err:.1e} (bound {bound:.0e}) {'ok' if err < bound else 'FAIL'}")
    a = rng.standard_normal((64, 33, 17)).astype(np.float32)
    b = rng.standard_normal((17, 9)).astype(np.float32)
    out = cygemm.gemm_strided_batched(cp.asarray(a), cp.asarray(b), math="fp32")
    err = np.linalg.norm(out.get() - a.astype(np.float64) @ b) / np.linalg.norm(a.astype(np.float64) @ b)
    ok &= bool(err < 1e-5)
    print(f"  gemm_strided_batched (B broadcast): rel. error {err:.1e} {'ok' if err < 1e-5 else 'FAIL'}")

    A, B, C = (cp.asarray(rng.standard_normal((64, 64)).astype(np.float32)) for _ in range(3))
    for name, fn in [("cygemm.gemm", lambda: cygemm.gemm(A, B, C)), ("cp.matmul", lambda: cp.matmul(A, B, out=C))]:
        for _ in range(200):
            fn()
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        for _ in range(3000):
            fn()
        cp.cuda.Device().synchronize()
        print(f"  64x64x64 float32, host time per call: {name:12s} {(time.perf_counter() - t0) / 3000 * 1e6:6.2f} us")
    print("self-check", "passed" if ok else "FAILED")
    return 0 if ok else 1


class _FakeDeviceArray:
    """A device array's description with no memory behind it: argument checks read only this."""

    def __init__(self, shape):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": "<f4", "data": (1 << 40, False),
                                         "version": 3, "strides": None}


# The subpackages of an optional dependency (their dependency's import name): checked where it
# is installed (the tests read this too).
OPTIONAL_MODULES = {"cygemm.autograd": "torch", "cygemm.jax": "jax"}


def _installed(name):
    import importlib.util
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _check_without_gpu():
    """Every compiled module loads, the include folders exist, and the row-major mapping and
    argument checks work on arrays described but never touched."""
    import importlib
    import importlib.util
    import pkgutil
    ok = True
    names = [m.name for m in pkgutil.walk_packages(cygemm.__path__, "cygemm.")
             if m.name != "cygemm.__main__"]
    # Modules of an optional dependency: checked where it is installed.
    optional = {name: dep for name, dep in OPTIONAL_MODULES.items() if not _installed(dep)}
    names = [n for n in names if not any(n == o or n.startswith(o + ".") for o in optional)]
    failed = []
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            failed.append(f"{name} ({exc})")
    ok &= not failed
    print(f"  {len(names) - len(failed)} of {len(names)} modules import" + (": failed " + ", ".join(failed) if failed else "")
          + "".join(f"; {name} not checked: needs {dep}, not installed" for name, dep in optional.items()))
    folders = cygemm.get_include()
    missing = [d for d in folders if not os.path.isdir(d)]
    ok &= not missing
    print(f"  get_include(): {len(folders)} folders" + (f", missing {missing}" if missing else ", all present"))
    a, b = _FakeDeviceArray((4, 3)), _FakeDeviceArray((3, 5))
    call = cygemm.describe_matmul(a, b)[0]
    mapped = (call["M"], call["N"], call["K"], call["swapped"], call["m"], call["n"]) == (4, 5, 3, True, 5, 4)
    ok &= mapped
    print(f"  describe_matmul (4, 3) @ (3, 5): M, N, K = {call['M']}, {call['N']}, {call['K']}; cuBLAS's "
          f"m, n = {call['m']}, {call['n']} (operands swapped) {'ok' if mapped else 'FAIL'}")
    try:
        cygemm.describe_matmul(a, _FakeDeviceArray((2, 5)))
        refused = "not refused"
    except ValueError as exc:
        refused = str(exc)
    named = refused.startswith("b:")
    ok &= named
    print(f"  shapes that do not multiply: {refused!r} {'ok' if named else 'FAIL'}")
    return ok


def _loaded_libraries(names):
    """Where the process loaded each shared library from (Linux: /proc/self/maps)."""
    found = {}
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1]
                base = os.path.basename(path)
                for name in names:
                    if base.startswith(f"lib{name}.so") and name not in found:
                        found[name] = path
    except OSError:
        pass
    return found


def _version(v):
    return f"{v // 1000}.{v % 1000 // 10}" if v else "none"


def _dist_version(name):
    import importlib.metadata
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def info(out=print):
    """Print cygemm's versions, the CUDA and cuBLAS it runs with, the GPUs and the settings
    that change what it does. Works without a GPU (and says so)."""
    from cygemm.bindings import cuda_paths as _cuda_paths
    from cygemm.engine import plans
    v = cygemm.versions()
    out(f"cygemm {cygemm.__version__} ({os.path.dirname(cygemm.__file__)})")
    out(f"python {sys.version.split()[0]}, numpy {np.__version__}")
    try:
        import cupy
        out(f"cupy {cupy.__version__} ({os.path.dirname(cupy.__file__)})")
    except ImportError as exc:
        out(f"cupy: not importable ({exc}); cygemm needs it only to allocate results and for stream=None")
    for module, dep in OPTIONAL_MODULES.items():     # (versions from the installed metadata: nothing imported)
        out(f"{dep} {_dist_version(dep) or 'not installed'} (for {module})")
    driver = f"driver supports CUDA {_version(v['cuda_driver'])}" if v["cuda_driver"] else "no driver found"
    out(f"CUDA runtime {_version(v['cuda_runtime'])} (linked statically into cygemm), {driver}")
    lt = v["cublasLt"]
    out(f"cuBLASLt {_lt(lt)} ({lt})")
    out(_verified_line(v))
    out(f"beyond 13.1 (device 0):")
    for line in _features_lines(v):
        out(line)
    libs = _loaded_libraries(["cublasLt", "cublas", "cuda"])
    for name in ("cublas", "cublasLt", "cuda"):
        where = libs.get(name) or _cuda_paths.LOADED.get(name) or "not loaded"
        out(f"  lib{name}: {where}")
    reason = cygemm.gpu_unavailable_reason()
    if reason:
        out(f"GPUs: none usable: {reason}")
    else:
        import cupy
        n = cupy.cuda.runtime.getDeviceCount()
        out(f"GPUs: {n}")
        for i in range(n):
            p = cupy.cuda.runtime.getDeviceProperties(i)
            name = p["name"].decode() if isinstance(p["name"], bytes) else p["name"]
            out(f"  {i}: {name}, sm_{p['major']}{p['minor']}, {p['totalGlobalMem'] / 2**30:.1f} GiB, "
                f"L2 {p['l2CacheSize'] / 2**20:.0f} MiB")
    from cygemm.engine import tuning
    from cygemm.engine import settings as _settings
    out("settings (cygemm.set_options; environment variables give the defaults):")
    out("  float32 math: TF32 by default (math='tf32'); math='fp32' is strict; math='cupy' "
        f"follows CUPY_TF32 (now {os.environ.get('CUPY_TF32', 'unset')})")
    try:
        opts = _settings.get_options()
    except ValueError as exc:
        out(f"  invalid: {exc}")
        return 1
    what = {"autotune": "how a large problem's algorithm and route are chosen: off, auto, exhaustive",
            "autotune_min_macs": "problems this large are timed once",
            "tuning_mode": "how candidates are timed: cold, hot or sustained",
            "tuning_cache": "the tuning file; None: kept in the process only",
            "max_stream_workspaces": "32 MiB cuBLAS workspaces per thread and device",
            "plan_cache_size": "plans kept per thread",
            "determinism": "reproducible results: off, run_to_run or batch_invariant",
            "batch_invariance": "how batch_invariant is kept: families, or cublas (cuBLASLt's own flag, 13.10)",
            "jax_command_buffers": "cygemm.jax's calls tell XLA they may go into its command buffers"}
    for name, value in opts.items():
        out(f"  {name} = {value!r} ({_settings._ENV[name]}; {what[name]})")
    out(f"  tuned problems in this process: {len(tuning.tuning_entries())}")
    return 0


def _parse(argv):
    import argparse
    parser = argparse.ArgumentParser(prog="python -m cygemm",
                                     description="cygemm's self-check, and what it runs with.")
    parser.add_argument("command", nargs="?", default="check", choices=["check", "info"],
                        help="check: build, versions and a few GEMMs against NumPy (default); "
                             "info: versions, libraries, GPUs and settings, for bug reports")
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = _parse(sys.argv[1:])
    sys.exit(info() if args.command == "info" else main())
