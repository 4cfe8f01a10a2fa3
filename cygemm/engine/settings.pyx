# cython: language_level=3
"""cygemm's options: one place that reads, validates and holds them.

Environment variables give the defaults, read once at first use (a malformed one is a
``ValueError`` naming it then, never an import failure); :func:`set_options` changes them for
the process. ``python -m cygemm info`` prints them from here.

=========================  ==============================  =====================================
option                     environment variable            default
=========================  ==============================  =====================================
``autotune``               ``CYGEMM_AUTOTUNE``             ``"auto"``
``autotune_min_macs``      ``CYGEMM_AUTOTUNE_MIN_MACS``    ``2**28`` multiply-adds
``tuning_mode``            ``CYGEMM_TUNING_MODE``          ``"cold"``
``tuning_cache``           ``CYGEMM_TUNING_CACHE``         ``$XDG_CACHE_HOME/cygemm/tuning.jsonl``
                                                           (else ``~/.cache/cygemm/...``);
                                                           ``"off"`` keeps tuning in the process
``max_stream_workspaces``  ``CYGEMM_MAX_STREAM_WORKSPACES``  8 per thread and device
``plan_cache_size``        ``CYGEMM_PLAN_CACHE_SIZE``      256 plans per thread
``determinism``            ``CYGEMM_DETERMINISM``          ``"off"``
``batch_invariance``       ``CYGEMM_BATCH_INVARIANCE``     ``"families"``
``jax_command_buffers``    ``CYGEMM_JAX_COMMAND_BUFFERS``  ``False``
=========================  ==============================  =====================================
"""
import os
import threading

_AUTOTUNE = {"off": AUTOTUNE_OFF, "auto": AUTOTUNE_AUTO, "exhaustive": AUTOTUNE_EXHAUSTIVE}
_TUNING_MODES = {"cold": TUNING_COLD, "hot": TUNING_HOT, "sustained": TUNING_SUSTAINED}
_DETERMINISM = {"off": DETERMINISM_OFF, "run_to_run": DETERMINISM_RUN_TO_RUN,
                "batch_invariant": DETERMINISM_BATCH_INVARIANT}
_OFF = ("off", "none", "0", "")
_ENV = {"autotune": "CYGEMM_AUTOTUNE", "autotune_min_macs": "CYGEMM_AUTOTUNE_MIN_MACS",
        "tuning_mode": "CYGEMM_TUNING_MODE", "tuning_cache": "CYGEMM_TUNING_CACHE",
        "max_stream_workspaces": "CYGEMM_MAX_STREAM_WORKSPACES", "plan_cache_size": "CYGEMM_PLAN_CACHE_SIZE",
        "determinism": "CYGEMM_DETERMINISM", "batch_invariance": "CYGEMM_BATCH_INVARIANCE",
        "jax_command_buffers": "CYGEMM_JAX_COMMAND_BUFFERS"}
DEFAULTS = {"autotune": "auto", "autotune_min_macs": 2.0 ** 28, "tuning_mode": "cold",
            "tuning_cache": "default", "max_stream_workspaces": 8, "plan_cache_size": 256, "determinism": "off",
            "batch_invariance": "families", "jax_command_buffers": False}
_ON = ("on", "1", "true", "yes")
_INVARIANCE = ("families", "cublas")

cdef Options _c
cdef bint _loaded = False
_values = {}                    # the options as Python values (tuning_cache: a path or None)
_lock = threading.Lock()


def default_tuning_cache():
    """Where tuning is kept by default: ``$XDG_CACHE_HOME/cygemm/tuning.jsonl``, else
    ``~/.cache/cygemm/tuning.jsonl`` (as Triton and Numba keep their caches)."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "cygemm", "tuning.jsonl")


def _check(str name, value, str source):
    """The validated value of one option; ValueError naming where it came from."""
    def bad(expected):
        return ValueError(f"{source}: expected {expected}, got {value!r}")
    if name == "autotune":
        if str(value).lower() not in _AUTOTUNE:
            raise bad("'off', 'auto' or 'exhaustive'")
        return str(value).lower()
    if name == "determinism":
        if str(value).lower() not in _DETERMINISM:
            raise bad("'off', 'run_to_run' or 'batch_invariant'")
        return str(value).lower()
    if name == "batch_invariance":
        if str(value).lower() not in _INVARIANCE:
            raise bad("'families' or 'cublas'")
        return str(value).lower()
    if name == "jax_command_buffers":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _ON + _OFF + ("false", "no"):
            return value.strip().lower() in _ON
        raise bad("True or False (in the environment: 1 or 0, on or off, true or false)")
    if name == "tuning_mode":
        if str(value).lower() not in _TUNING_MODES:
            raise bad("'cold', 'hot' or 'sustained'")
        return str(value).lower()
    if name == "autotune_min_macs":
        try:
            x = float(value)
        except (TypeError, ValueError):
            raise bad("a number of multiply-adds >= 0") from None
        if not x >= 0:
            raise bad("a number of multiply-adds >= 0")
        return x
    if name in ("max_stream_workspaces", "plan_cache_size"):
        try:
            n = int(value)
        except (TypeError, ValueError):
            raise bad("an integer >= 1") from None
        if n < 1 or (isinstance(value, float) and value != n):
            raise bad("an integer >= 1")
        return n
    if name == "tuning_cache":
        if value is None or (isinstance(value, str) and value.strip().lower() in _OFF):
            return None
        if value == "default":
            return default_tuning_cache()
        return os.path.abspath(os.path.expanduser(os.fspath(value)))
    raise TypeError(f"set_options: unknown option {name!r}; expected one of {sorted(DEFAULTS)}")


cdef void _publish() noexcept:
    _c.autotune = <Autotune>_AUTOTUNE[_values["autotune"]]
    _c.autotune_min_macs = _values["autotune_min_macs"]
    _c.tuning_mode = <TuningMode>_TUNING_MODES[_values["tuning_mode"]]
    _c.max_stream_workspaces = _values["max_stream_workspaces"]
    _c.plan_cache_size = _values["plan_cache_size"]
    _c.determinism = <Determinism>_DETERMINISM[_values["determinism"]]
    _c.cublas_invariance = False
    if _values["batch_invariance"] == "cublas":
        from cygemm.engine import lt_features     # (where the library does not take the flag: families)
        _c.cublas_invariance = lt_features.feature_gate("batch_invariance") is None


cdef int _load() except -1:
    global _loaded
    with _lock:
        if _loaded:
            return 0
        values = {}
        for name, var in _ENV.items():
            raw = os.environ.get(var)
            values[name] = _check(name, DEFAULTS[name] if raw is None else raw,
                                  var if raw is not None else f"default {name}")
        _values.update(values)
        _publish()
        _loaded = True
    return 0


cdef const Options* options() except NULL:
    if not _loaded:
        _load()
    return &_c


cdef const Options* loaded_options() noexcept nogil:
    return &_c


cdef int call_policy(object autotune, object determinism, Policy* out) except -1:
    cdef const Options* o = options()
    out.autotune, out.determinism = o.autotune, o.determinism
    if determinism is not None:
        det = _DETERMINISM.get(determinism) if isinstance(determinism, str) else None
        if det is None:
            raise ValueError(f"determinism: expected None, 'off', 'run_to_run' or 'batch_invariant', "
                             f"got {determinism!r}")
        out.determinism = <Determinism>det
    if autotune is not None:
        level = _AUTOTUNE.get(autotune) if isinstance(autotune, str) else None
        if level is None:
            raise ValueError(f"autotune: expected None, 'off', 'auto' or 'exhaustive', got {autotune!r}")
        out.autotune = <Autotune>level
    if out.determinism != DETERMINISM_OFF:
        out.autotune = AUTOTUNE_AUTO
    return 0


cdef str determinism_name(Policy policy):
    for name, value in _DETERMINISM.items():
        if value == policy.determinism:
            return name
    return None


cdef str autotune_name(Policy policy):
    for name, value in _AUTOTUNE.items():
        if value == policy.autotune:
            return name
    return None


cdef Policy default_policy() noexcept nogil:
    cdef Policy p
    p.autotune, p.determinism = _c.autotune, _c.determinism
    if p.determinism != DETERMINISM_OFF:
        p.autotune = AUTOTUNE_AUTO
    return p


_listeners = []


def on_change(callback):
    """Call `callback(changed_names)` after set_options changes options (caches that depend
    on them register here)."""
    _listeners.append(callback)


def get_options():
    """The options now, as a dict (see the module's table).

    Returns
    -------
    dict
        ``autotune``, ``autotune_min_macs``, ``tuning_mode``, ``tuning_cache`` (a path, or None
        when tuning is kept in the process only), ``max_stream_workspaces``, ``plan_cache_size``,
        ``determinism``, ``batch_invariance``, ``jax_command_buffers``.

    Raises
    ------
    ValueError
        An environment variable that gives an option's default is malformed (named).
    """
    _load()
    return dict(_values)


def set_options(**changes):
    """Change cygemm's options for this process; returns the previous values of those changed.

    Parameters
    ----------
    autotune : {"off", "auto", "exhaustive"}
        How a large problem's way to run is chosen the first time: the heuristic's first
        choice; a few candidates timed within max(50 ms, 25 GEMMs of it); or every candidate
        timed, then the finalists again.
    autotune_min_macs : float
        Problems of fewer multiply-adds are never timed (their time is mostly launch cost).
    tuning_mode : {"cold", "hot", "sustained"}
        How a candidate is timed: after flushing L2, without flushing, or as back-to-back calls.
    tuning_cache : str, os.PathLike or None
        The tuning file (read at the first tuning lookup, one line appended per new result);
        None or "off": tuning is kept in this process only; "default": the user's cache folder.
    max_stream_workspaces : int
        Eager cuBLAS workspaces (32 MiB each) kept per thread and device; the least recently
        used stream's is freed beyond that.
    plan_cache_size : int
        Plans kept per thread; the least recently used is dropped beyond that.
    determinism : {"off", "run_to_run", "batch_invariant"}
        "off": the fastest way to run (timed, remembered in the tuning file). "run_to_run": the
        same bits for the same call in every process on the same GPU model and cuBLAS version,
        whatever the tuning file or timing noise. "batch_invariant": moreover, row i of a result
        depends only on row i of the inputs, never on how many rows there are or what the others
        hold. See :doc:`/reproducibility`.
    batch_invariance : {"families", "cublas"}
        How "batch_invariant" is kept: "families" (the default), the split-free kernels of one
        cuBLASLt algorithm, measured on cuBLAS 13.1 and checked at first use elsewhere;
        "cublas", cuBLASLt's own promise (``CUBLASLT_MATMUL_DESC_BATCH_INVARIANCE_FLAGS``, with
        the alignment class of the call's operands) where the loaded cuBLASLt takes it (13.10
        does), else the families. Either way the first use on an unverified cuBLAS is checked.
        On cuBLASLt 13.10.0.20 (H100, H200) no problem probed was offered an algorithm under
        the flag, so "cublas" refuses there; see :doc:`/reproducibility`.
    jax_command_buffers : bool
        Whether ``cygemm.jax``'s calls traced from now on tell XLA they may go into its command
        buffers (CUDA graphs, where XLA's flags let custom calls in; ``ragged_dot``'s where
        cuBLASLt's grouped matmul takes them), False by default; read while JAX traces, so a
        function ``jax.jit`` traced already keeps its calls. See :doc:`/jax`.

    Returns
    -------
    dict
        The previous values of the options given, to restore with ``set_options(**old)``.

    Raises
    ------
    ValueError
        A value of the wrong kind (named), or an unknown option (TypeError).
    """
    _load()
    checked = {name: _check(name, value, name) for name, value in changes.items()}
    with _lock:
        old = {name: _values[name] for name in checked}
        _values.update(checked)
        _publish()
    # Only a change reaches the caches: setting an option to its value again (a call that sets
    # it around every GEMM) must not drop every plan.
    changed = {name for name in checked if checked[name] != old[name]}
    if changed:
        for callback in list(_listeners):
            callback(changed)
    return old


def tuning_cache_path():
    """The tuning file now, or None (kept in the process only)."""
    _load()
    return _values["tuning_cache"]
