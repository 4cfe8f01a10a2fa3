# cython: language_level=3
"""What the loaded cuBLAS offers beyond the 13.1 this release was first written for, decided from
the library itself: the functions it exports, the attributes it accepts, its version, the GPU.

cygemm builds against any 13.x header and imports with any 13.x library, so nothing added after
13.1 is linked: the functions are looked up in the loaded libcublasLt (``dlopen`` of its soname
with ``RTLD_NOLOAD`` gives the copy the extensions already use) and the batch-invariance
attribute is probed by setting it on a descriptor (no GPU needed for either).

:func:`features` names each feature, whether this process can use it, and why not. The facts
behind the gates (NVIDIA's cuBLAS release notes):

- grouped matmul in cuBLASLt: Blackwell from 13.2.0, Hopper (sm_90) from 13.4.0; 13.4 to 13.7 had
  Hopper defects (host pointer mode wrong past two waves, a workspace reused across grouped calls
  could hang), fixed in 13.8.0.4, and TransformerEngine refuses 13.7.0 to 13.8.0 for a data
  corruption with discrete outputs. cublasLtGetVersion cannot tell 13.8.0's builds apart, so
  cygemm asks for 13.8.1 (130801) or newer, and compute capability 9.0, 10.x or 11.0 (what
  cublasLtMatmul's rules for grouped matrices list);
- the split-K kernels that drop the end of K (NVIDIA bug 6580689, since 12.6.3): fixed in
  13.8.0.4, so from 13.8.1 on the K-tail guard confirms the fix at first use and stands down
  (cygemm.engine.ktail);
- batch invariance (CUBLASLT_MATMUL_DESC_BATCH_INVARIANCE_FLAGS) and the stream-aware heuristic
  (cublasLtMatmulAlgoGetHeuristicForStream): where the library takes them, whatever its version.
"""
import contextlib

from libc.stdint cimport int32_t
from posix.dlfcn cimport dlopen, dlsym, RTLD_LAZY

from cygemm.bindings.cudart cimport cudaDeviceGetAttribute, cudaDevAttrComputeCapabilityMajor, cudaSuccess
from cygemm.bindings.cublas cimport CUBLAS_STATUS_SUCCESS, CUBLAS_STATUS_NOT_SUPPORTED, CUBLAS_COMPUTE_32F, cublasStatus_t
from cygemm.bindings.cudart cimport CUDA_R_32F, cudaDataType
from cygemm.bindings.cublaslt cimport *

cdef extern from "<dlfcn.h>" nogil:
    int RTLD_NOLOAD

# The cuBLASLt version from which cygemm uses its grouped matmul, and from which NVIDIA's notes
# say the K-tail defect is fixed (see the module's docstring).
GROUPED_MIN_CUBLASLT = 130801
KTAIL_FIXED_CUBLASLT = 130801
# The compute capabilities (major numbers) whose GPUs cuBLASLt's grouped matmul runs on: 9.0
# (Hopper), 10.x and 11.0 (Blackwell), as cublasLtMatmul's "grouped matrices" rules list them
# (not 12.x, the RTX Blackwell parts).
GROUPED_MAJORS = (9, 10, 11)

FEATURES = ("grouped_gemm", "batch_invariance", "stream_heuristic", "ktail_fixed")

cdef LtExtras _loaded
cdef bint _resolved = False
# The cuBLASLt versions (cublasLtGetVersion) whose behaviour cygemm's promises were measured on
# (cygemm.engine.promises checks them at first use on any other).
VERIFIED_CUBLASLT = (130100,)

cdef LtExtras _stand_in             # the test hook's library, while _pretending
cdef bint _pretending = False
cdef int _pretend_major = -1        # the test hook's compute capability (-1: the GPU's)


cdef void* _symbol(void* lib, const char* name) noexcept:
    return dlsym(lib, name) if lib != NULL else NULL


cdef bint _takes_batch_invariance() noexcept:
    """Whether the library accepts the batch-invariance attribute (13.1 answers
    CUBLAS_STATUS_INVALID_VALUE for an attribute it does not know)."""
    cdef cublasLtMatmulDesc_t desc = NULL
    cdef int32_t flags = LT_BATCH_INVARIANCE_DISABLED
    cdef bint ok
    if cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS:
        return False
    ok = cublasLtMatmulDescSetAttribute(desc, <cublasLtMatmulDescAttributes_t>LT_MATMUL_DESC_BATCH_INVARIANCE_FLAGS,
                                        &flags, sizeof(flags)) == CUBLAS_STATUS_SUCCESS
    cublasLtMatmulDescDestroy(desc)
    return ok


cdef int _resolve() except -1:
    global _resolved
    # The copy the extensions link (DT_NEEDED libcublasLt.so.13): RTLD_NOLOAD finds it by its
    # soname without loading another.
    cdef void* lib = dlopen(b"libcublasLt.so.13", RTLD_LAZY | RTLD_NOLOAD)
    _loaded.version = cublasLtGetVersion()
    _loaded.grouped_layout_create = <cublasLtGroupedMatrixLayoutCreate_fn>_symbol(lib, b"cublasLtGroupedMatrixLayoutCreate")
    _loaded.heuristic_for_stream = <cublasLtMatmulAlgoGetHeuristicForStream_fn>_symbol(
        lib, b"cublasLtMatmulAlgoGetHeuristicForStream")
    _loaded.check_for_stream = <cublasLtMatmulAlgoCheckForStream_fn>_symbol(lib, b"cublasLtMatmulAlgoCheckForStream")
    _loaded.batch_invariance_flags = _takes_batch_invariance()
    _resolved = True
    return 0


cdef const LtExtras* lt_extras() except NULL:
    if _pretending:
        return &_stand_in
    if not _resolved:
        _resolve()
    return &_loaded


def _version_text(v):
    return f"{v // 10000}.{v // 100 % 100}.{v % 100}"


cdef int _major(int device) except -2:
    """The compute capability's major number of `device`; -1 where there is no GPU."""
    cdef int major = 0
    if _pretend_major >= 0:
        return _pretend_major
    from cygemm.engine.errors import gpu_unavailable_reason
    if gpu_unavailable_reason() is not None:
        return -1
    if cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess:
        return -1
    return major


def major(int device=0):
    """The compute capability's major number of `device` (the test hook's where it pretends);
    -1 where no GPU is usable."""
    return _major(device)


def feature_gate(str name, int device=0):
    """Why ``name`` (one of ``FEATURES``) cannot be used here, or None when it can.

    Parameters
    ----------
    name : str
        "grouped_gemm", "batch_invariance", "stream_heuristic" or "ktail_fixed".
    device : int
        The GPU asked about (grouped_gemm alone depends on it).

    Returns
    -------
    str or None
        The reason in words (the version needed and the one loaded, the GPU's compute
        capability, a function the library does not export), or None.

    Raises
    ------
    ValueError
        An unknown feature name.
    """
    cdef const LtExtras* x = lt_extras()
    v = x.version
    if name == "grouped_gemm":
        if v < GROUPED_MIN_CUBLASLT:
            return (f"needs cuBLASLt {_version_text(GROUPED_MIN_CUBLASLT)} or newer (grouped matmul on Hopper, "
                    f"with its known defects fixed); the loaded cuBLASLt is {_version_text(v)}")
        if x.grouped_layout_create == NULL:
            return f"the loaded cuBLASLt {_version_text(v)} does not export cublasLtGroupedMatrixLayoutCreate"
        major = _major(device)
        if major < 0:
            return "needs a GPU of compute capability 9.0, 10.x or 11.0; no GPU is usable here"
        if major not in GROUPED_MAJORS:
            return (f"needs a GPU of compute capability 9.0 (Hopper), 10.x or 11.0 (Blackwell); device {device} "
                    f"is {major}.x")
        return None
    if name == "batch_invariance":
        if not x.batch_invariance_flags:
            return (f"the loaded cuBLASLt {_version_text(v)} does not take CUBLASLT_MATMUL_DESC_BATCH_INVARIANCE_FLAGS "
                    "(it came after 13.1)")
        return None
    if name == "stream_heuristic":
        if x.heuristic_for_stream == NULL:
            return f"the loaded cuBLASLt {_version_text(v)} does not export cublasLtMatmulAlgoGetHeuristicForStream"
        return None
    if name == "ktail_fixed":
        if v < KTAIL_FIXED_CUBLASLT:
            return (f"NVIDIA's notes name the fix in 13.8.0.4; the loaded cuBLASLt is {_version_text(v)}, "
                    "so cygemm's K-tail guard acts")
        return None
    raise ValueError(f"name: expected one of {', '.join(repr(f) for f in FEATURES)}, got {name!r}")


cdef bint grouped_gemm_usable(int device) except -1:
    return feature_gate("grouped_gemm", device) is None


def features(int device=0):
    """What the loaded cuBLAS offers beyond 13.1, for this process and GPU (no GPU needed to ask).

    Parameters
    ----------
    device : int
        The GPU that grouped_gemm is asked about.

    Returns
    -------
    dict
        One entry per name of ``FEATURES``: ``{"usable": bool, "why_not": str or None}``.
        "grouped_gemm": cuBLASLt's grouped matmul with the group sizes on the GPU
        (:func:`cygemm.moe_gemm` with device offsets, without a host sync); "batch_invariance":
        cuBLASLt's own batch-invariance attribute; "stream_heuristic": the heuristic that knows
        the stream (used for calls made inside a capture); "ktail_fixed": the split-K defect
        is fixed by NVIDIA's notes (the guard confirms it at first use, then stands down).
    """
    out = {}
    for name in FEATURES:
        why = feature_gate(name, device)
        out[name] = {"usable": why is None, "why_not": why}
    return out


cdef cublasStatus_t _absent_grouped_layout_create(cublasLtMatrixLayout_t* layout, cudaDataType type, int count,
                                                  const void* rows, const void* cols, const void* ld) noexcept nogil:
    return CUBLAS_STATUS_NOT_SUPPORTED


@contextlib.contextmanager
def _pretend(version=None, *, grouped=None, stream_heuristic=None, batch_invariance=None, major=None):
    """Test hook: stand in for another cuBLASLt (its version and what it exports or accepts;
    None: the loaded one's, but the grouped API: what the version given exports) and GPU (its
    compute capability's major number; None: the GPU's) until the block ends."""
    global _pretending, _pretend_major
    if _pretending:
        raise RuntimeError("lt_features._pretend: already pretending (blocks do not nest)")
    cdef const LtExtras* real = lt_extras()
    _stand_in.version = real.version if version is None else version
    if grouped is None:     # what the version stood in for exports (the loaded one's: as loaded)
        grouped = (real.grouped_layout_create != NULL) if version is None else version >= GROUPED_MIN_CUBLASLT
    # A stand-in library that exports the grouped API where the loaded one does not (the image's
    # 13.1 under a test of 13.10's gates): a function that answers NOT_SUPPORTED, never a crash.
    _stand_in.grouped_layout_create = (
        (real.grouped_layout_create if real.grouped_layout_create != NULL else _absent_grouped_layout_create)
        if grouped else NULL)
    _stand_in.heuristic_for_stream = real.heuristic_for_stream if stream_heuristic is None or stream_heuristic else NULL
    _stand_in.check_for_stream = real.check_for_stream if stream_heuristic is None or stream_heuristic else NULL
    _stand_in.batch_invariance_flags = real.batch_invariance_flags if batch_invariance is None else batch_invariance
    _pretending, _pretend_major = True, (-1 if major is None else major)
    try:
        yield
    finally:
        _pretending, _pretend_major = False, -1
