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

# Whether a problem of `macs` multiply-adds is timed at all (the autotune_min_macs option).
cdef bint worth_tuning(double macs) noexcept nogil
# The time a new problem's tuning may take: max(50 ms, 25 runs of one_run_ms).
cdef double tuning_budget_ms(double one_run_ms) noexcept nogil
# Nested tuning: while > 0 (a feature timing its routes), plans take the heuristic's choice.
cdef int enter_route_timing() noexcept
cdef int leave_route_timing() noexcept
cdef bint in_route_timing() noexcept
