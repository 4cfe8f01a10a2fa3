"""cygemm/kernels/nn.cu on the CPU (tests/kernels/emulator): the losses of cygemm.nn (softmax
cross-entropy with int32 and int64 labels, its bias gradient; mean squared error), forward and
backward in one launch whose last block adds the partial sums in block order, and the optimizers
(SGD with momentum, dampening, Nesterov and weight decay; Adam and AdamW), several steps over one
flat buffer, with float32 and bfloat16 gradients and the bfloat16 copy of the parameters; the
float32/bfloat16 conversions. Against float64 NumPy for the losses and against torch's own
optimizers (torch.optim on the CPU, an independent implementation) for the steps, on grids of
one and of several blocks, with the completion counter left at zero for the next launch. The
GPU tests through cygemm are tests/nn/."""
import ctypes

import ml_dtypes
import numpy as np
import pytest

import emulator
from refs import rows as rows_ref

THREADS = 256
c_f, c_i, c_i64, p = ctypes.c_float, ctypes.c_int, ctypes.c_longlong, ctypes.c_void_p


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    lib = emulator.build_or_skip("nn", tmp_path_factory)
    xent = [p, c_i64, p, p, c_i64, c_i, c_i, c_f, c_f, p, p, p, p, p, p, c_i, p]
    lib.cygemm_softmax_xent_i32.argtypes = xent
    lib.cygemm_softmax_xent_i64.argtypes = xent
    lib.cygemm_mse.argtypes = [p, c_i64, p, c_i64, p, c_i64, c_i, c_i, c_f, c_f, p, p, p, c_i, p]
    lib.cygemm_sgd.argtypes = [p, p, c_i, p, p, c_i64, p, p, c_f, c_f, c_f, c_i, c_i, c_i, c_i, c_f, p, c_i, p]
    lib.cygemm_adam.argtypes = [p, p, c_i, p, p, p, c_i64, p, p, c_f, c_f, c_f, c_f, c_i, c_i, c_i, c_i, c_f, p,
                                c_i, p]
    lib.cygemm_f32_to_bf16.argtypes = [p, p, c_i64, c_i, p]
    lib.cygemm_bf16_to_f32.argtypes = [p, p, c_i64, c_i, p]
    for name in ("cygemm_softmax_xent_i32", "cygemm_softmax_xent_i64", "cygemm_mse", "cygemm_sgd", "cygemm_adam",
                 "cygemm_f32_to_bf16", "cygemm_bf16_to_f32"):
        getattr(lib, name).restype = ctypes.c_int
    return lib


def addr(a):
    return a.ctypes.data


class Counters:
    """The launch's scratch: partial sums (NaN first), the zeroed completion counter, the loss."""

    def __init__(self, blocks, C=0):
        self.partial = np.full(blocks, np.nan, np.float32)
        self.done = np.zeros(1, np.uint32)
        self.loss = np.full(1, np.nan, np.float32)
        self.bad = np.zeros(1, np.int32)
        self.col_partial = np.full(blocks * max(C, 1), np.nan, np.float32)


@pytest.mark.parametrize("labels_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("B,C,blocks", [(1, 3, 1), (9, 10, 1), (37, 130, 3), (64, 7, 8)])
@pytest.mark.parametrize("with_bias_grad", [False, True])
def test_softmax_cross_entropy_and_its_gradient(lib, labels_dtype, B, C, blocks, with_bias_grad):
    rng = np.random.default_rng([B, C, blocks, with_bias_grad])
    ld, gld = C + 3, C + 1
    logits = np.full((B, ld), np.nan, np.float32)
    logits[:, :C] = rng.standard_normal((B, C)) * 4
    labels = rng.integers(0, C, B).astype(labels_dtype)
    grad = np.full((B, gld), np.nan, np.float32)
    k = Counters(blocks, C)
    bias_grad = np.full(C, np.nan, np.float32)
    fn = lib.cygemm_softmax_xent_i32 if labels_dtype == np.int32 else lib.cygemm_softmax_xent_i64
    assert fn(addr(logits), ld, addr(labels), addr(grad), gld, B, C, 1.0 / B, 1.0 / B, addr(k.partial),
              addr(k.done), addr(k.loss), addr(k.bad), addr(k.col_partial) if with_bias_grad else None,
              addr(bias_grad) if with_bias_grad else None, blocks, None) == 0
    z = logits[:, :C].astype(np.float64)
    onehot = np.eye(C)[labels]
    ref_loss = float(np.mean(rows_ref.logsumexp(z) - z[np.arange(B), labels]))
    ref_grad = (rows_ref.softmax(z) - onehot) / B
    assert abs(float(k.loss[0]) - ref_loss) <= 1e-5 * max(1.0, abs(ref_loss))
    assert np.max(np.abs(grad[:, :C] - ref_grad)) <= 1e-6
    assert np.isnan(grad[:, C:]).all(), "written past the gradient's columns"
    if with_bias_grad:
        assert np.max(np.abs(bias_grad - ref_grad.sum(axis=0))) <= 1e-5
    assert k.done[0] == 0 and k.bad[0] == 0


def test_a_label_outside_the_classes_sets_bad_and_adds_nothing(lib):
    B, C = 4, 5
    logits = np.zeros((B, C), np.float32)
    labels = np.array([0, 5, 2, -1], np.int32)
    grad = np.full((B, C), np.nan, np.float32)
    k = Counters(1)
    assert lib.cygemm_softmax_xent_i32(addr(logits), C, addr(labels), addr(grad), C, B, C, 1.0, 1.0,
                                       addr(k.partial), addr(k.done), addr(k.loss), addr(k.bad), None, None, 1,
                                       None) == 0
    assert k.bad[0] != 0
    assert abs(float(k.loss[0]) - 2 * np.log(C)) <= 1e-5       # the two valid rows only


@pytest.mark.parametrize("B,C,blocks", [(1, 1, 1), (13, 21, 2), (100, 33, 5)])
def test_mean_squared_error_and_its_gradient(lib, B, C, blocks):
    rng = np.random.default_rng([B, C, blocks])
    y = rng.standard_normal((B, C + 2)).astype(np.float32)
    t = rng.standard_normal((B, C)).astype(np.float32)
    grad = np.full((B, C + 5), np.nan, np.float32)
    k = Counters(blocks)
    n = B * C
    assert lib.cygemm_mse(addr(y), C + 2, addr(t), C, addr(grad), C + 5, B, C, 2.0 / n, 1.0 / n, addr(k.partial),
                          addr(k.done), addr(k.loss), blocks, None) == 0
    d = y[:, :C].astype(np.float64) - t
    assert abs(float(k.loss[0]) - float(np.mean(d * d))) <= 1e-5 * max(1.0, float(np.mean(d * d)))
    assert np.max(np.abs(grad[:, :C] - 2.0 / n * d)) <= 1e-6
    assert np.isnan(grad[:, C:]).all() and k.done[0] == 0


def _bf16(x):
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16)


@pytest.mark.parametrize("momentum,dampening,nesterov,weight_decay", [
    (0.0, 0.0, False, 0.0), (0.9, 0.0, False, 0.0), (0.9, 0.1, False, 0.01), (0.9, 0.0, True, 0.05)])
@pytest.mark.parametrize("grad_bf16", [False, True])
def test_sgd_steps_as_torch_optim_sgd(lib, momentum, dampening, nesterov, weight_decay, grad_bf16):
    torch = pytest.importorskip("torch")
    n, blocks, lr = 1000, 3, 0.05
    rng = np.random.default_rng(1)
    p = rng.standard_normal(n).astype(np.float32)
    ref = torch.nn.Parameter(torch.tensor(p.copy()))
    opt = torch.optim.SGD([ref], lr=lr, momentum=momentum, dampening=dampening, nesterov=nesterov,
                          weight_decay=weight_decay)
    buf = np.zeros(n, np.float32)
    lr_dev, step, done = np.array([lr], np.float32), np.zeros(1, np.int32), np.zeros(1, np.uint32)
    p_bf16 = np.full(n, np.nan, ml_dtypes.bfloat16)
    for s in range(3):
        g = rng.standard_normal(n).astype(np.float32)
        g_dev = _bf16(g) if grad_bf16 else g
        assert lib.cygemm_sgd(addr(p), addr(g_dev), int(grad_bf16), addr(p_bf16), addr(buf), n, addr(lr_dev),
                              addr(step), momentum, dampening, weight_decay, int(nesterov), 0, 0, 0, 1.0,
                              addr(done), blocks, None) == 0
        ref.grad = torch.tensor(np.asarray(g_dev, np.float32))
        opt.step()
        assert step[0] == s + 1 and done[0] == 0
        assert np.max(np.abs(p - ref.detach().numpy())) <= 1e-6 * (s + 1)
        assert np.array_equal(np.asarray(p_bf16, np.float32), np.asarray(_bf16(p), np.float32))


@pytest.mark.parametrize("decoupled", [False, True])
@pytest.mark.parametrize("weight_decay", [0.0, 0.02])
def test_adam_and_adamw_step_as_torchs(lib, decoupled, weight_decay):
    torch = pytest.importorskip("torch")
    n, blocks, lr = 700, 2, 0.01
    rng = np.random.default_rng(2)
    p = rng.standard_normal(n).astype(np.float32)
    ref = torch.nn.Parameter(torch.tensor(p.copy()))
    make = torch.optim.AdamW if decoupled else torch.optim.Adam
    opt = make([ref], lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=weight_decay)
    m, v = np.zeros(n, np.float32), np.zeros(n, np.float32)
    lr_dev, step, done = np.array([lr], np.float32), np.zeros(1, np.int32), np.zeros(1, np.uint32)
    for s in range(4):
        g = rng.standard_normal(n).astype(np.float32)
        assert lib.cygemm_adam(addr(p), addr(g), 0, None, addr(m), addr(v), n, addr(lr_dev), addr(step), 0.9,
                               0.999, 1e-8, weight_decay, int(decoupled), 0, 0, 0, 1.0, addr(done), blocks,
                               None) == 0
        ref.grad = torch.tensor(g)
        opt.step()
        assert step[0] == s + 1 and done[0] == 0
        assert np.max(np.abs(p - ref.detach().numpy())) <= 2e-6 * (s + 1)


@pytest.mark.parametrize("n,blocks", [(0, 1), (1, 1), (1000, 3), (5000, 1)])
def test_float32_bfloat16_conversions_round_to_nearest_even(lib, n, blocks):
    rng = np.random.default_rng([n, blocks])
    x = (rng.standard_normal(n) * 100).astype(np.float32)
    y = np.full(n + 8, np.nan, ml_dtypes.bfloat16)
    assert lib.cygemm_f32_to_bf16(addr(x), addr(y), n, blocks, None) == 0
    assert np.array_equal(y[:n].view(np.uint16), _bf16(x).view(np.uint16))
    assert np.isnan(np.asarray(y[n:], np.float32)).all()
    back = np.full(n + 8, np.nan, np.float32)
    assert lib.cygemm_bf16_to_f32(addr(y), addr(back), n, blocks, None) == 0
    assert np.array_equal(back[:n], np.asarray(y[:n], np.float32)) and np.isnan(back[n:]).all()
