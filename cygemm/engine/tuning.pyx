# cython: language_level=3, boundscheck=False, wraparound=False
# kernels: timing
"""Tuning: the table of tuned choices, the tuning file, and the registry of routes that
features register.

A large problem's candidates (cuBLASLt algorithms and cublasGemmEx for a plan, a feature's
routes) are timed once (cygemm.engine.tuning); what won is kept here.

Tuned choices are kept in a process-wide table keyed by GPU model, driver and cuBLASLt version
and the problem, and persist in a tuning file (by default in the user's cache folder; see
:func:`cygemm.set_options`): read at the first lookup, one line appended per new result, so a
second process runs its first call of a tuned shape with no timing. A line torn by a process
that ended mid-write costs nothing else: the next entry starts a line of its own, and readers
skip lines that do not parse (one RuntimeWarning per file, with the count).

A problem is timed once even when threads meet it at once: the first claims it
(claim_tuning), the others wait without the GIL until it is done and take its record.
"""


# -------------------- timing (merged into tuning)
# Timing candidates on the GPU: a plan's algorithms (cygemm.engine.candidates) and a feature's
# routes (cygemm.engine.chooser) are timed here, never during a capture, waiting without the GIL.
#
# With ``autotune="auto"`` (the default) a new problem's timing stays within max(50 ms, 25 runs
# of it): a few candidates, rounds cut short by the budget. ``"exhaustive"`` times every candidate
# and then the finalists again, longer; ``"off"`` times nothing. The tuning mode says how each run
# is timed: with the L2 cache flushed first ("cold", the default), or several calls back to back
# ("sustained"). What won is kept by cygemm.engine.tuning. Threads that meet one new problem at once
# time it once (SingleFlight).
import threading
import time

from libc.stdint cimport uint64_t
from libc.stdlib cimport malloc, free
from libc.string cimport memset

from cygemm.bindings.cudart cimport *
from cygemm.kernels.timing cimport cygemm_hold_stream
from cygemm.engine.errors cimport check_cuda
from cygemm.engine.settings cimport options, loaded_options, Options, TUNING_COLD, TUNING_SUSTAINED

# One buffer per device, twice its L2 size, written before every timed run so that no
# candidate finds its operands in L2 left there by the previous one. Made on the first
# tuning on that device and kept for the life of the process.
cdef void* _flush_buf[64]
cdef size_t _flush_bytes[64]


cdef int _flush_l2(int device, cudaStream_t stream) except -1:
    cdef int l2 = 0
    cdef cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed
    cdef cudaError_t err
    cdef size_t nbytes
    if device < 0 or device >= 64:
        return 0
    if _flush_buf[device] == NULL:
        check_cuda(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device), "cudaDeviceGetAttribute(L2)")
        nbytes = 2 * <size_t>l2 + 256
        with nogil:         # cudaMalloc of ~100 MB takes milliseconds: other threads run meanwhile
            cudaThreadExchangeStreamCaptureMode(&mode)
            err = cudaMalloc(&_flush_buf[device], nbytes)
            cudaThreadExchangeStreamCaptureMode(&mode)
        check_cuda(err, "cudaMalloc(L2 flush buffer)")
        _flush_bytes[device] = nbytes
    return check_cuda(cudaMemsetAsync(_flush_buf[device], 0, _flush_bytes[device], stream),
                      "cudaMemsetAsync(L2 flush)")


cdef enum:
    SUSTAINED_CALLS = 3            # tuning_mode "sustained": calls per timed run
    HOLD_NS_PER_CALL = 40000       # host time to enqueue one call, with a margin
    MIN_BUDGET_MS = 50
    BUDGET_RUNS = 25


cdef double tuning_budget_ms(double one_run_ms) noexcept nogil:
    return max(<double>MIN_BUDGET_MS, BUDGET_RUNS * one_run_ms)


# Per thread: another thread's plans are not part of this thread's route timing.
cdef extern from *:
    """
    #if defined(_MSC_VER)
    static __declspec(thread) int cg_route_timing_depth;
    #else
    static __thread int cg_route_timing_depth;
    #endif
    """
    int cg_route_timing_depth


cdef int enter_route_timing() noexcept:
    global cg_route_timing_depth
    cg_route_timing_depth += 1
    return 0


cdef int leave_route_timing() noexcept:
    global cg_route_timing_depth
    cg_route_timing_depth -= 1
    return 0


cdef bint in_route_timing() noexcept:
    return cg_route_timing_depth > 0


cdef int _sync(cudaEvent_t ev) except -1:
    cdef cudaError_t st
    with nogil:
        st = cudaEventSynchronize(ev)
    return check_cuda(st, "cudaEventSynchronize")


cdef float _median(float* t, int reps) noexcept:
    cdef int r, j
    cdef float x
    for r in range(1, reps):        # insertion sort: reps is small
        x = t[r]
        j = r - 1
        while j >= 0 and t[j] > x:
            t[j + 1] = t[j]
            j -= 1
        t[j + 1] = x
    return t[reps // 2] if reps % 2 else 0.5 * (t[reps // 2 - 1] + t[reps // 2])


cdef int time_choices(GemmContext* ctx, cudaStream_t stream, enqueue_fn enqueue, void* arg,
                      const int* choices, int n, int reps, float* ms, double budget_ms) except -1:
    cdef const Options* opt = options()
    cdef int i, r, c, done = 0
    cdef int calls = SUSTAINED_CALLS if opt.tuning_mode == TUNING_SUSTAINED else 1
    cdef int n_events = 2 * n * reps + 1      # the last one: recorded after every round
    cdef cudaEvent_t* ev = <cudaEvent_t*>malloc(n_events * sizeof(cudaEvent_t))
    cdef float* t = <float*>malloc(n * reps * sizeof(float))
    cdef float* column = <float*>malloc(reps * sizeof(float))
    cdef bint* ok = <bint*>malloc(n * sizeof(bint))
    cdef double start = time.perf_counter(), round_ms = 0, fastest, first_round_done = 0
    if ev == NULL or t == NULL or ok == NULL or column == NULL:
        free(ev); free(t); free(ok); free(column)
        raise MemoryError()
    memset(ev, 0, n_events * sizeof(cudaEvent_t))
    try:
        for i in range(n_events):
            check_cuda(cudaEventCreate(&ev[i]), "cudaEventCreate")
        for i in range(n):          # warm-up: kernels loaded, the choice's own plans made
            ok[i] = enqueue(arg, choices[i]) == 0
        for r in range(reps):       # interleaved rounds: drift hits every choice alike
            if r > 0 and budget_ms > 0:
                if r == 1:          # the first round tells how long one takes, and the budget
                    check_cuda(cudaEventRecord(ev[n_events - 1], stream), "cudaEventRecord")
                    _sync(ev[n_events - 1])
                    fastest = -1
                    for i in range(n):
                        if ok[i]:
                            check_cuda(cudaEventElapsedTime(&t[i * reps], ev[2 * i], ev[2 * i + 1]),
                                       "cudaEventElapsedTime")
                            round_ms += t[i * reps]
                            if fastest < 0 or t[i * reps] / calls < fastest:
                                fastest = t[i * reps] / calls
                    if fastest > 0:
                        budget_ms = min(budget_ms, tuning_budget_ms(fastest))
                    first_round_done = (time.perf_counter() - start) * 1e3
                # Rounds 1..r-1 are queued, not finished: where the GPU will be is the first
                # round's end plus r - 1 rounds (the host clock alone would lag behind).
                if first_round_done + r * round_ms > budget_ms:
                    break
            if calls > 1:
                check_cuda(cygemm_hold_stream(<uint64_t>min(n * calls * HOLD_NS_PER_CALL + 100000, 20000000),
                                              stream), "cygemm_hold_stream")
            for i in range(n):
                if not ok[i]:
                    continue
                if opt.tuning_mode == TUNING_COLD:
                    _flush_l2(ctx.device, stream)
                check_cuda(cudaEventRecord(ev[2 * (r * n + i)], stream), "cudaEventRecord")
                for c in range(calls):
                    if ok[i]:
                        ok[i] = enqueue(arg, choices[i]) == 0
                check_cuda(cudaEventRecord(ev[2 * (r * n + i) + 1], stream), "cudaEventRecord")
            done = r + 1
        check_cuda(cudaEventRecord(ev[n_events - 1], stream), "cudaEventRecord")
        _sync(ev[n_events - 1])
        for i in range(n):
            ms[i] = -1
            if not ok[i] or done == 0:
                continue
            for r in range(done):
                check_cuda(cudaEventElapsedTime(&column[r], ev[2 * (r * n + i)], ev[2 * (r * n + i) + 1]),
                           "cudaEventElapsedTime")
            ms[i] = _median(column, done) / calls
    finally:
        for i in range(n_events):
            if ev[i] != NULL:
                cudaEventDestroy(ev[i])
        free(ev); free(t); free(ok); free(column)
    return 0


# ---------------------------------------------------------------- single flight

class SingleFlight:
    """At most one thread at a time works on a key; the others wait until it is done.

    The work (timing a problem) is done once: threads that ask for a key while its owner
    works wait for the owner's release, then find its result. Generic: keys are any hashable.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._owners = {}           # key -> (the owning thread's ident, Event set at release)

    def claim(self, key, settled):
        """Whether this thread is to do the work of `key` now.

        Parameters
        ----------
        key : hashable
            What the work is for.
        settled : callable
            ``settled()`` is true when a result of the work is there (then nothing is claimed).
            Called with the lock held, so a result recorded before the owner's release is
            always seen.

        Returns
        -------
        bool
            True: this thread owns `key` and must call ``release(key)`` when done, in a
            ``finally`` (waiters are released on errors too). False: it must not do the work,
            because ``settled()`` (use the result) or because this thread owns `key` already
            (a nested claim: no deadlock). While another thread owns `key`, this waits first
            (without the GIL) and then decides again: a waiter whose owner left no result
            claims `key` itself.
        """
        me = threading.get_ident()
        while True:
            with self._lock:
                owner = self._owners.get(key)
                if owner is None:
                    if settled():
                        return False
                    self._owners[key] = (me, threading.Event())
                    return True
                if owner[0] == me:
                    return False
                released = owner[1]
            released.wait()

    def release(self, key):
        """End this thread's claim of `key` and wake the threads waiting for it.

        Raises
        ------
        RuntimeError
            This thread does not own `key`.
        """
        me = threading.get_ident()
        with self._lock:
            owner = self._owners.get(key)
            if owner is None or owner[0] != me:
                raise RuntimeError(f"release({key!r}): the key is not claimed by this thread")
            del self._owners[key]
        owner[1].set()

# -------------------- tuning
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


def claim_flight(int device, str kind, tuple key, settled):
    """claim_tuning for Python callers whose result is not a tuning record (the promises'
    first-use checks), keyed by the device itself (a verdict is one device's): True, this thread
    is to do the work of (device, kind, key) and must call release_flight in a ``finally``;
    False when ``settled()`` or this thread owns the key already."""
    return _timing_flights.claim(("device", device, kind, key), settled)


def release_flight(int device, str kind, tuple key):
    _timing_flights.release(("device", device, kind, key))


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
