from cygemm.bindings.cudart cimport cudaStream_t

# The one chooser: the order in which every decision of the engine is made (a plan's candidate
# in cygemm.engine.plans, a feature's route in cygemm.engine.chooser). See chooser.pyx.

# Why a choice was made (what choose returns).
cdef enum Chosen:
    CHOSEN_FORCED = 0       # cygemm.engine.tuning.force_routes
    CHOSEN_TUNED = 1        # the tuning table (timed before, or a tuning file)
    CHOSEN_TIMED = 2        # timed by this call, and remembered
    CHOSEN_RULE = 3         # the fixed rule: a problem not timed, or timing found nothing
    CHOSEN_UNTIMED = 4      # the fixed rule for now: not timed yet (capturing, autotune off, not allowed)

# A step of a decision, given the decider's state: 1 when it decided (forced, remembered, timed),
# else 0. rule(self, why) applies the fixed rule for the reason `why` (CHOSEN_RULE or _UNTIMED).
ctypedef int (*step_fn)(void* self) except -1
ctypedef int (*rule_fn)(void* self, int why) except -1
# The decision's entry for single flight: (kind, key, what the table held when it was read).
ctypedef object (*flight_fn)(void* self)

# A decision: its hooks, and what the call allows. read_table: the tuning table is consulted
# (else the rule decides what force does not); may_time: this problem is timed when nothing
# decided it (the size rule, worth_timing, and the caller's own conditions).
cdef struct Decider:
    void* self
    step_fn forced
    step_fn remembered
    step_fn time            # time the choices (the flight is held), apply the fastest and remember it
    rule_fn rule
    flight_fn flight
    bint read_table
    bint may_time
    int device
    cudaStream_t stream     # the call's: timed only when it is not capturing
    int capturing           # 1 or 0 when known, -1: ask the stream (only when it would be timed)

# Decide: forced; remembered (read_table); the fixed rule unless may_time and the stream is
# eager (asked only then: the check is a CUDA call); timed under single flight (threads deciding one new problem at once time it once:
# the others take the owner's choice, remembered, or the rule for now); the rule when timing
# found nothing. Returns a Chosen.
cdef int choose(Decider* d) except -1

# The one size rule: a problem of `macs` multiply-adds is large from the autotune_min_macs
# option on. A large problem is timed under `autotune` (a level or a determinism mode's
# AUTOTUNE_AUTO) when autotune is on (macs < 0: never); the fixed rules (untimed routes) take
# the same line between small and large.
cdef bint is_large(double macs) noexcept nogil
cdef bint worth_timing(int autotune, double macs) noexcept nogil


# -------------------- routes (merged into chooser)
# A feature's routes, decided by the one chooser: every feature with routes (the dense layer's forward and backward,
# grouped GEMMs) describes its routes by a RouteTable and asks choose_route for each call.
from libc.stdint cimport int64_t
from cygemm.bindings.cudart cimport cudaStream_t
from cygemm.engine.context cimport GemmContext
from cygemm.engine.tuning cimport enqueue_fn
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
