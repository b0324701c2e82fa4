"""The app's logic without the UI: the shared model, each visitor's session, run traces, sweeps.

`app.py` holds components and event handlers only; everything here is plain Python over the decoder core
(`mars.decoding.stream`), testable without Gradio.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from mars.decoding import DecodeConfig, DecodeControl, PassRecord, stream

from mars.app_inputs import (  # noqa: F401  (re-exported: app.py and the tests import them from here)
    APP_MODES, MAX_BLOCK, MODE_LABELS, TOP_K, check_mode, check_prompt, check_tau, encode_checked, fit_to_model,
    make_config, max_new_tokens_limit, max_prompt_chars, max_prompt_tokens, sanitize_text,
)


def default_provider() -> Callable[[], object]:
    """Loads the model named by env MARS_MODEL / MARS_ADAPTER (default: the embedded SmolLM2).

    An adapter that is missing or does not fit the model falls back to the bare model, with a warning that
    the model panel shows: a typo in MARS_ADAPTER should not take the whole app down, nor pass unnoticed.
    """

    def provide():
        from mars.loading import AdapterError, load

        model, adapter = os.environ.get("MARS_MODEL") or None, os.environ.get("MARS_ADAPTER") or "auto"
        try:
            return load(model, adapter)
        except AdapterError as e:
            lm = load(model, "none")
            lm.warnings.insert(0, f"MARS_ADAPTER={adapter!r} could not be used, so this is the bare model: {e}")
            return lm

    return provide


class ModelHolder:
    """One model for every visitor: loaded lazily, once; replaced only by an explicit load.

    `pass_lock` guards each forward pass (not whole runs): concurrent visitors interleave pass by pass, each
    pass's measured time is its own, and a visitor who leaves mid-run never holds the model.
    A failed load is remembered, so every visitor gets its message at once instead of retrying a slow load;
    `replace` (the Model tab) clears it.
    """

    def __init__(self, provider: Callable[[], object] | None = None):
        self._provider = provider or default_provider()
        self._lm = None
        self._error: str | None = None
        self._load_lock = threading.Lock()
        self.pass_lock = threading.Lock()

    def get(self):
        from mars.loading import LoadError

        if self._lm is None:
            with self._load_lock:
                if self._lm is None:
                    if self._error is None:
                        try:
                            self._lm = warm_up(self._provider())
                        except LoadError as e:
                            self._error = str(e)
                        except Exception as e:  # whatever a provider raises, the app stays up and says it
                            self._error = f"{type(e).__name__}: {e}"
                    if self._lm is None:
                        raise LoadError(self._error)
        return self._lm

    @property
    def loaded(self):
        return self._lm

    def replace(self, lm):
        lm = warm_up(lm)
        with self._load_lock:
            self._lm, self._error = lm, None


def warm_up(lm):
    """One short pass, so the first visitor's first pass does not also pay one-off allocation costs."""
    ids = lm.tokenizer("Hello", add_special_tokens=False)["input_ids"] or [0]
    mode = "mars" if lm.mask_token_id is not None else "ar"
    for _ in stream(lm, ids, DecodeConfig(mode=mode, max_new_tokens=1)):
        pass
    return lm


@dataclass
class Trace:
    """One run (MARS or AR) as it happens: its pass records, token texts and timings."""

    mode: str
    prompt: str
    prompt_ids: list[int]
    settings: dict
    records: list[PassRecord] = field(default_factory=list)
    token_texts: list[list[str]] = field(default_factory=list)  # per record, each accepted token's text
    rejected_texts: list[list[str]] = field(default_factory=list)  # per record, each rejected proposal's text
    started: float = field(default_factory=time.perf_counter)
    finished: float | None = None
    finish_reason: str | None = None
    tokenizer: object = field(default=None, repr=False)  # the run's own, for the inspector

    def add(self, rec: PassRecord, tokenizer):
        self.tokenizer = tokenizer
        self.records.append(rec)
        self.token_texts.append([tokenizer.decode([t]) for t in rec.token_ids])
        self.rejected_texts.append(_pieces(tokenizer, rec.rejected_token_ids))
        self.finish_reason = rec.finish_reason or self.finish_reason

    @property
    def token_ids(self) -> list[int]:
        return [t for r in self.records for t in r.token_ids]

    @property
    def text(self) -> str:
        return "".join(r.text for r in self.records)

    @property
    def passes(self) -> int:
        return len(self.records)

    @property
    def tokens(self) -> int:
        return sum(len(r.token_ids) for r in self.records)

    @property
    def decode_seconds(self) -> float:
        return sum(r.seconds for r in self.records)

    @property
    def elapsed(self) -> float:
        return (self.finished or time.perf_counter()) - self.started

    @property
    def tokens_per_pass(self) -> float:
        return self.tokens / max(1, self.passes)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0

    def to_dict(self) -> dict:
        return {
            "mode": self.mode,
            "prompt": self.prompt,
            "settings": self.settings,
            "text": self.text,
            "token_ids": self.token_ids,
            "forward_passes": self.passes,
            "tokens": self.tokens,
            "tokens_per_pass": self.tokens_per_pass,
            "decode_seconds": self.decode_seconds,
            "finish_reason": self.finish_reason,
            "passes": [
                {k: v for k, v in r.to_dict().items() if k != "row" and (k != "candidates" or v)}
                | {"token_texts": tt, "rejected_texts": rt}
                for r, tt, rt in zip(self.records, self.token_texts, self.rejected_texts)
            ],
        }


def _pieces(tokenizer, ids: list[int]) -> list[str]:
    """Each token's text, cut so that the pieces join into the decoded whole (spaces of word-level
    tokenizers, characters split across byte-level tokens); decoding each token alone does neither."""
    out, prev = [], ""
    for i in range(len(ids)):
        text = tokenizer.decode(ids[: i + 1])
        out.append(text[len(prev):] if text.startswith(prev) else text)
        prev = text
    return out


@dataclass
class Session:
    """One visitor's state (lives in a gr.State): their live tau, their run's control, their last traces."""

    tau: float = 0.9
    control: DecodeControl | None = None
    mars: Trace | None = None
    ar: Trace | None = None
    files: dict = field(default_factory=dict)

    follow_tau: bool = True  # False while a sweep runs: its tau values are fixed per run

    def new_control(self, follow_tau: bool = True) -> DecodeControl:
        if self.control is not None:
            self.control.cancel()  # a new run supersedes an old one still going
        self.follow_tau = follow_tau
        self.control = DecodeControl(self.tau if follow_tau else None)
        return self.control

    def set_tau(self, tau) -> None:
        tau = check_tau(tau)
        self.tau = tau
        if self.control is not None and self.follow_tau:
            self.control.tau = tau  # read by the decoder before its next forward pass

    def stop(self) -> None:
        if self.control is not None:
            self.control.cancel()

    def close(self) -> None:
        """Gradio's delete_callback, once the visitor has gone: end any run, delete the run's files."""
        self.stop()
        folder = self.files.get("folder")
        if folder:
            import shutil

            shutil.rmtree(folder, ignore_errors=True)
        self.files = {}


# ------------------------------------------------------------------------------------------------- runs


def run_passes(holder: ModelHolder, lm, prompt_ids: list[int], cfg: DecodeConfig,
               control: DecodeControl) -> Iterator[PassRecord]:
    """`decoding.stream`, one forward pass at a time under the holder's lock."""
    it = stream(lm, prompt_ids, cfg, control)
    while True:
        with holder.pass_lock:
            rec = next(it, None)
        if rec is None:
            return
        yield rec


def run_trace(holder, lm, prompt: str, prompt_ids, cfg, control) -> Iterator[Trace]:
    """Yield the growing trace after every pass; the final trace carries finish time and reason."""
    trace = Trace(cfg.mode, prompt, list(prompt_ids), settings_of(cfg))
    for rec in run_passes(holder, lm, prompt_ids, cfg, control):
        trace.add(rec, lm.tokenizer)
        yield trace
    trace.finished = time.perf_counter()
    if control.cancelled and trace.finish_reason is None:
        trace.finish_reason = "cancelled"
    yield trace


def settings_of(cfg: DecodeConfig) -> dict:
    return {"mode": cfg.mode, "tau": cfg.tau, "block_size": cfg.block_size,
            "max_new_tokens": cfg.max_new_tokens, "confidence": cfg.confidence}


def live_stats(mars: Trace | None, ar: Trace | None, state: str, tau: float | None, note: str = "") -> dict:
    """The numbers shown while a run goes; the speed-up is measured (AR decode time / MARS decode time)."""
    t = mars or ar
    if t is None:
        return {"state": state, "tau": tau, "note": note}
    speedup = None
    if mars and ar and ar.finished and mars.finished and mars.decode_seconds > 0 and ar.tokens:
        # per generated token, so a stopped or shorter run still compares fairly
        speedup = (ar.decode_seconds / ar.tokens) / (mars.decode_seconds / max(1, mars.tokens))
    return {
        "passes": t.passes, "tokens": t.tokens, "tokens_per_pass": t.tokens_per_pass,
        "tokens_per_second": t.tokens_per_second, "elapsed": t.elapsed, "speedup": speedup,
        "state": state, "tau": tau, "note": note,
    }


def mode_name(mode: str) -> str:
    return {"mars": "MARS", "verified": "Verified MARS", "ar": "AR"}.get(mode, mode)


def summary_line(mars: Trace, ar: Trace | None) -> str:
    s = (f"{mode_name(mars.mode)}: {mars.tokens} tokens in {mars.passes} forward passes "
         f"({mars.tokens_per_pass:.2f} tokens/pass), "
         f"{mars.decode_seconds:.2f} s of decoding")
    if ar is not None and ar.finished:
        s += f"; AR: {ar.tokens} tokens in {ar.passes} passes, {ar.decode_seconds:.2f} s"
    return s + "."


# ------------------------------------------------------------------------------------------------ sweep


def parse_taus(text: str) -> list[float]:
    try:
        taus = [check_tau(float(x)) for x in str(text).replace(";", ",").split(",") if x.strip()]
    except ValueError as e:
        raise ValueError(f"taus must be comma-separated numbers between 0 and 1 ({e})") from None
    if not taus or len(taus) > 10:
        raise ValueError("give between 1 and 10 values of tau, e.g. 1.0, 0.9, 0.8, 0.7, 0.5")
    return taus


def sweep(holder, lm, prompt_ids: list[int], base: DecodeConfig, taus: list[float], control: DecodeControl,
          reference: list[int] | None = None) -> Iterator[list[dict]]:
    """Run the prompt once per tau; yield the growing table of {tau, passes, tokens, tokens_per_pass,
    seconds, agreement, nll}. Quality is measured against AR's output (`reference`, else an AR run first):
    exact-prefix agreement, and the AR model's mean NLL of each text."""
    from dataclasses import replace

    from mars.quality import mean_nll, prefix_agreement

    def run(cfg):
        recs = list(run_passes(holder, lm, prompt_ids, cfg, control))
        return [t for r in recs for t in r.token_ids], recs

    if reference is None:
        reference, _ = run(replace(base, mode="ar"))
    rows: list[dict] = []
    for tau in taus:
        if control.cancelled:
            return
        ids, recs = run(replace(base, mode="mars", tau=tau))
        if control.cancelled or not ids:
            return
        with holder.pass_lock:
            nll = mean_nll(lm, prompt_ids, ids)
        rows.append({"tau": tau, "passes": len(recs), "tokens": len(ids), "tokens_per_pass": len(ids) / len(recs),
                     "seconds": sum(r.seconds for r in recs), "agreement": prefix_agreement(reference, ids),
                     "nll": nll})
        yield list(rows)


# ------------------------------------------------------------------------------------------- inspector


def chain_stop_reason(rec: PassRecord, proposals: int, mode: str = "mars") -> str:
    """Why pass `rec` accepted no more tokens than it did."""
    n = len(rec.token_ids)
    if rec.finish_reason == "eos":
        return "the model ended its answer (EOS token)"
    if rec.finish_reason == "length":
        return "max new tokens reached"
    if rec.finish_reason == "stop":
        return "a stop string was completed"
    if mode == "verified":
        if rec.drafts_sent == 0:
            return "no drafts to check (none reached tau, or the first pass): the model's own next token only"
        if rec.rejected_token_ids:
            return (f"draft {n} differs from the model's own choice: it and the drafts after it are dropped, "
                    "the model's token takes its place")
        return f"all {rec.drafts_sent} drafts verified, plus the model's own next token"
    if proposals == 1:
        return "AR mode: one token per pass"
    if n >= proposals:
        return f"all {proposals} proposals accepted: the window ends here"
    if rec.tau >= 1.0:
        return "tau = 1: only the AR token is accepted (plain AR decoding)"
    if rec.rejected_confidences and rec.rejected_confidences[0] < rec.tau:
        return f"position {n}: confidence {rec.rejected_confidences[0]:.3f} is below tau {rec.tau:.2f}"
    return "the cap on tokens per pass"


def inspector_rows(rec: PassRecord, decode: Callable[[int], str], mode: str = "mars") -> list[dict]:
    """One row per proposal of the pass: its token, confidence, status and top candidates.

    MARS: the AR token, then the masks. Verified: the drafts fed in (the model's own confidence for the
    verified ones, the draft's for the rejected), then the model's own token at the first mismatch.
    """
    n = len(rec.token_ids)
    proposals = rec.token_ids + rec.rejected_token_ids
    confs = rec.confidences + rec.rejected_confidences
    rows = []
    for j, (tok, conf) in enumerate(zip(proposals, confs)):
        # verified: candidate row j is the model's choice after input j, meaningful up to the first mismatch
        has_cands = rec.candidates and j < len(rec.candidates) and (mode != "verified" or j < n)
        cands = [(decode(c), p) for c, p in (rec.candidates[j] if has_cands else [])]
        if mode == "verified":
            position = "model's token" if j == n - 1 else f"draft {j + 1 if j < n else j}"
            status = ("accepted" if j == n - 1 else "accepted: verified" if j < n else
                      "rejected: not the model's choice" if j == n else "dropped (after the mismatch)")
        else:
            position = "AR token (0)" if j == 0 else f"mask +{j}"
            status = "accepted" if j < n else ("rejected: chain stops here" if j == n else "dropped (after the stop)")
        rows.append({"position": position, "token": decode(tok), "confidence": conf, "status": status,
                     "candidates": cands})
    return rows


# ----------------------------------------------------------------------------------------- other models


def hub_reachable() -> bool:
    from mars.loading import hub_offline

    return not hub_offline()


def load_other(model: str, adapter: str | None, load_fn=None, reachable=hub_reachable):
    """(LoadedModel or None, message). Never raises: on failure the current model keeps serving."""
    from mars.loading import LoadError, load

    load_fn = load_fn or load
    model = sanitize_text(model).strip() if isinstance(model, str) else ""
    adapter = (sanitize_text(adapter).strip() if isinstance(adapter, str) else "") or "auto"
    if not model:
        return None, "Give a Hub id (e.g. Xalphinions/MARS-Qwen2.5-0.5B-blk4) or a local folder."
    is_path = Path(model).expanduser().exists() or model.startswith((".", "/", "~")) or model == "smollm2"
    if not is_path and not reachable():
        return None, (f"Cannot load {model!r}: this server has no network access to the Hugging Face Hub. "
                      "Give a local folder instead. The current model keeps serving.")
    try:
        lm = load_fn(model, adapter)
    except LoadError as e:
        return None, f"Could not load: {e}. The current model keeps serving."
    except Exception as e:  # anything else must not take the app down either
        return None, f"Could not load {model!r}: {type(e).__name__}: {e}. The current model keeps serving."
    return lm, f"Loaded {lm.name}."
