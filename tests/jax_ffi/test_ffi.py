"""cygemm's XLA FFI handlers called as XLA calls them, on the CPU: call frames built here
through ctypes after XLA's FFI C ABI (a second, independent reading of it), with a stand-in API
table (Error_Create, Stream_Get) and the targets' runners replaced by recorders. The handler
answers XLA's version question, reads arrays, attributes and the stream, and turns an
exception into XLA's error with its message. (The GPU tests run them inside jax.jit.)"""
import ctypes as C

import pytest

pytest.importorskip("jax")

from cygemm.engine import context  # noqa: E402
from cygemm.engine.arrays import describe_array  # noqa: E402
from cygemm.jax import ffi, targets  # noqa: E402


class Ext(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("type", C.c_int), ("next", C.c_void_p)]


class Version(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("ext", C.c_void_p), ("major", C.c_int), ("minor", C.c_int)]


class Metadata(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("version", Version), ("traits", C.c_uint32), ("state", C.c_int64)]


class MetadataExt(C.Structure):
    _fields_ = [("base", Ext), ("metadata", C.POINTER(Metadata))]


class ErrorArgs(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("ext", C.c_void_p), ("message", C.c_char_p), ("code", C.c_int)]


class StreamArgs(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("ext", C.c_void_p), ("ctx", C.c_void_p), ("stream", C.c_void_p)]


ERROR_CREATE = C.CFUNCTYPE(C.c_void_p, C.POINTER(ErrorArgs))
STREAM_GET = C.CFUNCTYPE(C.c_void_p, C.POINTER(StreamArgs))


class Api(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("ext", C.c_void_p), ("version", Version), ("internal", C.c_void_p),
                ("error_create", ERROR_CREATE), ("get_message", C.c_void_p), ("destroy", C.c_void_p),
                ("register", C.c_void_p), ("stream_get", STREAM_GET)] + [(f"f{i}", C.c_void_p) for i in range(13)]


class Buffer(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("ext", C.c_void_p), ("dtype", C.c_int), ("data", C.c_void_p),
                ("rank", C.c_int64), ("dims", C.POINTER(C.c_int64))]


class Bytes(C.Structure):
    _fields_ = [("ptr", C.c_char_p), ("len", C.c_size_t)]


class Scalar(C.Structure):
    _fields_ = [("dtype", C.c_int), ("value", C.c_void_p)]


class Items(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("ext", C.c_void_p), ("size", C.c_int64), ("types", C.POINTER(C.c_int)),
                ("items", C.POINTER(C.c_void_p))]


class Attrs(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("ext", C.c_void_p), ("size", C.c_int64), ("types", C.POINTER(C.c_int)),
                ("names", C.POINTER(C.POINTER(Bytes))), ("items", C.POINTER(C.c_void_p))]


class Frame(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("ext", C.c_void_p), ("api", C.POINTER(Api)), ("ctx", C.c_void_p),
                ("stage", C.c_int), ("args", Items), ("rets", Items), ("attrs", Attrs), ("future", C.c_void_p)]


HANDLER = C.CFUNCTYPE(C.c_void_p, C.POINTER(Frame))
# XLA's element type codes (XLA_FFI_DataType) used below.
F32, BF16, S32, S64, F64, PRED, F8E4M3FN, U8 = 11, 16, 4, 5, 12, 1, 20, 6
# Every call's last result: XLA's scratch buffer for it, one part (cygemm.jax asks for it).
SCRATCH = (U8, 0x1000000, (33619968 + 256,))
# The targets registered a second time for XLA's command buffers: every one (cygemm.jax calls
# a grouped one there only where its route can be captured).
CAPTURABLE = {"cygemm_matmul", "cygemm_int_mm", "cygemm_scaled_matmul", "cygemm_dense_forward",
              "cygemm_dense_backward", "cygemm_ragged_dot", "cygemm_ragged_dot_wgrad"}


def _handler(target):
    get = C.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = C.c_void_p, [C.py_object, C.c_char_p]
    return HANDLER(get(ffi.capsules()[target], None))


class Call:
    """One call frame, its stand-in API, and what the API saw."""

    def __init__(self, args=(), rets=(), attrs=(), stage=3, stream=0xBEEF):
        self.keep, self.errors = [], []
        self.api = Api(struct_size=C.sizeof(Api))
        self.api.error_create = ERROR_CREATE(self._error)
        self.api.stream_get = STREAM_GET(self._stream)
        self.stream = stream
        self.frame = Frame(struct_size=C.sizeof(Frame), api=C.pointer(self.api), ctx=0x1234, stage=stage)
        self.frame.args, self.frame.rets = self._items(args), self._items(rets)
        self.frame.attrs = self._attrs(attrs)

    def _error(self, a):
        self.errors.append((a.contents.message.decode(), a.contents.code))
        return 0xE770

    def _stream(self, a):
        assert a.contents.ctx == 0x1234
        a.contents.stream = self.stream
        return None

    def _items(self, arrays):
        bufs = []
        for dtype, ptr, dims in arrays:
            d = (C.c_int64 * len(dims))(*dims)
            self.keep.append(d)
            bufs.append(Buffer(struct_size=C.sizeof(Buffer), dtype=dtype, data=ptr, rank=len(dims), dims=d))
        self.keep.append(bufs)
        types = (C.c_int * len(bufs))(*([1] * len(bufs)))
        ptrs = (C.c_void_p * len(bufs))(*[C.addressof(b) for b in bufs])
        self.keep += [types, ptrs]
        return Items(struct_size=C.sizeof(Items), size=len(bufs), types=types, items=ptrs)

    def _attrs(self, attrs):
        names, kinds, items = [], [], []
        for name, value in attrs:
            b = name.encode()
            names.append(Bytes(b, len(b)))
            if isinstance(value, str):
                v = value.encode()
                item = Bytes(v, len(v))
                kinds.append(4)
            else:
                dtype, ctype = value
                self.keep.append(ctype)
                item = Scalar(dtype, C.addressof(ctype))
                kinds.append(3)
            items.append(item)
        self.keep += [names, items]
        n = len(names)
        name_ptrs = (C.POINTER(Bytes) * n)(*[C.pointer(x) for x in names])
        item_ptrs = (C.c_void_p * n)(*[C.addressof(x) for x in items])
        types = (C.c_int * n)(*kinds)
        self.keep += [name_ptrs, item_ptrs, types]
        return Attrs(struct_size=C.sizeof(Attrs), size=n, types=types, names=name_ptrs, items=item_ptrs)

    def __call__(self, target):
        return _handler(target)(C.byref(self.frame))


@pytest.fixture
def recorded(monkeypatch):
    seen = []

    def record(stream, args, rets, attrs):
        seen.append((stream, [describe_array(a) if len(a.shape) > 1 else a.shape for a in args],
                     [describe_array(r) for r in rets], attrs, context._given_now()))

    def fail(stream, args, rets, attrs):
        raise ValueError("b: expected 16 columns, got 15")

    class Unprintable(Exception):
        def __str__(self):
            raise RuntimeError("no message")

    def fail_badly(stream, args, rets, attrs):
        raise Unprintable()

    runners = dict(targets.RUNNERS, cygemm_matmul=record, cygemm_int_mm=fail, cygemm_dense_forward=fail_badly)
    ffi.set_runners(runners)
    yield seen
    ffi.set_runners(targets.RUNNERS)


@pytest.mark.parametrize("target", sorted(ffi.capsules()))
def test_each_handler_answers_xlas_version_question_without_running(target, recorded):
    meta = Metadata(struct_size=C.sizeof(Metadata), traits=0xFFFF)
    ext = MetadataExt(Ext(C.sizeof(MetadataExt), 1, None), C.pointer(meta))
    call = Call()
    call.frame.ext = C.addressof(ext)
    assert call(target) is None
    assert (meta.version.major, meta.version.minor, meta.version.struct_size) == (0, 1, C.sizeof(Version))
    # (the command buffer trait: only a capturable target's second registration claims it)
    assert meta.traits == (1 if target.endswith("_capturable") else 0) and not recorded and not call.errors


def test_every_target_has_a_capturable_registration():
    assert set(ffi.capsules()) == set(ffi.TARGETS) | {t + "_capturable" for t in CAPTURABLE}


def test_a_capturable_registration_runs_its_targets_call(recorded):
    call = Call(args=[(F32, 0x10000, (4, 8)), (F32, 0x20000, (8, 3))], rets=[(F32, 0x40000, (4, 3)), SCRATCH])
    assert call("cygemm_matmul_capturable") is None and not call.errors
    assert len(recorded) == 1 and recorded[0][2][0]["ptr"] == 0x40000


def test_the_handler_on_the_cpu_claims_no_trait():
    meta = Metadata(struct_size=C.sizeof(Metadata), traits=0xFFFF)
    ext = MetadataExt(Ext(C.sizeof(MetadataExt), 1, None), C.pointer(meta))
    call = Call()
    call.frame.ext = C.addressof(ext)
    get = C.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = C.c_void_p, [C.py_object, C.c_char_p]
    assert HANDLER(get(ffi.cpu_capsule(), None))(C.byref(call.frame)) is None
    assert meta.traits == 0 and (meta.version.major, meta.version.minor) == (0, 1)


def test_a_handler_reads_arrays_attributes_and_xlas_stream(recorded):
    call = Call(args=[(F32, 0x10000, (4, 8)), (BF16, 0x20000, (2, 8, 3)), (S32, 0x30000, (5,))],
                rets=[(F32, 0x40000, (4, 3)), SCRATCH],
                attrs=[("math", "fp32"), ("autotune", ""), ("flag", (PRED, C.c_uint8(1))),
                       ("slope", (F64, C.c_double(0.25))), ("n", (S64, C.c_int64(-7))), ("m", (S32, C.c_int32(9)))])
    assert call("cygemm_matmul") is None and not call.errors
    ((stream, args, rets, attrs, given),) = recorded
    assert stream == 0xBEEF
    assert given == (0xBEEF, 0x1000000, 1) and context._given_now() is None    # the scratch, while it ran
    assert args[0] == dict(ptr=0x10000, batch=1, rows=4, cols=8, batch_stride=0, row_stride=8, col_stride=1,
                           dtype="float32")
    assert args[1] == dict(ptr=0x20000, batch=2, rows=8, cols=3, batch_stride=24, row_stride=3, col_stride=1,
                           dtype="bfloat16")
    assert args[2] == (5,)
    assert len(rets) == 1 and rets[0]["ptr"] == 0x40000 and (rets[0]["rows"], rets[0]["cols"]) == (4, 3)
    assert attrs == {"math": "fp32", "autotune": "", "flag": True, "slope": 0.25, "n": -7, "m": 9}


def test_an_exception_becomes_xlas_error_with_its_message(recorded):
    call = Call(args=[(F32, 0x10000, (4, 8))], rets=[(F32, 0x40000, (4, 3)), SCRATCH])
    assert call("cygemm_int_mm") == 0xE770
    assert call.errors == [("cygemm: ValueError: b: expected 16 columns, got 15", 3)]
    assert context._given_now() is None         # (taken back on the error path too)


@pytest.mark.parametrize("rets, message", [
    ([], "result: expected the call's scratch buffer last"),
    ([(F32, 0x40000, (4, 3))], "result 0: expected the call's scratch buffer (uint8), got XLA element type 11"),
    ([(F32, 0x40000, (4, 3)), (U8, 0x1000000, (1 << 20,))], "workspace: expected at least 33619968 bytes"),
    # (128 bytes go to reach cuBLASLt's alignment: one byte short)
    ([(F32, 0x40000, (4, 3)), (U8, 0x1000080, (33619968 + 127,))],
     "workspace: expected at least 33619968 bytes (cuBLAS's workspace and cygemm's table) from the first "
     "256-byte aligned address, got 33620095 bytes at 0x1000080"),
])
def test_a_call_without_its_scratch_buffer_is_refused_before_running(recorded, rets, message):
    call = Call(args=[(F32, 0x10000, (4, 8)), (F32, 0x20000, (8, 3))], rets=rets)
    assert call("cygemm_matmul") == 0xE770 and not recorded
    assert len(call.errors) == 1 and message in call.errors[0][0]
    assert context._given_now() is None


@pytest.mark.parametrize("address, nbytes, given", [
    (0x1000000, 2 * 33619968 + 5, (0xBEEF, 0x1000000, 2)),
    (0x1000080, 33619968 + 128, (0xBEEF, 0x1000100, 1)),       # its first aligned address
    (0x1000010, 2 * 33619968 + 256, (0xBEEF, 0x1000100, 2)),
])
def test_a_scratch_buffer_is_given_from_its_first_aligned_address_in_whole_parts(recorded, address, nbytes, given):
    call = Call(args=[(F32, 0x10000, (4, 8)), (F32, 0x20000, (8, 3))],
                rets=[(F32, 0x40000, (4, 3)), (U8, address, (nbytes,))])
    assert call("cygemm_matmul") is None and not call.errors
    assert recorded[0][-1] == given


def test_an_exception_without_a_message_is_still_an_error(recorded):
    """(XLA reads NULL as success: the error path never returns it.)"""
    call = Call(args=[(F32, 0x10000, (4, 8))], rets=[(F32, 0x40000, (4, 3)), SCRATCH])
    assert call("cygemm_dense_forward") == 0xE770
    assert call.errors == [("cygemm: an error whose message could not be formed", 13)]


def test_a_view_past_its_buffer_is_refused():
    from cygemm.engine.arrays import describe_array
    call = Call(rets=[SCRATCH])
    b = call._items([(F32, 0x10000, (3, 256))])
    seen = []
    ffi.set_runners(dict(targets.RUNNERS, cygemm_matmul=lambda s, a, r, t: seen.append(a[0])))
    try:
        call.frame.args = b
        assert call("cygemm_matmul") is None
    finally:
        ffi.set_runners(targets.RUNNERS)
    x = seen[0]
    assert describe_array(ffi.strided(x, (256, 3), (1, 256)))["col_stride"] == 256
    with pytest.raises(ValueError, match="reaches element"):
        ffi.strided(x, (256, 5), (1, 256))


def test_an_element_type_cygemm_does_not_take_is_an_error_naming_the_operand(recorded):
    call = Call(args=[(F32, 0x10000, (4, 8)), (33, 0x20000, (8, 3))], rets=[(F32, 0x40000, (4, 3)), SCRATCH])
    assert call("cygemm_matmul") == 0xE770 and not recorded
    assert call.errors == [("cygemm: TypeError: operand 1: XLA element type 33 is not one cygemm computes with", 3)]


def test_a_stage_other_than_execute_runs_nothing(recorded):
    call = Call(args=[(F32, 0x10000, (4, 8))], stage=1)
    assert call("cygemm_matmul") is None and not recorded


def test_every_dtype_cygemm_takes_has_its_xla_code_in_the_dtype_table():
    from cygemm.engine.dtypes import ROWS
    codes = {r["name"]: r["xla"] for r in ROWS}
    assert codes["float32"] == F32 and codes["bfloat16"] == BF16 and codes["float8_e4m3fn"] == F8E4M3FN
    assert len(set(codes.values())) == len(codes)
