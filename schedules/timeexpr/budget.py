"""Work budgets: every evaluation of an expression stops after a fixed amount of work.

The engine's loops call ``charge(n)`` for each unit of work they do (a calendar year skipped, a
candidate day examined, a wall time resolved). The unit count is deterministic, so whether a rule
fits its budget does not depend on the machine or its load; a CPU-time guard backs it up in case
some path is charged too little. Budgets nest: a ``next_after`` inside a preview is charged to
both, so each has its own limit.

Units are calibrated so that one unit is roughly a microsecond of CPU on a current server core;
bench/timeexpr_costs.py prints what they cost on the machine it runs on.
"""

from __future__ import annotations

import gc
import threading
import time

from .types import ExpressionError

# Validation (parse) and previews: the API answers within about 50 ms of CPU or refuses the rule.
VALIDATION_UNITS = 30_000
PREVIEW_UNITS = 30_000
# One next_after call on an accepted rule. Validation asks for the next occurrence from several
# points (parsing._PROBES) and refuses the rule if any costs more than PROBE_UNITS, so accepted
# rules stay far below NEXT_AFTER_UNITS; a rule that still reaches it at scan time is
# pathological and the caller should park its schedule.
PROBE_UNITS = 1_000
NEXT_AFTER_UNITS = 20_000

# CPU guards, checked every _CPU_CHECK_EVERY units, counting from the first check: reading a
# thread's CPU clock is a system call, and a busy host's scheduler takes the CPU from the caller
# there (under load it cost a scanner a quarter of its samples when every next_after read it on
# entry); the evaluations that end before a check, nearly all of them, never read it. Generous on purpose: they exist for paths that
# are under-charged, not to make the unit budget machine-dependent. Thread CPU time also counts
# what the rule did not cause (a lazy import, a virtual machine's stolen time): a validation guard
# a few times the unit budget's own cost refused an ordinary RRULE on a busy CI host, so the guard
# is well above any such stall. Full garbage collections are left out of it (_gc_clock): one of a
# large process's heap costs the thread that triggers it as much as the guard allows, and a
# scanner holding many rules would park a healthy schedule for it.
VALIDATION_CPU_SECONDS = 0.50
NEXT_AFTER_CPU_SECONDS = 0.25
_CPU_CHECK_EVERY = 1024

_local = threading.local()


def _gc_clock(phase: str, info: dict) -> None:
    """Thread CPU time spent in full collections, per thread (the collecting thread is the one
    whose allocation triggered it). The younger generations are left alone: they are short, and
    this runs for every collection of every process that imports the engine."""
    if info["generation"] != 2:
        return
    if phase == "start":
        _local.gc_from = time.thread_time()
    elif (started := getattr(_local, "gc_from", None)) is not None:
        _local.gc_spent = getattr(_local, "gc_spent", 0.0) + time.thread_time() - started
        _local.gc_from = None


gc.callbacks.append(_gc_clock)


def _cpu_now() -> float:
    """This thread's CPU time less its full collections'."""
    return time.thread_time() - getattr(_local, "gc_spent", 0.0)


class TooExpensive(ExpressionError):
    """The expression cannot be evaluated within its work budget.

    A subclass of ExpressionError (field 'expression'), so an API that already turns
    ExpressionError into a 400 also refuses these. Raised by ``parse`` and ``preview`` for
    rules that cost too much to validate, and by ``Rule.next_after`` when one call exceeds
    NEXT_AFTER_UNITS: a scanner should then stop evaluating that schedule (park it with this
    message as the reason) rather than retry it in a loop.
    """

    def __init__(self, message: str, field: str = "expression"):
        super().__init__(f"too expensive to evaluate: {message}", field)


class Meter:
    __slots__ = ("what", "limit", "used", "cpu_limit", "cpu_start", "next_check")

    def __init__(self, what: str, limit: int, cpu_limit: float):
        self.what = what
        self.limit = limit
        self.used = 0
        self.cpu_limit = cpu_limit
        self.cpu_start: float | None = None  # read at the first check
        self.next_check = _CPU_CHECK_EVERY

    def __enter__(self) -> Meter:
        stack = getattr(_local, "meters", None)
        if stack is None:
            stack = _local.meters = []
        stack.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _local.meters.remove(self)

    def _over_units(self) -> TooExpensive:
        return TooExpensive(f"{self.what} needed more than its budget of {self.limit} work units")

    def _over_cpu(self) -> TooExpensive:
        return TooExpensive(f"{self.what} needed more than {self.cpu_limit * 1000:.0f} ms of CPU "
                            f"(after {self.used} of its {self.limit} work units)")


def metered(what: str, limit: int, cpu_limit: float) -> Meter:
    return Meter(what, limit, cpu_limit)


def charge(n: int = 1) -> None:
    stack = getattr(_local, "meters", None)
    if not stack:
        return
    for m in stack:
        m.used += n
        if m.used > m.limit:
            raise m._over_units()
        if m.used >= m.next_check:
            m.next_check = m.used + _CPU_CHECK_EVERY
            if m.cpu_start is None:
                m.cpu_start = _cpu_now()
            elif _cpu_now() - m.cpu_start > m.cpu_limit:
                raise m._over_cpu()


def active() -> bool:
    return bool(getattr(_local, "meters", None))
