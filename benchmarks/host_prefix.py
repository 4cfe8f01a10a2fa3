"""The host path of ``cygemm.gemm(a, b, out)`` for a 64 x 64 float32 problem, compared
between two builds, up to the first call that needs a GPU (the thread's cuBLAS context): the
argument reading, the checks, the policy and the stream. No GPU needed: the call stops where
CUDA reports no device, and that error path is timed alone and subtracted.

Two kinds of arrays: objects with only ``__cuda_array_interface__`` (numba, cuda.core, JAX's
views) and CuPy-like arrays (a stand-in module named ``cupy`` whose ndarray cygemm's reader
takes by its fast path, as it takes CuPy's). Each build runs in its own process, the builds
alternating, ``--rounds`` times; the medians over rounds are printed and written as JSON.

    python3 -m benchmarks.host_prefix OLD_TREE NEW_TREE [--rounds 6] [--out results.json]

Each tree is a source checkout built in place (``python setup.py build_ext --inplace``).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap

_STAND_IN = textwrap.dedent('''
    import numpy as _np
    class _Memory:
        def __init__(self, ptr):
            self.ptr, self.device_id = ptr, 0
    class ndarray:
        def __init__(self, ptr, shape):
            self.dtype, self.shape, self.data = _np.dtype(_np.float32), shape, _Memory(ptr)
            self.strides, self.ndim = _np.empty(shape, _np.float32).strides, len(shape)
    class _Stream:
        ptr = 0
    class cuda:
        get_current_stream = staticmethod(lambda: _Stream())
    def __getattr__(name):          # what cygemm's modules look up at import, never called here
        return lambda *args, **kwargs: None
''')

_CHILD = textwrap.dedent('''
    import json, statistics, sys, time
    tree, stand_in, kind, calls = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    sys.path[:0] = [tree, stand_in]
    import cupy, cygemm
    from cygemm.engine import streams
    assert cygemm.__file__.startswith(tree), cygemm.__file__

    class Interface:
        def __init__(self, ptr, shape):
            self.__cuda_array_interface__ = dict(shape=shape, typestr="<f4", data=(ptr, False), version=3,
                                                 strides=None)

    make = Interface if kind == "interface" else cupy.ndarray
    a, b, out = (make((1 << 32) + i * 65536, (64, 64)) for i in range(3))
    kwargs = dict(stream=0) if kind == "interface" else {}

    def per_call(fn):
        t = time.perf_counter()
        for _ in range(calls):
            try:
                fn()
            except Exception:
                pass
        return (time.perf_counter() - t) / calls * 1e6

    gemm = lambda: cygemm.gemm(a, b, out, **kwargs)
    no_gpu = lambda: streams.is_capturing(0)      # the same error path, alone
    per_call(gemm), per_call(no_gpu)
    print(json.dumps(statistics.median(per_call(gemm) - per_call(no_gpu) for _ in range(5))))
''')


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--out")
    args = p.parse_args(argv)
    trees = {"old": os.path.abspath(args.old), "new": os.path.abspath(args.new)}
    with tempfile.TemporaryDirectory() as stand_in:
        os.mkdir(os.path.join(stand_in, "cupy"))
        with open(os.path.join(stand_in, "cupy", "__init__.py"), "w") as f:
            f.write(_STAND_IN)
        times = {(kind, who): [] for kind in ("interface", "cupy") for who in trees}
        for _ in range(args.rounds):
            for kind in ("interface", "cupy"):
                for who, tree in trees.items():
                    out = subprocess.run([sys.executable, "-c", _CHILD, tree, stand_in, kind, str(args.calls)],
                                         capture_output=True, text=True, cwd=stand_in, check=True)
                    times[kind, who].append(json.loads(out.stdout.strip().splitlines()[-1]))
    report = {kind: {who: dict(median_us=round(statistics.median(times[kind, who]), 3),
                               range_us=[round(min(times[kind, who]), 3), round(max(times[kind, who]), 3)])
                     for who in trees} for kind in ("interface", "cupy")}
    report["trees"] = trees
    report["python"] = sys.version.split()[0]
    print(json.dumps(report, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
