# cython: language_level=3, boundscheck=False, wraparound=False
"""The one chooser: the order in which the engine decides how a call runs.

Two kinds of decision exist, and they are made alike: which of a plan's cuBLASLt candidates
(or cublasGemmEx) runs a problem (cygemm.engine.plans), and which of a feature's routes runs a
call (cygemm.engine.chooser: the dense layer's forward and backward, grouped GEMMs). Each
gives a :c:type:`Decider`, its hooks over its own state; :c:func:`choose` walks them in one
order: forced, remembered, the fixed rule for what is not timed, timed under single flight,
the rule again when timing found nothing. The size rule, :c:func:`worth_timing`, is here too.
"""
from cygemm.engine.streams cimport stream_is_capturing
from cygemm.engine.settings cimport AUTOTUNE_OFF, loaded_options
from cygemm.engine.tuning cimport claim_tuning, release_tuning


cdef int choose(Decider* d) except -1:
    if d.forced(d.self):
        return CHOSEN_FORCED
    if d.read_table and d.remembered(d.self):
        return CHOSEN_TUNED
    if not d.may_time or (d.capturing if d.capturing >= 0 else stream_is_capturing(d.stream)):
        # (Not timed: the problem's rule, or for now when the table was read and timing waits.)
        why = CHOSEN_UNTIMED if d.read_table else CHOSEN_RULE
        d.rule(d.self, why)
        return why
    kind, key, seen = d.flight(d.self)
    if not claim_tuning(d.device, kind, key, seen):
        # Another thread timed it (perhaps while this one waited): its choice. Or this thread
        # is timing it already (a nested decision): the rule for now, decided next call.
        if d.forced(d.self):
            return CHOSEN_FORCED
        if d.remembered(d.self):
            return CHOSEN_TUNED
        d.rule(d.self, CHOSEN_UNTIMED)
        return CHOSEN_UNTIMED
    try:
        timed = d.time(d.self)
    finally:
        release_tuning(d.device, kind, key)
    if timed:
        return CHOSEN_TIMED
    d.rule(d.self, CHOSEN_RULE)
    return CHOSEN_RULE


cdef bint is_large(double macs) noexcept nogil:
    return macs >= loaded_options().autotune_min_macs


cdef bint worth_timing(int autotune, double macs) noexcept nogil:
    return autotune != AUTOTUNE_OFF and macs >= 0 and is_large(macs)


# ---------------------------------------------------------------- the order, observable

cdef class _Script:
    """Hooks that answer from a script and log each call: walk's state."""
    cdef dict answers
    cdef list steps
    cdef tuple key


cdef int _answer(_Script s, str step) except -1:
    s.steps.append(step)
    queue = s.answers.get(step)
    answer = queue.pop(0) if queue else 0
    return 1 if (answer() if callable(answer) else answer) else 0


cdef int _script_forced(void* s) except -1:
    return _answer(<_Script>s, "forced")


cdef int _script_remembered(void* s) except -1:
    return _answer(<_Script>s, "remembered")


cdef int _script_time(void* s) except -1:
    return _answer(<_Script>s, "time")


cdef int _script_rule(void* s, int why) except -1:
    (<_Script>s).steps.append("rule" if why == CHOSEN_RULE else "rule for now")
    return 0


cdef object _script_flight(void* s):
    (<_Script>s).steps.append("flight")
    return ("chooser probe", (<_Script>s).key, None)


_CHOSEN_NAMES = {CHOSEN_FORCED: "forced", CHOSEN_TUNED: "tuned", CHOSEN_TIMED: "timed", CHOSEN_RULE: "rule",
                 CHOSEN_UNTIMED: "untimed"}


def walk(dict answers, bint read_table, bint may_time, bint capturing=False, tuple key=(), int device=0):
    """Run :c:func:`choose` over scripted hooks, for tests of its order.

    Parameters
    ----------
    answers : dict
        For "forced", "remembered" and "time": the answers (truthy: that step decides; a
        callable is called for its answer) of its calls in order; a step with none left
        answers no.
    read_table, may_time, capturing : bool
        The decision's :c:type:`Decider` flags and whether the stream is capturing.
    key : tuple
        The key this decision claims for timing (single flight, on ``device``: a GPU is
        needed only when the walk reaches timing).

    Returns
    -------
    (str, list of str)
        Why it was decided ("forced", "tuned", "timed", "rule" or "untimed") and the steps
        called, in order.
    """
    cdef _Script s = _Script()
    s.answers = {k: list(v) for k, v in answers.items()}
    s.steps, s.key = [], key
    cdef Decider d
    d.self = <void*>s
    d.forced, d.remembered, d.time = _script_forced, _script_remembered, _script_time
    d.rule, d.flight = _script_rule, _script_flight
    d.read_table, d.may_time, d.device = read_table, may_time, device
    d.stream, d.capturing = NULL, capturing
    why = choose(&d)
    return _CHOSEN_NAMES[why], s.steps


# -------------------- routes (merged into chooser)
# The one route chooser. A feature that can run a call several ways (its routes) gives a
# RouteTable: the route names and, through C function pointers, which routes apply to a call,
# the fixed rule, the call's key in the tuning table and how to run a route. choose_route then
# decides every call by the one chooser (cygemm.engine.chooser): forced, tuned, timed now
# (large, eager, allowed) and remembered, or the fixed rule; describe_route says what it would
# decide without running anything.
from cygemm.bindings.cudart cimport cudaStream_t
from cygemm.engine.context cimport GemmContext
from libc.string cimport memcmp, memset
from cygemm.engine.settings cimport Policy, AUTOTUNE_OFF, AUTOTUNE_EXHAUSTIVE, DETERMINISM_OFF
from cygemm.engine.tuning cimport enqueue_fn, time_choices, enter_route_timing, leave_route_timing
from cygemm.engine.tuning cimport forced_route, tuned_route, remember_route, routes_generation
from cygemm.engine import tuning

cdef enum:
    ROUTE_REPS = 7          # timed rounds per route (median)


cdef class RouteTable:
    """A feature's routes: kind (its key in the tuning table and in force_routes), names, hooks."""


cdef RouteTable route_table(str kind, tuple names, applies_fn applies, fixed_rule_fn fixed_rule, key_fn key,
                            enqueue_fn enqueue, ckey_fn ckey=NULL, bint every_size=False):
    if len(names) > MAX_ROUTES:
        raise ValueError(f"{kind}: at most {MAX_ROUTES} routes, got {len(names)}")
    cdef RouteTable t = RouteTable.__new__(RouteTable)
    t.kind, t.names, t.n = kind, names, len(names)
    t.applies, t.fixed_rule, t.key, t.enqueue = applies, fixed_rule, key, enqueue
    t.ckey, t.every_size = ckey, every_size
    t.memo_n = t.memo_next = 0
    t.memo_generation = 0
    tuning.register_routes(kind, names)
    return t


# One call's decision, the state of the chooser's hooks.
cdef struct RouteCall:
    void* table                 # the RouteTable (borrowed)
    void* call
    GemmContext* ctx            # NULL: describing (nothing is timed)
    cudaStream_t stream
    int device
    Policy policy
    int route
    int why


cdef int _named(RouteCall* r, object name, int reason) except -1:
    """The route of a forced or tuned name when it applies to the call, else the fixed rule."""
    cdef RouteTable t = <RouteTable>r.table
    cdef int route = t.names.index(name)
    if t.applies(r.call, route):
        r.route, r.why = route, reason
    else:
        r.route, r.why = t.fixed_rule(r.call), CHOSEN_RULE
    return 1


cdef int _forced(void* self) except -1:
    cdef RouteCall* r = <RouteCall*>self
    cdef RouteTable t = <RouteTable>r.table
    forced = forced_route(t.kind)
    if forced is None or forced not in t.names:
        return 0
    return _named(r, forced, CHOSEN_FORCED)


cdef int _remembered(void* self) except -1:
    cdef RouteCall* r = <RouteCall*>self
    cdef RouteTable t = <RouteTable>r.table
    if r.device < 0:                    # no GPU to look the table up for
        return 0
    name = tuned_route(r.device, t.key(r.call))
    if name is None or name not in t.names:
        return 0
    return _named(r, name, CHOSEN_TUNED)


cdef int _rule(void* self, int why) except -1:
    cdef RouteCall* r = <RouteCall*>self
    r.route, r.why = (<RouteTable>r.table).fixed_rule(r.call), why
    return 0


cdef object _flight(void* self):
    cdef RouteCall* r = <RouteCall*>self
    key = (<RouteTable>r.table).key(r.call)
    return key[0], key[1:], None


cdef int _time(void* self) except -1:
    """Every route that applies, timed on the call's operands; the fastest remembered."""
    cdef RouteCall* r = <RouteCall*>self
    cdef RouteTable t = <RouteTable>r.table
    cdef int choices[MAX_ROUTES]
    cdef float ms[MAX_ROUTES]
    cdef int n = 0, i, best = -1
    for i in range(t.n):
        if t.applies(r.call, i):
            choices[n] = i
            n += 1
    time_routes(r.ctx, r.stream, t.enqueue, r.call, choices, n, ms, r.policy.autotune)
    for i in range(n):
        if ms[i] >= 0 and (best < 0 or ms[i] < ms[best]):
            best = i
    if best < 0:
        return 0
    remember_route(r.device, t.key(r.call), t.names[choices[best]], {t.names[choices[i]]: ms[i] for i in range(n)})
    r.route, r.why = choices[best], CHOSEN_TIMED
    return 1


cdef int _decide(RouteTable t, RouteCall* r, double macs, bint may_time) except -1:
    """The one chooser over the table's hooks; r.route and r.why get its decision."""
    cdef Decider d
    d.self = r
    d.forced, d.remembered, d.time, d.rule, d.flight = _forced, _remembered, _time, _rule, _flight
    d.read_table = route_tabled(t, r.policy, macs)
    d.may_time = d.read_table and may_time and r.policy.autotune != AUTOTUNE_OFF
    d.device, d.stream, d.capturing = r.device, r.stream, -1
    choose(&d)
    return 0


cdef bint route_tabled(RouteTable t, Policy policy, double macs) noexcept nogil:
    if policy.determinism != DETERMINISM_OFF:      # a determinism mode: the fixed rule, never timing
        return False
    if t.every_size:
        return True
    return worth_timing(policy.autotune, macs)


# ---------------------------------------------------------------- the memo (recent decisions by C key)

cdef int _memo_find(RouteTable t, const int64_t* key) noexcept:
    cdef int i
    if t.memo_generation != routes_generation():     # routes forced or cleared since: forget
        t.memo_n = 0
        t.memo_generation = routes_generation()
        return -1
    for i in range(t.memo_n):
        if memcmp(&t.memo_key[i * ROUTE_KEY_WORDS], key, ROUTE_KEY_WORDS * sizeof(int64_t)) == 0:
            return t.memo_route[i]
    return -1


cdef void _memo_add(RouteTable t, const int64_t* key, int route, unsigned long generation) noexcept:
    if generation != routes_generation() or generation != t.memo_generation:
        return                          # decided under routes that have changed since
    cdef int i = t.memo_next
    if t.memo_n < ROUTE_MEMO:
        i = t.memo_n
        t.memo_n += 1
    else:
        t.memo_next = (t.memo_next + 1) % ROUTE_MEMO
    cdef int w
    for w in range(ROUTE_KEY_WORDS):
        t.memo_key[i * ROUTE_KEY_WORDS + w] = key[w]
    t.memo_route[i] = route


cdef int choose_route(RouteTable t, void* call, GemmContext* ctx, cudaStream_t stream, Policy policy,
                      double macs, bint may_time, int asked, int* why) except -1:
    if asked >= 0:
        if why != NULL:
            why[0] = CHOSEN_FORCED
        return asked
    cdef int64_t key[ROUTE_KEY_WORDS]
    # Timing waits without the GIL: another thread may force or clear routes meanwhile, and
    # then a route chosen now must not enter the memo.
    cdef unsigned long generation = routes_generation()
    cdef int route
    if t.ckey != NULL:
        memset(key, 0, sizeof(key))
        t.ckey(call, key)
        route = _memo_find(t, key)
        if route >= 0:
            if why != NULL:
                why[0] = CHOSEN_TUNED
            return route
    cdef RouteCall r
    r.table, r.call, r.ctx, r.stream = <void*>t, call, ctx, stream
    r.device, r.policy, r.route, r.why = ctx.device, policy, -1, CHOSEN_UNTIMED
    _decide(t, &r, macs, may_time)
    if why != NULL:
        why[0] = r.why
    if t.ckey != NULL and (r.why == CHOSEN_FORCED or r.why == CHOSEN_TUNED or r.why == CHOSEN_TIMED):
        _memo_add(t, key, r.route, generation)
    return r.route


cdef tuple describe_route(RouteTable t, void* call, int device, Policy policy, double macs):
    cdef RouteCall r
    r.table, r.call, r.ctx, r.stream = <void*>t, call, NULL, NULL
    r.device, r.policy, r.route, r.why = device, policy, -1, CHOSEN_UNTIMED
    _decide(t, &r, macs, False)
    if r.why == CHOSEN_UNTIMED:         # the call would time it
        return None, None
    return t.names[r.route], ("forced", "tuned", "timed", "rule")[r.why]


cdef int time_routes(GemmContext* ctx, cudaStream_t s, enqueue_fn enqueue, void* arg, const int* choices,
                     int n, float* ms, int autotune) except -1:
    if autotune == AUTOTUNE_EXHAUSTIVE:
        return time_choices(ctx, s, enqueue, arg, choices, n, ROUTE_REPS, ms, 0)
    enter_route_timing()
    try:
        return time_choices(ctx, s, enqueue, arg, choices, n, ROUTE_REPS, ms, 1e30)
    finally:
        leave_route_timing()
