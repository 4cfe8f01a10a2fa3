# cygemm's options, read from the environment once (at first use, never at import) and
# changed by set_options. The C copy below is what nogil code reads.
cdef enum Autotune:
    AUTOTUNE_OFF = 0            # the heuristic's first choice (or cublasGemmEx), no timing
    AUTOTUNE_AUTO = 1           # time a few candidates within a budget (the default)
    AUTOTUNE_EXHAUSTIVE = 2     # time every candidate, then the finalists again, longer

# The determinism option's modes. Under one: no cublasGemmEx among a plan's candidates, and
# only the kernels of one family (see cygemm.engine.families), which give the same bits.
cdef enum Determinism:
    DETERMINISM_OFF = 0
    DETERMINISM_RUN_TO_RUN = 1          # the same bits in every process (same GPU model and cuBLAS)
    DETERMINISM_BATCH_INVARIANT = 2     # and row i independent of the number of rows and the other rows

# A call's policy: resolved once at its entry point (call_policy), passed down whole.
ctypedef struct Policy:
    Autotune autotune           # how new problems are timed; under a determinism mode always
                                # AUTOTUNE_AUTO (its family's kernels, within the budget)
    Determinism determinism

cdef enum TuningMode:
    TUNING_COLD = 0             # one call after L2 is flushed
    TUNING_HOT = 1              # one call, no flush
    TUNING_SUSTAINED = 2        # calls back to back behind a kernel that holds the stream

ctypedef struct Options:
    Autotune autotune
    double autotune_min_macs
    TuningMode tuning_mode
    int max_stream_workspaces
    int plan_cache_size
    Determinism determinism
    bint cublas_invariance      # batch_invariant by cuBLASLt's own flag (the option is "cublas" and the library takes it)

# The options now (loaded from the environment on the first call; raises ValueError naming
# the variable when one is malformed).
cdef const Options* options() except NULL
# The same without loading, for nogil code: valid once any context exists (making one loads
# the options first).
cdef const Options* loaded_options() noexcept nogil
# A call's policy from its `autotune` and `determinism` arguments (None: the option's): a
# determinism mode other than "off" takes autotune AUTOTUNE_AUTO, whatever `autotune` says.
# ValueError naming the argument for an unknown value.
cdef int call_policy(object autotune, object determinism, Policy* out) except -1
# The options' policy, without loading them (nogil code, such as the C entry points; valid
# once a context exists).
cdef Policy default_policy() noexcept nogil
# A policy's two fields by the names the calls take ("run_to_run", "auto", ...): describe_*'s.
cdef str determinism_name(Policy policy)
cdef str autotune_name(Policy policy)
# Whether a plan decided at tune level `level` serves a call of `policy` (plans keep the
# determinism modes' plans apart, so the level alone says it).
cdef inline bint level_serves(int level, Policy policy) noexcept nogil:
    return level >= <int>policy.autotune
