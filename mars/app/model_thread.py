"""The one thread that runs the app's model: every forward pass, the warm-up, the sweep's NLL.

Why one thread. The CPU kernels and torch run their parallel regions on OpenMP (libgomp). Each thread that
opens a parallel region gets a team of its own, kept until that thread exits; once the process holds more
team threads than it has cores, libgomp's waiting threads no longer spin but sleep, so every one of a pass's
~150 parallel regions must wake its second thread first. Gradio runs handlers on a pool of worker threads,
so two visitors (or one visitor's MARS and AR runs) were enough to make every later pass pay that: measured
on two cores (int8, the default model, AR), 6.4 ms a pass from one thread, 23.6 ms once a second thread had
run passes too, for as long as both threads lived. Here every pass runs on this one thread, so the process
keeps one team.

Passes run one at a time in the order they were asked for (a FIFO queue): two visitors' passes alternate,
and a visitor who stops asking never holds the model. `shared()` is the process's one such thread: every
ModelHolder (an app, a test's) runs on it, as the teams are the process's.
"""

from __future__ import annotations

import contextvars
import queue
import threading
from concurrent.futures import Future
from typing import Callable, TypeVar

T = TypeVar("T")


class ModelThread:
    """`call(fn, *args)` runs fn on this object's one thread, after the calls asked for before it, and returns its
    result or raises its exception in the caller. The thread starts on the first call and lives as long as the
    process (a daemon: it never keeps the process from exiting)."""

    def __init__(self, name: str = "mars-model"):
        self.name = name
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    @property
    def ident(self) -> int | None:
        """The thread's id once started (tests check that passes ran here)."""
        return self._thread.ident if self._thread is not None else None

    def call(self, fn: Callable[..., T], *args, **kwargs) -> T:
        if threading.current_thread() is self._thread:  # already on it (a call made by a call): run it now
            return fn(*args, **kwargs)
        self._ensure_started()
        done: Future = Future()
        self._queue.put((done, fn, args, kwargs))
        return done.result()

    def _ensure_started(self):
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
                self._thread.start()

    def _serve(self):
        while True:
            done, fn, args, kwargs = self._queue.get()
            if not done.set_running_or_notify_cancel():
                continue
            try:
                done.set_result(fn(*args, **kwargs))
            except BaseException as e:  # noqa: BLE001 - the caller re-raises it; this thread serves on
                done.set_exception(e)
            del done, fn, args, kwargs  # a departed visitor's decoder (its cache) is not kept until the next call


_SHARED: list[ModelThread] = []
_SHARED_LOCK = threading.Lock()


def shared() -> ModelThread:
    """The process's model thread (created on first use)."""
    with _SHARED_LOCK:
        if not _SHARED:
            _SHARED.append(ModelThread())
        return _SHARED[0]


def in_own_thread(fn: Callable[..., T], *args, **kwargs) -> T:
    """fn(*args) on a new thread that ends with it; its result, or its exception raised here. For model loads:
    the OpenMP team that a load's torch ops open ends with that thread, instead of living on in a Gradio worker
    beside the model thread's (and a long download does not hold the visitors' passes up). It runs in a copy of
    the caller's context: Gradio's progress bar finds its event through context variables."""
    box: dict = {}
    context = contextvars.copy_context()

    def target():
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - raised again in the caller
            box["error"] = e

    t = threading.Thread(target=context.run, args=(target,), name="mars-load", daemon=True)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["value"]
