# cygemm's options, read from the environment once (at first use, never at import) and
# changed by set_options. The C copy below is what nogil code reads.
cdef enum Autotune:
    AUTOTUNE_OFF = 0            # the heuristic's first choice (or cublasGemmEx), no timing
    AUTOTUNE_AUTO = 1           # time a few candidates within a budget (the default)
    AUTOTUNE_EXHAUSTIVE = 2     # time every candidate, then the finalists again, longer

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

# The options now (loaded from the environment on the first call; raises ValueError naming
# the variable when one is malformed).
cdef const Options* options() except NULL
# The same without loading, for nogil code: valid once any context exists (making one loads
# the options first).
cdef const Options* loaded_options() noexcept nogil
# -1: not a known name; else the Autotune value (None: the current option).
cdef int autotune_level(object name) except -2
