"""A visitor's session (their live tau, their run's control, their last traces) and the trace of one run."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from typing import Iterator

from mars.app.inputs import check_tau
from mars.core.decoding import DecodeConfig, DecodeControl, PassRecord


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


def settings_of(cfg: DecodeConfig) -> dict:
    return {"mode": cfg.mode, "tau": cfg.tau, "block_size": cfg.block_size,
            "max_new_tokens": cfg.max_new_tokens, "confidence": cfg.confidence}


def run_trace(holder, lm, prompt: str, prompt_ids, cfg, control) -> Iterator[Trace]:
    """Yield the growing trace after every pass; the final trace carries finish time and reason."""
    trace = Trace(cfg.mode, prompt, list(prompt_ids), settings_of(cfg))
    for rec in holder.passes(lm, prompt_ids, cfg, control):
        trace.add(rec, lm.tokenizer)
        yield trace
    trace.finished = time.perf_counter()
    if control.cancelled and trace.finish_reason is None:
        trace.finish_reason = "cancelled"
    yield trace


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
            shutil.rmtree(folder, ignore_errors=True)
        self.files = {}
