"""What a run did, as data: one `PassRecord` per forward pass and row, one `RunRecord` per prompt, and
`RunTotals`, the one place where runs are added up.

Vocabulary, the same for the app, the CLI, the benchmark, the evaluation and the sweep:
  pass            one forward pass of the model (in a batch, a pass counts once for each row that proposed)
  tokens          generated tokens (an EOS that ended the run included)
  tokens_per_pass tokens / passes: the speed-up over AR in passes (AR = 1.0)
  decode_seconds  wall time of the passes (a batch's pass time is shared by its rows)
  batch pass      one forward call, counted once however many rows it served (batch_passes, batch_seconds)
The benchmark and evaluation JSON files use the same words. Files written before 2026-12-03 said
`forwards` and `tokens_per_forward`; `stored` reads either, so stored results (the adapter card's curve)
stay readable.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    from mars.decoding.decoder import DecodeConfig


@dataclass
class PassRecord:
    """What one forward pass did for one row."""

    row: int
    pass_index: int  # index of the forward pass in the whole (batched) run
    token_ids: list[int]  # accepted this pass
    text: str  # their text
    confidences: list[float]  # one per accepted token
    rejected_token_ids: list[int]  # the rest of the proposals, not accepted
    rejected_confidences: list[float]
    tau: float
    seconds: float  # wall time of the pass (shared by all rows of a batch)
    cache_len: int  # cached columns before the pass
    input_len: int  # positions per row in this pass's forward input
    finish_reason: str | None = None  # "eos", "stop", "length", "cancelled" on the row's last pass
    candidates: list[list[tuple[int, float]]] | None = None  # top-k (id, prob) per proposal
    # each accepted token's text and each rejected proposal's, filled by callers that show tokens one by one
    # (the app): the decoder joins a pass's text once and has no use for the pieces
    token_texts: list[str] | None = None
    rejected_texts: list[str] | None = None
    drafts_sent: int = 0  # verified / jacobi: draft tokens fed as real inputs to be checked
    # verified: where the drafts sent came from: "mars", "lookup", "store", or a tree's "mars+lookup" / "mars+store"
    draft_source: str | None = None
    # verified with tree drafts (mars.decoding.tree): the distinct candidates checked at each depth, likeliest
    # first, and the accepted path's draft at each depth (the pass then adds the model's own next token)
    tree_depths: list[list[int]] | None = None
    tree_path: list[int] | None = None
    repeat_guard: bool = False  # mars: the chain stopped at a draft repeating the text before it (repeat_tau)
    batch_rows: int = 1  # rows that shared the pass's forward (the fixed batch's, or the server's visitors')

    def to_dict(self) -> dict:
        """For a run's JSON: the row is the run's own, empty candidates (top_k = 0) and texts never filled
        say nothing."""
        return {k: v for k, v in asdict(self).items()
                if k != "row" and (k != "candidates" or v) and not (k.endswith("_texts") and v is None)
                and not (k.startswith("tree_") and v is None)}


@dataclass
class RunRecord:
    """One prompt's run: the settings it ran with and its pass records, filled as the passes arrive.

    `add` takes the records of one pass (or several) while streaming; every figure below is derived from
    the records, so a run half-way through reads the same way as a finished one.
    """

    config: DecodeConfig
    prompt_ids: list[int]
    steps: list[PassRecord] = field(default_factory=list)  # one per pass of this row, in order
    token_ids: list[int] = field(default_factory=list)  # generated ids (an EOS that ended the run included)
    # the pieces of the records joined while streaming; `generate_ids` replaces it by one decode of all
    # the ids at the end, which also settles a multi-byte character split across two passes
    text: str = ""
    finish_reason: str | None = None  # "eos", "stop", "length", "cancelled"; None while running
    prompt: str = ""  # the prompt's text, where the caller has it (the app shows it and reuses a run by it)
    # wall clock of the whole run, waits for other visitors' passes included (decode_seconds counts the passes)
    started: float = field(default_factory=time.perf_counter, repr=False)
    finished: float | None = field(default=None, repr=False)  # set by `finish`; None while running

    def add(self, records: PassRecord | Iterable[PassRecord]) -> "RunRecord":
        for rec in [records] if isinstance(records, PassRecord) else records:
            self.steps.append(rec)
            self.token_ids.extend(rec.token_ids)
            self.text += rec.text
            self.finish_reason = rec.finish_reason or self.finish_reason
        return self

    def finish(self, cancelled: bool = False) -> "RunRecord":
        """The run is over: its wall clock stops, and a run stopped before its last pass says so."""
        self.finished = time.perf_counter()
        if cancelled and self.finish_reason is None:
            self.finish_reason = "cancelled"
        return self

    @property
    def passes(self) -> int:
        return len(self.steps)

    @property
    def elapsed(self) -> float:
        return (self.finished or time.perf_counter()) - self.started

    @property
    def tokens(self) -> int:
        return len(self.token_ids)

    @property
    def tokens_per_pass(self) -> float:
        return self.tokens / max(1, self.passes)

    @property
    def decode_seconds(self) -> float:
        return sum(s.seconds for s in self.steps)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0

    def to_dict(self) -> dict:
        return {
            "config": asdict(self.config),
            "text": self.text,
            "token_ids": self.token_ids,
            "passes": self.passes,
            "tokens": self.tokens,
            "tokens_per_pass": self.tokens_per_pass,
            "decode_seconds": self.decode_seconds,
            "finish_reason": self.finish_reason,
            "steps": [s.to_dict() for s in self.steps],
        }


@dataclass
class RunTotals:
    """Runs added up: `RunTotals.of(runs)` for runs decoded together (one batch), `+` across batches."""

    runs: int = 0
    tokens: int = 0
    passes: int = 0  # summed over rows: a batch pass counts once per row that proposed in it
    decode_seconds: float = 0.0  # summed over rows
    batch_passes: int = 0  # forward calls: a batch's pass counts once
    batch_seconds: float = 0.0  # wall time of the forward calls: a batch's pass time counts once
    input_positions: int = 0  # forward-input positions per row, summed over the forward calls
    histogram: Counter = field(default_factory=Counter)  # tokens accepted in a pass -> how many passes

    @classmethod
    def of(cls, runs: Iterable[RunRecord]) -> "RunTotals":
        runs = list(runs)
        per_pass = {s.pass_index: s for r in runs for s in r.steps}  # one record per batch pass
        return cls(
            runs=len(runs),
            tokens=sum(r.tokens for r in runs),
            passes=sum(r.passes for r in runs),
            decode_seconds=sum(r.decode_seconds for r in runs),
            batch_passes=len(per_pass),
            batch_seconds=sum(s.seconds for s in per_pass.values()),
            input_positions=sum(s.input_len for s in per_pass.values()),
            histogram=Counter(len(s.token_ids) for r in runs for s in r.steps),
        )

    def __add__(self, other: "RunTotals") -> "RunTotals":
        return RunTotals(self.runs + other.runs, self.tokens + other.tokens, self.passes + other.passes,
                         self.decode_seconds + other.decode_seconds, self.batch_passes + other.batch_passes,
                         self.batch_seconds + other.batch_seconds, self.input_positions + other.input_positions,
                         self.histogram + other.histogram)

    @property
    def tokens_per_pass(self) -> float:
        return self.tokens / max(1, self.passes)

    @property
    def tokens_per_batch_pass(self) -> float:
        """All rows' tokens per forward call: what a batch gains from its width (batch 1: tokens_per_pass)."""
        return self.tokens / max(1, self.batch_passes)

    @property
    def input_per_pass(self) -> float | None:
        """Forward-input positions per row and forward call: the window width the passes paid for."""
        return self.input_positions / self.batch_passes if self.batch_passes else None

    @property
    def tokens_per_second(self) -> float:
        """Tokens per second of wall time (the forward calls')."""
        return self.tokens / self.batch_seconds if self.batch_seconds > 0 else 0.0


def stored(row: dict, key: str, default=None):
    """A figure from a stored JSON row under its current name, or its name in files written before the
    vocabulary was unified ("passes" was "forwards", "tokens_per_pass" was "tokens_per_forward")."""
    old = {"passes": "forwards", "tokens_per_pass": "tokens_per_forward", "row_passes": "row_forwards"}
    return row.get(key, row.get(old.get(key, key), default))
