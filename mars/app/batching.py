"""Continuous batching for the app: every visitor's row that is ready runs in ONE forward pass (issue 53).

A visitor's Generate (its MARS row and its race's AR row), an API client's answer, the warm-up: each is a row
handed to `BatchServer.submit`, which returns the row's stream of pass records at once (the row has joined the
queue when it returns, so a race's two rows join the same pass). A driver thread asks the model thread
(mars.app.model_thread) for one pass at a time, `_pass`: the rows waiting join (up to the row cap,
first come first served), every scheduler (mars.decoding.scheduler: one per model and backend) runs one forward
over all its rows, and each record goes to its row's inbox. A row leaves the moment it finishes, its visitor
presses Stop or goes (the stream is closed: its control is cancelled and it leaves before the next pass).

One pass per call to the model thread, not a loop there: the Batch tab's and the sweep's passes, the cost
keeper's timings and a model switch still take their turn between two passes.

`snapshot()` is the server's batch as data (rows in the last pass, their widths, the pass's time, the aggregate
tokens/s): the page's live line, no visitor's text. MARS_BATCHING=0 keeps one pass per row at a time.
"""

from __future__ import annotations

import atexit
import logging
import queue
import sys
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Iterator

from mars.decoding.scheduler import PassStats, Scheduler, check_rows

LOG = logging.getLogger("mars.app")
_DONE = object()  # an inbox's end: the row left without a last record (cancelled, or its visitor went)
RATE_WINDOW_S = 10.0  # the aggregate tokens/s is over the passes of the last this many seconds
# records a row may have waiting for its reader and still take the next pass. 1: a reader takes its record a
# moment after the pass that made it (a Gradio worker, turning the last one into an update), and a room whose
# rows waited for that ran half its rows a pass (16 clients 263 -> 133 tokens/s with 0). So a row runs at most
# one pass ahead of its reader: a tau set between two reads steers the pass after next at the latest, and a
# reader who stops reading, or goes, gets at most two passes more
LOOKAHEAD = 1
# The interpreter's switch interval while the server batches: the model thread, back from a pass's C call, waits
# for the interpreter lock while a reader (a Gradio worker turning a record into an update) holds it, up to the
# whole interval (5 ms by default: nearly an int8 AR pass of the default model). 0.5 ms bounds that wait.
SWITCH_INTERVAL_S = 0.0005


def _close_at_exit(ref):
    server = ref()
    if server is not None:
        server._close()


@dataclass
class _Ticket:
    lm: object
    prompt_ids: list[int]
    cfg: object
    control: object
    backend: object  # the runner factory (ModelHolder.backend) or None: the one cfg.backend names
    inbox: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    row: object = None  # the scheduler's Row, once admitted
    gone: bool = False  # its reader closed the stream: the row leaves (its control may be shared: a race's two rows)


class BatchServer:
    """Rows of every visitor in shared forward passes, on `slot` (a PassSlot: the model thread, its threads)."""

    def __init__(self, slot, rows: int):
        self.slot = slot
        self.cap = rows  # rows in one pass at most; more wait, in the order they came
        if sys.getswitchinterval() > SWITCH_INTERVAL_S:
            sys.setswitchinterval(SWITCH_INTERVAL_S)
        self._lock = threading.Lock()
        self._waiting: deque[_Ticket] = deque()
        self._schedulers: dict[tuple, Scheduler] = {}
        self._driver: threading.Thread | None = None
        # set when a pass may have work again: a reader took a record (its row may be ready), a row came or went
        self._wake = threading.Event()
        self._closing = False  # the interpreter is exiting: no pass starts (a pass cut off in C aborts the process)
        atexit.register(_close_at_exit, weakref.ref(self))  # a weak one: a test's many servers are not kept
        self._recent: deque[PassStats] = deque(maxlen=4096)
        self._recent_at: deque[float] = deque(maxlen=4096)
        self.passes = 0

    # ------------------------------------------------------------------------------------------- visitors
    def submit(self, lm, prompt_ids: list[int], cfg, control, backend=None) -> Iterator:
        """Queue a row now; its pass records, as its passes run (a ValueError for a row that cannot run, raised
        from the stream). Closing the stream early takes the row out: it leaves before the next pass."""
        ticket = _Ticket(lm, list(prompt_ids), cfg, control, backend)
        with self._lock:
            self._waiting.append(ticket)
            self._ensure_driver()
        self._wake.set()
        return self._records(ticket)

    def _records(self, ticket: _Ticket) -> Iterator:
        try:
            while True:
                item = ticket.inbox.get()
                self._wake.set()
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finish_reason is not None:
                    return
        finally:  # the reader went (or the row is done, where this changes nothing)
            ticket.gone = True
            if ticket.row is not None:
                ticket.row.departed = True
            self._wake.set()

    # ------------------------------------------------------------------------------------------- the loop
    def _ensure_driver(self):
        if self._driver is None or not self._driver.is_alive():
            self._driver = threading.Thread(target=self._drive, name="mars-batching", daemon=True)
            self._driver.start()

    def _drive(self):
        """Pass after pass while any row runs or waits; then the thread ends (the next submit starts another)."""
        while True:
            with self._lock:
                if self._closing or not self._waiting and all(s.idle for s in self._schedulers.values()):
                    self._driver = None
                    return
            self._wake.clear()
            try:
                ran = self.slot.run(self._pass)
            except Exception:  # noqa: BLE001 - _pass hands each row its error; this is a bug in the loop itself
                LOG.exception("the batching loop failed; its rows were told")
                self._fail_all(RuntimeError("the server's batching loop failed"))
                ran = True
            if not ran:  # every row's reader is behind: wait until one takes a record (or a row comes or goes)
                self._wake.wait()

    def _pass(self) -> bool:
        """On the model thread: the waiting rows join, every scheduler runs one forward, records go out. A row whose
        reader is more than LOOKAHEAD records behind sits this pass out (the model never runs far ahead of a reader
        who stopped reading, or went); the others' passes go on. False when no forward ran."""
        self._admit()
        ran = False
        for key, sched in list(self._schedulers.items()):
            for row in sched.cancel_departed():
                row.tag.inbox.put(_DONE)
            if sched.idle:
                continue
            hold = {r.index for r in sched.rows if r.tag.inbox.qsize() > LOOKAHEAD}
            if len(hold) == len(sched.rows) and not sched.pending:
                continue
            tickets = {r.index: r.tag for r in sched.rows + sched.pending}  # before the finished rows leave
            ran = True
            try:
                records = sched.step(hold)
            except Exception as e:  # noqa: BLE001 - every row of this scheduler gets the error; the app serves on
                LOG.exception("a shared forward pass failed")
                for row in sched.rows + sched.pending:
                    row.tag.inbox.put(e)
                del self._schedulers[key]
                continue
            for rec in records:
                tickets[rec.row].inbox.put(rec)
            if sched.last is not None:
                self.passes += 1
                self._recent.append(sched.last)
                self._recent_at.append(time.perf_counter())
        return ran

    def _admit(self):
        with self._lock:
            live = sum(len(s.rows) + len(s.pending) for s in self._schedulers.values())
            while self._waiting and live < self.cap:
                ticket = self._waiting.popleft()
                if ticket.control.cancelled or ticket.gone:
                    ticket.inbox.put(_DONE)
                    continue
                try:
                    check_rows(ticket.lm, [ticket.prompt_ids], ticket.cfg)
                    key = (id(ticket.lm), ticket.cfg.backend, ticket.cfg.use_cache, id(ticket.backend))
                    sched = self._schedulers.get(key)
                    if sched is None or sched.lm is not ticket.lm:
                        sched = self._schedulers[key] = Scheduler(ticket.lm, ticket.cfg.backend,
                                                                  ticket.cfg.use_cache, backend=ticket.backend)
                    ticket.row = sched.add(ticket.prompt_ids, ticket.cfg, ticket.control, tag=ticket)
                    ticket.row.departed = ticket.gone  # a reader that left between the two lines above
                except ValueError as e:
                    ticket.inbox.put(e)
                    continue
                live += 1
            # schedulers of a model no longer served, and empty, go (their cache with them)
            for key in [k for k, s in self._schedulers.items() if s.idle]:
                del self._schedulers[key]

    def _close(self):
        self._closing = True
        self._wake.set()

    def _fail_all(self, error: Exception):
        with self._lock:
            for sched in self._schedulers.values():
                for row in sched.rows + sched.pending:
                    row.tag.inbox.put(error)
            self._schedulers.clear()
            while self._waiting:
                self._waiting.popleft().inbox.put(error)

    # ------------------------------------------------------------------------------------------- the view
    def snapshot(self) -> dict:
        """The server's batch now, as data: rows running and waiting, the last pass (rows, widths, ms), and the
        aggregate tokens/s and passes/s over the last RATE_WINDOW_S seconds."""
        with self._lock:
            running = sum(len(s.rows) + len(s.pending) for s in self._schedulers.values())
            waiting = len(self._waiting)
        now = time.perf_counter()
        recent = [(t, st) for t, st in zip(list(self._recent_at), list(self._recent)) if now - t <= RATE_WINDOW_S]
        last = self._recent[-1] if self._recent else None
        span = (now - recent[0][0] + recent[0][1].seconds) if recent else 0.0
        tokens = sum(st.tokens for _, st in recent)
        return {
            "running": running,
            "waiting": waiting,
            "cap": self.cap,
            "last_rows": last.rows if last else 0,
            "last_widths": list(last.widths) if last else [],
            "last_ms": round(1000 * last.seconds, 1) if last else None,
            "tokens_per_s": round(tokens / span, 1) if span > 0 else 0.0,
            "passes": self.passes,
        }
