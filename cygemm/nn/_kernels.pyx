# cython: language_level=3, boundscheck=False, wraparound=False
# kernels: nn
"""The launchers of cygemm.nn's kernels (cygemm/kernels/nn.cu, compiled at build time): the
losses, forward and backward in one launch, and the optimizers, one launch for every parameter
of a model (they live in one flat buffer).

Each launcher reads its arrays' pointers and geometry (checking dtype, layout and size, so a
wrong array is an error before anything launches) and enqueues one kernel on `stream`: it
allocates nothing, synchronises nothing and reads nothing from the device, so a training step
can be captured whole into a CUDA graph. A scalar result (the loss) is reduced in the same
launch, deterministically: see include/cygemm/nn_kernels.h.
"""
from libc.stdint cimport int32_t, int64_t, uintptr_t, INT32_MAX

import cupy as cp
import ml_dtypes
import numpy as np

from cygemm.kernels.nn cimport *
from cygemm.capi cimport cudaStream_t, check_cuda, stream_from_object   # the public contract, as any Cython code

THREADS = CYGEMM_NN_THREADS
MAX_BLOCKS = 1024

cdef object _ndarray = cp.ndarray
cdef object _F32 = np.dtype(np.float32)
cdef object _I32 = np.dtype(np.int32)
cdef object _I64 = np.dtype(np.int64)
cdef object _U32 = np.dtype(np.uint32)
cdef object _BF16 = np.dtype(ml_dtypes.bfloat16)     # CuPy's bfloat16 (CuPy 14 reads ml_dtypes')


def grid_for(n, threads=THREADS):
    """Blocks for a grid-stride loop over n items (at least one, at most MAX_BLOCKS)."""
    return max(1, min(MAX_BLOCKS, (int(n) + threads - 1) // threads))


cdef int _array(object x, str name, object dtype) except -1:
    if not isinstance(x, _ndarray):
        raise TypeError(f"{name}: expected a CuPy {dtype.name} array, got {type(x).__name__}")
    if x.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype.name}, got {x.dtype.name}")
    return 0


cdef void* _flat(object x, str name, object dtype, int64_t size) except? NULL:
    """The pointer of x: a contiguous array of `dtype` of at least `size` elements."""
    _array(x, name, dtype)
    if x.size < size:
        raise ValueError(f"{name}: expected at least {size} elements, got {x.size}")
    if not x.flags.c_contiguous:
        raise ValueError(f"{name}: expected a contiguous array, got strides {x.strides}")
    return <void*><uintptr_t>x.data.ptr


cdef void* _rows(object x, str name, int64_t B, int64_t C, int64_t* ld) except? NULL:
    """The pointer of x: a (B, C) float32 array with unit stride along its rows (row stride *ld)."""
    _array(x, name, _F32)
    if x.ndim != 2 or x.shape[0] != B or x.shape[1] != C:
        raise ValueError(f"{name}: expected shape ({B}, {C}), got {x.shape}")
    if x.strides[1] != 4 or x.strides[0] % 4:
        raise ValueError(f"{name}: expected unit stride along its last axis, got strides {x.strides}")
    ld[0] = x.strides[0] // 4
    return <void*><uintptr_t>x.data.ptr


cdef int _grid(int blocks) except -1:
    if blocks < 1:
        raise ValueError(f"blocks: expected at least 1, got {blocks}")
    return 0


cdef int _shape(object x, str name, int64_t* B, int64_t* C) except -1:
    """(B, C) of a 2-D array, each at most INT32_MAX (the kernels count rows and columns in int)."""
    if not isinstance(x, _ndarray) or x.ndim != 2:
        raise TypeError(f"{name}: expected a 2-D CuPy float32 array, got "
                        f"{getattr(x, 'shape', type(x).__name__)}")
    B[0], C[0] = x.shape[0], x.shape[1]
    if B[0] > INT32_MAX or C[0] > INT32_MAX:
        raise ValueError(f"{name}: expected at most {INT32_MAX} rows and columns, got {x.shape}")
    return 0


def softmax_xent(logits, labels, grad, float grad_scale, float loss_scale, partial, done, loss, bad,
                 int blocks, stream, col_partial=None, bias_grad=None):
    """Softmax cross-entropy of `logits` (B, C) against `labels` (B,) in one launch.

    ``loss = loss_scale * sum(logsumexp(z) - z[y])``, ``grad = (softmax(z) - onehot(y)) *
    grad_scale``; with `bias_grad` (C,) also grad's column sums, the gradient of the bias of
    the layer that made the logits. A label outside [0, C) sets `bad` and adds nothing.

    Parameters
    ----------
    logits, grad : cupy.ndarray
        float32 (B, C), unit stride along the last axis.
    labels : cupy.ndarray
        int32 or int64 (B,), contiguous.
    grad_scale, loss_scale : float
        The factors of the gradient and of the summed loss.
    partial : cupy.ndarray
        float32 scratch of at least `blocks` elements.
    done : cupy.ndarray
        uint32 counter, 0 before and after the launch.
    loss : cupy.ndarray
        float32, 0-d: written.
    bad : cupy.ndarray
        int32, 0-d: set to 1 when a label is outside [0, C).
    blocks : int
        Blocks of THREADS threads (a warp per row).
    stream
        Where the kernel runs (a CuPy stream, an int cudaStream_t, ...).
    col_partial, bias_grad : cupy.ndarray, optional
        Both or neither: float32 scratch of at least blocks * C elements, and the (C,) float32
        column sums (C at most 1536: THREADS / 32 * C floats of shared memory).

    Returns
    -------
    cupy.ndarray
        `loss`.
    """
    cdef cudaStream_t s
    cdef int64_t B, C, ld, gld
    _shape(logits, "logits", &B, &C)
    cdef const float* z = <const float*>_rows(logits, "logits", B, C, &ld)
    cdef float* g = <float*>_rows(grad, "grad", B, C, &gld)
    if not isinstance(labels, _ndarray) or labels.dtype not in (_I32, _I64):
        raise TypeError(f"labels: expected a CuPy int32 or int64 array, got "
                        f"{getattr(labels, 'dtype', type(labels).__name__)}")
    if labels.shape != (B,):
        raise ValueError(f"labels: expected shape ({B},), got {labels.shape}")
    cdef bint wide = labels.dtype == _I64
    cdef const void* y = _flat(labels, "labels", labels.dtype, B)
    _grid(blocks)
    cdef float* p = <float*>_flat(partial, "partial", _F32, blocks)
    cdef unsigned int* d = <unsigned int*>_flat(done, "done", _U32, 1)
    cdef float* out = <float*>_flat(loss, "loss", _F32, 1)
    cdef int* flag = <int*>_flat(bad, "bad", _I32, 1)
    cdef float* col = NULL
    cdef float* bg = NULL
    if (bias_grad is None) != (col_partial is None):
        raise ValueError("bias_grad, col_partial: expected both or neither")
    if bias_grad is not None:
        bg = <float*>_flat(bias_grad, "bias_grad", _F32, C)
        col = <float*>_flat(col_partial, "col_partial", _F32, blocks * C)
    stream_from_object(stream, &s)
    with nogil:
        if wide:
            check_cuda(cygemm_softmax_xent_i64(z, ld, <const int64_t*>y, g, gld, <int>B, <int>C, grad_scale,
                                               loss_scale, p, d, out, flag, col, bg, blocks, s),
                       "cygemm_softmax_xent_i64")
        else:
            check_cuda(cygemm_softmax_xent_i32(z, ld, <const int32_t*>y, g, gld, <int>B, <int>C, grad_scale,
                                               loss_scale, p, d, out, flag, col, bg, blocks, s),
                       "cygemm_softmax_xent_i32")
    return loss


def mse(y, target, grad, float grad_scale, float loss_scale, partial, done, loss, int blocks, stream):
    """Mean squared error of `y` against `target` in one launch: ``loss = loss_scale *
    sum((y - t)^2)``, ``grad = grad_scale * (y - t)``.

    Parameters
    ----------
    y, target, grad : cupy.ndarray
        float32 (B, C), unit stride along the last axis.
    grad_scale, loss_scale, partial, done, loss, blocks, stream
        As :func:`softmax_xent`'s (blocks of THREADS threads over the B * C elements).

    Returns
    -------
    cupy.ndarray
        `loss`.
    """
    cdef cudaStream_t s
    cdef int64_t B, C, yld, tld, gld
    _shape(y, "y", &B, &C)
    cdef const float* yp = <const float*>_rows(y, "y", B, C, &yld)
    cdef const float* tp = <const float*>_rows(target, "target", B, C, &tld)
    cdef float* g = <float*>_rows(grad, "grad", B, C, &gld)
    _grid(blocks)
    cdef float* p = <float*>_flat(partial, "partial", _F32, blocks)
    cdef unsigned int* d = <unsigned int*>_flat(done, "done", _U32, 1)
    cdef float* out = <float*>_flat(loss, "loss", _F32, 1)
    stream_from_object(stream, &s)
    with nogil:
        check_cuda(cygemm_mse(yp, yld, tp, tld, g, gld, <int>B, <int>C, grad_scale, loss_scale, p, d, out,
                              blocks, s), "cygemm_mse")
    return loss


cdef int64_t _parameters(object params, object grads, object params_bf16, float** p, const void** g,
                        bint* grad_bf16, void** copy) except -1:
    """n, the number of parameters (float32), with their pointer, their gradients' (n float32,
    or n bfloat16: grad_bf16) and that of their bfloat16 copy (NULL when params_bf16 is None)."""
    _array(params, "params", _F32)
    cdef int64_t n = params.size
    p[0] = <float*>_flat(params, "params", _F32, n)
    if not isinstance(grads, _ndarray) or grads.dtype not in (_F32, _BF16):
        raise TypeError(f"grads: expected a CuPy float32 or bfloat16 array, got "
                        f"{getattr(grads, 'dtype', type(grads).__name__)}")
    grad_bf16[0] = grads.dtype == _BF16
    g[0] = <const void*>_flat(grads, "grads", grads.dtype, n)
    copy[0] = NULL
    if params_bf16 is not None:
        copy[0] = _flat(params_bf16, "params_bf16", _BF16, n)
        if params_bf16.size != n:
            raise ValueError(f"params_bf16: expected {n} elements (as params), got {params_bf16.size}")
    return n


cdef int _schedule(int schedule, int warmup, int total) except -1:
    if schedule != CYGEMM_LR_CONSTANT and schedule != CYGEMM_LR_LINEAR and schedule != CYGEMM_LR_COSINE:
        raise ValueError(f"schedule: expected 0 (constant), 1 (linear) or 2 (cosine), got {schedule}")
    if warmup < 0 or total < 0:
        raise ValueError(f"warmup, total: expected steps >= 0, got {warmup} and {total}")
    return 0


ctypedef struct _StepArgs:
    const float* rate
    int* step
    unsigned int* done
    cudaStream_t stream


cdef int _step_args(_StepArgs* a, object lr, object steps, object done, int schedule, int warmup, int total,
                    int blocks, object stream) except -1:
    """What every optimizer's launch reads alike: the base rate, the step count and the
    finishing counter on the device, the schedule, the grid and the stream."""
    a.rate = <const float*>_flat(lr, "lr", _F32, 1)
    a.step = <int*>_flat(steps, "steps", _I32, 1)
    a.done = <unsigned int*>_flat(done, "done", _U32, 1)
    _schedule(schedule, warmup, total)
    _grid(blocks)
    stream_from_object(stream, &a.stream)
    return 0


def sgd(params, grads, momentum_buffer, lr, steps, done, float momentum, float dampening, float weight_decay,
        bint nesterov, int schedule, int warmup, int total, float final_factor, int blocks, stream,
        params_bf16=None):
    """One SGD step (as ``torch.optim.SGD``) over every parameter, in one launch.

    Parameters
    ----------
    params : cupy.ndarray
        float32, contiguous, n elements: updated from the gradients.
    grads : cupy.ndarray
        float32 or bfloat16 (bf16-mixed training), contiguous, n elements.
    momentum_buffer : cupy.ndarray
        float32, n elements (read and written only when momentum != 0).
    lr : cupy.ndarray
        float32, 0-d: the base learning rate, read on the device.
    steps : cupy.ndarray
        int32, 0-d: the steps taken, advanced by one on the device.
    done : cupy.ndarray
        uint32 counter, 0 before and after the launch.
    momentum, dampening, weight_decay, nesterov
        As torch's.
    schedule, warmup, total, final_factor
        The rate at step t: 0 constant, 1 linear, 2 cosine decay to final_factor * lr at step
        `total`, after a linear warm-up over `warmup` steps.
    blocks : int
        Blocks of THREADS threads (a grid-stride loop over the n parameters).
    stream
        Where the kernel runs.
    params_bf16 : cupy.ndarray, optional
        bfloat16, contiguous, n elements: receives the updated parameters rounded to bfloat16
        (the copy bf16-mixed training's GEMMs read), in the same launch.
    """
    cdef float* p
    cdef const void* g
    cdef void* copy
    cdef bint grad_bf16
    cdef int64_t n = _parameters(params, grads, params_bf16, &p, &g, &grad_bf16, &copy)
    cdef float* buf = <float*>_flat(momentum_buffer, "momentum_buffer", _F32, n if momentum != 0 else 0)
    cdef _StepArgs a
    _step_args(&a, lr, steps, done, schedule, warmup, total, blocks, stream)
    with nogil:
        check_cuda(cygemm_sgd(p, g, grad_bf16, copy, buf, n, a.rate, a.step, momentum, dampening, weight_decay,
                              nesterov, schedule, warmup, total, final_factor, a.done, blocks, a.stream),
                   "cygemm_sgd")
    return params


def adam(params, grads, exp_avg, exp_avg_sq, lr, steps, done, float beta1, float beta2, float eps,
         float weight_decay, bint decoupled, int schedule, int warmup, int total, float final_factor,
         int blocks, stream, params_bf16=None):
    """One Adam (``decoupled`` False) or AdamW (True) step, as torch's, in one launch.

    Parameters
    ----------
    params, grads, lr, steps, done, schedule, warmup, total, final_factor, blocks, stream, params_bf16
        As :func:`sgd`'s.
    exp_avg, exp_avg_sq : cupy.ndarray
        float32, n elements: the moments, updated.
    beta1, beta2, eps, weight_decay
        As torch's.
    """
    cdef float* p
    cdef const void* g
    cdef void* copy
    cdef bint grad_bf16
    cdef int64_t n = _parameters(params, grads, params_bf16, &p, &g, &grad_bf16, &copy)
    cdef float* m = <float*>_flat(exp_avg, "exp_avg", _F32, n)
    cdef float* v = <float*>_flat(exp_avg_sq, "exp_avg_sq", _F32, n)
    cdef _StepArgs a
    _step_args(&a, lr, steps, done, schedule, warmup, total, blocks, stream)
    with nogil:
        check_cuda(cygemm_adam(p, g, grad_bf16, copy, m, v, n, a.rate, a.step, beta1, beta2, eps, weight_decay,
                               decoupled, schedule, warmup, total, final_factor, a.done, blocks, a.stream),
                   "cygemm_adam")
    return params


cdef int64_t _same_size(object x, object y) except -1:
    """The element count of x, which y (another contiguous array) must share."""
    if not isinstance(y, _ndarray) or y.size != x.size:
        raise ValueError(f"y: expected {x.size} elements (as x), got "
                         f"{getattr(y, 'size', type(y).__name__)}")
    return x.size


def f32_to_bf16(x, y, stream):
    """``y[...] = x`` rounded to bfloat16 (nearest even), in one launch.

    Parameters
    ----------
    x : cupy.ndarray
        float32, contiguous, any shape.
    y : cupy.ndarray
        bfloat16, contiguous, as many elements as x; not overlapping x.
    stream
        Where the kernel runs.

    Returns
    -------
    cupy.ndarray
        `y`.
    """
    cdef cudaStream_t s
    _array(x, "x", _F32)
    cdef int64_t n = _same_size(x, y)
    cdef const float* xp = <const float*>_flat(x, "x", _F32, n)
    cdef void* yp = _flat(y, "y", _BF16, n)
    cdef int blocks = grid_for(n)
    stream_from_object(stream, &s)
    with nogil:
        check_cuda(cygemm_f32_to_bf16(xp, yp, n, blocks, s), "cygemm_f32_to_bf16")
    return y


def bf16_to_f32(x, y, stream):
    """``y[...] = x`` widened from bfloat16 to float32 (exact), in one launch: as
    :func:`f32_to_bf16` with the dtypes swapped."""
    cdef cudaStream_t s
    _array(x, "x", _BF16)
    cdef int64_t n = _same_size(x, y)
    cdef const void* xp = <const void*>_flat(x, "x", _BF16, n)
    cdef float* yp = <float*>_flat(y, "y", _F32, n)
    cdef int blocks = grid_for(n)
    stream_from_object(stream, &s)
    with nogil:
        check_cuda(cygemm_bf16_to_f32(xp, yp, n, blocks, s), "cygemm_bf16_to_f32")
    return y
