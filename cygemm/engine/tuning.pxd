# Timing candidates on the GPU: a plan's algorithms, a feature's routes. Below the tuning table:
# it times and knows nothing of what is kept.
from cygemm.bindings.cudart cimport cudaStream_t
from cygemm.engine.context cimport GemmContext

# Timing choices: enqueue(arg, choice) enqueues one run of `choice` on `stream` (0: done,
# nonzero: refused). Each choice runs once (warm-up), then `reps` interleaved rounds as the
# tuning mode says; ms[i] gets the median (-1: refused). budget_ms > 0: fewer rounds (at least
# one) when the warm-up shows that `reps` would take longer than the budget.
ctypedef int (*enqueue_fn)(void* arg, int choice) except -1
cdef int time_choices(GemmContext* ctx, cudaStream_t stream, enqueue_fn enqueue, void* arg,
                      const int* choices, int n, int reps, float* ms, double budget_ms) except -1

# The time a new problem's tuning may take: max(50 ms, 25 runs of one_run_ms).
cdef double tuning_budget_ms(double one_run_ms) noexcept nogil
# Nested tuning: while > 0 (a feature timing its routes), plans take the heuristic's choice.
cdef int enter_route_timing() noexcept
cdef int leave_route_timing() noexcept
cdef bint in_route_timing() noexcept


# -------------------- timing (merged into, above tuning)
# The table of tuned choices (what tuning files hold) and the registry of routes that features
# register. Below the plans: it knows no plan and no feature (timing is cygemm.engine.tuning).

# The tuned table, keyed by (GPU model, kind, key); kind "gemm" is the plans', the others
# are registered routes. Entries come from timing or from the tuning file.
cdef object lookup(int device, str kind, tuple key)
cdef int remember(int device, str kind, tuple key, dict record) except -1
cdef int count_tuning() noexcept
# Single flight: one thread times a problem, the others wait for its record. claim_tuning
# gives 1 when this thread is to time (device, kind, key); it must then call release_tuning
# with the same arguments in a `finally` (remember() before it). 0: it must not time: the
# table holds a record other than `seen` (the one the caller looked up, or None): look it
# up again and use it; or this thread is timing that key already (nested: no deadlock).
# While another thread times the key this waits (without the GIL), then decides again: a
# waiter whose owner recorded nothing gets 1. Keyed as the table is (GPU model, kind, key),
# so threads on two GPUs of one model time once too.
cdef int claim_tuning(int device, str kind, tuple key, object seen) except -1
cdef int release_tuning(int device, str kind, tuple key) except -1

# Routes: tuned_route gives the forced or tuned route name for a layer's problem (key[0] is
# the kind), remember_route records a timed choice.
cdef object forced_route(str kind)
cdef object tuned_route(int device, tuple key)
cdef int remember_route(int device, tuple key, str route, dict times) except -1
# Bumped whenever routes may change (force_routes, clear_tuning, load_tuning, set_options): a
# C-level memo of routes is valid while it holds the value it was filled under.
cdef unsigned long routes_generation() noexcept nogil
