"""The paper's Figure 4, live: up to 8 prompts decoded as ONE batch on the block-level KV cache.

Plain Python over the decoder core (`mars.decoding.decoder.decode_steps`), testable without Gradio:
- `parse_batch_prompts`: the textbox (one prompt per line) into 1..MAX_BATCH checked prompts;
- `run_batch`: the batch's state after every pass (each row's `RunRecord`, filled as the passes arrive,
  and its idle passes), on one shared time axis;
- `measure_comparison`: the same prompts as the MARS batch, one at a time (MARS, batch 1 each), and as
  AR at the same batch size: every figure measured, none estimated, and added up by `RunTotals`.

A row that is still decoding but has no record in a pass was idling at the cache-block end (the core
feeds it no masks until every row has reached that end). Idling never changes a row's output, so the
comparison also checks, token for token, that each batch row equals its prompt decoded alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Iterator

from mars.app.serving import one_at_a_time
from mars.decoding.decoder import DecodeConfig, DecodeControl, decode_steps
from mars.decoding.records import PassRecord, RunRecord, RunTotals

MAX_BATCH = 8  # rows shown at once; the paper's Figure 4 uses 4


def parse_batch_prompts(text, check: Callable[[str], str] | None = None) -> list[str]:
    """One prompt per non-blank line, 1..MAX_BATCH of them; ValueError with a message a visitor can act on.

    check: the app's single-prompt check (mars.app.inputs.check_prompt: sanitizing, length cap), applied
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
    """One prompt of the batch: its run record, each accepted token's text, and the passes it spent idle."""

    index: int
    prompt: str
    run: RunRecord  # the passes in which this row proposed, added as they arrive
    token_texts: list[list[str]] = field(default_factory=list)  # per pass record, each accepted token's text
    idle_passes: list[int] = field(default_factory=list)  # batch pass indices spent waiting at a block end

    @property
    def finished(self) -> bool:
        return self.run.finish_reason is not None

    def to_dict(self) -> dict:
        run = self.run
        return {
            "row": self.index, "prompt": self.prompt, "text": run.text, "token_ids": run.token_ids,
            "tokens": run.tokens, "passes": run.passes, "idle_passes": list(self.idle_passes),
            "tokens_per_pass": run.tokens_per_pass, "finish_reason": run.finish_reason,
            "groups": [{"pass_index": r.pass_index, "token_ids": r.token_ids, "token_texts": tt, "text": r.text,
                        "confidences": r.confidences, "tau": r.tau}
                       for r, tt in zip(run.steps, self.token_texts)],
        }


@dataclass
class BatchState:
    """A batch run as it happens: its rows and the shared time axis (one entry per batch pass)."""

    rows: list[BatchRow]
    settings: dict
    pass_seconds: list[float] = field(default_factory=list)  # wall time of each batch pass
    done: bool = False

    @property
    def batch_passes(self) -> int:
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
    def totals(self) -> RunTotals:
        return RunTotals.of(r.run for r in self.rows)

    @property
    def idle_row_passes(self) -> int:
        return sum(len(r.idle_passes) for r in self.rows)

    def to_dict(self) -> dict:
        t = self.totals
        return {
            "settings": self.settings, "batch_passes": self.batch_passes, "tokens": t.tokens,
            "tokens_per_batch_pass": t.tokens_per_batch_pass, "batch_seconds": t.batch_seconds,
            "pass_seconds": list(self.pass_seconds), "idle_row_passes": self.idle_row_passes,
            "rows": [r.to_dict() for r in self.rows],
        }


def _timed_steps(lm, prompt_ids: list[list[int]], cfg: DecodeConfig, control: DecodeControl | None,
                 lock, backend=None) -> Iterator[tuple[list[PassRecord], float]]:
    """decode_steps, one pass at a time through `lock` (the app's pass slot, or a lock), with each pass's
    measured wall time (the core's own timing when a record carries it)."""
    for records, took in one_at_a_time(decode_steps(lm, prompt_ids, cfg, control, backend=backend), lock):
        yield records, (records[0].seconds if records else took)


def run_batch(lm, prompts: list[str], prompt_ids: list[list[int]], cfg: DecodeConfig,
              control: DecodeControl | None = None, lock=None, backend=None) -> Iterator[BatchState]:
    """Decode the prompts as one batch; yield the state after every forward pass, and once more at the end."""
    if not 1 <= len(prompt_ids) <= MAX_BATCH or len(prompts) != len(prompt_ids):
        raise ValueError(f"a batch holds 1 to {MAX_BATCH} prompts, got {len(prompt_ids)}")
    control = control or DecodeControl()
    settings = {"mode": cfg.mode, "tau": cfg.tau, "block_size": cfg.block_size, "cache_block": cfg.cache_block,
                "max_new_tokens": cfg.max_new_tokens, "batch_size": len(prompt_ids)}
    state = BatchState([BatchRow(i, p, RunRecord(cfg, list(ids)))
                        for i, (p, ids) in enumerate(zip(prompts, prompt_ids))], settings)
    for records, seconds in _timed_steps(lm, prompt_ids, cfg, control, lock, backend):
        index = state.batch_passes
        proposed = {rec.row for rec in records}
        for rec in records:
            row = state.rows[rec.row]
            row.run.add(rec)
            row.token_texts.append([lm.tokenizer.decode([t]) for t in rec.token_ids])  # as the main view
        for row in state.rows:
            if not row.finished and row.index not in proposed:
                row.idle_passes.append(index)  # live, but waiting at the cache-block end
        state.pass_seconds.append(seconds)
        yield state
    if control.cancelled:
        for row in state.rows:
            row.run.finish_reason = row.run.finish_reason or "cancelled"
    state.done = True
    yield state


# ------------------------------------------------------------------------------------------ comparison


@dataclass
class RunMeasure:
    """One way of decoding the batch's prompts, measured: its runs added up.

    From `totals`: batch_passes (model calls), passes (a row's pass counts once per row that proposed: idle
    and finished rows excluded), tokens_per_batch_pass (what a batch gains from its width), tokens_per_pass
    (MARS's own gain, AR: 1), batch_seconds (wall time of the model calls).
    """

    label: str
    mode: str
    batch_size: int  # rows per forward pass
    totals: RunTotals

    def to_dict(self) -> dict:
        t = self.totals
        return {"label": self.label, "mode": self.mode, "batch_size": self.batch_size,
                "batch_passes": t.batch_passes, "tokens": t.tokens, "tokens_per_batch_pass": t.tokens_per_batch_pass,
                "passes": t.passes, "tokens_per_pass": t.tokens_per_pass, "batch_seconds": t.batch_seconds,
                "tokens_per_second": t.tokens_per_second}


@dataclass
class BatchComparison:
    """The MARS batch against the same prompts one at a time and against AR at the same batch size."""

    batch: RunMeasure
    one_at_a_time: RunMeasure | None = None
    ar_batch: RunMeasure | None = None
    same_as_alone: bool | None = None  # every batch row == its prompt decoded alone, token for token

    def speedup(self, other: RunMeasure | None) -> float | None:
        """Measured wall-clock ratio per generated token: other's seconds/token over the batch's."""
        mine = self.batch.totals
        if other is None or not other.totals.tokens or not mine.tokens or mine.batch_seconds <= 0:
            return None
        return (other.totals.batch_seconds / other.totals.tokens) / (mine.batch_seconds / mine.tokens)

    @property
    def runs(self) -> list[RunMeasure]:
        return [r for r in (self.batch, self.one_at_a_time, self.ar_batch) if r is not None]

    def to_dict(self) -> dict:
        return {"runs": [r.to_dict() for r in self.runs], "speedup_vs_one_at_a_time": self.speedup(self.one_at_a_time),
                "speedup_vs_ar_batch": self.speedup(self.ar_batch), "same_as_alone": self.same_as_alone}


def batch_measure(state: BatchState) -> RunMeasure:
    return RunMeasure(f"{state.settings['mode'].upper()} batch of {len(state.rows)}", state.settings["mode"],
                      len(state.rows), state.totals)


def _decode(lm, prompt_ids: list[list[int]], cfg: DecodeConfig, control: DecodeControl, lock) -> list[RunRecord]:
    """generate_ids, with `lock` held around every pass."""
    runs = [RunRecord(cfg, list(p)) for p in prompt_ids]
    for records, _ in _timed_steps(lm, prompt_ids, cfg, control, lock):
        for rec in records:
            runs[rec.row].add(rec)
    return runs


def measure_comparison(lm, state: BatchState, cfg: DecodeConfig, control: DecodeControl | None = None,
                       lock=None) -> Iterator[BatchComparison]:
    """After a finished batch run: decode each prompt alone, then the batch as AR; yield the growing comparison.

    Stops early (yielding nothing more) when `control` is cancelled.
    """
    control = control or DecodeControl()
    comp = BatchComparison(batch_measure(state))
    prompt_ids = [r.run.prompt_ids for r in state.rows]

    alone: list[RunRecord] = []
    for ids in prompt_ids:
        alone += _decode(lm, [ids], cfg, control, lock)
        if control.cancelled:
            return
    # one total per decode: separate decodes each number their passes from 0
    comp.one_at_a_time = RunMeasure(f"{cfg.mode.upper()} one at a time", cfg.mode, 1,
                                    sum((RunTotals.of([run]) for run in alone), RunTotals()))
    comp.same_as_alone = all(a.token_ids == r.run.token_ids for a, r in zip(alone, state.rows))
    yield replace(comp)  # a snapshot: the caller may keep it

    ar_cfg = replace(cfg, mode="ar", tau=1.0, block_size=1)
    ar = _decode(lm, prompt_ids, ar_cfg, control, lock)
    if control.cancelled:
        return
    comp.ar_batch = RunMeasure(f"AR batch of {len(prompt_ids)}", "ar", len(prompt_ids), RunTotals.of(ar))
    yield replace(comp)  # a snapshot: the caller may keep it
