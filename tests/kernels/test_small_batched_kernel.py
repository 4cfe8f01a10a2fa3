"""cygemm/kernels/small_batched.cu on the CPU (tests/kernels/emulator): the launch logic and every
tile of the kernel, run on host memory by the emulator, against float64 references on fresh random
inputs with NaN-poisoned outputs. Every dtype, operation (conjugate transposes for complex) and
tile, padded, unpadded and in two stages (copies landing only when waited for), on sizes that
leave partial tiles and partial groups of matrices;
leading dimensions past the rows, gaps between matrices, broadcast operands, starts off 16 bytes,
alpha and beta; the launch shapes' threads, shared memory and grids. Nothing outside C is written,
A and B are not. A matrix's bits are the same whatever its batch, its place in it, the tile and
the launch shape. Shapes out of range are refused before anything runs.

The file is built as the probe builds it, with the launch options under measurement compiled in
(the unpadded vector tile, two stages), and as the library builds it, where those shapes fall back
to the measured ones. The GPU tests of the library's kernel through cygemm are
tests/engine/test_small_batched.py."""
import contextlib
import itertools

import numpy as np
import pytest

import emulator
import small_batched_emulated as E

REAL = ("float32", "float16", "bfloat16", "float64")
COMPLEX = ("complex64", "complex128")
REAL_OPS = ((0, 0), (1, 0), (0, 1), (1, 1))
COMPLEX_OPS = REAL_OPS + ((2, 0), (0, 2), (2, 2), (1, 2))
SHAPES = ((3, 5, 7), (8, 8, 8), (16, 12, 4), (12, 16, 16), (2, 2, 2), (1, 4, 3))
STAGING = ((0, 1), (1, 1), (0, 2))          # (pad, stages): two stages copy runs as stored, unpadded
INVALID = 1                     # cudaErrorInvalidValue


def _load(tmp_path_factory, candidates):
    try:
        lib = E.load(tmp_path_factory.mktemp("small_batched_cpu"), candidates)
    except emulator.Unavailable as e:
        pytest.skip(f"the kernel cannot be built for the CPU here: {e}")
    lib.cuda_on_cpu_set_sm_count(2)         # (a few blocks: groups of matrices run in turn)
    return lib


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    """The kernel file as the probe builds it: every launch option."""
    return _load(tmp_path_factory, True)


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    """The kernel file as the library builds it: the options under measurement left out."""
    return _load(tmp_path_factory, False)


def run(lib, args, shape, buffers):
    """Run one shape; the launch's error code. A and B must be left as they were."""
    A, B, C = buffers
    before = [X.buf.copy() for X in buffers]
    rc = lib.cygemm_small_batched_shaped(args, shape, None)
    assert np.array_equal(A.buf.view(np.uint8), before[0].view(np.uint8))
    assert np.array_equal(B.buf.view(np.uint8), before[1].view(np.uint8))
    if rc:                                  # (refused: C as it was)
        assert np.array_equal(C.buf.view(np.uint8), before[2].view(np.uint8))
    else:                                   # nothing outside the matrices of C written
        mask = C.outside()
        assert np.array_equal(C.buf[mask].view(np.uint8), before[2][mask].view(np.uint8))
    return rc


def check(lib, rng, dtype, shape, m, n, k, batch, **layout):
    args, buffers, expected, bound = E.problem(rng, dtype, m, n, k, batch, **layout)
    assert run(lib, args, shape, buffers) == 0, (shape, m, n, k, layout)
    got = buffers[2].matrices()
    bad = ~(np.abs(got - expected) <= bound)         # (NaN fails)
    assert not bad.any(), (f"{dtype} {m}x{n}x{k} {layout} {shape}: {bad.sum()} of {bad.size} wrong, "
                           f"first at {np.argwhere(bad)[0]}: {got[bad][0]} vs {expected[bad][0]}")
    return got


@contextlib.contextmanager
def sm_count(lib, n):
    """The emulated GPU with n SMs for a while (then the fixture's 2 again)."""
    lib.cuda_on_cpu_set_sm_count(n)
    try:
        yield
    finally:
        lib.cuda_on_cpu_set_sm_count(2)


def tiles_for(lib, dtype, m, n, k, opa=0, opb=0):
    """The tiles that take the problem (the vector and tensor-core tiles only where m, n, k fit them)."""
    args, _, _, _ = E.problem(np.random.default_rng(0), dtype, m, n, k, 1, opa=opa, opb=opb)
    return (["1x1", "2x2", "4x4"] + (["vector"] if lib.cygemm_small_batched_vector_fits(args) else [])
            + (["mma"] if lib.cygemm_small_batched_mma_fits(args) else []))


# ---------------------------------------------------------------- every dtype, operation, tile

@pytest.mark.parametrize("dtype", REAL + COMPLEX)
def test_every_tile_and_operation_against_float64(lib, dtype):
    rng = np.random.default_rng(1)
    ops = COMPLEX_OPS if dtype in COMPLEX else REAL_OPS
    for (m, n, k), (opa, opb) in itertools.product(SHAPES, ops):
        for tile, (pad, stages) in itertools.product(tiles_for(lib, dtype, m, n, k, opa, opb), STAGING):
            shape = E.Shape(E.TILES[tile], 128, 16 << 10, pad, stages)
            check(lib, rng, dtype, shape, m, n, k, 13, opa=opa, opb=opb)


@pytest.mark.parametrize("dtype", REAL + COMPLEX)
def test_the_vector_tile_on_its_sizes(lib, dtype):
    """Multiples of its width V (4 for float32 and the 16-bit types, 2 for float64 and complex64, 1
    for complex128), every operation, padded or packed."""
    rng = np.random.default_rng(2)
    ops = COMPLEX_OPS if dtype in COMPLEX else REAL_OPS
    for (m, n, k), (opa, opb), (pad, stages) in itertools.product(((4, 8, 12), (16, 16, 16), (8, 4, 24)), ops, STAGING):
        if "vector" in tiles_for(lib, dtype, m, n, k, opa, opb):
            check(lib, rng, dtype, E.Shape(E.TILES["vector"], 256, 32 << 10, pad, stages), m, n, k, 9,
                  opa=opa, opb=opb)


@pytest.mark.parametrize("dtype", ("float16", "bfloat16"))
def test_the_tensor_core_tile(lib, dtype):
    """float16 and bfloat16 with m, n, k multiples of 16, 8, 16: every operation, padded, unpadded and
    in two stages, broadcast operands, gaps, starts off 16 bytes, alpha and beta, warps that take
    several tiles in turn (32 threads) or none (256)."""
    rng = np.random.default_rng(12)
    for (m, n, k), (opa, opb) in itertools.product(((16, 8, 16), (16, 16, 32), (32, 24, 16)), REAL_OPS):
        assert "mma" in tiles_for(lib, dtype, m, n, k, opa, opb)
        for (pad, stages), threads in itertools.product(STAGING, (32, 256)):
            check(lib, rng, dtype, E.Shape(E.TILES["mma"], threads, 16 << 10, pad, stages), m, n, k, 7,
                  opa=opa, opb=opb)
    for layout in LAYOUTS:
        check(lib, rng, dtype, E.Shape(E.TILES["mma"], 128, 16 << 10, 0, 2), 16, 16, 16, 9, opa=1, **layout)
    args, _, _, _ = E.problem(rng, dtype, 16, 12, 16, 2)
    assert not lib.cygemm_small_batched_mma_fits(args)                  # (n not a multiple of 8)
    args, _, _, _ = E.problem(rng, "float32", 16, 16, 16, 2)
    assert not lib.cygemm_small_batched_mma_fits(args)


# ---------------------------------------------------------------- layouts

LAYOUTS = (dict(pad_ld=3), dict(gap=5), dict(broadcast_a=True), dict(broadcast_b=True),
           dict(offset=1), dict(offset=1, pad_ld=1, gap=3), dict(alpha=-0.5, beta=2.0),
           dict(broadcast_b=True, beta=0.25))


@pytest.mark.parametrize("dtype", REAL + COMPLEX)
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()))
def test_leading_dimensions_strides_broadcast_and_scalars(lib, dtype, layout):
    rng = np.random.default_rng(3)
    layout = dict(layout)
    if dtype in COMPLEX and "alpha" in layout:
        layout.update(alpha=-0.5 + 0.75j, beta=2.0 - 1.0j)
    for (m, n, k), (opa, opb) in itertools.product(((3, 5, 7), (8, 8, 8), (16, 16, 16)), REAL_OPS):
        for tile, (pad, stages) in itertools.product(tiles_for(lib, dtype, m, n, k, opa, opb), STAGING):
            check(lib, rng, dtype, E.Shape(E.TILES[tile], 128, 16 << 10, pad, stages), m, n, k, 11, opa=opa,
                  opb=opb, **layout)


# ---------------------------------------------------------------- launch shapes and grids

@pytest.mark.parametrize("dtype", ("float32", "float16", "complex128"))
def test_launch_shapes_and_grids(lib, dtype):
    """Threads, shared memory and SM counts that change how many matrices a block takes, how many
    blocks run, and how a batch's last group is cut; batches of 2 to 700 (at most 32 blocks an SM:
    the largest take several groups a block)."""
    rng = np.random.default_rng(4)
    for sms, threads, smem, batch in itertools.product((1, 3), (32, 96, 256), (2 << 10, 8 << 10, 48 << 10),
                                                       (2, 37, 700)):
        for (m, n, k), stages in itertools.product(((4, 4, 4), (5, 3, 8)), (1, 2)):
            if (m * k + k * n + 4) * {"float16": 4, "float32": 4}.get(dtype, 16) * stages > smem:
                continue                        # (one pair past the shared memory given)
            with sm_count(lib, sms):
                check(lib, rng, dtype, E.Shape(E.TILES["2x2"], threads, smem, 0, stages), m, n, k, batch,
                      gap=0 if stages == 2 else 1)


def test_the_rules_shape_runs_every_problem_the_kernel_takes(lib):
    rng = np.random.default_rng(5)
    for dtype, (m, n, k), (opa, opb) in itertools.product(REAL + COMPLEX, ((2, 2, 2), (12, 12, 12), (16, 16, 16),
                                                                           (8, 32, 8), (32, 8, 32)), REAL_OPS):
        args, buffers, expected, bound = E.problem(rng, dtype, m, n, k, 5, opa=opa, opb=opb)
        if lib.cygemm_small_batched_fits(args):
            check(lib, rng, dtype, lib.cygemm_small_batched_rule(args), m, n, k, 5, opa=opa, opb=opb)


@pytest.fixture(params=("waited", "issued"))
def copies_land(lib, request):
    """Asynchronous copies landing when waited for (the latest), or when issued (the earliest)."""
    lib.cuda_on_cpu_copies_land(request.param == "issued")
    yield request.param
    lib.cuda_on_cpu_copies_land(0)


@pytest.mark.parametrize("dtype", REAL + COMPLEX)
def test_two_stages_whenever_the_copies_land(lib, dtype, copies_land):
    """Blocks that take several runs in turn (one SM: at most 32 blocks; a run of one or two
    matrices), so each buffer is refilled while the block may still read the other."""
    rng = np.random.default_rng(9)
    with sm_count(lib, 1):
        for (m, n, k), tile, layout in itertools.product(((4, 4, 4), (3, 5, 7), (8, 8, 16)), ("1x1", "2x2", "vector"),
                                                         ({}, dict(broadcast_a=True), dict(broadcast_b=True))):
            if tile in tiles_for(lib, dtype, m, n, k):
                smem = 2 * (m * k + k * n) * {"float16": 6, "bfloat16": 6}.get(dtype, E.itemsize(dtype)) + 128
                check(lib, rng, dtype, E.Shape(E.TILES[tile], 64, smem, 0, 2), m, n, k, 97, **layout)


def test_two_stages_copy_runs_asynchronously_and_fall_back_to_one_elsewhere(lib):
    """Contiguous runs on 16 bytes (a broadcast operand staged once beside them) take two stages;
    gaps between matrices, padded leading dimensions, starts off 16 bytes, conjugation and padding
    take one, with the same results."""
    rng = np.random.default_rng(8)
    for dtype, layout, pad, two in (("float32", {}, 0, True), ("float16", {}, 0, True),
                                    ("complex64", dict(broadcast_b=True), 0, True),
                                    ("float64", dict(broadcast_a=True), 0, True),
                                    ("float32", dict(gap=4), 0, False), ("float32", dict(pad_ld=4), 0, False),
                                    ("float32", dict(offset=1), 0, False), ("float32", {}, 1, False),
                                    ("complex64", dict(opa=2), 0, False)):
        before = lib.cuda_on_cpu_async_copies()
        check(lib, rng, dtype, E.Shape(E.TILES["1x1"], 64, 4 << 10, pad, 2), 4, 4, 8, 21, **layout)
        assert (lib.cuda_on_cpu_async_copies() > before) == two, (dtype, layout, pad)


def test_two_stages_fall_back_to_one_where_a_matrix_of_each_does_not_fit_twice(lib):
    """complex128 32 x 32 x 32 (16 KiB a matrix): one stage fits 48 KiB, two stages would not."""
    rng = np.random.default_rng(10)
    for dtype, (m, n, k), (opa, opb), tile in (("complex128", (32, 32, 32), (0, 0), "1x1"),
                                               ("complex128", (33, 2, 64), (1, 0), "2x2"),
                                               ("float32", (64, 64, 64), (0, 1), "2x2"),
                                               ("complex128", (16, 16, 16), (0, 0), "vector")):
        before = lib.cuda_on_cpu_async_copies()
        check(lib, rng, dtype, E.Shape(E.TILES[tile], 128, 48 << 10, 0, 2), m, n, k, 3, opa=opa, opb=opb)
        two = lib.cuda_on_cpu_async_copies() > before
        assert two == ((dtype, m) == ("complex128", 16)), (dtype, m, n, k)    # (16^3: 8 KiB a pair, fits twice)


def test_the_librarys_build_runs_the_measured_shapes_for_the_candidates(shipped):
    """Without the options under measurement, an unpadded vector tile runs padded and two stages
    run one: the same results, no asynchronous copy."""
    rng = np.random.default_rng(11)
    for dtype, (opa, opb) in itertools.product(("float32", "float16", "float64", "complex64"), REAL_OPS):
        for tile, pad, stages in (("vector", 0, 1), ("vector", 0, 2), ("2x2", 0, 2), ("1x1", 1, 2)):
            check(shipped, rng, dtype, E.Shape(E.TILES[tile], 128, 16 << 10, pad, stages), 8, 8, 16, 19,
                  opa=opa, opb=opb)
    assert shipped.cuda_on_cpu_async_copies() == 0


# ---------------------------------------------------------------- the bits are each matrix's own

@pytest.mark.parametrize("dtype", ("float32", "bfloat16", "complex64"))
def test_a_matrixs_bits_do_not_depend_on_batch_place_tile_or_shape(lib, dtype):
    """The K products are added in order k = 0, 1, ... by every tile: the same bits for one matrix
    computed alone, in a batch of 29 at place 17, by each tile, with any launch shape."""
    rng = np.random.default_rng(6)
    m, n, k = 8, 8, 16
    args, (A, B, C), _, _ = E.problem(rng, dtype, m, n, k, 29)
    reference = None
    for tile in [t for t in tiles_for(lib, dtype, m, n, k) if t != "mma"]:      # (the tensor cores' order is theirs)
        for threads, smem, pad, stages in ((128, 16 << 10, 0, 1), (32, 4 << 10, 1, 1), (256, 48 << 10, 0, 2)):
            assert run(lib, args, E.Shape(E.TILES[tile], threads, smem, pad, stages), (A, B, C)) == 0
            bits = C.buf[C.index[17]].copy()
            reference = bits if reference is None else reference
            assert np.array_equal(bits.view(np.uint8), reference.view(np.uint8)), (tile, threads, smem, pad)
    # The same matrix alone: a batch of one would not reach the kernel, so two copies of it.
    one = E.Batch(rng, dtype, 2, m, k, m, 0)
    one.buf[one.index] = A.buf[A.index[17]]
    two = E.Batch(rng, dtype, 2, k, n, k, 0)
    two.buf[two.index] = B.buf[B.index[17]]
    out = E.Batch(rng, dtype, 2, m, n, m, m * n, fill=np.nan)
    args2 = E.Args(args.dtype, 0, 0, m, n, k, one.ptr, m, 0, two.ptr, k, 0, out.ptr, m, m * n, 2, 1, 0, 0, 0)
    assert run(lib, args2, E.Shape(E.TILES["1x1"], 64, 8 << 10, 0), (one, two, out)) == 0
    assert np.array_equal(out.buf[out.index[1]].view(np.uint8), reference.view(np.uint8))


# ---------------------------------------------------------------- what is refused

def test_shapes_and_problems_out_of_range_are_refused_before_anything_runs(lib):
    rng = np.random.default_rng(7)
    args, buffers, _, _ = E.problem(rng, "float32", 4, 4, 4, 3)
    launches = lib.cuda_on_cpu_launches()
    for bad in (E.Shape(4, 128, 8 << 10, 0), E.Shape(-1, 128, 8 << 10, 0), E.Shape(0, 16, 8 << 10, 0),
                E.Shape(0, 288, 8 << 10, 0), E.Shape(0, 100, 8 << 10, 0), E.Shape(0, 128, 0, 0),
                E.Shape(0, 128, (48 << 10) + 1, 0), E.Shape(0, 128, 8 << 10, 2), E.Shape(0, 128, 8 << 10, 0, 0),
                E.Shape(0, 128, 8 << 10, 0, 3)):
        assert run(lib, args, bad, buffers) == INVALID, bad
    good = E.Shape(0, 128, 8 << 10, 0)
    for field, value in (("m", 65), ("k", 0), ("opa", 3), ("dtype", 3), ("batch", 0), ("stride_a", -1),
                         ("lda", 1 << 31)):
        bad = E.Args.from_buffer_copy(args)
        setattr(bad, field, value)
        assert lib.cygemm_small_batched_fits(bad) == 0, field
        assert run(lib, bad, good, buffers) == INVALID, field
    misaligned = E.Args.from_buffer_copy(args)
    misaligned.c = args.c + 2                                    # (float32 off its 4 bytes)
    assert run(lib, misaligned, good, buffers) == INVALID
    vector_only = E.Args.from_buffer_copy(args)
    vector_only.m = 6                                            # (not a multiple of 4)
    assert lib.cygemm_small_batched_vector_fits(vector_only) == 0
    assert run(lib, vector_only, E.Shape(E.TILES["vector"], 128, 8 << 10, 0), buffers) == INVALID
    assert lib.cuda_on_cpu_launches() == launches              # none of them launched
