# A feature's routes, decided by the one chooser: every feature with routes (the dense layer's forward and backward,
# grouped GEMMs) describes its routes by a RouteTable and asks choose_route for each call.
from libc.stdint cimport int64_t
from cygemm.bindings.cudart cimport cudaStream_t
from cygemm.engine.context cimport GemmContext
from cygemm.engine.timing cimport enqueue_fn
from cygemm.engine.chooser cimport Chosen
from cygemm.engine.settings cimport Policy

cdef enum:
    MAX_ROUTES = 8
    ROUTE_KEY_WORDS = 14    # a call's C key for the chooser's memo (int64 words)
    ROUTE_MEMO = 16         # recent decisions each table remembers by C key

# A feature's hooks, each given the feature's call struct: applies(call, route) 1/0, the fixed
# rule's route, the problem's key in the tuning table (key[0] is the kind; built only where the
# table is consulted), and enqueue (run the route: 0 done, nonzero refused with nothing enqueued).
ctypedef int (*applies_fn)(void* call, int route) except -1
ctypedef int (*fixed_rule_fn)(void* call) except -1
ctypedef object (*key_fn)(void* call)
# The call's C key (ROUTE_KEY_WORDS words, the unused ones zero): a table that has one remembers
# its recent decisions by it, so a repeated small call finds its route without a Python key.
ctypedef void (*ckey_fn)(void* call, int64_t* key) noexcept nogil

cdef class RouteTable:
    cdef readonly str kind
    cdef readonly tuple names       # in the order of the route numbers
    cdef int n
    cdef applies_fn applies
    cdef fixed_rule_fn fixed_rule
    cdef key_fn key
    cdef enqueue_fn enqueue
    cdef ckey_fn ckey               # NULL: no memo
    cdef bint every_size            # tabled (read, timed) at every size and autotune level
    cdef int64_t memo_key[ROUTE_MEMO * ROUTE_KEY_WORDS]
    cdef int memo_route[ROUTE_MEMO]
    cdef int memo_n, memo_next
    cdef unsigned long memo_generation

# A feature's table (registered with cygemm.engine.tuning, so force_routes knows its names).
# every_size: its routes are timed at every size (the default: only problems worth tuning);
# ckey: its memo's key (NULL: none).
cdef RouteTable route_table(str kind, tuple names, applies_fn applies, fixed_rule_fn fixed_rule, key_fn key,
                            enqueue_fn enqueue, ckey_fn ckey=*, bint every_size=*)

# The route for one call: `asked` (the call's route=, checked by the feature; -1: none); the
# table's memo; then the one chooser (cygemm.engine.chooser): forced (when it applies, else
# the fixed rule); the fixed rule unless the problem is tabled (route_tabled); tuned (when it
# applies); the fixed rule unless `may_time`, policy.autotune is on and the stream is not capturing;
# else every route that applies is timed on the call's operands under single flight and the
# fastest remembered. why (may be NULL) gets a Chosen.
cdef int choose_route(RouteTable t, void* call, GemmContext* ctx, cudaStream_t stream, Policy policy,
                      double macs, bint may_time, int asked, int* why) except -1
# Whether choose_route reads the tuning table for a problem of `macs` under `policy`: never
# under a determinism mode; at every size for an every_size table; else the size rule.
cdef bint route_tabled(RouteTable t, Policy policy, double macs) noexcept nogil
# What choose_route would decide without timing: (route name, "forced" / "tuned" / "rule"), or
# (None, None) when the call would time (or device < 0: no GPU to look the table up for).
cdef tuple describe_route(RouteTable t, void* call, int device, Policy policy, double macs)
# Time routes: auto, the plans inside each route take the heuristic's choice and the rounds
# stay within the tuning budget; exhaustive, the plans are timed too and every round runs.
cdef int time_routes(GemmContext* ctx, cudaStream_t s, enqueue_fn enqueue, void* arg, const int* choices,
                     int n, float* ms, int autotune) except -1
