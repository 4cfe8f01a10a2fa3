"""Objects that look like device arrays (__cuda_array_interface__) but point into host
memory or nowhere: for CPU tests of validation and of the cuBLAS argument mapping."""

BASE = 0x7F00_0000_0000  # a fake device address for the start of a host buffer


class FakeDeviceArray:
    def __init__(self, shape, typestr="<f4", strides=None, ptr=BASE):
        self.__cuda_array_interface__ = {
            "shape": tuple(shape), "typestr": typestr, "strides": strides,
            "data": (ptr, False), "version": 3}


def fake_view(buf, view):
    """A FakeDeviceArray describing `view`, a NumPy view into `buf`, at BASE + its byte offset."""
    offset = view.__array_interface__["data"][0] - buf.__array_interface__["data"][0]
    return FakeDeviceArray(view.shape, view.dtype.str, view.strides, BASE + offset)


# The keys every describe_* result starts with, in this order (tests/properties/test_describe.py).
DESCRIBE_KEYS = ["M", "N", "K", "batch", "swapped", "cublas_a", "cublas_b", "why", "determinism", "kernels",
                 "opa", "opb", "m", "n", "k", "lda", "ldb", "ldc", "stride_a", "stride_b", "stride_c", "a", "b", "c",
                 "compute", "autotune"]


def moe_fakes(T=40, K=64, N=48, G=4, layout="kn", typestr="<f2", offsets="<i4", kind="forward"):
    """Stand-ins for one mixture-of-experts call with device offsets: (a, b, offsets, out), each in
    its own region: moe_gemm's (x, w, offsets, out) or, kind "wgrad", moe_gemm_wgrad's (x, dy,
    offsets, dw); 2-byte elements by default, every start and row 16-byte aligned."""
    x = FakeDeviceArray((T, K), typestr, None, BASE)
    if kind == "forward":
        b = FakeDeviceArray((G, K, N) if layout == "kn" else (G, N, K), typestr, None, BASE + 0x1000000)
        out = FakeDeviceArray((T, N), typestr, None, BASE + 0x2000000)
    else:
        b = FakeDeviceArray((T, N), typestr, None, BASE + 0x1000000)
        out = FakeDeviceArray((G, K, N) if layout == "kn" else (G, N, K), typestr, None, BASE + 0x2000000)
    offs = FakeDeviceArray((G + 1,), offsets, None, BASE + 0x30000000)
    return x, b, offs, out
