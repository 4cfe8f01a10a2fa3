# cython: language_level=3
"""The dtype table (its rows: dtypes.pxd), read as Python: names, typestrs, DLPack codes and
torch's and NumPy's dtypes, each derived from the one row of each storage type."""
from cygemm.bindings.cudart cimport cudaDataType

import numpy as _np


cdef list _rows():
    cdef int i
    cdef const cg_dtype_row* r
    rows = []
    for i in range(cg_N_DTYPES):
        r = cg_dtype_at(i)
        rows.append(dict(cuda=r.cuda, size=r.size, name=r.name.decode(), level=r.level, listed=bool(r.listed),
                         kind=chr(r.kind), dlpack=(r.dl_code, r.dl_bits) if r.dl_code >= 0 else None,
                         typestr=r.typestr.decode() or None, alias=r.alias.decode() or None,
                         compute=(r.compute_fast, r.compute_strict) if r.compute_fast >= 0 else None,
                         max_finite=r.max_finite or None, xla=r.xla))
    return rows


ROWS = tuple(_rows())
#: The DTYPES_* levels by name, for Python callers.
LEVELS = dict(float=DTYPES_FLOAT, wide=DTYPES_WIDE, gemm=DTYPES_GEMM, fp8=DTYPES_FP8, bytes=DTYPES_BYTES,
              index=DTYPES_INDEX)
#: Every name and alias -> its row (the names describe_* and out_dtype= take).
BY_ANY_NAME = {**{r["name"]: r for r in ROWS}, **{r["alias"]: r for r in ROWS if r["alias"]}}
_NAMES = {r["cuda"]: r["name"] for r in ROWS}


cdef bint _takes(dict row, int level):
    if level <= DTYPES_GEMM:
        return row["level"] <= level
    if level == DTYPES_INDEX:
        return row["kind"] == "i" and row["size"] >= 4
    return row["level"] == level


def names(int level, bint listed_only=False):
    """The names of the rows a DTYPES_* level takes, in the table's order."""
    return tuple(r["name"] for r in ROWS if _takes(r, level) and (r["listed"] or not listed_only))


def row_of_name(name):
    """The row of a dtype name or alias, or None."""
    return BY_ANY_NAME.get(name)


cdef list _by_level(str field):
    return [{(r[field] if field != "name" else r["name"]): (r["cuda"], r["size"])
             for r in ROWS if _takes(r, level) and r[field] is not None} for level in range(DTYPES_INDEX + 1)]


_BY_NAME = _by_level("name")
_BY_TYPESTR = _by_level("typestr")
_BY_DLPACK = _by_level("dlpack")
_EXPECTED = [None] * (DTYPES_INDEX + 1)
for _level in range(DTYPES_INDEX + 1):
    _listed = names(_level, _level != DTYPES_INDEX)     # (offsets: every index type)
    _EXPECTED[_level] = ", ".join(_listed[:-1]) + " or " + _listed[-1] if len(_listed) > 1 else "".join(_listed)


#: The FP8 formats by their short names (the FP8 rows' aliases): what format= and format_*= take.
FP8_FORMATS = {r["alias"]: r["cuda"] for r in ROWS if r["level"] == DTYPES_FP8}
#: The largest finite value of each FP8 format: quantize saturates there.
FP8_MAX = {r["alias"]: r["max_finite"] for r in ROWS if r["level"] == DTYPES_FP8}
#: "'e4m3' or 'e5m2'", for errors.
FORMATS_EXPECTED = " or ".join([repr(f) for f in FP8_FORMATS])


def expected(int level):
    """The listed names of a level, as errors say them ("float16, bfloat16 or float32")."""
    return _EXPECTED[level]


cdef object dtype_name(cudaDataType dtype):
    return _NAMES.get(dtype) or f"cudaDataType {<int>dtype}"


cdef str expected_names(int level):
    return _EXPECTED[level]


cdef dict by_name(int level):
    return _BY_NAME[level]


cdef dict by_typestr(int level):
    return _BY_TYPESTR[level]


cdef dict by_dlpack(int level):
    return _BY_DLPACK[level]


def name_of(int cuda):
    """The table's name of a cudaDataType value."""
    return dtype_name(<cudaDataType>cuda)


def numpy_dtype(name):
    """The NumPy dtype of a table name: NumPy's own, or ml_dtypes' (bfloat16, FP8), which CuPy 14
    reads. TypeError, saying what to install, where ml_dtypes is missing."""
    row = BY_ANY_NAME.get(name)
    name = row["name"] if row is not None else name
    if row is not None and row["typestr"] is None:
        try:
            import ml_dtypes
        except ImportError:
            raise TypeError(f"{name}: a CuPy or NumPy {name} array needs the ml_dtypes package "
                            "(pip install ml_dtypes), or pass torch tensors / out=") from None
        return _np.dtype(getattr(ml_dtypes, name))
    return _np.dtype(name)


def torch_dtype(torch, int cuda):
    """torch's dtype of a cudaDataType (its attribute of the table's name)."""
    return getattr(torch, _NAMES[cuda])
