"""The one decoder core: MARS (tau rule), AR, the lossless verified mode and Jacobi, batch 1 and batches,
with a block-level KV cache.

`decode_steps` is a generator that yields, after every forward pass, one `PassRecord` per row that
proposed tokens in that pass. Everything else (streaming to the app, whole runs for the CLI, the benchmark
and the evaluation: `generate_ids`, `RunRecord`) is a thin wrapper over it.

Layout. Row r's frontier F_r is its logical column: its left padding to the longest prompt P plus its
tokens, the same in a batch as alone. The cache (mars/decoding/cache.py, `BlockCache`) holds, per row, the
KV of the tokens it has committed (`_Row.n_cached`): their KV was computed from real inputs. Its other
tokens (accepted from mask inputs, or the last one, fed again as the query) go into the next window.

One pass, in `decode_steps`:
  1. propose : each row's window (`_window`): its uncommitted tokens, then what its mode plans
               (mars: B-1 masks; verified: the drafts as real tokens plus mask groups; jacobi: guesses;
               ar: nothing), who sees whom given by mars.decoding.masks; the windows right-aligned in one
               (b, W) input, one forward; the last real token's logits give the AR token, mask j's the token
               j+1 further on.
  2. score   : the mode picks tokens and measures their confidence (mars.decoding.modes).
  3. accept  : mars: left to right while confidence >= tau (the first always); verified/jacobi: the
               prefix the AR logits confirm; then EOS, stop strings, limits (`_accept`).
  4. commit  : each row keeps the KV of what it computed from real inputs (its fed tokens, plus drafts that
               were verified), all but its last token, and drops masks and the rest (`BlockCache.commit`);
               a row that keeps less than another leaves holes, columns that are never its keys.
Batches: a row whose frontier has reached the current cache-block end E idles (feeds its uncommitted tokens
but the last, accepts nothing) until every row has reached E; then E moves on by `cache_block`. Idling never
changes a row's output: a row's next pass depends only on its own prefix, so a batch gives each row exactly
the passes it would get alone. A row's window holds only its own uncommitted tokens and plan, however far
the other rows are: the right-aligned windows' left padding is input the fast backend does not compute
(mars.runtime.fastpath), and committed tokens are never fed again.

`cache_block` plays the role of the paper's Bcache (rows wait for each other at cache-block ends) but it
is not the authors' block-cached sampler (`MARSBlockCachedSampler` in Xalp/MARS). Theirs drafts the whole
cache block: every inner pass feeds the block's Bcache positions (masks and tokens already filled)
against a copy of the prefix cache, and once every row has filled the block it spends one more forward
to extend the cache with it. Here a pass feeds a row's uncommitted tokens plus B-1 masks (B as trained,
whatever cache_block is), committed tokens are never fed again, and the cache grows after every pass, so
there is no extra forward per block. Pass counts are therefore not comparable one to one.

The model runs behind one forward function and one KV store (mars/runtime/backends.py): transformers' own
forward (`backend="hf"`, the reference) or a lean forward with a preallocated cache (mars/runtime/fastpath.py).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch

from mars.decoding.acceptance import CONFIDENCE_MEASURES, is_finite_number, top_probs
from mars.runtime.backends import BACKENDS
from mars.decoding.cache import BlockCache
from mars.decoding.masks import tree_depths, window_mask
from mars.decoding.modes import DRAFT_SOURCES, MODES, VERIFY_GROUPS, Outcome, RowPlan, make_mode
from mars.decoding.records import PassRecord, RunRecord
from mars.decoding.rows import RowText, take

# The library's caps and defaults, named once. A server may cap lower (the app's block-size slider), but
# says so with its own named cap and these same checkers, not a second set of rules.
DEFAULT_BLOCK_SIZE = 4  # B when the model does not say what it was trained with (LoadedModel.default_block_size)
MAX_BLOCK_SIZE = 64
DEFAULT_CACHE_BLOCK = 32  # the paper's Bcache at batch 4 and 8; not the authors' block-cached sampler (README)
MAX_CACHE_BLOCK = 4096
MAX_NEW_TOKENS = 100_000
MAX_TOP_K = 100
MAX_TREE_NODES = 256  # draft tokens per pass in a tree (each may bring a mask group: the input grows fast)
DEFAULT_STEPS_PER_READ = 4  # the device step: k steps replayed per device read (issue 42)
MAX_STEPS_PER_READ = 64
DEFAULT_REPEAT_TAU = 1.0  # the repeat guard: on, a repeated draft waits for the next pass (docs/stutter.md: lower NLL at equal tokens/pass)


@dataclass
class DecodeConfig:
    """One run's settings, checked and normalised here once: every caller (app, CLI, bench, eval) gets
    the same messages, worded for the person who typed the value."""

    mode: str = "mars"  # "mars" (tau rule), "ar" (one token per pass), "verified" (lossless), "jacobi"
    block_size: int = DEFAULT_BLOCK_SIZE  # B: proposals per pass = the AR token + B-1 mask positions (as trained)
    tau: float = 0.9  # confidence threshold; a DecodeControl may change it between passes
    # mars mode: a draft repeating the 1 or 2 tokens just before it ("Europe Europe") must also clear this
    # (None: no guard; 1.0: never accepted as a draft). See acceptance.repeat_flags, docs/stutter.md
    repeat_tau: float | None = DEFAULT_REPEAT_TAU
    confidence: str = "prob"  # "prob" (paper default), "entropy" or "margin"
    max_tokens_per_pass: int | None = None  # optional cap on accepted tokens per pass
    max_new_tokens: int = 128
    cache_block: int = DEFAULT_CACHE_BLOCK  # batches: rows idle at cache-block ends (paper: 32 at batch 4/8, 16 at 16)
    use_cache: bool = True  # False recomputes the whole sequence every pass: the slow reference path
    stop_strings: tuple[str, ...] = ()  # per-row stop, on the decoded text
    temperature: float = 0.0  # 0 = greedy (default); > 0 = seeded sampling
    seed: int | None = None
    top_k: int = 0  # keep the top-k candidates of every proposal in the records (the app's inspector)
    verify_groups: str = "all"  # verified mode: "all" = a mask group per acceptance outcome, "last" = one
    drafts: str = "mars"  # verified mode: drafts from the masks, n-gram "lookup" in the text, or "both" (mars.decoding.modes)
    # verified mode: check a tree of up to this many draft tokens per pass (mars.decoding.tree); 0 = one chain
    tree_nodes: int = 0
    # a tree with verify_groups "last": mask groups on this many nodes, the likeliest to end the accepted path
    # (mars.decoding.tree.group_anchors); None: by the model's device (tree.DEFAULT_TREE_GROUPS: 1 on a CPU, where
    # each group is a gated input that costs time, docs/int8.md; 3 elsewhere, as measured before)
    tree_groups: int | None = None
    # a tree with lookup drafts: where the text offers no copy of 2+ matched tokens, a chain from the n-gram
    # table of the default model's own answers to other prompts (mars.decoding.datastore). Token ids are the
    # default model's: for another tokenizer it only wastes inputs (the check keeps the text exact)
    datastore: bool = False
    # a tree: a pass's cost by inputs, relative to one input (index w-1: w inputs; mars.decoding.costs measures
    # them); each pass then sends only the first k of its N nodes that give the most expected tokens per unit
    # of time (mars.decoding.tree.best_cut). None: all N. The text is the same either way (the check)
    pass_costs: tuple[float, ...] | None = None
    # with pass_costs: what a pass pays on top when some inputs are masks (the gated adapter's rows), relative to
    # one input; a pass then sends its mask group only while the group's drafts pay for it (tree.TreeMode._cut).
    # None: the group always goes
    group_cost: float | None = None
    # what runs the model (mars/runtime/backends.py): "auto" = "fast" (mars/runtime/fastpath.py: same logits to float
    # rounding, fewer ops, preallocated cache) where the model is supported, else "hf" (transformers, the
    # reference); "fast-bf16" is faster still but changes the numerics, so it is only ever asked for
    backend: str = "auto"
    # backend "static-device" (mars.decoding.device_step): steps run on the device between two reads of their
    # tokens; the app streams at each read. Other backends read every step
    steps_per_read: int = DEFAULT_STEPS_PER_READ

    def __post_init__(self):
        self.mode = check_choice("mode", self.mode, tuple(MODES))
        self.block_size = check_int("block size", self.block_size, 1, MAX_BLOCK_SIZE)
        self.tau = check_tau(self.tau)
        if self.repeat_tau is not None:
            self.repeat_tau = check_tau(self.repeat_tau, "repeat tau")
        self.confidence = check_choice("confidence", self.confidence, CONFIDENCE_MEASURES)
        if self.max_tokens_per_pass is not None:
            self.max_tokens_per_pass = check_int("max tokens per pass", self.max_tokens_per_pass, 1, MAX_BLOCK_SIZE)
        self.max_new_tokens = check_int("max new tokens", self.max_new_tokens, 1, MAX_NEW_TOKENS)
        self.cache_block = check_int("cache block", self.cache_block, 1, MAX_CACHE_BLOCK)
        if isinstance(self.stop_strings, str):
            self.stop_strings = (self.stop_strings,)  # one stop string, not its characters
        self.stop_strings = tuple(s for s in self.stop_strings if s)
        if not is_finite_number(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a number of 0 or more, got {_short(self.temperature)}")
        self.temperature = float(self.temperature)
        if self.seed is not None:
            self.seed = check_int("seed", self.seed, 0, 2 ** 63 - 1)
        self.top_k = check_int("top k", self.top_k, 0, MAX_TOP_K)
        self.verify_groups = check_choice("verify groups", self.verify_groups, VERIFY_GROUPS)
        self.drafts = check_choice("drafts", self.drafts, DRAFT_SOURCES)
        self.tree_nodes = check_int("tree nodes", 0 if self.tree_nodes is None else self.tree_nodes, 0, MAX_TREE_NODES)
        if self.tree_groups is not None:
            self.tree_groups = check_int("tree groups", self.tree_groups, 1, MAX_TREE_NODES + 1)
        if self.tree_nodes and self.mode != "verified":
            raise ValueError("tree nodes need mode 'verified' (the AR check that picks the path)")
        if self.drafts != "mars" and self.mode != "verified":
            raise ValueError(f"drafts {self.drafts!r} needs mode 'verified' (the AR check that keeps copies exact)")
        self.datastore = bool(self.datastore)
        if self.datastore and (not self.tree_nodes or self.drafts == "mars"):
            raise ValueError("datastore drafts need a tree (tree nodes > 0) with drafts 'lookup' or 'both'")
        if self.pass_costs is not None:
            self.pass_costs = check_costs(self.pass_costs)
            if not self.tree_nodes:
                raise ValueError("pass costs need a tree (tree nodes > 0): they decide how many of its nodes a pass sends")
        if self.group_cost is not None:
            if not is_finite_number(self.group_cost) or self.group_cost < 0:
                raise ValueError(f"group cost must be a number of 0 or more, got {_short(self.group_cost)}")
            if self.pass_costs is None:
                raise ValueError("group cost needs pass costs (the cost of the inputs it is weighed against)")
            self.group_cost = float(self.group_cost)
        self.backend = check_choice("backend", self.backend, BACKENDS)
        if self.mode in ("verified", "jacobi") and self.temperature > 0:
            raise ValueError(f"{self.mode} mode reproduces greedy decoding: set temperature to 0, or use mode 'mars'")
        self.steps_per_read = check_int("steps per read", self.steps_per_read, 1, MAX_STEPS_PER_READ)
        if self.backend == "static-device":
            from mars.decoding.device_loop import unsupported
            from mars.decoding.static_tree import MAX_STATIC_NODES

            why = unsupported(self)
            if why is None and self.tree_nodes > MAX_STATIC_NODES:
                why = f"a tree of more than {MAX_STATIC_NODES} nodes"
            if why is not None:
                raise ValueError(f"backend 'static-device' does not run {why}; use backend 'static'")


def check_tau(value, name: str = "tau") -> float:
    """The one tau check, for a DecodeConfig and for a DecodeControl's live changes alike."""
    if not is_finite_number(value) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be a number between 0 and 1, got {_short(value)}")
    return float(value)


def check_costs(value) -> tuple[float, ...]:
    """Pass costs by inputs: 1 to MAX_TREE_NODES + 64 numbers, each finite and above 0."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or not 1 <= len(value) <= MAX_TREE_NODES + 64 \
            or not all(is_finite_number(c) and c > 0 for c in value):
        raise ValueError(f"pass costs must be a list of 1 to {MAX_TREE_NODES + 64} numbers above 0, got {_short(value)}")
    return tuple(float(c) for c in value)


def check_int(name: str, value, lo: int, hi: int) -> int:
    """A whole number in [lo, hi]; 4.0 counts as 4 (sliders and JSON clients send floats)."""
    given = value
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{name} must be a whole number between {lo} and {hi}, got {_short(given)}")
    return value


def check_choice(name: str, value, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, got {_short(value)}")
    return value


def _short(value) -> str:
    """A value in a message: its repr, cut short (a client can send a megabyte)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def context_needed(prompt_tokens: int, cfg: DecodeConfig) -> int:
    """Positions a run may use: the prompt, the answer, and a last pass's masks reaching past the answer."""
    return prompt_tokens + cfg.max_new_tokens + 2 * cfg.block_size


def check_context(model, prompt_tokens: int, cfg: DecodeConfig) -> None:
    """Refuse a run that would not fit the model's context, before any forward pass."""
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if limit and context_needed(prompt_tokens, cfg) > limit:
        raise ValueError(
            f"the prompt ({prompt_tokens} tokens) plus max new tokens ({cfg.max_new_tokens}) does not fit this "
            f"model's context of {limit} tokens: shorten the prompt or lower max new tokens"
        )


class DecodeControl:
    """Shared between a running generation and its caller: live tau, and cancellation.

    The decoder reads `tau` before every forward pass, so a slider can steer a running generation.
    """

    def __init__(self, tau: float | None = None):
        self._tau = None
        self.tau = tau  # checked like any later change
        self._cancel = threading.Event()

    @property
    def tau(self) -> float | None:
        return self._tau

    @tau.setter
    def tau(self, value: float | None):
        self._tau = None if value is None else check_tau(value)

    def cancel(self):
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()


def encode_prompt(tokenizer, prompt: str, system: str | None = None) -> list[int]:
    """One user message (and an optional system message) through the tokenizer's chat template."""
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer(prompt)["input_ids"]  # base models without a template: the raw prompt


class _Row(RowText):
    """Book-keeping of one row: its tokens and text (RowText), its left padding, frontier and drafts."""

    def __init__(self, index: int, prompt: list[int], pad: int):
        super().__init__(index, prompt)
        self.pad = pad  # left padding to the longest prompt: the frontier is a logical column, as alone
        self.n_cached = 0  # leading tokens whose KV the cache holds (never fed again)
        self.drafts: list[int] = []  # verified / jacobi: tokens proposed for the columns after the frontier
        self.draft_conf: list[float] = []

    @property
    def frontier(self) -> int:
        return self.pad + len(self.tokens)


def make_runner(model, cfg: DecodeConfig, batch: int, capacity: int):
    """The backend `cfg.backend` names (mars.runtime.backends), for one run of `batch` rows sized for `capacity`
    columns: the decoder's default where the caller hands it no `backend`."""
    from mars.runtime.backends import make_backend

    return make_backend(model, cfg.backend, batch, capacity, cfg.use_cache)


def decode_steps(
    lm, prompts: list[list[int]], cfg: DecodeConfig, control: DecodeControl | None = None, *,
    backend=None, mode=None,
) -> Iterator[list[PassRecord]]:
    """Decode a batch of tokenized prompts; yield the records of every forward pass as it happens.

    backend: what runs the model, `backend(model, cfg, batch, capacity) -> runner` (the verbs of
    mars.runtime.backends: forward, length, truncate, select; and optionally `scoring`); default `make_runner`,
    the backend cfg.backend names. mode: the mode object (mars.decoding.modes); default make_mode(cfg, lm)."""
    needs_masks = cfg.mode == "mars" or (cfg.mode == "verified" and cfg.drafts != "lookup")
    if needs_masks and lm.mask_token_id is None:
        raise ValueError(f"this model has no mask token: use mode 'ar', or give a mask token to use {cfg.mode}")
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    P = max(len(p) for p in prompts)
    check_context(lm.model, P, cfg)
    if cfg.backend == "static-device":  # the whole step on the device, read once per cfg.steps_per_read steps
        if mode is not None:
            raise ValueError("backend 'static-device' runs its own modes (mars.decoding.device_step): pass no mode")
        from mars.decoding.device_loop import decode_steps_device

        yield from decode_steps_device(lm, prompts, cfg, control or DecodeControl(), backend)
        return
    tok = lm.tokenizer
    eos = set(lm.eos_token_ids)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    gen = torch.Generator().manual_seed(cfg.seed) if cfg.seed is not None else None
    control = control or DecodeControl()

    live = [_Row(i, p, P - len(p)) for i, p in enumerate(prompts)]  # rows still decoding, in the cache's order
    # sized for the prompt, the answer and a pass's extras (< B drafts + B mask groups); it grows if need be
    runner = (backend or make_runner)(lm.model, cfg, len(live), P + cfg.max_new_tokens + cfg.block_size ** 2)
    scoring = getattr(runner, "scoring", None)
    mode = mode or make_mode(cfg, lm, scoring)
    cache = BlockCache(runner, P, len(live), cfg.cache_block, cfg.use_cache)
    pass_index = 0
    while live:
        if control.cancelled:
            for r in live:
                r.finish_reason = "cancelled"
            return
        tau = cfg.tau if control.tau is None else control.tau
        t0 = time.perf_counter()
        # rows at the cache-block end idle: they feed their uncommitted tokens but the last, and accept nothing
        block_end = cache.next_block([r.frontier for r in live])
        plans = [mode.plan(r, cfg, tau) if r.frontier < block_end else None for r in live]

        # 1. propose: one window per row, right-aligned in the pass's input, one forward
        windows = [_window(r, p, lm.mask_token_id) for r, p in zip(live, plans)]
        ids, pos, local, starts = _stack_windows(windows, pad_id)
        keep = sorted({o + k for w, o in zip(windows, starts) for k in w.reads})
        padding = torch.arange(ids.shape[1])[None, :] < torch.tensor(starts)[:, None]  # (b, W): nobody reads these
        logits = cache.forward(ids, pos, local, keep, padding)  # (b, len(keep), V) float32
        at = {k: j for j, k in enumerate(keep)}

        # 2. score and 3. accept, row by row
        computed = [w.n_real for w in windows]  # per row: leading window inputs computed from real tokens
        records = []
        for i, (r, plan, w, o) in enumerate(zip(live, plans, windows, starts)):
            if plan is None:
                continue
            row_logits = logits[i]  # (len(keep), V)
            main = _rows(row_logits, [at[o + k] for k in w.main_reads])
            groups = _Groups(row_logits, w.group_reads, at, o)
            res = mode.accept(r, plan, main, groups, cfg, tau, gen)
            computed[i] += res.n_verified
            records.append(_accept(tok, r, plan, res, cfg, eos, pass_index, tau, cache.length, ids.shape[1], scoring))

        # 4. commit: each row keeps the KV it computed from real inputs, all but its last token (fed next pass
        # as the query); finished rows leave the batch
        counts = [min(c, len(r.tokens) - 1 - r.n_cached) for r, c in zip(live, computed)]
        for r, kept in zip(live, cache.commit(starts, counts)):
            r.n_cached += kept
        keep_rows = [i for i, r in enumerate(live) if r.finish_reason is None]
        if len(keep_rows) < len(live):
            cache.select(keep_rows)
            live = [live[i] for i in keep_rows]
        elapsed = time.perf_counter() - t0
        for rec in records:
            rec.seconds = elapsed
        pass_index += 1
        yield records


def _accept(tok, row: _Row, plan: RowPlan, res: Outcome, cfg: DecodeConfig, eos: set[int], pass_index: int,
            tau: float, cache_len: int, width: int, scoring=None) -> PassRecord:
    """Stage 3 for one row: cut the mode's accepted run at EOS, the length limit and stop strings; take
    the tokens into the row; return the pass's record."""
    props = res.tokens
    n, reason = _apply_limits(props, len(props), len(row.generated), cfg.max_new_tokens, eos)
    n, reason, piece = take(tok, row, props, n, cfg.stop_strings, reason)
    accepted = props[:n]
    cands = None
    if cfg.top_k and res.proposal_logits is not None:
        probs = top_probs(res.proposal_logits, min(cfg.top_k, res.proposal_logits.shape[-1]), scoring)
        cands = [list(zip(ix.tolist(), [round(v, 6) for v in pv.tolist()])) for pv, ix in zip(*probs)]
    return PassRecord(
        row=row.index,
        pass_index=pass_index,
        token_ids=accepted,
        text=piece,
        confidences=res.confidences[:n],
        rejected_token_ids=props[n:] + res.rejected,
        rejected_confidences=res.confidences[n:] + res.rejected_confidences,
        tau=tau,
        seconds=0.0,  # the pass's wall time, set once every row is done
        cache_len=cache_len,
        input_len=width,
        finish_reason=reason,
        candidates=cands,
        drafts_sent=len(plan.to_verify),
        draft_source=plan.source,
        tree_depths=res.tree_depths,
        tree_path=res.tree_path,
        repeat_guard=res.repeat_guard and n == len(props),  # not when EOS, the length or a stop string cut first
    )


@dataclass
class _RowWindow:
    tokens: list[int]
    positions: list[int]
    allowed: torch.Tensor  # (n, n) bool: which window inputs each window input may attend to (masks.window_mask)
    main_reads: list[int]  # window indices of the last real token and of each extra
    group_reads: list[list[int]]  # window indices of each mask group
    n_real: int  # leading inputs that are the row's uncommitted tokens

    @property
    def reads(self) -> list[int]:
        return self.main_reads + [k for g in self.group_reads for k in g]


def _window(row: _Row, plan: RowPlan | None, mask_id: int | None) -> _RowWindow:
    """One row's part of the forward input: [its uncommitted tokens | the plan's extras | mask groups].

    The extras are a chain or a tree (plan.parents), each at the position of its depth after the last real
    token; mask group (j, n) holds n masks at the positions right after extra j-1. Who sees whom is
    `masks.window_mask`. An idle row (plan None) feeds its uncommitted tokens but the last, which its next
    plan feeds as the query: nothing at all once they are in the cache.
    """
    real = row.tokens[row.n_cached:] if plan else row.tokens[row.n_cached:-1]
    extra = plan.to_verify if plan else []
    groups = plan.groups if plan else []
    parents = plan.parents if plan else None
    n_real = len(real)
    if plan and n_real < 1:
        raise RuntimeError(f"row {row.index}: no uncached token to feed ({row.n_cached} of {len(row.tokens)} cached)")
    n = len(row.tokens)  # the position of the token after the last real one
    tokens = real + list(extra)
    positions = list(range(row.n_cached, row.n_cached + n_real))
    depth = tree_depths(parents, len(extra))
    positions += [n + d - 1 for d in depth]
    group_reads = []
    for j, m in groups:
        group_reads.append(list(range(len(tokens), len(tokens) + m)))
        tokens += [mask_id] * m
        after = depth[j - 1] if j else 0  # the depth of the extra the group follows
        positions += [n + after + o for o in range(m)]
    main_reads = list(range(n_real - 1, n_real + len(extra))) if plan else []
    return _RowWindow(tokens, positions, window_mask(0, n_real, len(extra), groups, parents), main_reads,
                      group_reads, n_real)


def _stack_windows(windows: list[_RowWindow], pad_id: int):
    """The rows' windows right-aligned in a common width W: ids, positions (b, W), masks (b, W, W), and each
    row's first column. Right-aligned, the rows' last real tokens and masks share columns (a MARS pass reads
    the last B of every row), so the logits kept are few; the left padding is what the fast backend skips
    (BlockCache.forward's `padding`)."""
    W = max(len(w.tokens) for w in windows)
    b = len(windows)
    starts = [W - len(w.tokens) for w in windows]
    # ids and positions padded as lists and made tensors at once: two tensors a pass, not two a row
    ids = torch.tensor([[pad_id] * o + w.tokens for w, o in zip(windows, starts)], dtype=torch.long)
    pos = torch.tensor([[0] * o + w.positions for w, o in zip(windows, starts)], dtype=torch.long)
    local = torch.zeros((b, W, W), dtype=torch.bool)
    for i, (w, o) in enumerate(zip(windows, starts)):
        local[i, o:, o:] = w.allowed
    return ids, pos, local, starts


class _Groups(Sequence):
    """A row's mask groups' logits, each cut out of the pass's logits only when the mode reads it: a tree
    pass carries a group per node and reads one of them."""

    def __init__(self, logits: torch.Tensor, reads: list[list[int]], at: dict[int, int], start: int = 0):
        # logits: (len(keep), V); at: pass column -> logits row; start: the row's window's first column
        self.logits, self.reads, self.at, self.start = logits, reads, at, start

    def __len__(self) -> int:
        return len(self.reads)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return _rows(self.logits, [self.at[self.start + k] for k in self.reads[i]])


def _rows(logits: torch.Tensor, idx: list[int]) -> torch.Tensor:
    """logits[idx]; a run of consecutive rows as a slice: indexing a GPU's tensor with a list copies the
    list there first, and waits for the device to do so."""
    if idx and idx == list(range(idx[0], idx[0] + len(idx))):
        return logits[idx[0]:idx[0] + len(idx)]
    return logits[idx]


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


def stream(lm, prompt_ids: list[int], cfg: DecodeConfig, control: DecodeControl | None = None, *,
           backend=None, mode=None) -> Iterator[PassRecord]:
    """Batch-1 streaming: one record per forward pass (backend, mode: as decode_steps)."""
    for records in decode_steps(lm, [prompt_ids], cfg, control, backend=backend, mode=mode):
        yield from records


def generate_ids(
    lm, prompts: list[list[int]], cfg: DecodeConfig, control: DecodeControl | None = None, *,
    backend=None, mode=None,
) -> list[RunRecord]:
    """Decode a batch to completion; one run record per prompt, in order (backend, mode: as decode_steps)."""
    runs = [RunRecord(cfg, list(p)) for p in prompts]
    for records in decode_steps(lm, prompts, cfg, control, backend=backend, mode=mode):
        for rec in records:
            runs[rec.row].add(rec)
    for run in runs:
        run.text = lm.tokenizer.decode(run.token_ids, skip_special_tokens=True)
        if control is not None and control.cancelled and run.finish_reason is None:
            run.finish_reason = "cancelled"
    return runs

