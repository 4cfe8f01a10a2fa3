from cygemm.bindings.cudart cimport cudaStream_t

# The one chooser: the order in which every decision of the engine is made (a plan's candidate
# in cygemm.engine.plans, a feature's route in cygemm.engine.routes). See chooser.pyx.

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

# The one size rule: a problem of `macs` multiply-adds is timed under `autotune` (a level or a
# determinism mode's AUTOTUNE_AUTO) when autotune is on and it is worth tuning (macs < 0: never).
cdef bint worth_timing(int autotune, double macs) noexcept nogil
