# The grouped engine (gemm.pyx) as the mixture-of-experts calls (moe.pyx) use it.
from cygemm.engine.args cimport CallArgs
from cygemm.grouped.groups cimport Groups

# Run checked groups by the chooser's route (c: the call's buffers, their overlaps checked).
cdef int run_groups(Groups grp, CallArgs* c, object alpha, object beta, object math, object stream, object route,
                    object autotune, object determinism) except -1
# describe_grouped's route keys for these groups: routes, not_applicable, chosen, decided_by, why_chosen.
cdef dict describe_host_routes(Groups grp, object math, object autotune, object determinism, object route=*)
# Record `name` as the calling thread's last grouped route (last_route()).
cdef int note_route(object name) except -1
