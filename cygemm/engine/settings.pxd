# cygemm's options, read from the environment once (at first use, never at import) and
# changed by set_options. The C copy below is what nogil code reads.
cdef enum Autotune:
    AUTOTUNE_OFF = 0            # the heuristic's first choice (or cublasGemmEx), no timing
    AUTOTUNE_AUTO = 1           # time a few candidates within a budget (the default)
    AUTOTUNE_EXHAUSTIVE = 2     # time every candidate, then the finalists again, longer
    # The determinism option's policies (they replace the autotune level of a call): no
    # timing, no tuning file, no cublasGemmEx among a plan's candidates; the fixed rule picks
    # among kernels that give the same bits (see cygemm.engine.families).
    POLICY_RUN_TO_RUN = 3       # the same bits in every process (same GPU model and cuBLAS)
    POLICY_BATCH_INVARIANT = 4  # and row i independent of the number of rows and the other rows

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
    int determinism             # 0 off, else POLICY_RUN_TO_RUN or POLICY_BATCH_INVARIANT

# The options now (loaded from the environment on the first call; raises ValueError naming
# the variable when one is malformed).
cdef const Options* options() except NULL
# The same without loading, for nogil code: valid once any context exists (making one loads
# the options first).
cdef const Options* loaded_options() noexcept nogil
# A call's policy: the determinism option's (the call's `determinism`, else the option) when it
# is not "off", else the autotune level (the call's `autotune`, else the option). ValueError
# naming the argument for an unknown value.
cdef int autotune_level(object name, object determinism=*) except -2
# The same for the options alone, without loading them (nogil code; valid once a context exists).
cdef int default_policy() noexcept nogil
