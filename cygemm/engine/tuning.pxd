# The table of tuned choices (what tuning files hold) and the registry of routes that features
# register. Below the plans: it knows no plan and no feature (timing is cygemm.engine.timing).

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
