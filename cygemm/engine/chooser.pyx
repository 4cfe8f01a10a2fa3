# cython: language_level=3, boundscheck=False, wraparound=False
"""The one chooser: the order in which the engine decides how a call runs.

Two kinds of decision exist, and they are made alike: which of a plan's cuBLASLt candidates
(or cublasGemmEx) runs a problem (cygemm.engine.plans), and which of a feature's routes runs a
call (cygemm.engine.routes: the dense layer's forward and backward, grouped GEMMs). Each
gives a :c:type:`Decider`, its hooks over its own state; :c:func:`choose` walks them in one
order: forced, remembered, the fixed rule for what is not timed, timed under single flight,
the rule again when timing found nothing. The size rule, :c:func:`worth_timing`, is here too.
"""
from cygemm.engine.streams cimport stream_is_capturing
from cygemm.engine.settings cimport AUTOTUNE_OFF
from cygemm.engine.timing cimport worth_tuning
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


cdef bint worth_timing(int autotune, double macs) noexcept nogil:
    return autotune != AUTOTUNE_OFF and macs >= 0 and worth_tuning(macs)


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
