"""On a GPU: the small-matrix kernel (cygemm/kernels/small_batched.cu) built for the GPU, as the
library ships it, gives the emulator's bits. The kernel promises bits (a matrix's result depends
on nothing but the matrix: the batch-invariant mode rests on it), and its CPU tests prove them on
the emulator only; here the same problems run through the emulator's build of the file and
through the library's GPU build (its C entry points, loaded from the extension), and C comes
back bit for bit equal, the NaN around its matrices included.

The library's build has no tensor-core tile (a launch option of the probe's build), whose mma
instruction sums in the hardware's order: the emulator promises no bits there."""
import ctypes
import itertools

import numpy as np
import pytest

import emulator
import small_batched_emulated as E

gpu = pytest.mark.gpu

OPS = {"real": ((0, 0), (1, 0), (0, 1), (1, 1)), "complex": ((0, 0), (1, 0), (2, 1), (0, 2), (2, 2))}
SHAPES = ((3, 5, 7), (8, 8, 8), (16, 12, 4), (1, 4, 3), (16, 16, 32), (12, 8, 40))
# pad_ld/gap/broadcast/offset/alpha/beta: each problem takes one, in turn
LAYOUTS = ({}, {"pad_ld": 3, "gap": 5, "offset": 1, "alpha": 0.75, "beta": -1.5},
           {"broadcast_b": True, "alpha": -2.0, "beta": 0.5}, {"broadcast_a": True, "pad_ld": 1})


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """(the emulator's build, the library's GPU build) of the kernel file, as the library builds it."""
    try:
        cpu = E.load(tmp_path_factory.mktemp("small_batched_cpu"), candidates=False)
    except emulator.Unavailable as e:
        pytest.skip(f"the kernel cannot be built for the CPU here: {e}")
    from cygemm.engine import small_batched
    return cpu, E.declare(ctypes.CDLL(small_batched.__file__))


def _on_the_gpu(lib, args, shape, buffers):
    """Run `args` (pointing into `buffers`' host memory) on the GPU through `lib`: C's whole buffer
    after it, as host storage."""
    import cupy as cp
    dev = [cp.asarray(X.buf) for X in buffers]
    moved = E.Args.from_buffer_copy(args)
    for field, X, d in zip("abc", buffers, dev):
        setattr(moved, field, d.data.ptr + X.offset * X.buf.itemsize)
    stream = cp.cuda.get_current_stream()
    rc = lib.cygemm_small_batched_shaped(moved, shape, ctypes.c_void_p(stream.ptr))
    assert rc == 0, f"the GPU launch failed: cudaError {rc}"
    stream.synchronize()
    for X, d in zip(buffers[:2], dev[:2]):          # (A and B as they were)
        assert np.array_equal(cp.asnumpy(d).view(np.uint8), X.buf.view(np.uint8))
    return cp.asnumpy(dev[2])


@gpu
@pytest.mark.parametrize("dtype", ("float32", "float64", "float16", "bfloat16", "complex64", "complex128"))
def test_the_gpus_bits_are_the_emulators(builds, dtype):
    cpu, dev = builds
    rng = np.random.default_rng(20261205)
    ops = OPS["complex" if dtype.startswith("complex") else "real"]
    compared = 0
    for i, ((opa, opb), (m, n, k)) in enumerate(itertools.product(ops, SHAPES)):
        layout = dict(LAYOUTS[i % len(LAYOUTS)])
        if dtype.startswith("complex") and "alpha" in layout:
            layout["alpha"] = complex(layout["alpha"], 0.25)
        args, buffers, expected, bound = E.problem(rng, dtype, m, n, k, 19, opa=opa, opb=opb, **layout)
        tiles = [(t, 0) for t in ("1x1", "2x2", "4x4")] + [("1x1", 1)]
        if cpu.cygemm_small_batched_vector_fits(args):
            tiles.append(("vector", 0))
        shapes = [(f"{t} pad {p}", E.Shape(E.TILES[t], 128, 16 << 10, p)) for t, p in tiles]
        shapes.append(("the rule's", cpu.cygemm_small_batched_rule(args)))
        assert dev.cygemm_small_batched_rule(args).tile == shapes[-1][1].tile     # (one rule, both builds)
        C = buffers[2]
        poisoned = C.buf.copy()
        for name, shape in shapes:
            C.buf[:] = poisoned
            on_gpu = _on_the_gpu(dev, args, shape, buffers)
            assert cpu.cygemm_small_batched_shaped(args, shape, None) == 0
            got = C.matrices()
            assert not (~(np.abs(got - expected) <= bound)).any(), (dtype, name, m, n, k, layout)
            where = f"{dtype} op {opa}{opb} {m}x{n}x{k} {layout} {name}"
            differing = on_gpu.view(np.uint8).reshape(on_gpu.size, -1) != C.buf.view(np.uint8).reshape(C.size, -1)
            assert not differing.any(), f"{where}: {differing.any(axis=1).sum()} elements differ from the GPU's"
            compared += 1
    assert compared >= len(ops) * len(SHAPES) * 4
    print(f"{dtype}: {compared} launches bit for bit equal")
