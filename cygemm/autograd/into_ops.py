"""cygemm's public functions as torch custom operators that write into given tensors
(``torch.ops.cygemm.*_into``): what torch.compile records where a model calls the public
functions themselves (:mod:`cygemm.autograd.traced` traces each call to one of these).

Each operator takes the public function's arrays and options (no ``stream``: it runs on
torch's current stream, as every operator does) and declares the tensors it writes, so that
functionalization orders them and Inductor writes into them in place, with no copy. Results
the public function would allocate are allocated by the caller, through torch. None is
differentiable (the public functions record no gradient either, except ``matmul``, which the
stand-in sends to the differentiable ``cygemm::matmul`` when it allocates).
"""
from typing import List, Optional

import torch
from torch.types import Number

import cygemm
from cygemm import dense, fp8, grouped
from cygemm.autograd import _stream_of

_Tensor = torch.Tensor


def _nothing(*args, **kwargs):
    """The fake implementation of an operator that only writes into its arguments."""
    return None


@torch.library.custom_op("cygemm::matmul_into", mutates_args=("out",))
def matmul_into(a: _Tensor, b: _Tensor, out: _Tensor, math: str, autotune: Optional[str],
                determinism: Optional[str]) -> None:
    cygemm.matmul(a, b, out, math=math, stream=_stream_of(a), autotune=autotune, determinism=determinism)


@torch.library.custom_op("cygemm::gemm_into", mutates_args=("out",))
def gemm_into(A: _Tensor, B: _Tensor, out: _Tensor, trans_a: str, trans_b: str, alpha: Number, beta: Number,
              math: str, autotune: Optional[str], determinism: Optional[str], batched: bool) -> None:
    run = cygemm.gemm_strided_batched if batched else cygemm.gemm
    run(A, B, out, trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta, math=math, stream=_stream_of(A),
        autotune=autotune, determinism=determinism)


@torch.library.custom_op("cygemm::int_mm_into", mutates_args=("out",))
def int_mm_into(A: _Tensor, B: _Tensor, out: _Tensor, autotune: Optional[str], determinism: Optional[str]) -> None:
    cygemm.int_mm(A, B, out, stream=_stream_of(A), autotune=autotune, determinism=determinism)


@torch.library.custom_op("cygemm::scaled_matmul_into", mutates_args=("out", "amax_out"))
def scaled_matmul_into(a: _Tensor, b: _Tensor, scale_a: _Tensor, scale_b: _Tensor, out: _Tensor,
                       bias: Optional[_Tensor], act: str, scale_out: Optional[_Tensor], amax_out: Optional[_Tensor],
                       fast_accum: bool, scale_mode_a: Optional[str], scale_mode_b: Optional[str],
                       determinism: Optional[str], autotune: Optional[str]) -> None:
    # (one mode for both operands, or a's and b's: as fp8.scaled_matmul's scale_mode takes them)
    mode = scale_mode_a if scale_mode_b is None else (scale_mode_a, scale_mode_b)
    fp8.scaled_matmul(a, b, scale_a, scale_b, out=out, bias=bias, act=act, scale_out=scale_out, amax_out=amax_out,
                      fast_accum=fast_accum, scale_mode=mode, determinism=determinism, stream=_stream_of(a),
                      autotune=autotune)


@torch.library.custom_op("cygemm::dense_forward_into", mutates_args=("out", "z_out", "lt_workspace"))
def dense_forward_into(A: _Tensor, B: _Tensor, out: _Tensor, bias: Optional[_Tensor], act: str, leaky_slope: float,
                       z_out: Optional[_Tensor], lt_workspace: Optional[_Tensor], math: str, autotune: Optional[str],
                       determinism: Optional[str]) -> None:
    dense.forward_into(A, B, out, bias, with_bias=bias is not None, act=act, leaky_slope=leaky_slope,
                       save_z=z_out is not None, z_out=z_out, lt_workspace=lt_workspace, math=math,
                       stream=_stream_of(A), autotune=autotune, determinism=determinism)


@torch.library.custom_op("cygemm::moe_gemm_into", mutates_args=("out",))
def moe_gemm_into(x: _Tensor, w: _Tensor, group_offsets: List[int], out: _Tensor, w_layout: str, math: str,
                  route: Optional[str], autotune: Optional[str], determinism: Optional[str]) -> None:
    grouped.moe_gemm(x, w, group_offsets, out, w_layout=w_layout, math=math, stream=_stream_of(x), route=route,
                     autotune=autotune, determinism=determinism)


@torch.library.custom_op("cygemm::moe_gemm_dev_into", mutates_args=("out",))
def moe_gemm_dev_into(x: _Tensor, w: _Tensor, offsets: _Tensor, out: _Tensor, w_layout: str, math: str,
                      route: Optional[str], autotune: Optional[str], determinism: Optional[str],
                      check_offsets: bool) -> None:
    grouped.moe_gemm(x, w, offsets, out, w_layout=w_layout, math=math, stream=_stream_of(x), route=route,
                     autotune=autotune, determinism=determinism, check_offsets=check_offsets)


@torch.library.custom_op("cygemm::moe_gemm_wgrad_into", mutates_args=("dw",))
def moe_gemm_wgrad_into(x: _Tensor, dy: _Tensor, offsets: _Tensor, dw: _Tensor, dw_layout: str, math: str,
                        route: Optional[str], autotune: Optional[str], determinism: Optional[str],
                        check_offsets: bool) -> None:
    grouped.moe_gemm_wgrad(x, dy, offsets, dw, dw_layout=dw_layout, math=math, stream=_stream_of(x), route=route,
                           autotune=autotune, determinism=determinism, check_offsets=check_offsets)


for _op in (matmul_into, gemm_into, int_mm_into, scaled_matmul_into, dense_forward_into, moe_gemm_into,
            moe_gemm_dev_into, moe_gemm_wgrad_into):
    _op.register_fake(_nothing)
del _op
