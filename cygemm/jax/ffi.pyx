# cython: language_level=3
"""cygemm's XLA FFI handlers: the C functions XLA calls for cygemm's custom calls inside
``jax.jit``, and the capsules that register them (:mod:`cygemm.jax` registers them).

XLA calls a handler with one call frame: its arrays (device pointers, XLA's element types,
shapes), its attributes and the stream XLA runs on. A handler answers XLA's question of which
FFI version it was built for, reads the frame, and calls cygemm's public function on XLA's
stream with the arrays as :class:`ArrayLayout` views of XLA's buffers (nothing is copied; the
results are XLA's buffers, written in place). Every call's last result is XLA's scratch buffer
for it, given to cygemm as the call's workspace (cygemm.engine.context.give_workspace): the call
allocates nothing of its own. Every target is registered a second time, as
"<name>_capturable", telling XLA it may trace the call into its command buffers (cygemm.jax
calls those where the option ``jax_command_buffers`` is on and the call's route can be
captured). The call takes the GIL for its argument checks and its plan, as an eager call does.
An error becomes XLA's error (the message cygemm's exception gives), so it surfaces as an
``XlaRuntimeError`` naming it.

The FFI's C ABI is declared in ``include/cygemm/xla_ffi.h`` (no jaxlib at build time).
"""
from libc.stdint cimport int64_t, uintptr_t
from cpython.pycapsule cimport PyCapsule_New

from cygemm.bindings.cudart cimport cudaDataType
from cygemm.engine.arrays cimport ArrayLayout, LAYOUT_TYPED
from cygemm.engine.dtypes cimport cg_dtype_row, cg_dtype_at, cg_N_DTYPES
from cygemm.engine.types cimport MAX_NDIM
from cygemm.engine.context cimport give_workspace, take_back_workspace
from cygemm.bindings.cudart cimport cudaStream_t

cdef extern from "cygemm/xla_ffi.h" nogil:
    int CG_XLA_FFI_MAJOR, CG_XLA_FFI_MINOR, CG_XLA_EXT_METADATA, CG_XLA_INVALID_ARGUMENT, CG_XLA_INTERNAL
    int CG_XLA_FAILED_PRECONDITION, CG_XLA_TRAIT_COMMAND_BUFFER
    int CG_XLA_ATTR_SCALAR, CG_XLA_ATTR_STRING, CG_XLA_ARG_BUFFER, CG_XLA_STAGE_EXECUTE
    ctypedef struct cg_xla_ext:
        size_t struct_size
        int type
    ctypedef struct cg_xla_version:
        size_t struct_size
        void* extension_start
        int major
        int minor
    ctypedef struct cg_xla_error
    ctypedef struct cg_xla_context
    ctypedef struct cg_xla_error_create_args:
        size_t struct_size
        void* extension_start
        const char* message
        int code
    ctypedef struct cg_xla_stream_get_args:
        size_t struct_size
        void* extension_start
        cg_xla_context* ctx
        void* stream
    ctypedef struct cg_xla_api:
        cg_xla_error* (*error_create)(cg_xla_error_create_args*) noexcept nogil
        cg_xla_error* (*stream_get)(cg_xla_stream_get_args*) noexcept nogil
    ctypedef struct cg_xla_buffer:
        int dtype
        void* data
        int64_t rank
        int64_t* dims
    ctypedef struct cg_xla_bytes:
        const char* ptr
        size_t len
    ctypedef struct cg_xla_scalar:
        int dtype
        void* value
    ctypedef struct cg_xla_list:
        int64_t size
        int* types
        void** items
    ctypedef struct cg_xla_attrs:
        int64_t size
        int* types
        cg_xla_bytes** names
        void** items
    ctypedef struct cg_xla_call_frame:
        cg_xla_ext* extension_start
        const cg_xla_api* api
        cg_xla_context* ctx
        int stage
        cg_xla_list args
        cg_xla_list rets
        cg_xla_attrs attrs
    ctypedef struct cg_xla_metadata:
        cg_xla_version version
        unsigned int traits
    ctypedef struct cg_xla_metadata_ext:
        cg_xla_metadata* metadata

__all__ = ["TARGETS", "CAPTURABLE", "capsules"]

# XLA's element type codes of scalar attributes cygemm reads (XLA_FFI_DataType's).
cdef enum:
    XLA_PRED = 1
    XLA_S32 = 4
    XLA_U8 = 6
    XLA_S64 = 5
    XLA_F32 = 11
    XLA_F64 = 12


cdef const cg_dtype_row* _row_of_xla(int xla) noexcept nogil:
    """The dtype table's row of XLA's element type code (NULL: none)."""
    cdef int i
    for i in range(cg_N_DTYPES):
        if cg_dtype_at(i).xla == xla:
            return cg_dtype_at(i)
    return NULL


cdef ArrayLayout _view(const cg_xla_buffer* b, str name):
    """XLA's buffer as the readers take a device array: row-major (the layouts each call
    asks XLA for; a view with other strides is made from this one)."""
    cdef const cg_dtype_row* r = _row_of_xla(b.dtype)
    if r == NULL:
        raise TypeError(f"{name}: XLA element type {b.dtype} is not one cygemm computes with")
    if b.rank > MAX_NDIM:
        raise ValueError(f"{name}: expected at most {MAX_NDIM} dimensions, got {b.rank}")
    cdef ArrayLayout x = ArrayLayout()
    cdef int i
    cdef int64_t step = 1
    x.kind, x.has_memory, x.on_gpu = LAYOUT_TYPED, True, True
    x.shape = tuple([b.dims[i] for i in range(b.rank)])
    x.dtype = r.name.decode()
    x.d.ptr, x.d.ndim, x.d.device, x.d.dtype, x.d.torch = <char*>b.data, b.rank, -1, <cudaDataType>r.cuda, False
    x.d.itemsize = r.size
    for i in range(b.rank - 1, -1, -1):
        x.d.shape[i], x.d.strides[i] = b.dims[i], step
        step *= b.dims[i]
    return x


def strided(ArrayLayout x, tuple shape, tuple strides):
    """Another view of x's memory: ``shape`` and ``strides`` in elements (e.g. a column-major
    operand XLA lays out as its call asks, or a padded scale grid). ValueError where the view
    would reach past x's elements."""
    cdef ArrayLayout v = ArrayLayout()
    cdef int i
    cdef int64_t n = 1, last = 0
    if len(shape) != len(strides) or len(shape) > MAX_NDIM:
        raise ValueError(f"a view of {len(shape)} extents and {len(strides)} strides")
    for i in range(x.d.ndim):
        n *= x.d.shape[i]
    for i in range(len(shape)):
        if shape[i] == 0:
            last = -1
            break
        if strides[i] < 0:
            raise ValueError(f"a view with a negative stride: {strides}")
        last += (shape[i] - 1) * strides[i]
    if last >= n:
        raise ValueError(f"a view {shape} with strides {strides} reaches element {last} of an array of {n} "
                         f"({x.shape})")
    v.kind, v.has_memory, v.on_gpu, v.dtype, v.shape = x.kind, True, True, x.dtype, shape
    v.d = x.d
    v.d.ndim = len(shape)
    for i in range(len(shape)):
        v.d.shape[i], v.d.strides[i] = shape[i], strides[i]
    return v


cdef object _attribute(int kind, void* item):
    cdef cg_xla_bytes* s
    cdef cg_xla_scalar* v
    if kind == CG_XLA_ATTR_STRING:
        s = <cg_xla_bytes*>item
        return s.ptr[:s.len].decode()
    if kind == CG_XLA_ATTR_SCALAR:
        v = <cg_xla_scalar*>item
        if v.dtype == XLA_PRED:
            return (<unsigned char*>v.value)[0] != 0
        if v.dtype == XLA_S32:
            return (<int*>v.value)[0]
        if v.dtype == XLA_S64:
            return (<long long*>v.value)[0]
        if v.dtype == XLA_F32:
            return (<float*>v.value)[0]
        if v.dtype == XLA_F64:
            return (<double*>v.value)[0]
    raise TypeError(f"an attribute of XLA kind {kind} that cygemm's handlers do not read")


cdef list _arrays(const cg_xla_list* items, str what, int64_t count):
    cdef int64_t i
    out = []
    for i in range(count):
        if items.types[i] != CG_XLA_ARG_BUFFER:
            raise TypeError(f"{what} {i}: expected an array")
        out.append(_view(<cg_xla_buffer*>items.items[i], f"{what} {i}"))
    return out


cdef cg_xla_error* _fail(const cg_xla_api* api, object exc) noexcept with gil:
    """XLA's error for exc (never NULL: XLA would read that as success)."""
    cdef bytes message = b"cygemm: an error whose message could not be formed"
    cdef cg_xla_error_create_args e
    e.code = CG_XLA_INTERNAL
    try:
        message = f"cygemm: {type(exc).__name__}: {exc}".encode("utf-8", "backslashreplace").replace(b"\0", b" ")
        if isinstance(exc, (TypeError, ValueError)):
            e.code = CG_XLA_INVALID_ARGUMENT
    except BaseException:
        pass
    e.struct_size, e.extension_start, e.message = sizeof(cg_xla_error_create_args), NULL, message
    return api.error_create(&e)


cdef int _give_scratch(const cg_xla_list* rets, uintptr_t stream) except -1:
    """The call's last result, XLA's scratch buffer (uint8, cygemm.jax asks for it), given as
    the workspace of the call's cuBLAS and cygemm work on XLA's stream: nothing of cygemm's own
    is allocated or shared with another call, so the call can be traced into a command buffer."""
    if rets.size < 1 or rets.types[rets.size - 1] != CG_XLA_ARG_BUFFER:
        raise TypeError("result: expected the call's scratch buffer last")
    cdef const cg_xla_buffer* b = <const cg_xla_buffer*>rets.items[rets.size - 1]
    if b.dtype != XLA_U8:
        raise TypeError(f"result {rets.size - 1}: expected the call's scratch buffer (uint8), got XLA element "
                        f"type {b.dtype}")
    cdef int64_t i, nbytes = 1
    for i in range(b.rank):
        nbytes *= b.dims[i]
    return give_workspace(<cudaStream_t>stream, b.data, <size_t>nbytes)


cdef unsigned long long _executed = 0


def executed():
    """How many calls the handlers have run (a call XLA replays from a command buffer runs no
    handler: it adds none)."""
    return _executed


cdef cg_xla_error* _call(cg_xla_call_frame* f, int target, uintptr_t stream) noexcept with gil:
    global _executed
    cdef int64_t i
    _executed += 1
    try:
        attrs = {f.attrs.names[i].ptr[:f.attrs.names[i].len].decode(): _attribute(f.attrs.types[i], f.attrs.items[i])
                 for i in range(f.attrs.size)}
        operands = _arrays(&f.args, "operand", f.args.size)
        results = _arrays(&f.rets, "result", max(f.rets.size - 1, 0))
        _give_scratch(&f.rets, stream)
        try:
            _RUN[target](stream, operands, results, attrs)
        finally:
            take_back_workspace()
    except BaseException as exc:
        return _fail(f.api, exc)
    return NULL


cdef bint _answered(cg_xla_call_frame* f, unsigned int traits) noexcept nogil:
    """Whether this was XLA's question of which FFI version the handler was built for, and its
    traits; answered."""
    cdef cg_xla_metadata* m
    if f.extension_start == NULL or f.extension_start.type != CG_XLA_EXT_METADATA:
        return False
    if f.extension_start.struct_size >= sizeof(cg_xla_metadata_ext):     # (else not one this handler knows)
        m = (<cg_xla_metadata_ext*>f.extension_start).metadata
        m.version.struct_size = sizeof(cg_xla_version)
        m.version.extension_start = NULL
        m.version.major, m.version.minor = CG_XLA_FFI_MAJOR, CG_XLA_FFI_MINOR
        m.traits = traits
    return True


cdef cg_xla_error* _on_the_cpu(cg_xla_call_frame* f) noexcept nogil:
    """Every target's handler on XLA's CPU platform: cygemm's error, not XLA's 'no handler'."""
    if _answered(f, 0):
        return NULL
    cdef cg_xla_error_create_args e
    e.struct_size, e.extension_start, e.code = sizeof(cg_xla_error_create_args), NULL, CG_XLA_FAILED_PRECONDITION
    e.message = (b"cygemm: cygemm.jax runs on NVIDIA GPUs (through cuBLAS), and this computation was placed on "
                 b"the CPU: JAX sees no GPU here (install JAX with CUDA, pip install 'jax[cuda13]', on a "
                 b"machine with an NVIDIA GPU), or the computation was put on a CPU device")
    return f.api.error_create(&e)


cdef cg_xla_error* _handle(cg_xla_call_frame* f, int target, unsigned int traits) noexcept nogil:
    if _answered(f, traits):
        return NULL
    if f.stage != CG_XLA_STAGE_EXECUTE:
        return NULL
    cdef cg_xla_stream_get_args s
    s.struct_size, s.extension_start, s.ctx, s.stream = sizeof(cg_xla_stream_get_args), NULL, f.ctx, NULL
    cdef cg_xla_error* err = f.api.stream_get(&s)
    if err != NULL:
        return err
    return _call(f, target, <uintptr_t>s.stream)


# ---------------------------------------------------------------- one C entry per target
# (XLA passes a handler nothing but its frame: each target's own function says which it is.)
# Each call runs in XLA's scratch buffer on XLA's stream, and never times routes or
# synchronizes inside a capture (cygemm.engine.chooser), so XLA may trace it into a command
# buffer: every target is registered twice, the second time ("<name>_capturable") saying so.
# (ragged_dot's, where cuBLASLt's grouped matmul does not take the call, would read the group
# sizes to the host, which a capture cannot: cygemm.jax calls those by their first name.)

cdef unsigned int _CB = CG_XLA_TRAIT_COMMAND_BUFFER

cdef cg_xla_error* _h0(cg_xla_call_frame* f) noexcept nogil:
    return _handle(f, 0, 0)
cdef cg_xla_error* _h1(cg_xla_call_frame* f) noexcept nogil:
    return _handle(f, 1, 0)
cdef cg_xla_error* _h2(cg_xla_call_frame* f) noexcept nogil:
    return _handle(f, 2, 0)
cdef cg_xla_error* _h3(cg_xla_call_frame* f) noexcept nogil:
    return _handle(f, 3, 0)
cdef cg_xla_error* _h4(cg_xla_call_frame* f) noexcept nogil:
    return _handle(f, 4, 0)
cdef cg_xla_error* _h5(cg_xla_call_frame* f) noexcept nogil:
    return _handle(f, 5, 0)
cdef cg_xla_error* _h6(cg_xla_call_frame* f) noexcept nogil:
    return _handle(f, 6, 0)
cdef cg_xla_error* _c0(cg_xla_call_frame* f) noexcept nogil:
    return _handle(f, 0, _CB)
cdef cg_xla_error* _c1(cg_xla_call_frame* f) noexcept nogil:
    return _handle(f, 1, _CB)
cdef cg_xla_error* _c2(cg_xla_call_frame* f) noexcept nogil:
    return _handle(f, 2, _CB)
cdef cg_xla_error* _c3(cg_xla_call_frame* f) noexcept nogil:
    return _handle(f, 3, _CB)
cdef cg_xla_error* _c4(cg_xla_call_frame* f) noexcept nogil:
    return _handle(f, 4, _CB)
cdef cg_xla_error* _c5(cg_xla_call_frame* f) noexcept nogil:
    return _handle(f, 5, _CB)
cdef cg_xla_error* _c6(cg_xla_call_frame* f) noexcept nogil:
    return _handle(f, 6, _CB)

ctypedef cg_xla_error* (*_handler_t)(cg_xla_call_frame*) noexcept nogil
cdef _handler_t[7] _HANDLERS = [_h0, _h1, _h2, _h3, _h4, _h5, _h6]
cdef _handler_t[7] _CAPTURABLE_HANDLERS = [_c0, _c1, _c2, _c3, _c4, _c5, _c6]

# The targets, in their handlers' order: the XLA name and the Python function that runs one
# call (stream, operands, results, attributes), set by cygemm.jax.targets.
TARGETS = ("cygemm_matmul", "cygemm_int_mm", "cygemm_scaled_matmul", "cygemm_dense_forward",
           "cygemm_dense_backward", "cygemm_ragged_dot", "cygemm_ragged_dot_wgrad")
#: The targets registered a second time, as "<name>_capturable", for XLA's command buffers.
CAPTURABLE = TARGETS
cdef list _RUN = [None] * len(TARGETS)


def set_runners(dict runners):
    """Each target's Python function, by name (cygemm.jax.targets gives them)."""
    for i, name in enumerate(TARGETS):
        _RUN[i] = runners[name]


def capsules():
    """{target name: the PyCapsule of its handler}, for ``jax.ffi.register_ffi_target``: every
    target, and each of CAPTURABLE again as "<name>_capturable" (the handler that tells XLA it
    may trace the call into a command buffer)."""
    found = {name: PyCapsule_New(<void*>_HANDLERS[i], NULL, NULL) for i, name in enumerate(TARGETS)}
    found.update({name + "_capturable": PyCapsule_New(<void*>_CAPTURABLE_HANDLERS[i], NULL, NULL)
                  for i, name in enumerate(CAPTURABLE)})
    return found


def cpu_capsule():
    """The PyCapsule of the handler every target has on XLA's CPU platform: it fails with
    cygemm's message (cygemm.jax runs on NVIDIA GPUs)."""
    return PyCapsule_New(<void*>_on_the_cpu, NULL, NULL)
