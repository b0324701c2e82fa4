"""The one model every visitor shares: loaded at start-up in the background, warmed up, run one pass at a time.

Why one pass at a time and not one run: concurrent visitors interleave pass by pass, each pass's measured
time is its own, and a visitor who leaves mid-run never holds the model.

Where the passes run: on one thread (mars.app.model_thread), whichever Gradio worker thread asked for them.
OpenMP keeps a team of threads per thread that opens parallel regions; two such threads on two cores make
every later pass ~3.5x dearer (the measurement is in model_thread's docstring). The torch thread count is set
on that thread, as OpenMP's count is per thread. Multi-row MARS passes need every core the machine has: a
MARS pass on one thread costs ~1.7 AR passes and MARS loses the race it exists to show.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import torch

from mars import settings
from mars.app.inputs import app_backend, app_datastore, app_pass_costs, app_run_backend, sanitize_text
from mars.app import model_thread
from mars.app.batching import BatchServer
from mars.app.cost_keeper import CostKeeper
from mars.decoding.decoder import DecodeConfig, DecodeControl, stream
from mars.decoding.records import PassRecord

LOG = logging.getLogger("mars.app")


def pass_threads() -> int:
    """Torch threads for each pass: MARS_THREADS when set, else every core of the machine."""
    return settings.get().threads or os.cpu_count() or 1


def default_provider() -> Callable[[], object]:
    """Loads the model named by env MARS_MODEL / MARS_ADAPTER (default: the embedded SmolLM2) on MARS_DEVICE
    (auto: CUDA when present; mars.models.device), in that device's default dtype.

    An adapter that is missing or does not fit the model falls back to the bare model, with a warning that
    the model panel shows: a typo in MARS_ADAPTER should not take the whole app down, nor pass unnoticed.
    """

    def provide():
        from mars.models.device import env_device
        from mars.models.loading import AdapterError, load

        model, adapter = settings.get().model, settings.get().adapter
        device = env_device()
        try:
            return load(model, adapter, device=device)
        except AdapterError as e:
            lm = load(model, "none", device=device)
            lm.warnings.insert(0, f"MARS_ADAPTER={adapter!r} could not be used, so this is the bare model: {e}")
            return lm

    return provide


def process_seconds() -> float | None:
    """Seconds since this process started (Linux: /proc), else None."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        return float(Path("/proc/uptime").read_text().split()[0]) - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class PassSlot:
    """Where every forward pass of the app runs: `run(fn, *args)` calls fn on the holder's model thread, one
    call at a time in the order asked for, on the holder's torch thread count."""

    def __init__(self, holder):
        self.holder = holder
        self.thread = model_thread.shared()

    def run(self, fn, *args, **kwargs):
        return self.thread.call(self._on_threads, fn, args, kwargs)

    def _on_threads(self, fn, args, kwargs):
        if torch.get_num_threads() != self.holder.threads:
            torch.set_num_threads(self.holder.threads)
        return fn(*args, **kwargs)


class ModelHolder:
    """One model for every visitor: loaded once (at start-up with `start()`, else on first use); replaced
    only by an explicit load. A failed load is remembered, so every visitor gets its message at once
    instead of retrying a slow load; `replace` (the Model tab) clears it.

    At start-up, after the load and `warm_up`, the app's `rehearsal` (its first visitor's Generate, run once)
    and only then is the model ready: the page says so, and visitors' calls to `get` wait for it (issue 41: the
    first visitor after a start waited 1.5 s for a first group that later visitors had in 0.25 s). `costs` keeps
    the pass-cost table true from then on (mars.app.cost_keeper)."""

    def __init__(self, provider: Callable[[], object] | None = None, threads: int | None = None,
                 rehearsal: Callable[[object], None] | None = None):
        self._provider = provider or default_provider()
        self._lm = None
        self._error: str | None = None
        self._load_lock = threading.Lock()
        self._loader: threading.Thread | None = None
        self.threads = threads or pass_threads()
        self.pass_slot = PassSlot(self)  # every forward pass runs through it: `holder.pass_slot.run(fn, ...)`
        # what runs the model for every visitor's run (decode_steps' `backend`); None: the backend cfg names
        self.backend = None
        self.rehearsal = rehearsal  # lm -> None: the app's first Generate, run once by `start` before ready
        self._warm = threading.Event()  # set once the start-up rehearsal is over (or there is none)
        self._warm.set()
        # what start-up spent, as data: {"load_s", "warm_up_s", "rehearsal_s"}, and the rehearsal's error if any
        self.start_up: dict = {}
        self.costs = CostKeeper(self.pass_slot)
        # continuous batching (mars.app.batching): every visitor's rows in shared passes; None: one pass of one
        # row at a time (MARS_BATCHING=0)
        self.batcher = BatchServer(self.pass_slot, settings.get().batch_rows) if settings.get().batching else None

    def start(self) -> None:
        """Load, warm up and rehearse in a background thread now, so the first visitor does not wait for it; once
        ready (or failed), one line on stderr says so (`ready_line`)."""
        if self._loader is None and self._lm is None:
            if self.rehearsal is not None:
                self._warm.clear()
            before = process_seconds()  # the imports and the app's set-up, when the system says
            if before is not None:
                self.start_up["before_s"] = before
            self._loader = threading.Thread(target=self._start_up, args=(time.perf_counter(),),
                                            name="mars-model-loader", daemon=True)
            self._loader.start()

    def _start_up(self, t0: float):
        lm = None
        try:
            try:
                lm = self.get()
            except Exception:  # noqa: BLE001 - remembered in self._error; visitors see it
                pass
            if lm is not None and self.rehearsal is not None:
                self.rehearse(lm)
        finally:
            self._warm.set()
            self.start_up["ready_s"] = time.perf_counter() - t0
            # the server log's only sign of ready otherwise: Gradio's "Running on local URL", printed before the load
            print(self.ready_line(), file=sys.stderr, flush=True)
        if lm is not None:
            self.costs.start(lambda: self._lm)

    def ready_line(self) -> str:
        """One line for the server log once the start-up is over: ready (with the model and what the start took)
        or serving without a model (with why)."""
        s = self.start_up
        ready = s.get("ready_s", 0.0)
        took = (f"{s['before_s'] + ready:.1f} s after the process started" if "before_s" in s
                else f"{ready:.1f} s after the model's load began")
        if self._lm is None:
            return (f"MARS Playground: the model could not be loaded ({self._error}), {took}; the app serves on, "
                    "its page says so")
        parts = [f"{name} {s[key]:.1f} s" for name, key in (("imports and set-up", "before_s"), ("load", "load_s"),
                                                            ("warm-up", "warm_up_s"),
                                                            ("first-run rehearsal", "rehearsal_s")) if key in s]
        failed = f"; the first-run rehearsal failed: {s['rehearsal_error']}" if "rehearsal_error" in s else ""
        return (f"MARS Playground is ready: {public_name(self._lm.name)}, {took}"
                + (f" ({', '.join(parts)})" if parts else "") + failed)

    def rehearse(self, lm) -> bool:
        """The app's rehearsal on `lm`, timed into `start_up`. A failure is logged and put on the model's warnings
        (the model panel shows them); the app serves on, only its first visitor may wait longer."""
        t0 = time.perf_counter()
        try:
            self.rehearsal(lm)
            ok = True
        except Exception as e:  # noqa: BLE001 - a warm-up: never what keeps the app from serving
            LOG.exception("the start-up rehearsal failed")
            self.start_up["rehearsal_error"] = f"{type(e).__name__}: {e}"
            lm.warnings.append(f"the start-up warm-up run failed ({type(e).__name__}: {e}): the first visitor's "
                               "run may wait for one-off costs")
            ok = False
        self.start_up["rehearsal_s"] = time.perf_counter() - t0
        return ok

    def get(self):
        """The model, loading it first if need be (waits for a load already running, and for the start-up
        rehearsal unless called from it)."""
        from mars.models.loading import LoadError

        if not self._warm.is_set() and threading.current_thread() is not self._loader:
            self._warm.wait()
        if self._lm is None:
            with self._load_lock:
                if self._lm is None:
                    if self._error is None:
                        try:
                            t0 = time.perf_counter()
                            lm = model_thread.in_own_thread(self._provider)
                            t1 = time.perf_counter()
                            self._lm = self.warm_up(lm)
                            self.start_up.update(load_s=t1 - t0, warm_up_s=time.perf_counter() - t1)
                        except LoadError as e:
                            self._error = str(e)
                        except Exception as e:  # whatever a provider raises, the app stays up and says it
                            LOG.exception("the model could not be loaded")
                            self._error = f"{type(e).__name__}: {e}"
                    if self._lm is None:
                        raise LoadError(self._error)
        return self._lm

    @property
    def loaded(self):
        return self._lm

    @property
    def state(self) -> str:
        """'ready', 'failed', 'loading' (the start-up load is running) or 'idle' (no load asked for yet)."""
        if self._lm is not None:
            return "ready" if self._warm.is_set() else "loading"
        if self._error is not None:
            return "failed"
        return "loading" if self._loader is not None and self._loader.is_alive() else "idle"

    def replace(self, lm):
        lm = self.warm_up(lm)
        with self._load_lock:
            self._lm, self._error = lm, None

    def warm_up(self, lm):
        """Two short runs (MARS and AR), so the first visitor's first passes pay no one-off costs: the fast
        path's packed copy of the matrices, oneDNN's kernels for several rows, the allocator's first blocks."""
        ids = lm.tokenizer("Hello", add_special_tokens=False)["input_ids"] or [0]
        modes = ["mars", "ar"] if lm.mask_token_id is not None else ["ar"]
        for mode in modes:
            cfg = DecodeConfig(mode=mode, max_new_tokens=4, block_size=4 if mode == "mars" else 1,
                               backend=app_backend())  # builds the matrices visitors' runs use (int8: its copy)
            for _ in self.passes(lm, ids, cfg, DecodeControl()):
                pass
        app_datastore(lm)  # builds the datastore's table (~4 s) before the first tree needs it
        backend = app_run_backend(lm)
        if self.pass_slot.run(app_pass_costs, lm, backend) is not None:  # what a wider pass costs here: trees follow it
            self.costs.measured(backend)  # its age, and the passes checked against it, start now
        return lm

    def passes(self, lm, prompt_ids: list[int], cfg: DecodeConfig, control: DecodeControl) -> Iterator[PassRecord]:
        """One row's pass records as its passes run on the model thread (`pass_slot`, `self.threads` threads):
        in the passes every visitor's rows share (`batcher`, queued now), or one pass of this row at a time
        (MARS_BATCHING=0, and backend static-device, which runs whole steps)."""
        if self.batcher is not None and cfg.backend != "static-device":
            return self._observed(cfg, self.batcher.submit(lm, prompt_ids, cfg, control, self.backend))
        return self._observed(cfg, (rec for rec, _ in one_at_a_time(
            stream(lm, prompt_ids, cfg, control, backend=self.backend), self.pass_slot)))

    def _observed(self, cfg: DecodeConfig, records) -> Iterator[PassRecord]:
        try:
            for rec in records:
                if rec.batch_rows == 1:  # what a pass of this row alone costs: the table is measured again on drift
                    self.costs.observe(cfg.backend, rec)
                yield rec
        finally:
            records.close()


def one_at_a_time(steps: Iterator, slot) -> Iterator[tuple[object, float]]:
    """Advance a decoder generator one forward pass at a time: on `slot`'s model thread (a PassSlot), inside
    `slot` (a lock), or here (None); so that a visitor who stops consuming never holds the model. Yields
    (item, seconds the pass took, queueing excluded)."""
    while True:
        if hasattr(slot, "run"):
            item, took = slot.run(_timed_next, steps)
        else:
            with slot if slot is not None else contextlib.nullcontext():
                item, took = _timed_next(steps)
        if item is None:
            return
        yield item, took


def _timed_next(steps: Iterator) -> tuple[object, float]:
    t0 = time.perf_counter()
    item = next(steps, None)
    return item, time.perf_counter() - t0


def hub_reachable() -> bool:
    from mars.models.loading import hub_offline

    return not hub_offline()


def no_network_message(model: str) -> str:
    return (f"Cannot load {model!r}: this server has no network access to the Hugging Face Hub, and it is not in "
            "the local cache. The current model keeps serving.")


def vet_switch(policy, token, model, adapter="none", *, reachable=None, cached=None):
    """(ModelRequest, adapter) when this visitor may switch the shared model to `model`: who (the token),
    what (the allow-list, the models folder), how big (the Hub's metadata or the folder's headers, against
    free memory and disk). Raises PolicyError or SizeError with the visitor's message, before any download.
    The one gate of every handler that can switch the model (mars.app.policy)."""
    from mars.app.policy import PolicyError
    from mars.models import sizing
    from mars.models.hub import in_local_cache

    cached = cached or in_local_cache
    # a Hub given to the policy (a mirror, a test's fake) answers for itself: no probe of huggingface.co
    reachable = reachable or ((lambda: True) if policy.hub_info is not None else hub_reachable)
    ok, why = policy.may_switch(token)
    if not ok:
        raise PolicyError(why)
    request = policy.check_model_request(model)
    adapter = policy.check_adapter(adapter)
    size = None
    if request.kind == "folder":
        size = sizing.folder_weights_size(Path(request.name), request.shown)
    elif request.kind == "hub":
        if cached(request.name):  # weights already on disk are sized from their headers: no download
            snapshot = cached_snapshot(request.name)
            size = sizing.folder_weights_size(snapshot, request.name) if snapshot else None
        if size is None or size.params is None:  # nothing, or only the config, in the cache
            if not reachable():
                raise PolicyError(no_network_message(request.name))
            size = sizing.hub_weights_size(request.name, policy.hub_info)
    if size is not None:
        sizing.check_fits(size)
    return request, adapter


def cached_snapshot(repo_id: str) -> Path | None:
    from huggingface_hub import try_to_load_from_cache

    path = try_to_load_from_cache(repo_id, "config.json")
    return Path(path).parent if isinstance(path, str) else None


def load_other(model: str, adapter: str | None, policy, token: str | None = None, load_fn=None,
               reachable=None):
    """(LoadedModel or None, message) for the Model tab's free-text Load, behind `vet_switch`.
    Never raises: on failure the current model keeps serving."""
    from mars.app.policy import PolicyError
    from mars.models.loading import LoadError, load
    from mars.models.sizing import SizeError

    load_fn = load_fn or load
    model = sanitize_text(model).strip() if isinstance(model, str) else ""
    adapter = sanitize_text(adapter).strip() if isinstance(adapter, str) else ""
    try:
        request, adapter = vet_switch(policy, token, model, adapter, reachable=reachable)
    except PolicyError as e:
        return None, str(e)
    except SizeError as e:
        return None, f"Cannot load: {e}. The current model keeps serving."
    try:
        lm = load_fn(request.name, adapter)
    except LoadError as e:
        return None, f"Could not load: {e}. The current model keeps serving."
    except Exception as e:  # anything else must not take the app down either
        return None, f"Could not load {request.shown!r}: {type(e).__name__}: {e}. The current model keeps serving."
    return lm, f"Loaded {public_name(lm.name)}."


def public_name(name: str | None) -> str | None:
    """A model or adapter as a visitor may see it: a Hub id or a folder's name, never a server path."""
    if not name or "/" not in name and "\\" not in name:
        return name
    path = Path(name).expanduser()
    if path.is_absolute() or name.startswith((".", "~")) or path.exists():
        return path.name or name
    return name  # a Hub id (owner/name)


def free_port() -> int:
    """A loopback TCP port nobody listens on right now: for a local server started by a test or a script
    (the load test, the race), never for the Space itself (it serves on GRADIO_SERVER_PORT)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
