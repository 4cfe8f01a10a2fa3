"""The bad-input table: every public function, each mistake -> the exception, raised
before anything is launched, whose message names the argument.

Each case runs twice:
- on the CPU (CI) with fake device arrays whose pointers are never dereferenced,
  where the check needs no GPU;
- on the GPU with real CuPy arrays: outputs are poisoned with NaN first and must
  still be all NaN afterwards (nothing was written), and a correct call on the
  same thread must still work (the library stays usable).
"""
import math

import numpy as np
import pytest

import cygemm
from cygemm import gemm_ops
from fakes import BASE, FakeDeviceArray

M, K, N, NB = 6, 5, 4, 3   # layer sizes; NB: batch


class Fakes:
    """Array maker for the CPU run: each allocation at its own fake address."""
    gpu = False

    def __init__(self):
        self.next_addr = BASE
        self.host = {}     # id(fake) -> (numpy twin, address): to take views of it
        self.outputs = []

    def arr(self, shape, dtype="float32"):
        twin = np.empty(shape, dtype)
        addr = self.next_addr
        self.next_addr += (twin.nbytes + 4095) // 4096 * 4096 + 4096
        fake = FakeDeviceArray(shape, twin.dtype.str, None, addr)
        self.host[id(fake)] = (twin, addr)
        return fake

    def out(self, shape, dtype="float32"):
        x = self.arr(shape, dtype)
        self.outputs.append(x)
        return x

    def view(self, parent, key):
        twin, addr = self.host[id(parent)]
        v = twin[key]
        offset = v.__array_interface__["data"][0] - twin.__array_interface__["data"][0]
        fake = FakeDeviceArray(v.shape, v.dtype.str, v.strides, addr + offset)
        self.host[id(fake)] = (v, addr + offset)
        if any(parent is o for o in self.outputs):
            self.outputs.append(fake)
        return fake

    def transpose(self, x):
        twin, addr = self.host[id(x)]
        fake = FakeDeviceArray(twin.T.shape, twin.dtype.str, twin.T.strides, addr)
        self.host[id(fake)] = (twin.T, addr)
        if any(x is o for o in self.outputs):
            self.outputs.append(fake)
        return fake

    def strided(self, shape, strides, dtype="float32"):
        """A view with the given element strides over a fresh buffer."""
        itemsize = np.dtype(dtype).itemsize
        return FakeDeviceArray(shape, np.dtype(dtype).str, tuple(s * itemsize for s in strides),
                               self.arr((4096,), dtype).__cuda_array_interface__["data"][0])


class Reals(Fakes):
    """Array maker for the GPU run: random inputs, NaN-poisoned outputs."""
    gpu = True

    def __init__(self, cp):
        super().__init__()
        self.cp = cp
        self.rng = np.random.default_rng()

    def arr(self, shape, dtype="float32"):
        return self.cp.asarray(self.rng.standard_normal(shape).astype(dtype))

    def out(self, shape, dtype="float32"):
        # poisoned: NaN, or for an integer dtype its most negative value
        fill = self.cp.nan if np.dtype(dtype).kind in "fc" else np.iinfo(dtype).min
        x = self.cp.full(shape, fill, dtype=dtype)
        self.outputs.append(x)
        return x

    def view(self, parent, key):
        v = parent[key]
        if any(parent is o for o in self.outputs):
            self.outputs.append(v)
        return v

    def transpose(self, x):
        return x.T

    def strided(self, shape, strides, dtype="float32"):
        buf = self.out((4096,), dtype)
        itemsize = np.dtype(dtype).itemsize
        return self.cp.lib.stride_tricks.as_strided(buf, shape, tuple(s * itemsize for s in strides))


def fn(name):
    return {"gemm": cygemm.gemm, "gemm_strided_batched": cygemm.gemm_strided_batched, "int_mm": cygemm.int_mm,
            "forward_into": gemm_ops.forward_into, "backward_into": gemm_ops.backward_into,
            "forward": gemm_ops.forward, "backward": gemm_ops.backward,
            "ensure_workspaces": gemm_ops.ensure_workspaces, "ActAttrs.make": gemm_ops.ActAttrs.make,
            "matmul": cygemm.matmul, "describe_matmul": cygemm.describe_matmul, "GemmPlan": cygemm.GemmPlan, "set_options": cygemm.set_options,
            "save_tuning": cygemm.save_tuning, "stream_pointer": cygemm.stream_pointer,
            "grouped_gemm": cygemm.grouped_gemm, "moe_gemm": cygemm.moe_gemm,
            "describe_gemm": cygemm.describe_gemm,
            "describe_grouped": cygemm.describe_grouped, "moe_gemm_wgrad": cygemm.moe_gemm_wgrad,
            "describe_moe": cygemm.describe_moe, "moe_scaled_gemm": cygemm.moe_scaled_gemm,
            "describe_moe_scaled": cygemm.describe_moe_scaled}[name]


# (function, build(mk) -> (args, kwargs), exception, words the message must hold, CPU-checkable)
# Words are matched case-sensitively; the first always names the argument.
def _cai_with_data(data):
    x = FakeDeviceArray((4, 3))
    x.__cuda_array_interface__["data"] = data
    return x


def _layer(mk):
    return mk.arr((M, K)), mk.arr((K, N)), mk.out((M, N))


def _bwd(mk):
    return mk.arr((M, K)), mk.arr((K, N)), mk.arr((M, N)), mk.arr((M, N))


CASES = {
    # ---- gemm
    "gemm/A numpy": ("gemm", lambda mk: ((np.ones((2, 2), np.float32), mk.arr((2, 2)), mk.out((2, 2))), {}),
                     TypeError, ["A:", "NumPy array in host memory", "cupy.asarray"], True),
    "gemm/B list": ("gemm", lambda mk: ((mk.arr((2, 2)), [[1.0, 2.0]], mk.out((2, 2))), {}),
                    TypeError, ["B:", "list"], True),
    "gemm/mixed dtypes": ("gemm", lambda mk: ((mk.arr((2, 2)), mk.arr((2, 2), "float16"), mk.out((2, 2))), {}),
                          TypeError, ["B:", "float32", "float16"], True),
    "gemm/int32": ("gemm", lambda mk: ((mk.arr((2, 2), "int32"), mk.arr((2, 2), "int32")), {}),
                   TypeError, ["A:", "expected float16, bfloat16, float32, float64, complex64, complex128 or int8, "
                               "got int32", "cupy.matmul"], True),
    # ---- int8 operands
    **{f"gemm/int8 {k} {v!r}": ("gemm", lambda mk, k=k, v=v: ((mk.arr((8, 8), "int8"), mk.transpose(mk.arr((8, 8), "int8")),
                                                          mk.out((8, 8), "int32")), {k: v}),
                                ValueError, [f"{k}:", "integer alpha and beta", repr(v)], True)
       for k, v in (("alpha", 0.5), ("alpha", float("inf")), ("beta", float("nan")), ("alpha", 1e20))},
    # ---- int_mm
    "int_mm/B read along N": ("int_mm", lambda mk: ((mk.arr((8, 16), "int8"), mk.arr((16, 8), "int8"),
                                                     mk.out((8, 8), "int32")), {}),
                              ValueError, ["B:", "along K", "asfortranarray"], True),
    "int_mm/leading dimension": ("int_mm", lambda mk: ((mk.arr((8, 6), "int8"), mk.transpose(mk.arr((8, 6), "int8")),
                                                        mk.out((8, 8), "int32")), {}),
                                 ValueError, ["multiples of 4", "got 6"], True),
    "int_mm/float32": ("int_mm", lambda mk: ((mk.arr((8, 8)), mk.transpose(mk.arr((8, 8))), mk.out((8, 8))), {}),
                       TypeError, ["A:", "int_mm multiplies int8", "float32"], True),
    "int_mm/out float32": ("int_mm", lambda mk: ((mk.arr((8, 8), "int8"), mk.transpose(mk.arr((8, 8), "int8")),
                                                  mk.out((8, 8))), {}),
                           TypeError, ["out:", "int32", "float32"], True),
    "gemm/mixed float64 and complex128": ("gemm", lambda mk: ((mk.arr((2, 2), "float64"), mk.arr((2, 2), "complex128"),
                                                               mk.out((2, 2), "float64")), {}),
                                          TypeError, ["B:", "expected the dtype of A (float64), got complex128"], True),
    "gemm/complex alpha with real operands": ("gemm", lambda mk: ((mk.arr((2, 2), "float64"), mk.arr((2, 2), "float64"),
                                                                   mk.out((2, 2), "float64")), {"alpha": 1j}),
                                              ValueError, ["alpha:", "complex value", "float64"], True),
    "gemm/A 3-D": ("gemm", lambda mk: ((mk.arr((2, 2, 2)), mk.arr((2, 2)), mk.out((2, 2))), {}),
                   ValueError, ["A:", "2-D", "3-D"], True),
    "gemm/inner mismatch": ("gemm", lambda mk: ((mk.arr((2, 3)), mk.arr((4, 5)), mk.out((2, 5))), {}),
                            ValueError, ["B:", "3 rows", "4x5"], True),
    "gemm/inner mismatch trans_b": ("gemm", lambda mk: ((mk.arr((2, 3)), mk.arr((5, 4)), mk.out((2, 5))),
                                                        {"trans_b": True}), ValueError, ["B:", "trans_b=True"], True),
    "gemm/out shape": ("gemm", lambda mk: ((mk.arr((2, 3)), mk.arr((3, 5)), mk.out((2, 4))), {}),
                       ValueError, ["out:", "(2, 5)", "(2, 4)"], True),
    "gemm/out dtype": ("gemm", lambda mk: ((mk.arr((2, 3)), mk.arr((3, 5)), mk.out((2, 5), "float16")), {}),
                       TypeError, ["out:", "float32"], True),
    "gemm/out 3-D": ("gemm", lambda mk: ((mk.arr((2, 3)), mk.arr((3, 5)), mk.out((1, 2, 5))), {}),
                     ValueError, ["out:", "2-D"], True),
    "gemm/A layout": ("gemm", lambda mk: ((mk.strided((4, 4), (8, 2)), mk.arr((4, 4)), mk.out((4, 4))), {}),
                      ValueError, ["A:", "layout"], True),
    "gemm/B layout": ("gemm", lambda mk: ((mk.arr((4, 4)), mk.strided((4, 4), (1, 2)), mk.out((4, 4))), {}),
                      ValueError, ["B:", "layout"], True),
    "gemm/out layout (broadcast rows)": ("gemm", lambda mk: ((mk.arr((4, 4)), mk.arr((4, 4)),
                                                               mk.strided((4, 4), (0, 1))), {}),
                                         ValueError, ["out:", "layout"], True),
    "gemm/math": ("gemm", lambda mk: ((mk.arr((4, 4)), mk.arr((4, 4)), mk.out((4, 4))), {"math": "fp16"}),
                  ValueError, ["math:", "'tf32'"], True),
    "gemm/beta without out": ("gemm", lambda mk: ((mk.arr((4, 4)), mk.arr((4, 4))), {"beta": 1.0}),
                              ValueError, ["beta:", "out="], True),
    "gemm/stream str": ("gemm", lambda mk: ((mk.arr((4, 4)), mk.arr((4, 4)), mk.out((4, 4))), {"stream": "s"}),
                        TypeError, ["stream:"], True),
    "gemm/alpha str": ("gemm", lambda mk: ((mk.arr((4, 4)), mk.arr((4, 4)), mk.out((4, 4))), {"alpha": "x"}),
                       TypeError, [], True),
    "gemm/out overlaps A": ("gemm", lambda mk: (lambda P: ((mk.view(P, np.s_[:, :K]), mk.arr((K, N)),
                                                            mk.view(P, np.s_[:, K - 1:K - 1 + N])), {}))(mk.out((M, 8))),
                            ValueError, ["out:", "overlaps A"], True),
    "gemm/out is B": ("gemm", lambda mk: (lambda Bo: ((mk.arr((4, 4)), Bo, Bo), {}))(mk.out((4, 4))),
                      ValueError, ["out:", "overlaps B"], True),
    "gemm/out is A transposed": ("gemm", lambda mk: (lambda X: ((X, mk.arr((4, 4)), mk.transpose(X)), {}))(mk.out((4, 4))),
                                 ValueError, ["out:", "overlaps A"], True),
    # ---- gemm_strided_batched
    "batched/batch mismatch": ("gemm_strided_batched", lambda mk: ((mk.arr((3, 2, 2)), mk.arr((4, 2, 2))), {}),
                               ValueError, ["B:", "batch", "3", "4"], True),
    "batched/out 2-D": ("gemm_strided_batched", lambda mk: ((mk.arr((3, 2, 2)), mk.arr((3, 2, 2)), mk.out((2, 2))), {}),
                        ValueError, ["out:", "3-D"], True),
    "batched/out shape": ("gemm_strided_batched", lambda mk: ((mk.arr((3, 2, 2)), mk.arr((3, 2, 2)),
                                                               mk.out((2, 2, 2))), {}), ValueError, ["out:", "(3, 2, 2)"], True),
    "batched/out batch overlap": ("gemm_strided_batched", lambda mk: ((mk.arr((3, 2, 2)), mk.arr((3, 2, 2)),
                                                                       mk.strided((3, 2, 2), (2, 2, 1))), {}),
                                  ValueError, ["out:", "overlap"], True),
    "batched/A 4-D": ("gemm_strided_batched", lambda mk: ((mk.arr((1, 3, 2, 2)), mk.arr((3, 2, 2))), {}),
                      ValueError, ["A:", "3-D"], True),
    "batched/mixed dtypes": ("gemm_strided_batched", lambda mk: ((mk.arr((3, 2, 2)), mk.arr((3, 2, 2), "float16"),
                                                                  mk.out((3, 2, 2))), {}), TypeError, ["B:"], True),
    "batched/out is A": ("gemm_strided_batched", lambda mk: (lambda X: ((X, mk.arr((3, 2, 2)), X), {}))(mk.out((3, 2, 2))),
                         ValueError, ["out:", "overlaps A"], True),
    "batched/inner mismatch": ("gemm_strided_batched", lambda mk: ((mk.arr((3, 2, 3)), mk.arr((3, 2, 2))), {}),
                               ValueError, ["B:", "3 rows"], True),
    # ---- forward_into
    "forward_into/A numpy": ("forward_into", lambda mk: ((np.ones((M, K), np.float32), mk.arr((K, N)), mk.out((M, N))), {}),
                             TypeError, ["A:"], True),
    "forward_into/A 3-D": ("forward_into", lambda mk: ((mk.arr((1, M, K)), mk.arr((K, N)), mk.out((M, N))), {}),
                           ValueError, ["A:", "2-D"], True),
    "forward_into/mixed dtypes": ("forward_into", lambda mk: ((mk.arr((M, K)), mk.arr((K, N), "float16"),
                                                               mk.out((M, N))), {}), TypeError, ["B:", "float32"], True),
    "forward_into/inner mismatch": ("forward_into", lambda mk: ((mk.arr((M, K)), mk.arr((K + 1, N)), mk.out((M, N))), {}),
                                    ValueError, ["B:", f"{K} rows"], True),
    "forward_into/out shape": ("forward_into", lambda mk: ((mk.arr((M, K)), mk.arr((K, N)), mk.out((M, N + 1))), {}),
                               ValueError, ["out:", f"({M}, {N})"], True),
    "forward_into/out dtype": ("forward_into", lambda mk: ((mk.arr((M, K)), mk.arr((K, N)), mk.out((M, N), "float16")), {}),
                               TypeError, ["out:", "float32"], True),
    "forward_into/out numpy": ("forward_into", lambda mk: ((mk.arr((M, K)), mk.arr((K, N)), np.zeros((M, N), np.float32)), {}),
                               TypeError, ["out:"], True),
    "forward_into/out column-major": ("forward_into", lambda mk: ((mk.arr((M, K)), mk.arr((K, N)),
                                                                   mk.transpose(mk.out((N, M)))), {}),
                                      ValueError, ["out:", "row-major"], True),
    "forward_into/bias length": ("forward_into", lambda mk: (_layer(mk) + (mk.arr((N + 1,)),), {}),
                                 ValueError, ["bias:", f"({N},)", f"got ({N + 1},)"], True),
    "forward_into/bias 2 rows": ("forward_into", lambda mk: (_layer(mk) + (mk.arr((2, N)),), {}),
                                 ValueError, ["bias:", f"got (2, {N})"], True),
    "forward_into/bias dtype": ("forward_into", lambda mk: (_layer(mk) + (mk.arr((N,), "float16"),), {}),
                                TypeError, ["bias:", "float32"], True),
    "forward_into/bias numpy": ("forward_into", lambda mk: (_layer(mk) + (np.zeros(N, np.float32),), {}),
                                TypeError, ["bias:"], True),
    "forward_into/bias strided": ("forward_into", lambda mk: (_layer(mk) + (mk.strided((N,), (2,)),), {}),
                                  ValueError, ["bias:", "contiguous"], True),
    "forward_into/save_z without z_out": ("forward_into", lambda mk: (_layer(mk), {"save_z": True}),
                                          ValueError, ["z_out:", "save_z"], True),
    "forward_into/z_out without save_z": ("forward_into", lambda mk: (_layer(mk), {"z_out": mk.out((M, N))}),
                                          ValueError, ["z_out:", "save_z"], True),
    "forward_into/z_out shape": ("forward_into", lambda mk: (_layer(mk), {"save_z": True, "z_out": mk.out((M + 1, N))}),
                                 ValueError, ["z_out:"], True),
    "forward_into/unknown act": ("forward_into", lambda mk: (_layer(mk), {"act": "swish"}),
                                 ValueError, ["act:", "leaky_relu"], True),
    "forward_into/act not a str": ("forward_into", lambda mk: (_layer(mk), {"act": 3}),
                                   ValueError, ["act:"], True),
    "forward_into/negative leaky_slope": ("forward_into", lambda mk: (_layer(mk), {"act": "leaky_relu", "leaky_slope": -1.0}),
                                          ValueError, ["leaky_slope:"], True),
    "forward_into/nan leaky_slope": ("forward_into", lambda mk: (_layer(mk), {"act": "leaky_relu", "leaky_slope": math.nan}),
                                     ValueError, ["leaky_slope:"], True),
    "forward_into/inf leaky_slope": ("forward_into", lambda mk: (_layer(mk), {"act": "leaky_relu", "leaky_slope": math.inf}),
                                     ValueError, ["leaky_slope:"], True),
    "forward_into/math": ("forward_into", lambda mk: (_layer(mk), {"math": "fp64"}), ValueError, ["math:"], True),
    "forward_into/lt_workspace bytes": ("forward_into", lambda mk: (_layer(mk), {"lt_workspace": bytearray(16)}),
                                        TypeError, ["lt_workspace:"], True),
    "forward_into/stream float": ("forward_into", lambda mk: (_layer(mk), {"stream": 1.5}), TypeError, ["stream:"], True),
    # A workspace that is a view of A's buffer: cuBLASLt would write into A mid-GEMM.
    "forward_into/lt_workspace overlaps A": ("forward_into", lambda mk: (lambda P: ((mk.view(P, np.s_[:M]), mk.arr((K, N)),
                                                                                     mk.out((M, N))),
                                                                                    {"lt_workspace": P}))(mk.arr((M + 64, K))),
                                             ValueError, ["lt_workspace:", "overlaps A"], True),
    "forward_into/lt_workspace is out": ("forward_into", lambda mk: (lambda Y: ((mk.arr((M, K)), mk.arr((K, N)), Y),
                                                                                {"lt_workspace": Y}))(mk.out((M, N))),
                                         ValueError, ["lt_workspace:", "overlaps out"], True),
    "forward_into/lt_workspace misaligned": ("forward_into", lambda mk: (_layer(mk), {"lt_workspace": mk.view(mk.arr((64, K)), np.s_[1:])}),
                                             ValueError, ["lt_workspace:", "aligned to 256 bytes"], True),
    "forward_into/lt_workspace strided": ("forward_into", lambda mk: (_layer(mk), {"lt_workspace": mk.strided((64,), (2,))}),
                                          ValueError, ["lt_workspace:", "contiguous"], True),
    "forward_into/autotune": ("forward_into", lambda mk: (_layer(mk), {"autotune": "always"}),
                              ValueError, ["autotune:", "'exhaustive'"], True),
    "forward_into/out overlaps A": ("forward_into", lambda mk: (lambda P: ((mk.view(P, np.s_[:, :K]), mk.arr((K, N)),
                                                                            mk.view(P, np.s_[:, 2:2 + N])), {}))(mk.out((M, 8))),
                                    ValueError, ["out:", "overlaps A"], True),
    "forward_into/out overlaps bias": ("forward_into", lambda mk: (lambda Y: ((mk.arr((M, K)), mk.arr((K, N)), Y,
                                                                               mk.view(Y, np.s_[2])), {}))(mk.out((M, N))),
                                       ValueError, ["out:", "overlaps bias"], True),
    "forward_into/z_out is out": ("forward_into", lambda mk: (lambda Y: ((mk.arr((M, K)), mk.arr((K, N)), Y),
                                                                         {"save_z": True, "z_out": Y}))(mk.out((M, N))),
                                  ValueError, ["z_out:", "overlaps out"], True),
    "forward_into/z_out overlaps B": ("forward_into", lambda mk: (lambda Q: ((mk.arr((M, K)), mk.view(Q, np.s_[:K, :N]),
                                                                              mk.out((M, N))),
                                                                             {"save_z": True, "z_out": mk.view(Q, np.s_[K - 1:K - 1 + M, :N])}))(mk.out((M + K, N))),
                                      ValueError, ["z_out:", "overlaps B"], True),
    # ---- backward_into
    "backward_into/gY shape": ("backward_into", lambda mk: ((mk.arr((M, K)), mk.arr((K, N)), mk.arr((M, N + 1)), None), {}),
                               ValueError, ["gY:"], True),
    "backward_into/relu without Z or y": ("backward_into", lambda mk: (_bwd(mk)[:3] + (None,), {"act": "relu"}),
                                          ValueError, ["Z:"], True),
    "backward_into/Z shape": ("backward_into", lambda mk: (_bwd(mk)[:3] + (mk.arr((M, 1)),), {"act": "relu"}),
                              ValueError, ["Z:"], True),
    "backward_into/Z dtype": ("backward_into", lambda mk: (_bwd(mk)[:3] + (mk.arr((M, N), "float16"),), {"act": "relu"}),
                              TypeError, ["Z:"], True),
    "backward_into/missing work_dZ": ("backward_into", lambda mk: (_bwd(mk), {"act": "relu", "gA_out": mk.out((M, K))}),
                                      ValueError, ["work_dZ:", "ensure_workspaces"], True),
    "backward_into/work_dZ shape": ("backward_into", lambda mk: (_bwd(mk), {"act": "relu", "gA_out": mk.out((M, K)),
                                                                           "work_dZ": mk.out((M, N + 1))}),
                                    ValueError, ["work_dZ:"], True),
    "backward_into/gA_out shape": ("backward_into", lambda mk: (_bwd(mk)[:3] + (None,), {"gA_out": mk.out((M, K + 1))}),
                                   ValueError, ["gA_out:"], True),
    "backward_into/gA_out numpy": ("backward_into", lambda mk: (_bwd(mk)[:3] + (None,), {"gA_out": np.zeros((M, K), np.float32)}),
                                   TypeError, ["gA_out:"], True),
    "backward_into/gB_out dtype": ("backward_into", lambda mk: (_bwd(mk)[:3] + (None,), {"gB_out": mk.out((K, N), "float16")}),
                                   TypeError, ["gB_out:"], True),
    "backward_into/gB_out layout": ("backward_into", lambda mk: (_bwd(mk)[:3] + (None,), {"gB_out": mk.strided((K, N), (4, 2))}),
                                    ValueError, ["gB_out:", "layout"], True),
    "backward_into/gBias_out length": ("backward_into", lambda mk: (_bwd(mk)[:3] + (None,), {"gBias_out": mk.out((N - 1,))}),
                                       ValueError, ["gBias_out:"], True),
    "backward_into/unknown act": ("backward_into", lambda mk: (_bwd(mk), {"act": "elu"}), ValueError, ["act:"], True),
    "backward_into/gelu from y": ("backward_into", lambda mk: (_bwd(mk)[:3] + (None,), {"act": "gelu", "y": mk.arr((M, N))}),
                                  ValueError, ["y:", "gelu"], True),
    "backward_into/leaky 0 from y": ("backward_into", lambda mk: (_bwd(mk)[:3] + (None,),
                                                                  {"act": "leaky_relu", "leaky_slope": 0.0, "y": mk.arr((M, N))}),
                                     ValueError, ["y:"], True),
    "backward_into/y shape": ("backward_into", lambda mk: (_bwd(mk)[:3] + (None,), {"act": "relu", "y": mk.arr((M, N + 2))}),
                              ValueError, ["y:"], True),
    "backward_into/inf leaky_slope": ("backward_into", lambda mk: (_bwd(mk), {"act": "leaky_relu", "leaky_slope": math.inf}),
                                      ValueError, ["leaky_slope:"], True),
    "backward_into/lt_workspace overlaps gY": ("backward_into", lambda mk: (lambda P: ((mk.arr((M, K)), mk.arr((K, N)),
                                                                                        mk.view(P, np.s_[:M]), None),
                                                                                       {"gA_out": mk.out((M, K)), "lt_workspace": P}))(mk.arr((M + 64, N))),
                                               ValueError, ["lt_workspace:", "overlaps gY"], True),
    "backward_into/math": ("backward_into", lambda mk: (_bwd(mk)[:3] + (None,), {"math": "tf16"}), ValueError, ["math:"], True),
    "backward_into/gA_out overlaps gY": ("backward_into", lambda mk: (lambda P: ((mk.arr((M, K)), mk.arr((K, N)),
                                                                                  mk.view(P, np.s_[:, :N]), None),
                                                                                 {"gA_out": mk.view(P, np.s_[:, N - 1:N - 1 + K])}))(mk.out((M, 16))),
                                         ValueError, ["gA_out:", "overlaps gY"], True),
    "backward_into/gB_out is B": ("backward_into", lambda mk: (lambda Bo: ((mk.arr((M, K)), Bo, mk.arr((M, N)), None),
                                                                           {"gB_out": Bo}))(mk.out((K, N))),
                                  ValueError, ["gB_out:", "overlaps B"], True),
    "backward_into/work_dZ is gY": ("backward_into", lambda mk: (lambda G: ((mk.arr((M, K)), mk.arr((K, N)), G, mk.arr((M, N))),
                                                                            {"act": "relu", "gB_out": mk.out((K, N)),
                                                                             "work_dZ": G}))(mk.out((M, N))),
                                    ValueError, ["work_dZ:", "overlaps gY"], True),
    "backward_into/work_dZ is Z": ("backward_into", lambda mk: (lambda Zo: ((mk.arr((M, K)), mk.arr((K, N)), mk.arr((M, N)), Zo),
                                                                            {"act": "gelu", "gA_out": mk.out((M, K)),
                                                                             "work_dZ": Zo}))(mk.out((M, N))),
                                   ValueError, ["work_dZ:", "overlaps Z"], True),
    "backward_into/gBias_out inside gA_out": ("backward_into", lambda mk: (lambda G: ((mk.arr((M, K)), mk.arr((K, N)),
                                                                                      mk.arr((M, N)), None),
                                                                                     {"gA_out": G, "gBias_out": mk.view(G, np.s_[1, :N])}))(mk.out((M, K))),
                                              ValueError, ["gBias_out:", "overlaps gA_out"], True),
    # ---- matmul
    "matmul/a numpy": ("matmul", lambda mk: ((np.ones((2, 2), np.float32), mk.arr((2, 2))), {}),
                       TypeError, ["a:", "NumPy array in host memory"], True),
    "matmul/b list": ("matmul", lambda mk: ((mk.arr((2, 2)), [[1.0]]), {}), TypeError, ["b:", "list"], True),
    "matmul/0-D": ("matmul", lambda mk: ((mk.arr(()), mk.arr((2, 2))), {}), ValueError, ["a:", "1 dimension"], True),
    "matmul/inner mismatch": ("matmul", lambda mk: ((mk.arr((3, 4)), mk.arr((5, 2))), {}),
                              ValueError, ["b:", "a's last axis (4)"], True),
    "matmul/batch broadcast": ("matmul", lambda mk: ((mk.arr((3, 2, 4)), mk.arr((2, 4, 2))), {}),
                               ValueError, ["b:", "do not broadcast"], True),
    "matmul/out shape": ("matmul", lambda mk: ((mk.arr((3, 4)), mk.arr((4, 2)), mk.out((3, 3))), {}),
                         ValueError, ["out:", "(3, 2)", "(3, 3)"], True),
    "matmul/out batch stride 0": ("matmul", lambda mk: ((mk.arr((3, 2, 4)), mk.arr((4, 2)), mk.strided((3, 2, 2), (0, 2, 1))), {}),
                                  ValueError, ["out:", "stride 0"], True),
    "matmul/math": ("matmul", lambda mk: ((mk.arr((2, 2)), mk.arr((2, 2)), mk.out((2, 2))), {"math": "tf16"}),
                    ValueError, ["math:", "'cupy'"], True),
    "matmul/autotune": ("matmul", lambda mk: ((mk.arr((2, 2)), mk.arr((2, 2)), mk.out((2, 2))), {"autotune": 1}),
                        ValueError, ["autotune:"], True),
    "describe_matmul/inner mismatch": ("describe_matmul", lambda mk: ((mk.arr((3, 4)), mk.arr((5, 2))), {}),
                                       ValueError, ["b:", "a's last axis (4)"], True),
    "describe_matmul/a [::2, ::2]": ("describe_matmul", lambda mk: ((mk.view(mk.arr((8, 8)), (slice(None, None, 2),
                                                                                             slice(None, None, 2))),
                                                                      mk.arr((4, 4))), {}),
                                     ValueError, ["a: a layout cuBLAS cannot read in place", "element strides (16, 2)",
                                                  "cupy.ascontiguousarray(a)"], True),
    "describe_matmul/b [::2, ::2]": ("describe_matmul", lambda mk: ((mk.arr((4, 4)),
                                                                      mk.view(mk.arr((8, 8)), (slice(None, None, 2),
                                                                                               slice(None, None, 2)))), {}),
                                     ValueError, ["b: a layout cuBLAS cannot read in place", "element strides (16, 2)",
                                                  "cupy.ascontiguousarray(b)"], True),
    "describe_matmul/out [::2, ::2]": ("describe_matmul", lambda mk: ((mk.arr((4, 4)), mk.arr((4, 4)),
                                                                        mk.view(mk.out((8, 8)), (slice(None, None, 2),
                                                                                                 slice(None, None, 2)))), {}),
                                       ValueError, ["out: a layout cuBLAS cannot write in place", "element strides (16, 2)",
                                                    "cupy.ascontiguousarray(out)"], True),
    "describe_matmul/mixed dtypes": ("describe_matmul", lambda mk: ((mk.arr((2, 3)), mk.arr((3, 2), "float16")), {}),
                                     ValueError, ["a/b: dtypes differ", "a is float32", "b is float16"], True),
    "describe_matmul/out dtype": ("describe_matmul", lambda mk: ((mk.arr((2, 3)), mk.arr((3, 2)), mk.out((2, 2), "float16")), {}),
                                  ValueError, ["out: its dtype is float16", "a and b are float32"], True),
    "describe_matmul/not an array": ("describe_matmul", lambda mk: (([1, 2, 3], mk.arr((3, 2))), {}),
                                     TypeError, ["a host (NumPy) array or tensor, or a (shape, dtype) pair"], True),
    "describe_gemm/inner mismatch": ("describe_gemm", lambda mk: ((mk.arr((2, 3)), mk.arr((4, 2))), {}),
                                     ValueError, ["B:", "3 rows"], True),
    "describe_gemm/not a pair": ("describe_gemm", lambda mk: (([1, 2, 3], mk.arr((3, 2))), {}),
                                 TypeError, ["A:", "a host (NumPy) array or tensor, or a (shape, dtype) pair"], True),
    # ---- GemmPlan
    "GemmPlan/out None": ("GemmPlan", lambda mk: ((mk.arr((2, 2)), mk.arr((2, 2)), None), {}), ValueError, ["out:"], True),
    "GemmPlan/inner mismatch": ("GemmPlan", lambda mk: ((mk.arr((2, 3)), mk.arr((4, 2)), mk.out((2, 2))), {}),
                                ValueError, ["B:", "3 rows"], True),
    "GemmPlan/out overlaps A": ("GemmPlan", lambda mk: (lambda X: ((X, mk.arr((4, 4)), X), {}))(mk.out((4, 4))),
                                ValueError, ["out:", "overlaps A"], True),
    "GemmPlan/math": ("GemmPlan", lambda mk: ((mk.arr((2, 2)), mk.arr((2, 2)), mk.out((2, 2))), {"math": "fp8"}),
                      ValueError, ["math:"], True),
    "GemmPlan/complex with an epilogue": ("GemmPlan", lambda mk: ((mk.arr((2, 2), "complex64"), mk.arr((2, 2), "complex64"),
                                                                    mk.out((2, 2), "complex64")), {"act": "relu"}),
                                           TypeError, ["A:", "epilogues", "complex64"], True),
    "GemmPlan/batched out 2-D": ("GemmPlan", lambda mk: ((mk.arr((3, 2, 2)), mk.arr((3, 2, 2)), mk.out((2, 2))),
                                                          {"batched": True}), ValueError, ["out:", "3-D"], True),
    # ---- options and tuning files
    "set_options/unknown": ("set_options", lambda mk: ((), {"autotuner": "auto"}), TypeError,
                            ["set_options:", "autotuner"], True),
    "set_options/autotune": ("set_options", lambda mk: ((), {"autotune": "sometimes"}), ValueError,
                             ["autotune:", "'off', 'auto' or 'exhaustive'"], True),
    "set_options/plan_cache_size": ("set_options", lambda mk: ((), {"plan_cache_size": 0}), ValueError,
                                    ["plan_cache_size:", ">= 1"], True),
    "set_options/tuning_mode": ("set_options", lambda mk: ((), {"tuning_mode": "warm"}), ValueError,
                                ["tuning_mode:", "'sustained'"], True),
    "save_tuning/unwritable": ("save_tuning", lambda mk: (("/etc/hostname/tuning.jsonl",), {}), OSError,
                               ["/etc/hostname"], True),
    "stream_pointer/str": ("stream_pointer", lambda mk: (("s",), {}), TypeError, ["stream:"], True),
    # ---- allocating forms (their own checks name the argument too)
    "forward/A numpy": ("forward", lambda mk: ((np.ones((M, K), np.float32), mk.arr((K, N))), {}), TypeError, ["A:"], True),
    "forward/B 3-D": ("forward", lambda mk: ((mk.arr((M, K)), mk.arr((1, K, N))), {}), ValueError, ["B:", "2-D"], True),
    "forward/unknown act": ("forward", lambda mk: ((mk.arr((M, K)), mk.arr((K, N))), {"act": "mish"}),
                            ValueError, ["act:"], False),
    "forward/inner mismatch": ("forward", lambda mk: ((mk.arr((M, K)), mk.arr((K + 2, N))), {}),
                               ValueError, ["B:"], False),
    "backward/A list": ("backward", lambda mk: (([[1.0]], mk.arr((K, N)), mk.arr((M, N)), None), {}),
                        TypeError, ["A:", "list"], True),
    "backward/gY shape": ("backward", lambda mk: ((mk.arr((M, K)), mk.arr((K, N)), mk.arr((M + 1, N)), None), {}),
                          ValueError, ["gY:"], False),
    # ---- helpers
    "ensure_workspaces/negative": ("ensure_workspaces", lambda mk: ((-1, 4), {}), ValueError, ["M:", "-1"], True),
    "ActAttrs.make/unknown act": ("ActAttrs.make", lambda mk: (("mish",), {}), ValueError, ["act:"], True),
    "ActAttrs.make/negative slope": ("ActAttrs.make", lambda mk: (("leaky_relu",), {"leaky_slope": -0.5}),
                                     ValueError, ["leaky_slope:"], True),
    # ---- grouped GEMMs
    "grouped_gemm/lengths differ": ("grouped_gemm", lambda mk: (([mk.arr((2, 3))], [mk.arr((3, 2))] * 2,
                                                                 [mk.out((2, 2))]), {}),
                                    ValueError, ["Bs:", "one matrix per group"], True),
    "grouped_gemm/inner mismatch": ("grouped_gemm", lambda mk: (([mk.arr((2, 3)), mk.arr((2, 3))],
                                                                 [mk.arr((3, 2)), mk.arr((4, 2))],
                                                                 [mk.out((2, 2)), mk.out((2, 2))]), {}),
                                    ValueError, ["Bs[1]:", "3 rows", "4x2"], True),
    "grouped_gemm/mixed dtypes": ("grouped_gemm", lambda mk: (([mk.arr((2, 3)), mk.arr((2, 3), "float16")],
                                                               [mk.arr((3, 2))] * 2, [mk.out((2, 2)), mk.out((2, 2))]),
                                                              {}), TypeError, ["As[1]:", "float16"], True),
    "grouped_gemm/out is an input": ("grouped_gemm", lambda mk: (lambda P: (([mk.view(P, np.s_[:, :3])], [mk.arr((3, 2))],
                                                                              [mk.view(P, np.s_[:, 2:4])]), {}))(mk.out((2, 4))),
                                     ValueError, ["outs[0]:", "overlaps As[0]"], True),
    "grouped_gemm/unknown route": ("grouped_gemm", lambda mk: (([mk.arr((2, 3))], [mk.arr((3, 2))], [mk.out((2, 2))]),
                                                               {"route": "fast"}), ValueError, ["route:", "'fast'"], True),
    "moe_gemm/decreasing offsets": ("moe_gemm", lambda mk: ((mk.arr((4, 3)), mk.arr((2, 3, 2)), [0, 3, 2],
                                                             mk.out((4, 2))), {}),
                                    ValueError, ["group_offsets:", "non-decreasing"], True),
    "moe_gemm/bad w_layout": ("moe_gemm", lambda mk: ((mk.arr((4, 3)), mk.arr((2, 3, 2)), [0, 2, 4], mk.out((4, 2))),
                                                      {"w_layout": "kt"}), ValueError, ["w_layout:", "'kt'"], True),
    "moe_gemm/device offsets float32": ("moe_gemm", lambda mk: ((mk.arr((4, 3)), mk.arr((2, 3, 2)), mk.arr((3,)),
                                                                 mk.out((4, 2))), {}),
                                        TypeError, ["group_offsets:", "int32 or int64", "float32"], True),
    "moe_gemm/device offsets length": ("moe_gemm", lambda mk: ((mk.arr((4, 3)), mk.arr((2, 3, 2)), mk.arr((4,), "int32"),
                                                                mk.out((4, 2))), {}),
                                       ValueError, ["group_offsets:", "G + 1 = 3", "got 4"], True),
    "moe_gemm_wgrad/dy rows": ("moe_gemm_wgrad", lambda mk: ((mk.arr((4, 3)), mk.arr((3, 2)), [0, 2, 4],
                                                              mk.out((2, 3, 2))), {}),
                               ValueError, ["dy:", "4 rows"], True),
    "moe_gemm_wgrad/bad dw_layout": ("moe_gemm_wgrad", lambda mk: ((mk.arr((4, 3)), mk.arr((4, 2)), mk.arr((3,), "int64"),
                                                                    mk.out((2, 3, 2))), {"dw_layout": "mk"}),
                                     ValueError, ["dw_layout:", "'mk'"], True),
    "describe_moe/bad kind": ("describe_moe", lambda mk: ((mk.arr((4, 3)), mk.arr((2, 3, 2)), [0, 2, 4], mk.out((4, 2))),
                                                          {"kind": "backward"}), ValueError, ["kind:", "'backward'"], True),
    "moe_scaled_gemm/float32 x": ("moe_scaled_gemm", lambda mk: ((mk.arr((4, 16)), mk.arr((2, 8, 16), "uint8"),
                                                                   mk.arr((1,)), mk.arr((2,)), [0, 2, 4],
                                                                   mk.out((4, 8))), {"format_w": "e4m3"}),
                                  TypeError, ["x:", "float32"], True),
    "describe_moe_scaled/scale_w length": ("describe_moe_scaled", lambda mk: (
        (mk.arr((4, 16), "uint8"), mk.arr((2, 8, 16), "uint8"), mk.arr((1,)), mk.arr((3,)), [0, 2, 4], mk.out((4, 8))),
        {"format_x": "e4m3", "format_w": "e4m3"}), ValueError, ["scale_w:", "G = 2"], True),
    # ---- arguments that are not arrays: named, before anything runs
    "ensure_workspaces/M a string": ("ensure_workspaces", lambda mk: (("a", 5), {}), TypeError,
                                     ["M:", "an int >= 0", "'a'"], True),
    "ensure_workspaces/N None": ("ensure_workspaces", lambda mk: ((4, None), {}), TypeError, ["N:", "None"], True),
    "ensure_workspaces/lt_bytes negative": ("ensure_workspaces", lambda mk: ((4, 4), {"lt_bytes": -1}), ValueError,
                                            ["lt_bytes:", "-1"], True),
    "forward_into/leaky_slope a string": ("forward_into", lambda mk: (_layer(mk), {"act": "leaky_relu", "leaky_slope": "a"}),
                                          TypeError, ["leaky_slope:", "real number", "'a'"], True),
    "backward_into/accumulate a string": ("backward_into", lambda mk: (_bwd(mk)[:3] + (None,), {"accumulate": "x"}),
                                          TypeError, ["accumulate:", "True or False", "'x'"], True),
    "describe_gemm/batched a string": ("describe_gemm", lambda mk: ((mk.arr((2, 2)), mk.arr((2, 2))), {"batched": "yes"}),
                                       TypeError, ["batched:", "True or False", "'yes'"], True),
    "describe_moe_scaled/fast_accum a string": ("describe_moe_scaled", lambda mk: (
        (mk.arr((4, 16), "uint8"), mk.arr((2, 8, 16), "uint8"), mk.arr((1,)), mk.arr((2,)), [0, 2, 4], mk.out((4, 8))),
        {"format_x": "e4m3", "format_w": "e4m3", "fast_accum": "yes"}), TypeError, ["fast_accum:", "True or False"], True),
    "int_mm/K mismatch names no transpose": ("int_mm", lambda mk: ((mk.arr((4, 16), "int8"), mk.arr((8, 8), "int8")), {}),
                                             ValueError, ["B: A is 4x16 so B must have 16 rows, got 8x8"], True),
    "describe_gemm/CAI shape of strings": ("describe_gemm", lambda mk: ((FakeDeviceArray(("4", 3)), mk.arr((3, 2))), {}),
                                           TypeError, ["A:", "shape and strides must be tuples of integers", "('4', 3)"], True),
    "describe_gemm/CAI negative shape": ("describe_gemm", lambda mk: ((FakeDeviceArray((-4, 3)), mk.arr((3, 2))), {}),
                                         ValueError, ["A:", "negative extent", "(-4, 3)"], True),
    "describe_gemm/CAI strides of floats": ("describe_gemm", lambda mk: (
        (FakeDeviceArray((4, 3), strides=(12.0, 4.0)), mk.arr((3, 2))), {}), TypeError, ["A:", "strides", "(12.0, 4.0)"], True),
    "describe_gemm/CAI data not a pointer": ("describe_gemm", lambda mk: ((_cai_with_data(None), mk.arr((3, 2))), {}),
                                             TypeError, ["A:", "data must be (pointer", "None"], True),
    "describe_gemm/CAI negative pointer": ("describe_gemm", lambda mk: ((_cai_with_data((-5, False)), mk.arr((3, 2))), {}),
                                           TypeError, ["A:", "data must be (pointer", "(-5, False)"], True),
    "grouped_gemm/one array as the groups": ("grouped_gemm", lambda mk: ((mk.arr((4, 3)), [mk.arr((3, 5))], None), {}),
                                             TypeError, ["As:", "one per group", "one array"], True),
    "forward_into/with_bias a string": ("forward_into", lambda mk: (_layer(mk), {"with_bias": "no"}),
                                        TypeError, ["with_bias:", "True or False", "'no'"], True),
    "forward_into/save_z a number": ("forward_into", lambda mk: (_layer(mk), {"save_z": 2}),
                                     TypeError, ["save_z:", "True or False"], True),
    "backward_into/with_bias a string": ("backward_into", lambda mk: (_bwd(mk)[:3] + (None,), {"with_bias": "yes"}),
                                         TypeError, ["with_bias:", "True or False"], True),
    "forward/save_z a string": ("forward", lambda mk: ((mk.arr((M, K)), mk.arr((K, N))), {"save_z": "yes"}),
                                TypeError, ["save_z:", "True or False"], True),
    "backward/need_gA a string": ("backward", lambda mk: (_bwd(mk), {"need_gA": "no"}),
                                  TypeError, ["need_gA:", "True or False"], True),
    "ActAttrs.make/with_bias a string": ("ActAttrs.make", lambda mk: ((), {"with_bias": "no"}),
                                         TypeError, ["with_bias:", "True or False"], True),
    "GemmPlan/batched a string": ("GemmPlan", lambda mk: ((mk.arr((2, 2)), mk.arr((2, 2)), mk.out((2, 2))), {"batched": "no"}),
                                  TypeError, ["batched:", "True or False"], True),
    "moe_gemm/check_offsets a string": ("moe_gemm", lambda mk: (
        (mk.arr((4, 8)), mk.arr((2, 8, 3)), [0, 2, 4], mk.out((4, 3))), {"check_offsets": "yes"}),
        TypeError, ["check_offsets:", "True or False"], True),
    "describe_grouped/inner mismatch": ("describe_grouped", lambda mk: (([mk.arr((2, 3))], [mk.arr((4, 2))],
                                                                         [mk.out((2, 2))]), {}),
                                        ValueError, ["Bs[0]:", "3 rows"], True),
}


def _check_raises(name, mk):
    fname, build, exc, words, _ = CASES[name]
    args, kwargs = build(mk)
    with pytest.raises(exc) as info:
        fn(fname)(*args, **kwargs)
    msg = str(info.value)
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"
    return msg


CPU_CASES = [n for n, c in CASES.items() if c[4]]


@pytest.mark.parametrize("name", CPU_CASES)
def test_bad_input_cpu(name):
    _check_raises(name, Fakes())


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_gpu_writes_nothing(name):
    import cupy as cp
    mk = Reals(cp)
    _check_raises(name, mk)
    cp.cuda.Device().synchronize()
    for out in mk.outputs:
        poisoned = cp.isnan(out) if out.dtype.kind in "fc" else out == np.iinfo(out.dtype).min
        assert bool(poisoned.all()), f"{name}: an output lost its poison"
    # The library is still usable on this thread.
    A, B = mk.arr((3, 4)), mk.arr((4, 2))
    got = cp.asnumpy(cygemm.gemm(A, B, math="fp32"))
    np.testing.assert_allclose(got, cp.asnumpy(A).astype(np.float64) @ cp.asnumpy(B), rtol=1e-5, atol=1e-6)


# Public names that take no argument a caller can get wrong (or only a file, whose faults are
# warnings by design): each with the reason it has no row.
NO_BAD_INPUT = {
    "get_include": "takes no arguments", "gpu_unavailable_reason": "takes no arguments", "require_gpu": "takes no arguments",
    "device_count": "takes no arguments", "versions": "takes no arguments",
    "release_workspaces": "takes no arguments", "get_options": "takes no arguments",
    "load_tuning": "a missing or corrupt file is a RuntimeWarning and is ignored (tests/engine/test_plans.py)",
    "clear_ws_cache": "takes no arguments", "clear_plan_cache": "takes no arguments",
    "parse_activation": "covered through every act= row",
    "GemmWorkspaces": "a NamedTuple of results",
    "ACTIVATIONS": "a dict", "ActAttrs": "covered as ActAttrs.make",
}


def test_table_covers_every_public_function():
    """Every public callable of cygemm and cygemm.gemm_ops has a row, or a reason above."""
    public = {n for n in cygemm.__all__ if not isinstance(getattr(cygemm, n), type(cygemm))}
    public |= set(gemm_ops.__all__)
    public -= {n for n in public if isinstance(getattr(cygemm, n, None), type) and issubclass(getattr(cygemm, n), Exception)}
    covered = {c[0].split(".")[0] for c in CASES.values()}
    missing = public - covered - set(NO_BAD_INPUT)
    assert not missing, f"public functions without a bad-input row: {sorted(missing)}"
    assert not (set(NO_BAD_INPUT) - public), "exemptions for names that are not public"


# ---- column blocks of one buffer do not overlap: accepted (exact check, not address ranges)

@pytest.mark.nogpu
def test_disjoint_column_blocks_pass_validation_cpu():
    mk = Fakes()
    P = mk.out((M, 16))
    A, out = mk.view(P, np.s_[:, :K]), mk.view(P, np.s_[:, K:K + N])
    # Validation passes; with no GPU the call then fails in CUDA, not in the overlap check.
    with pytest.raises((cygemm.CudaError, cygemm.CublasError)):
        cygemm.gemm(A, mk.arr((K, N)), out, stream=0)


@pytest.mark.gpu
def test_disjoint_column_blocks_compute_correctly():
    import cupy as cp
    rng = np.random.default_rng()
    P = cp.asarray(rng.standard_normal((M, 16)).astype(np.float32))
    before = cp.asnumpy(P)
    B = cp.asarray(rng.standard_normal((K, N)).astype(np.float32))
    cygemm.gemm(P[:, :K], B, P[:, K:K + N], math="fp32")
    after = cp.asnumpy(P)
    np.testing.assert_allclose(after[:, K:K + N], before[:, :K].astype(np.float64) @ cp.asnumpy(B), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(after[:, :K], before[:, :K])
    np.testing.assert_array_equal(after[:, K + N:], before[:, K + N:])


# ---- several GPUs: arrays and streams of another device (skip with one GPU)

def _two_gpus():
    import cupy as cp
    return cp


@pytest.mark.gpu
@pytest.mark.multigpu
def test_array_on_another_device_is_refused():
    cp = _two_gpus()
    with cp.cuda.Device(1):
        A1 = cp.ones((4, 4), cp.float32)
    with cp.cuda.Device(0):
        B, out = cp.ones((4, 4), cp.float32), cp.full((4, 4), cp.nan, cp.float32)
        with pytest.raises(ValueError, match="A: the array is on device 1"):
            cygemm.gemm(A1, B, out)
        assert bool(cp.isnan(out).all())


@pytest.mark.gpu
@pytest.mark.multigpu
def test_lt_workspace_on_another_device_is_refused():
    cp = _two_gpus()
    with cp.cuda.Device(1):
        ws1 = cp.empty(1 << 20, cp.uint8)
    with cp.cuda.Device(0):
        A, B, out = cp.ones((8, 8), cp.float32), cp.ones((8, 8), cp.float32), cp.full((8, 8), cp.nan, cp.float32)
        with pytest.raises(ValueError, match="lt_workspace: the array is on device 1"):
            gemm_ops.forward_into(A, B, out, act="relu", lt_workspace=ws1)
        assert bool(cp.isnan(out).all())


@pytest.mark.gpu
@pytest.mark.multigpu
def test_stream_of_another_device_is_refused():
    cp = _two_gpus()
    with cp.cuda.Device(1):
        s1 = cp.cuda.Stream(non_blocking=True)
    with cp.cuda.Device(0):
        A, out = cp.ones((4, 4), cp.float32), cp.full((4, 4), cp.nan, cp.float32)
        with pytest.raises(ValueError, match="stream: the stream belongs to device 1"):
            cygemm.gemm(A, A, out, stream=s1)
        assert bool(cp.isnan(out).all())


# ---- allocating calls while the stream is capturing: one CaptureError, and the capture survives

@pytest.mark.gpu
@pytest.mark.parametrize("call", ["forward", "backward", "ensure_workspaces", "gemm out=None", "matmul out=None",
                                  "matmul cast into out"])
def test_allocating_call_during_capture_is_refused(call):
    import cupy as cp
    mk = Reals(cp)
    A, B, gY = mk.arr((M, K)), mk.arr((K, N)), mk.arr((M, N))
    Y = mk.out((M, N))
    s = cp.cuda.Stream(non_blocking=True)
    cp.cuda.Device().synchronize()
    cygemm.gemm(A, B, Y, stream=s)          # warm: handles and workspace exist
    s.synchronize()
    Y.fill(cp.nan)
    cp.cuda.Device().synchronize()
    with cygemm.graph.capture(s) as g:
        with pytest.raises(cygemm.CaptureError, match="captur"):
            if call == "forward":
                gemm_ops.forward(A, B, stream=s)
            elif call == "backward":
                gemm_ops.backward(A, B, gY, None, stream=s)
            elif call == "ensure_workspaces":
                gemm_ops.ensure_workspaces(1234, 567, stream=s)
            elif call == "matmul out=None":
                cygemm.matmul(A, B, stream=s)
            elif call == "matmul cast into out":
                cygemm.matmul(A, B, cp.empty((M, N), cp.float64), stream=s)
            else:
                cygemm.gemm(A, B, stream=s)
        cygemm.gemm(A, B, Y, math="fp32", stream=s)    # the capture is still alive
    assert bool(cp.isnan(Y).all())                      # captured, not yet run
    g.launch(s)
    s.synchronize()
    np.testing.assert_allclose(cp.asnumpy(Y), cp.asnumpy(A).astype(np.float64) @ cp.asnumpy(B), rtol=1e-5, atol=1e-6)
