"""The benchmark suite's Recorder (rows, progress lines, interleaved GPU timing of
contenders) and the measuring helper the sections share."""
import statistics
import time

import cupy as cp

import contenders as C
from common import gpu_ms


class Recorder:
    def __init__(self, quick):
        self.rows, self.quick, self.t0 = [], quick, time.time()
        self.floor = None     # the C++ floor process (common.Floor)
        self.section = ""
        self.place = ""       # "section 3/15, " while a numbered section runs
        self.steps = 0        # progress lines so far in this section

    def start(self, section, index=None, total=None):
        """Enter `section` (the rows' section name); index/total (1-based) number it among the
        run's sections in the progress lines."""
        self.section, self.steps = section, 0
        self.place = f"section {index}/{total}, " if index is not None else ""

    def progress(self, what):
        """One line: seconds since the start, the section's number, this line's number in the
        section, and what runs now."""
        self.steps += 1
        print(f"[{time.time() - self.t0:6.1f}s] {self.place}step {self.steps}: {self.section}: {what}", flush=True)

    def add(self, case, contender, metric, value, lo=None, hi=None, **extra):
        row = dict(section=self.section, case=case, contender=contender, metric=metric, value=value,
                   lo=value if lo is None else lo, hi=value if hi is None else hi, **extra)
        self.rows.append(row)
        return row

    def skip(self, case, contender, reason):
        self.rows.append(dict(section=self.section, case=case, contender=contender, metric="skipped",
                              value=None, reason=str(reason)))

    def measure(self, case, contenders, stream, flop=None, inner=1, reps=30, floors=(), rounds=None, **extra):
        """GPU-time several contenders on one case in interleaved rounds: each round runs
        every contender once (the order rotated), so that drifts of clock or temperature
        fall on all alike. contenders: name -> callable(s) or a Skip; floors: (name, line)
        pairs for the C++ floor. Value: median of the round medians (min, max of them)."""
        entries = []
        for name, calls in contenders.items():
            if isinstance(calls, Exception):
                self.skip(case, name, calls)
            else:
                entries.append((False, name, calls))
        entries += [(True, name, line) for name, line in floors]
        got, failed = {name: [] for _, name, _ in entries}, {}
        rounds = rounds or (2 if self.quick else 3)
        for r in range(rounds):
            k = r % max(1, len(entries))
            for is_floor, name, x in entries[k:] + entries[:k]:
                if name in failed:
                    continue
                try:
                    got[name].append(self.floor(x) if is_floor else
                                     gpu_ms(cp, x, stream, inner=inner, reps=reps, warm_s=0.05 if r == 0 else 0.02)[0])
                except Exception as exc:   # a contender that fails is recorded, the suite goes on
                    failed[name] = exc
        if floors:
            self.floor.free()
        rows = []
        for is_floor, name, _ in entries:
            if name in failed:
                exc = failed[name]
                self.skip(case, name, exc if isinstance(exc, C.Skip) else f"failed: {type(exc).__name__}: {str(exc)[:160]}")
                continue
            v = got[name]
            med = statistics.median(v)
            more = dict(extra, rounds=v)
            if is_floor:
                more["floor"] = True
            if flop:
                more["tflops"] = flop / med / 1e9
            rows.append(self.add(case, name, "gpu_ms", med, min(v), max(v), **more))
        return rows


def inner_for(flop):
    """Calls per timed repeat: more for small problems, so that a repeat outlasts the timing's
    own overhead."""
    return 1 if flop > 1e10 else (10 if flop > 1e8 else 50)
