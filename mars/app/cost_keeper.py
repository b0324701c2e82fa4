"""Keeps the app's pass-cost table true: measured at warm-up, and again when it drifts or ages (issue 41), or
once soon after a warm-up whose table read flat (DriftRule.flat_below).

The table (mars.decoding.costs.PassCosts, on `lm.pass_costs[backend]`) sizes every tree's passes. It is a
minute's measurement; the machine under it changes (a neighbour's load, frequency, another route in a
library). So every pass a visitor's run makes is noted here (its width, its mask inputs, its seconds), and a
daemon thread asks `mars.decoding.costs.remeasure_reason` every few seconds whether the table should be measured
again: older than the rule's age, or the passes really run off the table's predictions by more than its
tolerance; never twice within its interval, and only once the model thread has been idle for a while, so no
visitor waits behind the ~0.8 s measurement. The measurement runs on the model thread (`pass_slot`), as every
pass does. `tick(now)` is the whole decision and the measurement, callable without the thread (tests).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

from mars.decoding.costs import DriftRule, remeasure_reason

LOG = logging.getLogger("mars.app")
CHECK_EVERY_S = 5.0  # how often the thread asks; a measurement is due at most every DriftRule.min_interval_s


def pass_shape(rec) -> tuple[int, int]:
    """(input width, mask inputs) of a pass: its real inputs are the last token and the drafts sent (verified,
    jacobi), the rest are masks (MARS mode's block, a tree's mask group); an AR pass is (1, 0)."""
    return rec.input_len, max(0, rec.input_len - 1 - rec.drafts_sent)


class CostKeeper:
    """The passes run since the table was measured, the decision to measure it again, and a log of each time it
    was (`history`: {at, backend, reason, by_width, group})."""

    def __init__(self, slot, rule: DriftRule = DriftRule(), clock=time.monotonic, measure=None, wall=time.time):
        self.slot = slot  # where the measurement runs (the holder's PassSlot: the model thread)
        self.rule = rule
        self.clock = clock
        self._measure = measure  # (lm, backend) -> PassCosts; None: mars.decoding.costs.measure_pass_costs
        self._lock = threading.Lock()
        self._passes: dict[str, deque] = {}  # backend -> (width, masks, seconds) of recent passes
        self.measured_at: dict[str, float] = {}  # backend -> when its table was measured (this clock)
        self.wall = wall  # the time of day, for the model panel's "measured at HH:MM"
        # backend -> (why it was measured: None at warm-up, else the keeper's reason; the time of day): what the
        # model panel says of the table
        self.origin: dict[str, tuple[str | None, float]] = {}
        self._first: set[str] = set()  # backends whose table is the warm-up's, not yet measured again (DriftRule.flat_*)
        self.last_pass_at = float("-inf")
        self.history: list[dict] = []
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def measured(self, backend: str, reason: str | None = None) -> None:
        """A table for `backend` was just measured (the warm-up's, or the keeper's for `reason`): its age starts
        now, its passes afresh."""
        self._restart(backend)
        self.origin[backend] = (reason, self.wall())
        if reason is None:
            self._first.add(backend)

    def _restart(self, backend: str) -> None:
        with self._lock:
            self.measured_at[backend] = self.clock()
            self._passes[backend] = deque(maxlen=self.rule.window)

    def when(self, backend: str) -> str:
        """When and why `backend`'s table was measured, for the model panel: "measured when the model was loaded,
        14:02 UTC (3 min ago)" or "re-measured at 14:22 UTC (1 min ago), because <the keeper's reason>"."""
        reason, at = self.origin.get(backend, (None, None))
        if at is None:
            return "measured when the model was loaded"
        ago = max(0, round((self.wall() - at) / 60))
        hhmm = f"{time.strftime('%H:%M UTC', time.gmtime(at))} ({ago} min ago)"
        return f"measured when the model was loaded, {hhmm}" if reason is None else f"re-measured at {hhmm}, because {reason}"

    def observe(self, backend: str, rec) -> None:
        """One pass of a visitor's run on `backend` (the first of a run, the prompt's, is wider than any table and
        is left out by the rule)."""
        with self._lock:
            self.last_pass_at = self.clock()
            if backend in self._passes:
                self._passes[backend].append((*pass_shape(rec), rec.seconds))

    def passes(self, backend: str) -> list[tuple[int, int, float]]:
        with self._lock:
            return list(self._passes.get(backend, ()))

    def reason(self, lm, backend: str, now: float | None = None) -> str | None:
        """Why `backend`'s table on `lm` should be measured again now (DriftRule), or None."""
        now = self.clock() if now is None else now
        table = getattr(lm, "pass_costs", {}).get(backend)
        return remeasure_reason(table, self.passes(backend), self.measured_at.get(backend, now),
                                self.last_pass_at, now, self.rule, first=backend in self._first)

    def tick(self, lm, now: float | None = None) -> list[str]:
        """Measure again every table of `lm` that is due; returns the backends measured. A failed measurement
        keeps the old table (logged) and waits the rule's interval before the next try."""
        done = []
        for backend in list(getattr(lm, "pass_costs", {})):
            why = self.reason(lm, backend, now)
            if why is None:
                continue
            self._first.discard(backend)  # a flat warm-up table is measured again once, whatever comes of it
            measure = self._measure
            if measure is None:
                from mars.decoding.costs import measure_pass_costs as measure
            try:
                costs = self.slot.run(measure, lm, backend)
            except Exception:  # noqa: BLE001 - a speed setting: the old table stays, the app serves on
                LOG.exception("could not measure the pass costs again (%s); the old table stays", why)
                self._restart(backend)  # not before the interval: a broken timer must not run every tick
                continue
            lm.pass_costs[backend] = costs
            self.measured(backend, why)
            self.history.append({"at": self.clock(), "backend": backend, "reason": why,
                                 "by_width": costs.by_width, "group": costs.group})
            LOG.info("pass costs measured again on %s: %s", backend, why)
            done.append(backend)
        return done

    def start(self, current_lm) -> None:
        """The daemon thread: every CHECK_EVERY_S, `tick` on the model the app serves now (`current_lm()`, None
        while there is none)."""
        if self._thread is not None:
            return

        def loop():
            while not self._stop.wait(CHECK_EVERY_S):
                lm = current_lm()
                if lm is not None:
                    try:
                        self.tick(lm)
                    except Exception:  # noqa: BLE001 - this thread must outlive any one model
                        LOG.exception("the pass-cost keeper failed a check")

        self._thread = threading.Thread(target=loop, name="mars-cost-keeper", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
