"""cygemm/kernels/small_batched.cu built for the CPU (tests/kernels/emulator): its C entry points
through ctypes, and batches of column-major matrices in host memory laid out as cuBLAS takes them
(any leading dimension and batch stride, 0 broadcasting), with a float64 reference."""
import ctypes

import numpy as np

import emulator
from cygemm.engine.dtypes import BY_ANY_NAME

# cudaDataType numbers (the dtype table's), the storage NumPy holds them in, and the accuracy of
# the result type.
_STORAGE = {"float32": (np.float32, 1e-5), "float64": (np.float64, 1e-12), "float16": (np.float16, 1e-2),
            "bfloat16": (np.uint16, 1e-2), "complex64": (np.complex64, 1e-5), "complex128": (np.complex128, 1e-12)}
DTYPES = {name: (BY_ANY_NAME[name]["cuda"],) + held for name, held in _STORAGE.items()}
TILES = {"1x1": 0, "2x2": 1, "4x4": 2, "vector": 3, "mma": 4}


class Args(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int), ("opa", ctypes.c_int), ("opb", ctypes.c_int),
                ("m", ctypes.c_longlong), ("n", ctypes.c_longlong), ("k", ctypes.c_longlong),
                ("a", ctypes.c_void_p), ("lda", ctypes.c_longlong), ("stride_a", ctypes.c_longlong),
                ("b", ctypes.c_void_p), ("ldb", ctypes.c_longlong), ("stride_b", ctypes.c_longlong),
                ("c", ctypes.c_void_p), ("ldc", ctypes.c_longlong), ("stride_c", ctypes.c_longlong),
                ("batch", ctypes.c_longlong),
                ("alpha_re", ctypes.c_double), ("alpha_im", ctypes.c_double),
                ("beta_re", ctypes.c_double), ("beta_im", ctypes.c_double)]


class Shape(ctypes.Structure):
    _fields_ = [("tile", ctypes.c_int), ("threads", ctypes.c_int), ("smem_bytes", ctypes.c_int),
                ("pad", ctypes.c_int), ("stages", ctypes.c_int)]

    def __init__(self, tile, threads, smem_bytes, pad=0, stages=1):
        super().__init__(tile, threads, smem_bytes, pad, stages)

    def __repr__(self):
        return (f"Shape(tile={self.tile}, threads={self.threads}, smem={self.smem_bytes}, pad={self.pad}, "
                f"stages={self.stages})")


def itemsize(dtype):
    return np.dtype(DTYPES[dtype][1]).itemsize


CANDIDATES = "CYGEMM_SMALL_BATCHED_CANDIDATES"       # (the launch options under measurement compiled in)


def load(folder, candidates=True):
    lib = declare(emulator.build("small_batched", str(folder), (CANDIDATES,) if candidates else ()))
    lib.cuda_on_cpu_set_sm_count.argtypes = [ctypes.c_int]
    lib.cuda_on_cpu_launches.restype = ctypes.c_longlong
    lib.cuda_on_cpu_async_copies.restype = ctypes.c_longlong
    lib.cuda_on_cpu_copies_land.argtypes = [ctypes.c_int]
    return lib


def declare(lib):
    """The kernel file's C entry points on `lib` (the emulator's build, or the library's GPU one)
    given their argument and result types."""
    for name in ("cygemm_small_batched_fits", "cygemm_small_batched_vector_fits", "cygemm_small_batched_mma_fits"):
        getattr(lib, name).argtypes = [ctypes.POINTER(Args)]
        getattr(lib, name).restype = ctypes.c_int
    lib.cygemm_small_batched_rule.argtypes = [ctypes.POINTER(Args)]
    lib.cygemm_small_batched_rule.restype = Shape
    lib.cygemm_small_batched_shaped.argtypes = [ctypes.POINTER(Args), Shape, ctypes.c_void_p]
    lib.cygemm_small_batched_shaped.restype = ctypes.c_int
    return lib


# ---------------------------------------------------------------- values in each storage type

def to_storage(x, dtype):
    """float64/complex128 values exactly representable in `dtype`, as its storage."""
    if dtype == "bfloat16":
        return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return x.astype(DTYPES[dtype][1])


def from_storage(x, dtype):
    if dtype == "bfloat16":
        return (x.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return x.astype(np.complex128 if np.iscomplexobj(x) else np.float64)


def random_values(rng, count, dtype):
    x = rng.standard_normal(count)
    if dtype.startswith("complex"):
        x = x + 1j * rng.standard_normal(count)
    return from_storage(to_storage(x, dtype), dtype)        # (rounded to what the type holds)


# ---------------------------------------------------------------- a batch laid out as cuBLAS takes it

class Batch:
    """`count` matrices of rows x cols (stored, column-major) at base + q*stride + r + c*ld in one
    buffer of `dtype` storage, the space around and between them filled with `fill`."""

    def __init__(self, rng, dtype, count, rows, cols, ld, stride, offset=0, fill=None):
        self.dtype, self.rows, self.cols, self.ld, self.stride, self.offset = dtype, rows, cols, ld, stride, offset
        self.count = count
        span = (count - 1) * stride + (cols - 1) * ld + rows if count else 0
        self.size = offset + span + 8               # (a tail that nothing may write)
        values = random_values(rng, self.size, dtype) if fill is None else np.full(self.size, fill)
        self.buf = to_storage(values, dtype)
        self.index = (offset + np.arange(count)[:, None, None] * stride + np.arange(rows)[None, :, None]
                      + np.arange(cols)[None, None, :] * ld)      # [q, r, c]

    @property
    def ptr(self):
        """Where the first matrix starts."""
        return self.buf.ctypes.data + self.offset * self.buf.itemsize

    def matrices(self):
        """The stored matrices as float64 (complex128): [q, rows, cols]."""
        return from_storage(self.buf, self.dtype)[self.index]

    def outside(self):
        """Where no matrix's elements are: a mask of the buffer (to check nothing wrote there)."""
        mask = np.ones(self.size, bool)
        mask[self.index.ravel()] = False
        return mask


def op(x, o):
    """op(X) of a batch [q, r, c]: 0 as is, 1 transposed, 2 conjugate transposed."""
    return x if o == 0 else (np.swapaxes(x, 1, 2) if o == 1 else np.conj(np.swapaxes(x, 1, 2)))


def problem(rng, dtype, m, n, k, batch, opa=0, opb=0, pad_ld=0, gap=0, broadcast_a=False, broadcast_b=False,
            offset=0, alpha=1.0, beta=0.0):
    """(args, A, B, C, expected, bound): C poisoned with NaN where beta is 0, else random."""
    code = DTYPES[dtype][0]
    ar, ac = (k, m) if opa else (m, k)
    br, bc = (n, k) if opb else (k, n)
    lda, ldb, ldc = ar + pad_ld, br + pad_ld, m + pad_ld
    sa = 0 if broadcast_a else lda * ac + gap
    sb = 0 if broadcast_b else ldb * bc + gap
    sc = ldc * n + gap
    A = Batch(rng, dtype, 1 if broadcast_a else batch, ar, ac, lda, sa, offset)
    B = Batch(rng, dtype, 1 if broadcast_b else batch, br, bc, ldb, sb, offset)
    C = Batch(rng, dtype, batch, m, n, ldc, sc, offset, fill=np.nan if beta == 0 else None)
    if beta != 0:                   # (NaN around C still: nothing may write there)
        keep = C.buf[C.index]
        C.buf[:] = to_storage(np.full(C.size, np.nan), dtype)
        C.buf[C.index] = keep
    a, b, c0 = op(A.matrices(), opa), op(B.matrices(), opb), C.matrices()
    expected, scale = alpha * (a @ b), abs(alpha) * (np.abs(a) @ np.abs(b))
    if beta != 0:                   # (C is not read: NaN * 0 is no part of the result)
        expected, scale = expected + beta * c0, scale + abs(beta) * np.abs(c0)
    bound = DTYPES[dtype][2] * scale + 1e-30
    args = Args(code, opa, opb, m, n, k, A.ptr, lda, sa, B.ptr, ldb, sb, C.ptr, ldc, sc, batch,
                float(np.real(alpha)), float(np.imag(alpha)), float(np.real(beta)), float(np.imag(beta)))
    return args, (A, B, C), expected, bound
