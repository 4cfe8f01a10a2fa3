# cython: language_level=3, boundscheck=False, wraparound=False
"""Timing candidates on the GPU: a plan's algorithms (cygemm.engine.candidates) and a feature's
routes (cygemm.engine.routes) are timed here, never during a capture, waiting without the GIL.

With ``autotune="auto"`` (the default) a new problem's timing stays within max(50 ms, 25 runs
of it): a few candidates, rounds cut short by the budget. ``"exhaustive"`` times every candidate
and then the finalists again, longer; ``"off"`` times nothing. The tuning mode says how each run
is timed: with the L2 cache flushed first ("cold", the default), or several calls back to back
("sustained"). What won is kept by cygemm.engine.tuning. Threads that meet one new problem at once
time it once (SingleFlight).
"""
import threading
import time

from libc.stdint cimport uint64_t
from libc.stdlib cimport malloc, free
from libc.string cimport memset

from cygemm.bindings.cudart cimport *
from cygemm.kernels.timing cimport cygemm_hold_stream
from cygemm.engine.errors cimport check_cuda
from cygemm.engine.settings cimport options, loaded_options, Options, TUNING_COLD, TUNING_SUSTAINED

# One buffer per device, twice its L2 size, written before every timed run so that no
# candidate finds its operands in L2 left there by the previous one. Made on the first
# tuning on that device and kept for the life of the process.
cdef void* _flush_buf[64]
cdef size_t _flush_bytes[64]


cdef int _flush_l2(int device, cudaStream_t stream) except -1:
    cdef int l2 = 0
    cdef cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed
    cdef cudaError_t err
    cdef size_t nbytes
    if device < 0 or device >= 64:
        return 0
    if _flush_buf[device] == NULL:
        check_cuda(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device), "cudaDeviceGetAttribute(L2)")
        nbytes = 2 * <size_t>l2 + 256
        with nogil:         # cudaMalloc of ~100 MB takes milliseconds: other threads run meanwhile
            cudaThreadExchangeStreamCaptureMode(&mode)
            err = cudaMalloc(&_flush_buf[device], nbytes)
            cudaThreadExchangeStreamCaptureMode(&mode)
        check_cuda(err, "cudaMalloc(L2 flush buffer)")
        _flush_bytes[device] = nbytes
    return check_cuda(cudaMemsetAsync(_flush_buf[device], 0, _flush_bytes[device], stream),
                      "cudaMemsetAsync(L2 flush)")


cdef enum:
    SUSTAINED_CALLS = 3            # tuning_mode "sustained": calls per timed run
    HOLD_NS_PER_CALL = 40000       # host time to enqueue one call, with a margin
    MIN_BUDGET_MS = 50
    BUDGET_RUNS = 25


cdef double tuning_budget_ms(double one_run_ms) noexcept nogil:
    return max(<double>MIN_BUDGET_MS, BUDGET_RUNS * one_run_ms)


cdef bint worth_tuning(double macs) noexcept nogil:
    return macs >= loaded_options().autotune_min_macs


# Per thread: another thread's plans are not part of this thread's route timing.
cdef extern from *:
    """
    #if defined(_MSC_VER)
    static __declspec(thread) int cg_route_timing_depth;
    #else
    static __thread int cg_route_timing_depth;
    #endif
    """
    int cg_route_timing_depth


cdef int enter_route_timing() noexcept:
    global cg_route_timing_depth
    cg_route_timing_depth += 1
    return 0


cdef int leave_route_timing() noexcept:
    global cg_route_timing_depth
    cg_route_timing_depth -= 1
    return 0


cdef bint in_route_timing() noexcept:
    return cg_route_timing_depth > 0


cdef int _sync(cudaEvent_t ev) except -1:
    cdef cudaError_t st
    with nogil:
        st = cudaEventSynchronize(ev)
    return check_cuda(st, "cudaEventSynchronize")


cdef float _median(float* t, int reps) noexcept:
    cdef int r, j
    cdef float x
    for r in range(1, reps):        # insertion sort: reps is small
        x = t[r]
        j = r - 1
        while j >= 0 and t[j] > x:
            t[j + 1] = t[j]
            j -= 1
        t[j + 1] = x
    return t[reps // 2] if reps % 2 else 0.5 * (t[reps // 2 - 1] + t[reps // 2])


cdef int time_choices(GemmContext* ctx, cudaStream_t stream, enqueue_fn enqueue, void* arg,
                      const int* choices, int n, int reps, float* ms, double budget_ms) except -1:
    cdef const Options* opt = options()
    cdef int i, r, c, done = 0
    cdef int calls = SUSTAINED_CALLS if opt.tuning_mode == TUNING_SUSTAINED else 1
    cdef int n_events = 2 * n * reps + 1      # the last one: recorded after every round
    cdef cudaEvent_t* ev = <cudaEvent_t*>malloc(n_events * sizeof(cudaEvent_t))
    cdef float* t = <float*>malloc(n * reps * sizeof(float))
    cdef float* column = <float*>malloc(reps * sizeof(float))
    cdef bint* ok = <bint*>malloc(n * sizeof(bint))
    cdef double start = time.perf_counter(), round_ms = 0, fastest, first_round_done = 0
    if ev == NULL or t == NULL or ok == NULL or column == NULL:
        free(ev); free(t); free(ok); free(column)
        raise MemoryError()
    memset(ev, 0, n_events * sizeof(cudaEvent_t))
    try:
        for i in range(n_events):
            check_cuda(cudaEventCreate(&ev[i]), "cudaEventCreate")
        for i in range(n):          # warm-up: kernels loaded, the choice's own plans made
            ok[i] = enqueue(arg, choices[i]) == 0
        for r in range(reps):       # interleaved rounds: drift hits every choice alike
            if r > 0 and budget_ms > 0:
                if r == 1:          # the first round tells how long one takes, and the budget
                    check_cuda(cudaEventRecord(ev[n_events - 1], stream), "cudaEventRecord")
                    _sync(ev[n_events - 1])
                    fastest = -1
                    for i in range(n):
                        if ok[i]:
                            check_cuda(cudaEventElapsedTime(&t[i * reps], ev[2 * i], ev[2 * i + 1]),
                                       "cudaEventElapsedTime")
                            round_ms += t[i * reps]
                            if fastest < 0 or t[i * reps] / calls < fastest:
                                fastest = t[i * reps] / calls
                    if fastest > 0:
                        budget_ms = min(budget_ms, tuning_budget_ms(fastest))
                    first_round_done = (time.perf_counter() - start) * 1e3
                # Rounds 1..r-1 are queued, not finished: where the GPU will be is the first
                # round's end plus r - 1 rounds (the host clock alone would lag behind).
                if first_round_done + r * round_ms > budget_ms:
                    break
            if calls > 1:
                check_cuda(cygemm_hold_stream(<uint64_t>min(n * calls * HOLD_NS_PER_CALL + 100000, 20000000),
                                              stream), "cygemm_hold_stream")
            for i in range(n):
                if not ok[i]:
                    continue
                if opt.tuning_mode == TUNING_COLD:
                    _flush_l2(ctx.device, stream)
                check_cuda(cudaEventRecord(ev[2 * (r * n + i)], stream), "cudaEventRecord")
                for c in range(calls):
                    if ok[i]:
                        ok[i] = enqueue(arg, choices[i]) == 0
                check_cuda(cudaEventRecord(ev[2 * (r * n + i) + 1], stream), "cudaEventRecord")
            done = r + 1
        check_cuda(cudaEventRecord(ev[n_events - 1], stream), "cudaEventRecord")
        _sync(ev[n_events - 1])
        for i in range(n):
            ms[i] = -1
            if not ok[i] or done == 0:
                continue
            for r in range(done):
                check_cuda(cudaEventElapsedTime(&column[r], ev[2 * (r * n + i)], ev[2 * (r * n + i) + 1]),
                           "cudaEventElapsedTime")
            ms[i] = _median(column, done) / calls
    finally:
        for i in range(n_events):
            if ev[i] != NULL:
                cudaEventDestroy(ev[i])
        free(ev); free(t); free(ok); free(column)
    return 0


# ---------------------------------------------------------------- single flight

class SingleFlight:
    """At most one thread at a time works on a key; the others wait until it is done.

    The work (timing a problem) is done once: threads that ask for a key while its owner
    works wait for the owner's release, then find its result. Generic: keys are any hashable.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._owners = {}           # key -> (the owning thread's ident, Event set at release)

    def claim(self, key, settled):
        """Whether this thread is to do the work of `key` now.

        Parameters
        ----------
        key : hashable
            What the work is for.
        settled : callable
            ``settled()`` is true when a result of the work is there (then nothing is claimed).
            Called with the lock held, so a result recorded before the owner's release is
            always seen.

        Returns
        -------
        bool
            True: this thread owns `key` and must call ``release(key)`` when done, in a
            ``finally`` (waiters are released on errors too). False: it must not do the work,
            because ``settled()`` (use the result) or because this thread owns `key` already
            (a nested claim: no deadlock). While another thread owns `key`, this waits first
            (without the GIL) and then decides again: a waiter whose owner left no result
            claims `key` itself.
        """
        me = threading.get_ident()
        while True:
            with self._lock:
                owner = self._owners.get(key)
                if owner is None:
                    if settled():
                        return False
                    self._owners[key] = (me, threading.Event())
                    return True
                if owner[0] == me:
                    return False
                released = owner[1]
            released.wait()

    def release(self, key):
        """End this thread's claim of `key` and wake the threads waiting for it.

        Raises
        ------
        RuntimeError
            This thread does not own `key`.
        """
        me = threading.get_ident()
        with self._lock:
            owner = self._owners.get(key)
            if owner is None or owner[0] != me:
                raise RuntimeError(f"release({key!r}): the key is not claimed by this thread")
            del self._owners[key]
        owner[1].set()
