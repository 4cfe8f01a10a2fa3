# The table of tuned choices (what tuning files hold) and the registry of routes that features
# register. Below the plans: it knows no plan and no feature (timing is cygemm._timing).

# The tuned table, keyed by (GPU model, kind, key); kind "gemm" is the plans', the others
# are registered routes. Entries come from timing or from the tuning file.
cdef object lookup(int device, str kind, tuple key)
cdef int remember(int device, str kind, tuple key, dict record) except -1
cdef int count_tuning() noexcept

# Routes: tuned_route gives the forced or tuned route name for a layer's problem (key[0] is
# the kind), remember_route records a timed choice.
cdef object forced_route(str kind)
cdef object tuned_route(int device, tuple key)
cdef int remember_route(int device, tuple key, str route, dict times) except -1
# Bumped whenever routes may change (force_routes, clear_tuning, load_tuning, set_options): a
# C-level memo of routes is valid while it holds the value it was filled under.
cdef unsigned long routes_generation() noexcept nogil
