"""CPU property tests, with hypothesis (the module skips where it is missing; the fixed-case
checks in test_mapping.py run regardless): for random shapes, transposes and layouts (slices,
F order, padding, broadcast batches), the cuBLAS arguments cygemm derives compute
op(A) @ op(B) under a NumPy model of column-major cuBLAS; and a batched output's overlap check
agrees with brute force for any batch stride. Derandomized, so CI runs a fixed set."""
import numpy as np
import pytest

pytest.importorskip("hypothesis")
from hypothesis import given, settings, strategies as st  # noqa: E402

import cygemm.rowmajor as cg  # noqa: E402
from fakes import BASE, FakeDeviceArray as F, fake_view  # noqa: E402
from refs.cublas import cublas_gemm_model  # noqa: E402

LAYOUTS = ["C", "F", "C-pad", "F-pad"]


def carve(buf, cursor, rows, cols, layout, rng, batch=None):
    """A view of logical shape ([batch,] rows, cols) in `layout`, cut from buf after cursor[0]."""
    pad = 3 if layout.endswith("pad") else 0
    outer, inner = (rows, cols) if layout.startswith("C") else (cols, rows)
    nb = batch or 1
    size = nb * outer * (inner + pad)
    block = buf[cursor[0]:cursor[0] + size].reshape(nb, outer, inner + pad)[:, :, :inner]
    cursor[0] += size + 5
    view = block if layout.startswith("C") else block.transpose(0, 2, 1)
    view[...] = rng.standard_normal(view.shape)
    return view if batch else view[0]


@settings(max_examples=150, deadline=None, derandomize=True)
@given(m=st.integers(1, 40), k=st.integers(1, 40), n=st.integers(1, 40),
       ta=st.booleans(), tb=st.booleans(), la=st.sampled_from(LAYOUTS), lb=st.sampled_from(LAYOUTS),
       lc=st.sampled_from(LAYOUTS), batch=st.sampled_from([None, 1, 3]), bcast=st.sampled_from(["none", "A", "B"]))
def test_mapping_property(m, k, n, ta, tb, la, lb, lc, batch, bcast):
    rng = np.random.default_rng(m * 10007 + k * 101 + n)
    buf = np.zeros(60_000, np.float32)
    cursor = [0]
    a_shape = (k, m) if ta else (m, k)
    b_shape = (n, k) if tb else (k, n)
    A = carve(buf, cursor, *a_shape, la, rng, batch)
    B = carve(buf, cursor, *b_shape, lb, rng, batch)
    C = carve(buf, cursor, m, n, lc, rng, batch)
    if batch and bcast == "A":
        A = np.broadcast_to(A[0], A.shape)          # batch stride 0
    elif batch and bcast == "B":
        B = B[0]                                    # a 2-D operand broadcast over the batch
    C[...] = np.nan
    d = cg.describe_gemm(fake_view(buf, A), fake_view(buf, B), fake_view(buf, C),
                         trans_a=ta, trans_b=tb, batched=bool(batch))
    cublas_gemm_model(buf, d, batched=bool(batch))
    nb = batch or 1
    A3 = np.broadcast_to(A, (nb, *a_shape)).astype(np.float64)
    B3 = np.broadcast_to(B, (nb, *b_shape)).astype(np.float64)
    ref = (A3.swapaxes(1, 2) if ta else A3) @ (B3.swapaxes(1, 2) if tb else B3)
    np.testing.assert_allclose(np.broadcast_to(C, ref.shape), ref, rtol=1e-5, atol=1e-5, err_msg=str(d))


# ---- a batched output's matrices must not overlap: the check against brute force (issue 10, item 4)

def _brute_force_overlap(batch, rows, cols, row_stride, batch_stride):
    seen = set()
    for i in range(batch):
        cells = {i * batch_stride + r * row_stride + c for r in range(rows) for c in range(cols)}
        if cells & seen:
            return True
        seen |= cells
    return False


@settings(max_examples=300, deadline=None, derandomize=True)
@given(batch=st.integers(2, 6), rows=st.integers(1, 5), cols=st.integers(1, 5), extra=st.integers(0, 6),
       batch_stride=st.integers(1, 60))
def test_batch_overlap_check_matches_brute_force(batch, rows, cols, extra, batch_stride):
    row_stride = cols + extra
    span = (batch - 1) * batch_stride + (rows - 1) * row_stride + cols
    out = F((batch, rows, cols), strides=(batch_stride * 4, row_stride * 4, 4), ptr=BASE + 2**24)
    A, B = F((batch, rows, 3)), F((batch, 3, cols), ptr=BASE + 2**25 + span * 4)
    overlaps = _brute_force_overlap(batch, rows, cols, row_stride, batch_stride)
    if overlaps:
        with pytest.raises(ValueError, match="out: batch stride"):
            cg.describe_gemm(A, B, out, batched=True)
    else:
        cg.describe_gemm(A, B, out, batched=True)
