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
from dataclasses import dataclass
from typing import Iterator

from mars.decoding.acceptance import CONFIDENCE_MEASURES, is_finite_number
from mars.runtime.backends import BACKENDS
from mars.decoding.modes import DRAFT_SOURCES, MODES, VERIFY_GROUPS, RowPlan  # noqa: F401 - RowPlan: modes written outside mars
from mars.decoding.records import PassRecord, RunRecord
from mars.decoding.scheduler import (Scheduler, check_context, check_rows,  # noqa: F401 - re-exported
                                     context_needed, make_runner)

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


def decode_steps(
    lm, prompts: list[list[int]], cfg: DecodeConfig, control: DecodeControl | None = None, *,
    backend=None, mode=None,
) -> Iterator[list[PassRecord]]:
    """Decode a batch of tokenized prompts; yield the records of every forward pass as it happens.

    The fixed batch is one caller of the scheduler (mars.decoding.scheduler): every row joins at once with the
    same settings and control, and rows idle at cache-block ends (cfg.cache_block).
    backend: what runs the model, `backend(model, cfg, batch, capacity) -> runner` (the verbs of
    mars.runtime.backends); default `make_runner`, the backend cfg.backend names. mode: the mode object
    (mars.decoding.modes) every row shares; default one make_mode(cfg, lm) per row."""
    check_rows(lm, prompts, cfg)
    P = max(len(p) for p in prompts)
    if cfg.backend == "static-device":  # the whole step on the device, read once per cfg.steps_per_read steps
        if mode is not None:
            raise ValueError("backend 'static-device' runs its own modes (mars.decoding.device_step): pass no mode")
        from mars.decoding.device_loop import decode_steps_device

        yield from decode_steps_device(lm, prompts, cfg, control or DecodeControl(), backend)
        return
    control = control or DecodeControl()
    # sized for the prompt, the answer and a pass's extras (< B drafts + B mask groups); it grows if need be
    sched = Scheduler(lm, cfg.backend, cfg.use_cache, backend=backend,
                      capacity=P + cfg.max_new_tokens + cfg.block_size ** 2, cache_block=cfg.cache_block,
                      prompt_len=P, prefill_chunk=None)
    rows = [sched.add(p, cfg, control, mode=mode, pad=P - len(p)) for p in prompts]
    while not sched.idle:
        if control.cancelled:
            for r in rows:
                if r.finish_reason is None:
                    r.finish_reason = "cancelled"
            return
        yield sched.step()


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

