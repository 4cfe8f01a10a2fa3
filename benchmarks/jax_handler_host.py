"""The host time of one cygemm.jax handler call beyond the eager call it makes: XLA's call frame
read (two operands, a result and its scratch buffer, three attributes), the views made, the GIL taken, with the
target's work replaced by a no-op. No GPU needed: the frame is built through ctypes as
tests/jax_ffi/test_ffi.py builds it.

    python3 -m benchmarks.jax_handler_host
"""
import ctypes
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "jax_ffi"))
import test_ffi as frames  # noqa: E402

from cygemm.jax import ffi, targets  # noqa: E402


def main(rounds=7, calls=20000):
    ffi.set_runners(dict(targets.RUNNERS, cygemm_matmul=lambda stream, args, rets, attrs: None))
    try:
        call = frames.Call(args=[(frames.F32, 0x10000, (64, 64)), (frames.F32, 0x20000, (64, 64))],
                           rets=[(frames.F32, 0x30000, (64, 64)), frames.SCRATCH],
                           attrs=[("math", "tf32"), ("autotune", ""), ("determinism", "")])
        handler, frame = frames._handler("cygemm_matmul"), ctypes.byref(call.frame)
        getpid = ctypes.CDLL(None).getpid           # a ctypes call that does nothing: subtracted
        per, base = [], []
        for _ in range(rounds):
            t = time.perf_counter()
            for _ in range(calls):
                handler(frame)
            per.append((time.perf_counter() - t) / calls * 1e6)
            t = time.perf_counter()
            for _ in range(calls):
                getpid()
            base.append((time.perf_counter() - t) / calls * 1e6)
    finally:
        ffi.set_runners(targets.RUNNERS)
    own = [p - b for p, b in zip(per, base)]
    print(f"handler beyond the eager call: median {statistics.median(own):.2f} us "
          f"(rounds {min(own):.2f} to {max(own):.2f}; ctypes' own call {statistics.median(base):.2f} us subtracted)")


if __name__ == "__main__":
    main()
