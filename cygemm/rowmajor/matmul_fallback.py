"""matmul for the dtypes cygemm's GEMMs do not take: CuPy's own matmul, on the call's stream.

cygemm.matmul multiplies float16, bfloat16, float32, float64, complex64 and complex128 through
cuBLAS. Every other pair of dtypes ``cp.matmul`` accepts (integers, booleans, and mixes of them
with floats) goes to CuPy's matmul instead, so that cygemm.matmul never refuses what cp.matmul
takes: NumPy's type promotion and results, CuPy's kernels. describe_matmul
says which path a call takes. CuPy's function is the one it had when cygemm was imported (a
caller may route ``cupy.matmul`` to cygemm's afterwards without a loop).
"""
import math

import cupy
import numpy as np

from cygemm.engine.arrays import is_pair
from cygemm.engine.dtypes import BY_ANY_NAME, LEVELS, expected, names

# The dtypes cygemm's engine multiplies; a pair of them stays on cuBLAS.
GEMM_DTYPES = frozenset(names(LEVELS["wide"]))

_cupy_matmul = cupy.matmul
INT8 = np.dtype(np.int8).name          # (int_mm's operands)


def dtype_name(x):
    """The dtype name of an operand as matmul or describe_matmul may get it (a device or host
    array, a torch tensor, a (shape, dtype) pair), or None where it cannot tell (the GEMM path
    then reads and refuses it, naming the argument)."""
    try:
        if isinstance(x, (tuple, list)):
            if not is_pair(x):
                return None         # no (shape, dtype) pair: the GEMM path refuses it, naming it
            dt = x[1]
        elif _is_torch(x):
            dt = str(x.dtype).replace("torch.", "")    # (a torch-only dtype, e.g. FP8: np.dtype refuses it)
        elif hasattr(x, "dtype"):
            dt = x.dtype
        elif hasattr(x, "__cuda_array_interface__"):
            dt = x.__cuda_array_interface__["typestr"]
        else:
            return None
        return str(dt) if str(dt) in BY_ANY_NAME else np.dtype(dt).name
    except (TypeError, ValueError, KeyError):
        return None


# NumPy's float dtypes, for the answer every float call gets at once (naming a dtype costs
# microseconds, and matmul asks on every call).
_FLOATS = frozenset(np.dtype(t) for t in (np.float16, np.float32, np.float64))


def _float_at_once(x):
    """True where x's dtype is plainly a float one (NumPy's or CuPy's float16/32/64, any torch
    floating dtype): the GEMM path takes or refuses it; False where takes must look closer."""
    dt = getattr(x, "dtype", None)
    return getattr(dt, "is_floating_point", False) is True or dt in _FLOATS


def takes(a, b, describing=False):
    """Whether matmul(a, b) goes to CuPy's matmul: both dtypes NumPy's, not both GEMM dtypes, and
    (unless describing, which reads stand-ins) both on the device: host arrays and CPU tensors
    stay on the GEMM path, which refuses them by name."""
    if _float_at_once(a) and _float_at_once(b):
        return False
    ta, tb = dtype_name(a), dtype_name(b)
    if ta is None or tb is None or (ta in GEMM_DTYPES and tb in GEMM_DTYPES):
        return False
    if not (_numpys(ta) and _numpys(tb)):      # bfloat16 or FP8 (ml_dtypes) beside another: the GEMM path refuses
        return False
    return describing or (_on_device(a) and _on_device(b))


def _numpys(name):
    """A dtype of NumPy's own (boolean, integer, float, complex) that CuPy's matmul takes."""
    try:
        row = BY_ANY_NAME.get(name)
        return (row is None or row["typestr"] is not None) and np.dtype(name).kind in "biufc"
    except TypeError:               # (a name NumPy does not parse back, e.g. void16)
        return False


def _on_device(x):
    if _is_torch(x):
        return x.is_cuda
    return isinstance(x, cupy.ndarray) or hasattr(x, "__cuda_array_interface__")


def _is_torch(x):
    from cygemm.engine.arrays import is_torch_tensor
    return is_torch_tensor(x)


def run(a, b, out, stream):
    """``cp.matmul(a, b, out=out)`` on `stream` (None: torch's current stream for torch
    operands, else CuPy's), reading torch tensors and other device arrays in place. Returns out,
    or the new result in the operands' library (a torch tensor when either is one)."""
    from cygemm.engine.alloc import as_cupy, stream_context
    from cygemm.engine.streams import stream_pointer
    torch_lib = _is_torch(a) or _is_torch(b)
    if torch_lib and any(getattr(x, "requires_grad", False) for x in (a, b, out)):
        import torch
        if torch.is_grad_enabled():
            raise TypeError(f"a/b: {dtype_name(a)} @ {dtype_name(b)} runs through CuPy's matmul, which torch's "
                            f"autograd does not record: use torch.matmul for tensors that require grad")
    with stream_context(stream_pointer(stream, a, b, out)):
        result = _cupy_matmul(as_cupy(a), as_cupy(b), out=None if out is None else as_cupy(out))
    if out is not None:
        return out
    if torch_lib:
        import torch
        return torch.from_dlpack(result)
    return result


def _shape(x):
    return tuple(x[0]) if isinstance(x, (tuple, list)) else tuple(x.shape)


def describe(a, b, columns):
    """describe_matmul's one entry for a call CuPy's matmul runs: the common keys (`columns`,
    in order; cuBLAS's arguments None: cygemm makes no cuBLAS call of its own), then route (None)
    and path."""
    sa, sb = _shape(a), _shape(b)
    if not sa or not sb:
        raise ValueError(f"{'a' if not sa else 'b'}: matmul needs at least 1 dimension, got a 0-D array")
    M = sa[-2] if len(sa) > 1 else 1
    N = sb[-1] if len(sb) > 1 else 1
    K = sa[-1]
    if K != (sb[-2] if len(sb) > 1 else sb[0]):
        raise ValueError(f"a/b: matmul needs a's last axis to equal b's {'second-to-last' if len(sb) > 1 else 'only'} "
                         f"axis, got shapes {sa} and {sb}")
    batch = math.prod(np.broadcast_shapes(sa[:-2], sb[:-2]))
    ta, tb = dtype_name(a), dtype_name(b)
    d = dict.fromkeys(columns)
    why = (f"cygemm's GEMMs take {expected(LEVELS['wide'])}; a is {ta} and b is {tb}: "
           f"CuPy's matmul runs the call on the same stream, with NumPy's type promotion")
    if ta == tb == INT8:            # (NumPy's int8 product is int8, wrapping; int_mm sums exactly)
        why += (f"; for int8 x int8 on cuBLASLt's integer tensor cores, with exact int32 sums, call "
                f"cygemm.int_mm")
    d.update(M=M, N=N, K=K, batch=batch, why=why, route=None, path="cupy.matmul")
    return d
