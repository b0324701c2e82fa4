"""The paper's Figure 4, live: up to 8 prompts decoded as ONE batch on the block-level KV cache.

Plain Python over the decoder core (`mars.decoding.decode_steps`), testable without Gradio:
- `parse_batch_prompts`: the textbox (one prompt per line) into 1..MAX_BATCH checked prompts;
- `run_batch`: the batch's state after every forward pass (each row's groups, its idle passes, whether
  it has finished), on one shared time axis;
- `measure_comparison`: the same prompts as the MARS batch, one at a time (MARS, batch 1 each), and as
  AR at the same batch size: every figure measured, none estimated.

A row that is still decoding but has no record in a pass was idling at the cache-block end (the core
feeds it no masks until every row has reached that end). Idling never changes a row's output, so the
comparison also checks, token for token, that each batch row equals its prompt decoded alone.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator

from mars.decoding import DecodeConfig, DecodeControl, PassRecord, decode_steps

MAX_BATCH = 8  # rows shown at once; the paper's Figure 4 uses 4


def parse_batch_prompts(text, check: Callable[[str], str] | None = None) -> list[str]:
    """One prompt per non-blank line, 1..MAX_BATCH of them; ValueError with a message a visitor can act on.

    check: the app's single-prompt check (mars.app_inputs.check_prompt: sanitizing, length cap), applied
    to every line so a batch prompt obeys the same rules as the main one.
    """
    if text is None:
        text = ""
    if not isinstance(text, str):
        raise ValueError(f"the prompts must be text, one per line, got {type(text).__name__}")
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise ValueError("no prompts: type one prompt per line (1 to 8 lines)")
    if len(lines) > MAX_BATCH:
        raise ValueError(f"{len(lines)} prompts given: a batch holds at most {MAX_BATCH}, one per line")
    if check is None:
        return [line.strip() for line in lines]
    out = []
    for i, line in enumerate(lines, 1):
        try:
            out.append(check(line.strip()))
        except ValueError as e:
            raise ValueError(f"line {i}: {e}") from None
    return out


@dataclass
class BatchRow:
    """One prompt of the batch: its accepted groups and the passes it spent idle."""

    index: int
    prompt: str
    prompt_ids: list[int]
    records: list[PassRecord] = field(default_factory=list)  # the passes in which this row proposed
    token_texts: list[list[str]] = field(default_factory=list)  # per record, each accepted token's text
    idle_passes: list[int] = field(default_factory=list)  # batch pass indices spent waiting at a block end
    finish_reason: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def token_ids(self) -> list[int]:
        return [t for r in self.records for t in r.token_ids]

    @property
    def tokens(self) -> int:
        return sum(len(r.token_ids) for r in self.records)

    @property
    def text(self) -> str:
        return "".join(r.text for r in self.records)

    @property
    def tokens_per_pass(self) -> float:
        """Tokens per pass in which the row proposed (idle passes excluded): the acceptance figure."""
        return self.tokens / max(1, len(self.records))

    def to_dict(self) -> dict:
        return {
            "row": self.index, "prompt": self.prompt, "text": self.text, "token_ids": self.token_ids,
            "tokens": self.tokens, "passes": len(self.records), "idle_passes": list(self.idle_passes),
            "tokens_per_pass": self.tokens_per_pass, "finish_reason": self.finish_reason,
            "groups": [{"pass_index": r.pass_index, "token_ids": r.token_ids, "token_texts": tt, "text": r.text,
                        "confidences": r.confidences, "tau": r.tau}
                       for r, tt in zip(self.records, self.token_texts)],
        }


@dataclass
class BatchState:
    """A batch run as it happens: its rows and the shared time axis (one entry per forward pass)."""

    rows: list[BatchRow]
    settings: dict
    pass_seconds: list[float] = field(default_factory=list)  # wall time of each batch forward pass
    done: bool = False

    @property
    def passes(self) -> int:
        return len(self.pass_seconds)

    @property
    def pass_starts(self) -> list[float]:
        """Start time of each pass on the shared axis (seconds of decoding since the first pass began)."""
        starts, t = [], 0.0
        for s in self.pass_seconds:
            starts.append(t)
            t += s
        return starts

    @property
    def seconds(self) -> float:
        return sum(self.pass_seconds)

    @property
    def tokens(self) -> int:
        return sum(r.tokens for r in self.rows)

    @property
    def tokens_per_forward(self) -> float:
        """All rows' tokens per batch forward pass: the batch's throughput per model call."""
        return self.tokens / max(1, self.passes)

    @property
    def idle_row_passes(self) -> int:
        return sum(len(r.idle_passes) for r in self.rows)

    def to_dict(self) -> dict:
        return {
            "settings": self.settings, "forward_passes": self.passes, "tokens": self.tokens,
            "tokens_per_forward": self.tokens_per_forward, "decode_seconds": self.seconds,
            "pass_seconds": list(self.pass_seconds), "idle_row_passes": self.idle_row_passes,
            "rows": [r.to_dict() for r in self.rows],
        }


def _timed_steps(lm, prompt_ids: list[list[int]], cfg: DecodeConfig, control: DecodeControl | None,
                 lock) -> Iterator[tuple[list[PassRecord], float]]:
    """decode_steps, one pass at a time under `lock` (the app's per-pass model lock), with each pass's
    measured wall time (the core's own timing when a record carries it)."""
    it = decode_steps(lm, prompt_ids, cfg, control)
    lock = lock if lock is not None else contextlib.nullcontext()
    while True:
        with lock:
            t0 = time.perf_counter()
            records = next(it, None)
            took = time.perf_counter() - t0
        if records is None:
            return
        yield records, (records[0].seconds if records else took)


def run_batch(lm, prompts: list[str], prompt_ids: list[list[int]], cfg: DecodeConfig,
              control: DecodeControl | None = None, lock=None) -> Iterator[BatchState]:
    """Decode the prompts as one batch; yield the state after every forward pass, and once more at the end."""
    if not 1 <= len(prompt_ids) <= MAX_BATCH or len(prompts) != len(prompt_ids):
        raise ValueError(f"a batch holds 1 to {MAX_BATCH} prompts, got {len(prompt_ids)}")
    control = control or DecodeControl()
    settings = {"mode": cfg.mode, "tau": cfg.tau, "block_size": cfg.block_size, "cache_block": cfg.cache_block,
                "max_new_tokens": cfg.max_new_tokens, "batch_size": len(prompt_ids)}
    state = BatchState([BatchRow(i, p, list(ids)) for i, (p, ids) in enumerate(zip(prompts, prompt_ids))],
                       settings)
    for records, seconds in _timed_steps(lm, prompt_ids, cfg, control, lock):
        index = state.passes
        proposed = {rec.row for rec in records}
        for rec in records:
            row = state.rows[rec.row]
            row.records.append(rec)
            row.token_texts.append([lm.tokenizer.decode([t]) for t in rec.token_ids])  # as the main view
            row.finish_reason = rec.finish_reason
        for row in state.rows:
            if not row.finished and row.index not in proposed:
                row.idle_passes.append(index)  # live, but waiting at the cache-block end
        state.pass_seconds.append(seconds)
        yield state
    if control.cancelled:
        for row in state.rows:
            row.finish_reason = row.finish_reason or "cancelled"
    state.done = True
    yield state


# ------------------------------------------------------------------------------------------ comparison


@dataclass
class RunMeasure:
    """One way of decoding the batch's prompts, measured."""

    label: str
    mode: str
    batch_size: int  # rows per forward pass
    forwards: int  # model calls
    tokens: int  # all rows together
    seconds: float  # wall time of the model calls, summed
    row_passes: int  # (row, pass) pairs in which a row proposed: idle rows and finished rows excluded

    @property
    def tokens_per_forward(self) -> float:
        """All rows' tokens per model call: what a batch gains from its width."""
        return self.tokens / max(1, self.forwards)

    @property
    def tokens_per_row_pass(self) -> float:
        """Tokens a row accepts per pass it proposes in: MARS's own gain (AR: 1)."""
        return self.tokens / max(1, self.row_passes)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict:
        return {"label": self.label, "mode": self.mode, "batch_size": self.batch_size, "forwards": self.forwards,
                "tokens": self.tokens, "tokens_per_forward": self.tokens_per_forward, "row_passes": self.row_passes,
                "tokens_per_row_pass": self.tokens_per_row_pass, "seconds": self.seconds,
                "tokens_per_second": self.tokens_per_second}


@dataclass
class BatchComparison:
    """The MARS batch against the same prompts one at a time and against AR at the same batch size."""

    batch: RunMeasure
    one_at_a_time: RunMeasure | None = None
    ar_batch: RunMeasure | None = None
    same_as_alone: bool | None = None  # every batch row == its prompt decoded alone, token for token

    def speedup(self, other: RunMeasure | None) -> float | None:
        """Measured wall-clock ratio per generated token: other's seconds/token over the batch's."""
        if other is None or not other.tokens or not self.batch.tokens or self.batch.seconds <= 0:
            return None
        return (other.seconds / other.tokens) / (self.batch.seconds / self.batch.tokens)

    @property
    def runs(self) -> list[RunMeasure]:
        return [r for r in (self.batch, self.one_at_a_time, self.ar_batch) if r is not None]

    def to_dict(self) -> dict:
        return {"runs": [r.to_dict() for r in self.runs], "speedup_vs_one_at_a_time": self.speedup(self.one_at_a_time),
                "speedup_vs_ar_batch": self.speedup(self.ar_batch), "same_as_alone": self.same_as_alone}


def batch_measure(state: BatchState) -> RunMeasure:
    return RunMeasure(f"{state.settings['mode'].upper()} batch of {len(state.rows)}", state.settings["mode"],
                      len(state.rows), state.passes, state.tokens, state.seconds,
                      sum(len(r.records) for r in state.rows))


def measure_comparison(lm, state: BatchState, cfg: DecodeConfig, control: DecodeControl | None = None,
                       lock=None) -> Iterator[BatchComparison]:
    """After a finished batch run: decode each prompt alone, then the batch as AR; yield the growing comparison.

    Stops early (yielding nothing more) when `control` is cancelled.
    """
    control = control or DecodeControl()
    comp = BatchComparison(batch_measure(state))
    prompt_ids = [r.prompt_ids for r in state.rows]

    forwards = tokens = 0
    seconds = 0.0
    alone_ids = []
    for ids in prompt_ids:
        out: list[int] = []
        for records, took in _timed_steps(lm, [ids], cfg, control, lock):
            forwards, seconds = forwards + 1, seconds + took
            out += [t for rec in records for t in rec.token_ids]
        if control.cancelled:
            return
        tokens += len(out)
        alone_ids.append(out)
    comp.one_at_a_time = RunMeasure(f"{cfg.mode.upper()} one at a time", cfg.mode, 1, forwards, tokens, seconds,
                                    forwards)
    comp.same_as_alone = all(a == r.token_ids for a, r in zip(alone_ids, state.rows))
    yield replace(comp)  # a snapshot: the caller may keep it

    ar_cfg = replace(cfg, mode="ar", tau=1.0, block_size=1)
    forwards = tokens = row_passes = 0
    seconds = 0.0
    for records, took in _timed_steps(lm, prompt_ids, ar_cfg, control, lock):
        forwards, seconds, row_passes = forwards + 1, seconds + took, row_passes + len(records)
        tokens += sum(len(rec.token_ids) for rec in records)
    if control.cancelled:
        return
    comp.ar_batch = RunMeasure(f"AR batch of {len(prompt_ids)}", "ar", len(prompt_ids), forwards, tokens, seconds,
                               row_passes)
    yield replace(comp)  # a snapshot: the caller may keep it
