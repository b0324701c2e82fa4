"""The one decoder core: MARS (tau rule) and the AR baseline, batch 1 and batches, with a block-level KV cache.

`decode_steps` is a generator that yields, after every forward pass, one `PassRecord` per row that
proposed tokens in that pass. Everything else (streaming to the app, whole generations for the CLI and the
benchmark) is a thin wrapper over it.

Layout. Prompts are left-padded to a common length P, so every row's tokens sit in shared columns:
row r's i-th token is at column pad_r + i, its position id is i. The KV cache holds columns [0, C) for all
rows. Row r's frontier F_r is the column after its last accepted token; columns [C, F_r) are accepted but
not cached (their KV was computed from mask inputs, or by a row that has run ahead of the others).

One pass:
  1. propose : each row feeds its uncached tokens [C, F_r), then what its mode plans (mars: B-1 masks;
               verified: the drafts as real tokens plus mask groups; jacobi: guesses; ar: nothing); one
               forward; the last real token's logits give the AR token, mask j's the token j+1 further on.
  2. score   : the mode picks tokens and measures their confidence (mars.modes).
  3. accept  : mars: left to right while confidence >= tau (the first always); verified/jacobi: the
               prefix the AR logits confirm; then EOS, stop strings, limits.
  4. cache   : keep the KV of columns every row computed from real inputs (its fed tokens, plus drafts
               that were verified); drop masks and the rest.
Batches: a row whose frontier has reached the current cache-block end E idles (feeds no masks, accepts
nothing) until every row has reached E; then E moves on by `cache_block`. This bounds how far rows drift
apart, and so the width of the forward input. Idling never changes a row's output: a row's next pass
depends only on its own prefix, so a batch gives each row exactly the passes it would get alone.
At batch 1, every pass commits all fed tokens: committed tokens are never recomputed.

The model runs behind one forward function and one KV cache (mars/backends.py): transformers' own
forward (`backend="hf"`, the reference) or a lean forward with a preallocated cache (mars/fastpath.py).
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Iterator

import torch

from mars.acceptance import CONFIDENCE_MEASURES, is_finite_number
from mars.backends import BACKENDS, make_backend
from mars.modes import DRAFT_SOURCES, RowPlan, make_mode

MODES = ("mars", "ar", "verified", "jacobi")


@dataclass
class DecodeConfig:
    mode: str = "mars"  # "mars" (tau rule), "ar" (one token per pass), "verified" (lossless), "jacobi"
    block_size: int = 4  # B: proposals per pass = the AR token + B-1 mask positions (as trained)
    tau: float = 0.9  # confidence threshold; a DecodeControl may change it between passes
    confidence: str = "prob"  # "prob" (paper default), "entropy" or "margin"
    max_tokens_per_pass: int | None = None  # optional cap on accepted tokens per pass
    max_new_tokens: int = 128
    cache_block: int = 32  # batches: rows idle at cache-block ends (paper: 32 at batch 4/8, 16 at 16)
    use_cache: bool = True  # False recomputes the whole sequence every pass: the slow reference path
    stop_strings: tuple[str, ...] = ()  # per-row stop, on the decoded text
    temperature: float = 0.0  # 0 = greedy (default); > 0 = seeded sampling
    seed: int | None = None
    top_k: int = 0  # keep the top-k candidates of every proposal in the records (the app's inspector)
    verify_groups: str = "all"  # verified mode: "all" = a mask group per acceptance outcome, "last" = one
    drafts: str = "mars"  # verified mode: drafts from the masks, n-gram "lookup" in the text, or "both" (mars.modes)
    # what runs the model (mars/backends.py): "auto" = "fast" (mars/fastpath.py: same logits to float
    # rounding, fewer ops, preallocated cache) where the model is supported, else "hf" (transformers, the
    # reference); "fast-bf16" is faster still but changes the numerics, so it is only ever asked for
    backend: str = "auto"

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        _check_int("block_size", self.block_size, 1, 64)
        _check_int("max_new_tokens", self.max_new_tokens, 1, 100_000)
        _check_int("cache_block", self.cache_block, 1, 4096)
        _check_int("top_k", self.top_k, 0, 100)
        if self.max_tokens_per_pass is not None:
            _check_int("max_tokens_per_pass", self.max_tokens_per_pass, 1, 64)
        if not is_finite_number(self.tau) or not 0.0 <= self.tau <= 1.0:
            raise ValueError(f"tau must be a number in [0, 1], got {self.tau!r}")
        if self.confidence not in CONFIDENCE_MEASURES:
            raise ValueError(f"confidence must be one of {CONFIDENCE_MEASURES}, got {self.confidence!r}")
        if not is_finite_number(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a number >= 0, got {self.temperature!r}")
        self.stop_strings = tuple(s for s in self.stop_strings if s)
        if self.verify_groups not in ("all", "last"):
            raise ValueError(f"verify_groups must be 'all' or 'last', got {self.verify_groups!r}")
        if self.drafts not in DRAFT_SOURCES:
            raise ValueError(f"drafts must be one of {DRAFT_SOURCES}, got {self.drafts!r}")
        if self.drafts != "mars" and self.mode != "verified":
            raise ValueError(f"drafts={self.drafts!r} needs mode 'verified' (the AR check that keeps copies exact)")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.mode in ("verified", "jacobi") and self.temperature > 0:
            raise ValueError(f"{self.mode} mode reproduces greedy decoding: temperature must be 0")



def _check_int(name, value, lo, hi):
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")


class DecodeControl:
    """Shared between a running generation and its caller: live tau, and cancellation.

    The decoder reads `tau` before every forward pass, so a slider can steer a running generation.
    """

    def __init__(self, tau: float | None = None):
        self._tau = tau
        self._cancel = threading.Event()

    @property
    def tau(self) -> float | None:
        return self._tau

    @tau.setter
    def tau(self, value: float | None):
        if value is not None and (not is_finite_number(value) or not 0.0 <= value <= 1.0):
            raise ValueError(f"tau must be a number in [0, 1], got {value!r}")
        self._tau = value

    def cancel(self):
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()


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
    drafts_sent: int = 0  # verified / jacobi: draft tokens fed as real inputs to be checked
    draft_source: str | None = None  # verified: where the drafts sent came from, "mars" or "lookup"

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class GenerationResult:
    prompt_ids: list[int]
    token_ids: list[int]  # generated ids only (an EOS that ended the run included)
    text: str
    steps: list[PassRecord] = field(default_factory=list)
    finish_reason: str | None = None

    @property
    def forwards(self) -> int:
        return len(self.steps)

    @property
    def tokens_per_forward(self) -> float:
        return len(self.token_ids) / max(1, self.forwards)

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.steps)

    def to_dict(self) -> dict:
        return {
            "text": self.text,
            "token_ids": self.token_ids,
            "forwards": self.forwards,
            "tokens_per_forward": self.tokens_per_forward,
            "finish_reason": self.finish_reason,
            "seconds": self.seconds,
            "steps": [
                {k: v for k, v in s.to_dict().items() if k not in ("row",) and (k != "candidates" or v)}
                for s in self.steps
            ],
        }


def encode_prompt(tokenizer, prompt: str, system: str | None = None) -> list[int]:
    """One user message (and an optional system message) through the tokenizer's chat template."""
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer(prompt)["input_ids"]  # base models without a template: the raw prompt


class _Row:
    """Book-keeping of one row: its tokens, frontier and text."""

    def __init__(self, index: int, prompt: list[int], pad: int):
        self.index = index
        self.tokens = list(prompt)
        self.n_prompt = len(prompt)
        self.pad = pad
        self.text = ""
        self.finish_reason: str | None = None
        self.drafts: list[int] = []  # verified / jacobi: tokens proposed for the columns after the frontier
        self.draft_conf: list[float] = []

    @property
    def frontier(self) -> int:
        return self.pad + len(self.tokens)

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.n_prompt:]


def decode_steps(
    lm, prompts: list[list[int]], cfg: DecodeConfig, control: DecodeControl | None = None
) -> Iterator[list[PassRecord]]:
    """Decode a batch of tokenized prompts; yield the records of every forward pass as it happens."""
    model, tok = lm.model, lm.tokenizer
    needs_masks = cfg.mode == "mars" or (cfg.mode == "verified" and cfg.drafts != "lookup")
    if needs_masks and lm.mask_token_id is None:
        raise ValueError(f"this model has no mask token: use mode 'ar', or give a mask token to use {cfg.mode}")
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    mode = make_mode(cfg)
    P = max(len(p) for p in prompts)
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit and P + cfg.max_new_tokens + 2 * cfg.block_size > limit:
        raise ValueError(
            f"prompt ({P} tokens) + max_new_tokens ({cfg.max_new_tokens}) exceeds the model's context of {limit}"
        )
    eos = set(lm.eos_token_ids)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    gen = torch.Generator().manual_seed(cfg.seed) if cfg.seed is not None else None
    control = control or DecodeControl()

    rows = [_Row(i, p, P - len(p)) for i, p in enumerate(prompts)]
    live = list(rows)  # rows still decoding, in the cache's batch order
    # one forward function and one KV cache whichever backend (uncached runs keep no column between passes);
    # sized for the prompt, the answer and a pass's extras (< B drafts + B mask groups), it grows if need be
    capacity = P + cfg.max_new_tokens + cfg.block_size ** 2
    runner = make_backend(model, cfg.backend, len(rows), capacity, cfg.use_cache)
    C = 0  # cached columns
    key_ok = torch.zeros((len(rows), 0), dtype=torch.bool)  # (b_live, C): False for left padding
    block_end = P + cfg.cache_block
    pass_index = 0

    while live:
        if control.cancelled:
            for r in live:
                r.finish_reason = "cancelled"
            return
        tau = cfg.tau if control.tau is None else control.tau
        t0 = time.perf_counter()
        while all(r.frontier >= block_end for r in live):
            block_end += cfg.cache_block
        start = C if cfg.use_cache else 0
        # idle rows (at the cache-block end) feed their real tokens only and accept nothing this pass
        plans = [mode.plan(r, cfg, tau) if r.frontier < block_end else None for r in live]

        # 1. propose: one window per row, [uncached real | extras | mask groups], right-padded to width W
        windows = [_window(r, p, start, lm.mask_token_id) for r, p in zip(live, plans)]
        W = max(len(w.tokens) for w in windows)
        b = len(live)
        ids = torch.full((b, W), pad_id, dtype=torch.long)
        pos = torch.zeros((b, W), dtype=torch.long)
        local = torch.zeros((b, W, W), dtype=torch.bool)
        for i, w in enumerate(windows):
            n = len(w.tokens)
            ids[i, :n] = torch.tensor(w.tokens)
            pos[i, :n] = torch.tensor(w.positions)
            local[i, :n, :n] = w.allowed
        keep_idx = sorted({k for w in windows for k in w.reads})
        cached = key_ok[:, :start] if cfg.use_cache else key_ok[:, :0]
        allowed = torch.cat([cached[:, None, :].expand(b, W, start), local], dim=2)  # (b, W, start + W)
        allowed[:, torch.arange(W), start + torch.arange(W)] = True  # padding queries see themselves
        logits = runner.forward(ids, pos, allowed, keep_idx)  # (b, len(keep_idx), V) float32
        where = {k: j for j, k in enumerate(keep_idx)}

        # 2. score and 3. accept, row by row
        valid = [r.frontier for r in live]  # per row: columns whose KV this pass computed from real inputs
        records: list[PassRecord] = []
        for i, (r, plan, w) in enumerate(zip(live, plans, windows)):
            if plan is None:
                continue
            main = logits[i, [where[k] for k in w.main_reads]]
            groups = [logits[i, [where[k] for k in g]] for g in w.group_reads]
            res = mode.accept(r, plan, main, groups, cfg, tau, gen)
            valid[i] += res.verified_extra
            props = res.tokens
            n, reason = _apply_limits(props, len(props), len(r.generated), cfg.max_new_tokens, eos)
            n, reason = _apply_stop_strings(tok, r, props, n, cfg.stop_strings, reason)
            accepted = props[:n]
            r.tokens.extend(accepted)
            new_text = tok.decode(r.generated, skip_special_tokens=True)
            piece = new_text[len(r.text):] if new_text.startswith(r.text) else new_text
            r.text = new_text
            r.finish_reason = reason
            cands = None
            if cfg.top_k and res.proposal_logits is not None:
                probs = torch.softmax(res.proposal_logits, dim=-1).topk(cfg.top_k, dim=-1)
                cands = [list(zip(ix.tolist(), [round(v, 6) for v in pv.tolist()])) for pv, ix in zip(*probs)]
            records.append(
                PassRecord(
                    row=r.index,
                    pass_index=pass_index,
                    token_ids=accepted,
                    text=piece,
                    confidences=res.confidences[:n],
                    rejected_token_ids=props[n:] + res.rejected,
                    rejected_confidences=res.confidences[n:] + res.rejected_confidences,
                    tau=tau,
                    seconds=0.0,
                    cache_len=C,
                    input_len=W,
                    finish_reason=reason,
                    candidates=cands,
                    drafts_sent=len(plan.extra),
                    draft_source=plan.source,
                )
            )

        # 4. cache: keep the columns every row computed from real inputs; drop masks and run-ahead tokens
        if cfg.use_cache:
            # columns [C, C + commit) hold real tokens' KV for every row; and every row keeps its last token
            # uncached, to be fed (as the query) next pass: a row idling at the cache-block end while another
            # row's verified extras run past it would otherwise be left with nothing to feed
            commit = min(min(valid), min(r.frontier for r in live) - 1) - C
            new_ok = torch.stack([torch.arange(C, C + commit) >= r.pad for r in live])
            key_ok = torch.cat([key_ok, new_ok], dim=1)
            C += commit
        runner.truncate(C)
        done = [i for i, r in enumerate(live) if r.finish_reason is not None]
        if done:
            keep_rows = [i for i in range(len(live)) if i not in done]
            if keep_rows:
                runner.select(keep_rows)
            key_ok = key_ok[keep_rows]
            live = [live[i] for i in keep_rows]
        elapsed = time.perf_counter() - t0
        for rec in records:
            rec.seconds = elapsed
        pass_index += 1
        yield records


@dataclass
class _RowWindow:
    tokens: list[int]
    positions: list[int]
    allowed: torch.Tensor  # (n, n) bool: which window inputs each window input may attend to
    main_reads: list[int]  # window indices of the last real token and of each extra
    group_reads: list[list[int]]  # window indices of each mask group

    @property
    def reads(self) -> list[int]:
        return self.main_reads + [k for g in self.group_reads for k in g]


def _window(row: _Row, plan: RowPlan | None, start: int, mask_id: int | None) -> _RowWindow:
    """One row's part of the forward input.

    Main chain: columns [start, F) (left padding, then uncached real tokens), then the plan's extras at
    columns F, F+1, ...: causal among themselves, as an ordinary sequence. Mask group (j, n): n masks at
    the positions right after extra j, seeing the real tokens, the first j extras and the group's earlier
    masks, nothing else.
    """
    F = row.frontier
    lo = max(start, row.pad)
    extra = plan.extra if plan else []
    groups = plan.groups if plan else []
    tokens = [0] * (lo - start) + row.tokens[lo - row.pad:] + list(extra)
    n_main = len(tokens)
    positions = [max(0, c - row.pad) for c in range(start, start + n_main)]
    n_real = F - start  # window index just after the last real token
    group_reads = []
    for j, n in groups:
        first = len(tokens)
        tokens += [mask_id] * n
        positions += [F - row.pad + j + o for o in range(n)]
        group_reads.append(list(range(first, first + n)))
    size = len(tokens)
    idx = torch.arange(size)
    is_main = idx < n_main
    valid = is_main & (idx >= lo - start)  # left padding is never a key
    allowed = (idx[None, :] <= idx[:, None]) & (is_main[:, None] & valid[None, :])
    for (j, n), reads in zip(groups, group_reads):
        g = torch.tensor(reads)
        allowed[g[:, None], torch.arange(n_real + j)[None, :]] = valid[: n_real + j][None, :]
        allowed[g[:, None], g[None, :]] = g[None, :] <= g[:, None]
    if plan and n_real < 1:
        raise RuntimeError(f"row {row.index}: no uncached token to feed (frontier {F}, cache {start})")
    main_reads = list(range(n_real - 1, n_real + len(extra))) if plan else []
    return _RowWindow(tokens, positions, allowed, main_reads, group_reads)


def _apply_limits(props: list[int], n: int, n_generated: int, max_new: int, eos: set[int]):
    """Cut the accepted run at the first EOS (kept) and at max_new_tokens."""
    for j in range(n):
        if props[j] in eos:
            n = j + 1
            break
    n = min(n, max_new - n_generated)
    if props[n - 1] in eos:
        return n, "eos"
    return n, ("length" if n_generated + n >= max_new else None)


def _apply_stop_strings(tok, row: _Row, props: list[int], n: int, stops: tuple[str, ...], reason):
    """Cut the accepted run right after the token that completes a stop string."""
    if not stops or n == 0:
        return n, reason
    base = row.generated
    for k in range(1, n + 1):
        text = tok.decode(base + props[:k], skip_special_tokens=True)
        tail = text[max(0, len(row.text) - max(len(s) for s in stops)):]
        if any(s in tail for s in stops):
            return k, "stop"
    return n, reason


def stream(lm, prompt_ids: list[int], cfg: DecodeConfig, control: DecodeControl | None = None) -> Iterator[PassRecord]:
    """Batch-1 streaming: one record per forward pass."""
    for records in decode_steps(lm, [prompt_ids], cfg, control):
        yield from records


def generate_ids(
    lm, prompts: list[list[int]], cfg: DecodeConfig, control: DecodeControl | None = None
) -> list[GenerationResult]:
    """Decode a batch to completion; one result per prompt, in order."""
    results = [GenerationResult(prompt_ids=list(p), token_ids=[], text="") for p in prompts]
    last: dict[int, PassRecord] = {}
    for records in decode_steps(lm, prompts, cfg, control):
        for rec in records:
            res = results[rec.row]
            res.steps.append(rec)
            res.token_ids.extend(rec.token_ids)
            last[rec.row] = rec
    for i, res in enumerate(results):
        res.text = lm.tokenizer.decode(res.token_ids, skip_special_tokens=True)
        res.finish_reason = last[i].finish_reason if i in last else None
        if control is not None and control.cancelled and res.finish_reason is None:
            res.finish_reason = "cancelled"
    return results


def generate(
    lm, prompts: list[str], cfg: DecodeConfig, system: str | None = None, control: DecodeControl | None = None
) -> list[GenerationResult]:
    """Text prompts in (each one user message through the chat template), results out."""
    ids = [encode_prompt(lm.tokenizer, p, system) for p in prompts]
    return generate_ids(lm, ids, cfg, control)
