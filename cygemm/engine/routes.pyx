# cython: language_level=3, boundscheck=False, wraparound=False
"""The one route chooser. A feature that can run a call several ways (its routes) gives a
RouteTable: the route names and, through C function pointers, which routes apply to a call,
the fixed rule, the call's key in the tuning table and how to run a route. choose_route then
decides every call alike: forced, tuned, timed now (large, eager, allowed) and remembered, or
the fixed rule; describe_route says what it would decide without running anything.
"""
from cygemm.bindings.cudart cimport cudaStream_t
from cygemm.engine.context cimport GemmContext
from cygemm.engine.streams cimport stream_is_capturing
from libc.string cimport memcmp, memset
from cygemm.engine.settings cimport AUTOTUNE_OFF, AUTOTUNE_EXHAUSTIVE, POLICY_RUN_TO_RUN
from cygemm.engine.timing cimport enqueue_fn, time_choices, enter_route_timing, leave_route_timing, worth_tuning
from cygemm.engine.tuning cimport (forced_route, tuned_route, remember_route, claim_tuning, release_tuning,
                                   routes_generation)
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


cdef int _named(RouteTable t, void* call, object name, int* why, int reason) except -1:
    """The route of a forced or tuned name when it applies to the call, else the fixed rule."""
    cdef int route = t.names.index(name)
    if t.applies(call, route):
        why[0] = reason
        return route
    why[0] = ROUTE_RULE
    return t.fixed_rule(call)


cdef int _decided(RouteTable t, void* call, int device, bint tabled, int* why) except -2:
    """The route decided without timing (why: forced, tuned or rule), else -1 (device < 0: the
    table is not consulted)."""
    forced = forced_route(t.kind)
    if forced is not None and forced in t.names:
        return _named(t, call, forced, why, ROUTE_FORCED)
    if not tabled:
        why[0] = ROUTE_RULE
        return t.fixed_rule(call)
    if device < 0:
        return -1
    name = tuned_route(device, t.key(call))
    if name is not None and name in t.names:
        return _named(t, call, name, why, ROUTE_TUNED)
    return -1


cdef bint route_tabled(RouteTable t, int autotune, double macs) noexcept nogil:
    if autotune >= POLICY_RUN_TO_RUN:      # a determinism policy: the fixed rule, never timing
        return False
    if t.every_size:
        return True
    return autotune != AUTOTUNE_OFF and macs >= 0 and worth_tuning(macs)


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


cdef int choose_route(RouteTable t, void* call, GemmContext* ctx, cudaStream_t stream, int autotune,
                      double macs, bint may_time, int asked, int* why) except -1:
    if asked >= 0:
        if why != NULL:
            why[0] = ROUTE_FORCED
        return asked
    cdef int64_t key[ROUTE_KEY_WORDS]
    # Timing waits without the GIL: another thread may force or clear routes meanwhile, and
    # then a route chosen now must not enter the memo.
    cdef unsigned long generation = routes_generation()
    cdef int route, reason = ROUTE_UNTIMED
    if t.ckey != NULL:
        memset(key, 0, sizeof(key))
        t.ckey(call, key)
        route = _memo_find(t, key)
        if route >= 0:
            if why != NULL:
                why[0] = ROUTE_TUNED
            return route
    route = _choose(t, call, ctx, stream, autotune, route_tabled(t, autotune, macs), may_time, &reason)
    if why != NULL:
        why[0] = reason
    if t.ckey != NULL and (reason == ROUTE_FORCED or reason == ROUTE_TUNED or reason == ROUTE_TIMED):
        _memo_add(t, key, route, generation)
    return route


cdef int _choose(RouteTable t, void* call, GemmContext* ctx, cudaStream_t stream, int autotune,
                 bint tabled, bint may_time, int* why) except -1:
    cdef int reason = ROUTE_UNTIMED
    cdef int route = _decided(t, call, ctx.device, tabled, &reason)
    if why != NULL:
        why[0] = reason
    if route >= 0:
        return route
    if not may_time or autotune == AUTOTUNE_OFF or stream_is_capturing(stream):
        if why != NULL:
            why[0] = ROUTE_UNTIMED
        return t.fixed_rule(call)
    cdef int choices[MAX_ROUTES]
    cdef float ms[MAX_ROUTES]
    cdef int n = 0, i, best = -1
    for i in range(t.n):
        if t.applies(call, i):
            choices[n] = i
            n += 1
    key = t.key(call)
    kind, table_key = key[0], key[1:]
    # Threads deciding one new problem at once time it once: the others wait for the owner's
    # choice and take it from the table (a nested claim, this thread timing it already: the rule).
    if not claim_tuning(ctx.device, kind, table_key, None):
        route = _decided(t, call, ctx.device, tabled, &reason)
        if route < 0:
            reason, route = ROUTE_UNTIMED, t.fixed_rule(call)
        if why != NULL:
            why[0] = reason
        return route
    try:
        time_routes(ctx, stream, t.enqueue, call, choices, n, ms, autotune)
        for i in range(n):
            if ms[i] >= 0 and (best < 0 or ms[i] < ms[best]):
                best = i
        if best >= 0:
            remember_route(ctx.device, key, t.names[choices[best]],
                           {t.names[choices[i]]: ms[i] for i in range(n)})
    finally:
        release_tuning(ctx.device, kind, table_key)
    if best < 0:
        if why != NULL:
            why[0] = ROUTE_RULE
        return t.fixed_rule(call)
    if why != NULL:
        why[0] = ROUTE_TIMED
    return choices[best]


cdef tuple describe_route(RouteTable t, void* call, int device, int autotune, double macs):
    cdef int reason = ROUTE_UNTIMED
    cdef int route = _decided(t, call, device, route_tabled(t, autotune, macs), &reason)
    if route < 0:
        return None, None
    return t.names[route], ("forced", "tuned", "timed", "rule")[reason]


cdef int time_routes(GemmContext* ctx, cudaStream_t s, enqueue_fn enqueue, void* arg, const int* choices,
                     int n, float* ms, int autotune) except -1:
    if autotune == AUTOTUNE_EXHAUSTIVE:
        return time_choices(ctx, s, enqueue, arg, choices, n, ROUTE_REPS, ms, 0)
    enter_route_timing()
    try:
        return time_choices(ctx, s, enqueue, arg, choices, n, ROUTE_REPS, ms, 1e30)
    finally:
        leave_route_timing()
