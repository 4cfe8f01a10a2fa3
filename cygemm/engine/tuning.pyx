# cython: language_level=3, boundscheck=False, wraparound=False
"""Tuning: the table of tuned choices, the tuning file, and the registry of routes that
features register.

A large problem's candidates (cuBLASLt algorithms and cublasGemmEx for a plan, a feature's
routes) are timed once (cygemm.engine.timing); what won is kept here.

Tuned choices are kept in a process-wide table keyed by GPU model, driver and cuBLASLt version
and the problem, and persist in a tuning file (by default in the user's cache folder; see
:func:`cygemm.set_options`): read at the first lookup, one line appended per new result, so a
second process runs its first call of a tuned shape with no timing. A line torn by a process
that ended mid-write costs nothing else: the next entry starts a line of its own, and readers
skip lines that do not parse (one RuntimeWarning per file, with the count).

A problem is timed once even when threads meet it at once: the first claims it
(claim_tuning), the others wait without the GIL until it is done and take its record.
"""
import functools
import json
import logging
import os
import threading
import warnings

from cygemm.bindings.cudart cimport *
from cygemm.bindings.cublaslt cimport cublasLtGetVersion
from cygemm.engine.errors cimport check_cuda
from cygemm.engine.settings cimport options
from cygemm.engine import settings as _settings
from cygemm.engine.timing import SingleFlight

# ---------------------------------------------------------------- the table of tuned choices

_FORMAT = "cygemm-tuning/2"     # JSON lines: a header, then one entry per line
_OLD_FORMAT = "cygemm-tuning/1"  # one JSON object with a list of entries (still read)
_tuned = {}                     # (gpu, kind, key) -> record; shared by every thread
_tuned_lock = threading.RLock()
cdef long _tuning_count = 0     # how many problems this process timed
_gpu_ids = {}
_loaded_from = None             # the tuning file read into _tuned (its path), if any


def _versions():
    cdef int driver = 0
    cudaDriverGetVersion(&driver)
    return {"cublasLt": int(cublasLtGetVersion()), "driver": driver}


def _header():
    return dict(format=_FORMAT, **_versions())


cdef str _gpu_id(int device):
    """The GPU model as tuning files key it: name and compute capability."""
    cdef cudaDeviceProp prop
    cdef int major = 0, minor = 0
    cdef cudaError_t err
    gid = _gpu_ids.get(device)
    if gid is None:
        with nogil:         # it may take milliseconds
            err = cudaGetDeviceProperties(&prop, device)
        check_cuda(err, "cudaGetDeviceProperties")
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device)
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device)
        gid = f"{prop.name.decode(errors='replace')} sm_{major}{minor}"
        _gpu_ids[device] = gid
    return gid


cdef int count_tuning() noexcept:
    global _tuning_count
    _tuning_count += 1
    return 0


cdef int _load_cache_file() except -1:
    """Read the tuning file of the options into the table, once per path."""
    global _loaded_from
    path = _settings.tuning_cache_path()
    if path is None or path == _loaded_from:
        return 0
    _loaded_from = path
    if os.path.exists(path):
        _load(path, quiet_when_ignored=True)    # a stale cache (other driver) is simply replaced
    return 0


cdef object lookup(int device, str kind, tuple key):
    _load_cache_file()
    with _tuned_lock:
        return _tuned.get((_gpu_id(device), kind, key))


# Each tuned problem is reported at INFO (what was timed, what won, the times): long tuning
# (autotune="exhaustive") can be followed with logging.basicConfig(level=logging.INFO).
logger = logging.getLogger("cygemm.engine.tuning")


cdef int remember(int device, str kind, tuple key, dict record) except -1:
    gpu = _gpu_id(device)
    with _tuned_lock:
        _tuned[(gpu, kind, key)] = record
    if logger.isEnabledFor(logging.INFO):
        logger.info("tuned %s %s on %s: %s", kind, key, gpu, record)
    path = _settings.tuning_cache_path()
    if path:
        try:
            _append(path, {"gpu": gpu, "kind": kind, "key": list(key), "record": record})
        except OSError as exc:
            warnings.warn(f"tuning_cache: could not write {path!r} ({exc}); tuning is kept in this "
                          "process only", RuntimeWarning, stacklevel=2)
    return 0


# ---------------------------------------------------------------- single flight

_timing_flights = SingleFlight()       # keyed as the table is: (gpu, kind, key)


def _has_new_record(entry, seen):
    with _tuned_lock:
        record = _tuned.get(entry)
    return record is not None and record is not seen


cdef int claim_tuning(int device, str kind, tuple key, object seen) except -1:
    _load_cache_file()
    entry = (_gpu_id(device), kind, key)
    return 1 if _timing_flights.claim(entry, functools.partial(_has_new_record, entry, seen)) else 0


cdef int release_tuning(int device, str kind, tuple key) except -1:
    _timing_flights.release((_gpu_id(device), kind, key))
    return 0


def _read_header(path):
    """The header of a tuning file (None when it has none that parses)."""
    try:
        with open(path) as f:
            first = f.readline()
        header = json.loads(first)
        return header if isinstance(header, dict) else None
    except (OSError, ValueError, RecursionError):
        return None


def _append(path, entry):
    """Add one entry line to the file, made (atomically, with this process's header) when it
    is missing or of another format, driver or cuBLASLt version. One write() per line, on a
    file opened for appending: lines of concurrent processes do not interleave. A file that
    does not end with a newline (a process killed mid-append left a torn line) gets one
    first, in the same write: the torn line stays apart, and is skipped when read."""
    line = json.dumps(entry, separators=(",", ":")) + "\n"
    header = _header()
    old = _read_header(path)
    if old is not None and all(old.get(k) == v for k, v in header.items()):
        fd = os.open(path, os.O_RDWR | os.O_APPEND)
        try:
            if os.fstat(fd).st_size > 0:
                os.lseek(fd, -1, os.SEEK_END)      # (the write still goes to the end: O_APPEND)
                if os.read(fd, 1) != b"\n":
                    line = "\n" + line
            os.write(fd, line.encode())
        finally:
            os.close(fd)
        return
    _write_atomically(path, json.dumps(header) + "\n" + line)


def _write_atomically(path, text):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _entry_of(e):
    """((gpu, kind, key), record) of a well-formed entry, else None."""
    try:
        record = e["record"]
        if not isinstance(record, dict) or not isinstance(record.get("route"), str):
            return None
        key = tuple(e["key"])
        # Numbers, and the words that mark a part of a key (an FP8 plan's "types").
        if not all(isinstance(x, (int, bool, str)) for x in key):
            return None
        return (str(e["gpu"]), str(e["kind"]), key), record
    except (KeyError, TypeError):
        return None


def _parse(text):
    """(header, entries, skipped) of a tuning file's text: JSON lines (a header line, one
    entry per line; malformed lines skipped one by one, and `skipped` counts those that are
    not JSON, torn lines among them), or the older single JSON object."""
    try:
        first, _, rest = text.partition("\n")
        header = json.loads(first)
    except RecursionError as exc:
        raise ValueError(str(exc)) from None
    if not isinstance(header, dict):
        raise ValueError("not a JSON object")
    entries = {}
    skipped = 0
    if header.get("format") == _OLD_FORMAT or "entries" in header:
        if not isinstance(header.get("entries"), list):
            raise ValueError("no list of entries")
        raw = header.pop("entries")
    else:
        raw = []
        for line in rest.splitlines():
            if not line.strip():        # racing appenders may each end the same torn line
                continue
            try:
                raw.append(json.loads(line))
            except (ValueError, RecursionError):
                skipped += 1
    for e in raw:
        found = _entry_of(e)
        if found is not None:
            entries[found[0]] = found[1]
    return header, entries, skipped


def _warn_skipped(path, int skipped, int stacklevel):
    if skipped:
        warnings.warn(f"tuning file {path!r}: {skipped} line{'s' if skipped > 1 else ''} skipped (not "
                      "JSON: torn by a process that ended mid-write?); the other entries are used",
                      RuntimeWarning, stacklevel=stacklevel + 1)


cdef int _load(path, bint quiet_when_ignored=False) except -1:
    """Add a tuning file's entries to the table. A file ignored as a whole (unreadable, of
    another format or versions) warns unless quiet_when_ignored; skipped lines always warn."""
    try:
        with open(path) as f:
            header, added, skipped = _parse(f.read())
        if header.get("format") not in (_FORMAT, _OLD_FORMAT):
            if not quiet_when_ignored:
                warnings.warn(f"tuning file {path!r} ignored: format={header.get('format')!r}, expected "
                              f"{_FORMAT!r}", RuntimeWarning, stacklevel=3)
            return 0
        for k, v in _versions().items():
            if header.get(k) != v:
                if not quiet_when_ignored:
                    warnings.warn(f"tuning file {path!r} ignored: it was made with {k}={header.get(k)!r}, "
                                  f"this process has {v!r}", RuntimeWarning, stacklevel=3)
                return 0
    except (OSError, ValueError, KeyError, TypeError) as exc:
        if not quiet_when_ignored:
            warnings.warn(f"tuning file {path!r} ignored: {type(exc).__name__}: {exc}", RuntimeWarning,
                          stacklevel=3)
        return 0
    _warn_skipped(path, skipped, 3)
    with _tuned_lock:
        _tuned.update(added)
    _routes_changed()
    return len(added)


def tuning_count():
    """How many problems (plans and routes) this process has timed."""
    return _tuning_count


def tuning_entries():
    """The tuned choices this process holds: a list of dicts (the record: route, ms, ...; and
    gpu, kind, key)."""
    with _tuned_lock:
        return [dict(record, gpu=g, kind=kind, key=list(key)) for (g, kind, key), record in _tuned.items()]


def clear_tuning():
    """Forget every tuned choice this process holds (and this thread's plans): the next large
    call times again. The tuning file is left as it is (delete it to forget there too)."""
    global _loaded_from
    with _tuned_lock:
        _tuned.clear()
    _loaded_from = _settings.tuning_cache_path()    # not read back in: cleared means cleared
    _routes_changed()


def save_tuning(path):
    """Write the tuned choices to `path`, merged with those already there.

    Parameters
    ----------
    path : str or os.PathLike
        The tuning file (JSON lines: a header, then one entry per line). Written atomically
        (a temporary file, then a rename). Entries of the file that this process does not
        hold are kept when the file has the same format, driver and cuBLASLt version;
        otherwise the file is replaced.

    Returns
    -------
    int
        How many entries the file holds now.

    Raises
    ------
    OSError
        The file or its folder cannot be written (nothing is left half-written).
    """
    path = os.fspath(path)
    header = _header()
    merged = {}
    try:
        with open(path) as f:
            old, entries, skipped = _parse(f.read())
        if all(old.get(k) == v for k, v in _versions().items()):
            merged = entries
            _warn_skipped(path, skipped, 2)     # those lines are not written back
    except (OSError, ValueError, KeyError, TypeError):
        pass
    with _tuned_lock:
        merged.update(_tuned)
    lines = [json.dumps(header)] + [json.dumps({"gpu": g, "kind": kind, "key": list(key), "record": record},
                                               separators=(",", ":"))
                                    for (g, kind, key), record in merged.items()]
    _write_atomically(path, "\n".join(lines) + "\n")
    return len(merged)


def load_tuning(path):
    """Add the tuned choices of a tuning file to this process's table.

    A file that cannot be read or parsed, of another format, or made with another driver or
    cuBLASLt version is ignored with a RuntimeWarning (its choices may not hold here);
    entries of other GPU models are kept but only used on those GPUs. A stored cuBLASLt
    algorithm is checked (cublasLtMatmulAlgoCheck) before its first use.

    Parameters
    ----------
    path : str or os.PathLike
        A file written by :func:`save_tuning` or kept as the ``tuning_cache`` option says.

    Returns
    -------
    int
        How many entries were added (0 when the file was ignored).

    Raises
    ------
    Nothing for a bad file: a missing, unreadable, corrupt or foreign one gives a
    ``RuntimeWarning`` and is ignored.
    """
    return _load(os.fspath(path))


# ---------------------------------------------------------------- routes

# kind -> the route names a feature registered.
_registered = {}
_forced_routes = {}
_route_memo = {}                # (device, key) -> route name: the hot path's lookup
_listeners = []                 # called when routes may change (the plans clear their cache)
cdef unsigned long _routes_generation = 1


def register_routes(str kind, names, on_change=None):
    """A layer's routes for problems of `kind` (their names, in its order of preference), and
    a callback for when forced or tuned routes change."""
    _registered[kind] = tuple(names)
    if on_change is not None:
        _listeners.append(on_change)


def registered_routes():
    """{kind: route names} of every registered layer."""
    return dict(_registered)


cdef void _routes_changed():
    global _routes_generation
    _route_memo.clear()
    _routes_generation += 1
    for callback in list(_listeners):
        callback()


_settings.on_change(lambda names: _routes_changed())


cdef unsigned long routes_generation() noexcept nogil:
    return _routes_generation


def force_routes(**routes):
    """Force routes instead of the measured or fixed choice; no arguments undo every forcing.

    Parameters
    ----------
    **routes : str or None
        One keyword per registered kind, its value one of that kind's route names:
        ``gemm`` ("cublasGemmEx" or "cublasLt": the heuristic's first algorithm), ``forward``
        (a name of ``cygemm.dense.FORWARD_ROUTES``), ``backward`` ("serial" or "branches"),
        ``small_batched`` ("cublas" or "kernel": strided batches of small matrices), and the
        grouped GEMMs' kinds. A call the forced route does not apply to takes the fixed rule.

    Clears this thread's plans. Tuned choices are neither used nor recorded for what is forced.

    Raises
    ------
    ValueError
        An unknown kind or route name (the message lists the valid ones).
    """
    for kind, name in routes.items():
        if kind not in _registered:
            raise ValueError(f"force_routes: unknown kind {kind!r}; expected one of {sorted(_registered)}")
        if name is not None and name not in _registered[kind]:
            valid = ", ".join(repr(n) for n in _registered[kind])
            raise ValueError(f"{kind}: expected None, {valid}, got {name!r}")
    _forced_routes.clear()
    _forced_routes.update({k: v for k, v in routes.items() if v is not None})
    _routes_changed()


def forced_routes():
    """The routes forced now, kind -> name: ``force_routes(**forced_routes())`` restores them."""
    return dict(_forced_routes)


cdef object forced_route(str kind):
    return _forced_routes.get(kind) if _forced_routes else None


cdef object tuned_route(int device, tuple key):
    forced = _forced_routes.get(key[0]) if _forced_routes else None
    if forced is not None:
        return forced
    name = _route_memo.get((device, key))
    if name is None:
        record = lookup(device, key[0], key[1:])
        if record is not None:
            name = record.get("route")
            _route_memo[(device, key)] = name
    return name


cdef int remember_route(int device, tuple key, str route, dict times) except -1:
    count_tuning()
    _route_memo[(device, key)] = route
    return remember(device, key[0], key[1:], {"route": route, "ms": times})


def autotune_threshold():
    """Multiply-adds from which a problem's candidates are timed (the autotune_min_macs option)."""
    return options().autotune_min_macs



# ---------------------------------------------------------------- promises' verdicts

def _lookup_promise(int device, tuple key):
    """The kept verdict of a promise's first-use check on this GPU and cuBLASLt (cygemm.engine.promises)."""
    return lookup(device, "promise", key)


def _remember_promise(int device, tuple key, dict record):
    remember(device, "promise", key, record)
