"""`python -m mars bench`: MARS against AR and no-extra-parameter peers, side by side in one process.

Methods, all on the same prompts and model:
  hf     transformers greedy `generate` with its KV cache (left-padded batches)
  ar     the core's AR mode (the baseline every speed-up is measured against)
  mars   the core at each tau
  lookup transformers prompt-lookup decoding (batch 1 only: transformers has no batched assisted decoding)
  verified the core's lossless mode: MARS drafts checked by the model's own AR logits, with a mask group per
         acceptance outcome; verified_last: one mask group, after all drafts (the fastest on a CPU, and the
         CLI's and the app's default). Both run at tau 0.0 (`verify_tau`): in verified mode tau only chooses
         which drafts are sent to be checked, never the text, and sending every draft gives the most tokens
         per pass
  verified_lookup the same lossless check on drafts copied by n-gram lookup (prompt lookup on this core)
  verified_both   drafts from the masks or from lookup, whichever is expected to be accepted more
         (mars.decoding.modes.prefer_lookup); one mask group after the drafts, as verified_last
  verified_tree   the same lossless check on a tree of drafts (mars.decoding.tree): mask candidates and lookup
         copies, N nodes a pass for each N of `tree_nodes` (a run named verified_tree:N), a mask group on every
         node; verified_tree_last: groups only on the few nodes likeliest to end the path (narrower passes);
         verified_tree_store: verified_tree_last with the datastore's chains (mars.decoding.datastore; the default
         model's token ids)
  jacobi Jacobi fixed-point decoding of the same checkpoint on the same core
  llamacpp llama.cpp (llama-cpp-python, an optional install: docs/peers.md) on the default model's own GGUF, the
         same threads, greedy, the same prompt ids and max new tokens (mars.evaluation.llamacpp); batch 1 only, and
         skipped with one line where the package is absent or the model is not the default
`also_backends` runs the core's methods again on other backends (`ar@fast-int8`, ...), interleaved, all
against the one AR baseline on `backend`: their speed and their text's agreement with it in one table.
Every method runs once untimed on the first prompt (warm-up), then timed. Results are data
(`run_bench` returns them); the table and the JSON file are written by `main`.
"""

from __future__ import annotations

import platform
import resource
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mars.decoding.decoder import DEFAULT_CACHE_BLOCK, DEFAULT_REPEAT_TAU
from mars.decoding.records import RunTotals

METHODS = ("hf", "ar", "mars", "lookup", "verified", "verified_last", "verified_lookup", "verified_both",
           "verified_tree", "verified_tree_last", "verified_tree_store", "verified_tree_mars", "jacobi", "llamacpp")
# the core's verified variants: method -> (verify_groups, drafts)
VERIFIED = {"verified": ("all", "mars"), "verified_last": ("last", "mars"), "verified_lookup": ("last", "lookup"),
            "verified_both": ("last", "both"), "verified_tree": ("all", "both"), "verified_tree_last": ("last", "both"),
            "verified_tree_store": ("last", "both"),
            # mask drafts only: the tree the device step runs (backend static-device: lookup runs on the host)
            "verified_tree_mars": ("all", "mars")}
TREES = ("verified_tree", "verified_tree_last", "verified_tree_store", "verified_tree_mars")  # run once per node budget, as "<method>:<N>"


@dataclass
class BenchConfig:
    prompts: list[str]
    methods: tuple[str, ...] = ("hf", "ar", "mars")
    taus: tuple[float, ...] = (1.0, 0.9, 0.7)
    batch_sizes: tuple[int, ...] = (1,)
    block_size: int | None = None  # None: the model's default (LoadedModel.default_block_size)
    cache_block: int = DEFAULT_CACHE_BLOCK
    max_new_tokens: int = 64
    lookup_tokens: int = 10  # prompt_lookup_num_tokens for the lookup method
    verify_tau: float = 0.0  # verified mode: drafts below this confidence are not sent (0 = send all)
    backend: str = "auto"  # runs the core's methods (DecodeConfig.backend); hf and lookup are transformers
    tree_nodes: tuple[int, ...] = (16,)  # verified_tree: draft nodes per pass, one run per value
    # the core's methods again on these backends too (runs named "<method>@<backend>"), interleaved with the
    # rest: int8 beside float32 in one run, against the same AR baseline (`backend`'s)
    also_backends: tuple[str, ...] = ()
    repeat_tau: float | None = DEFAULT_REPEAT_TAU  # mars: the repeat guard (DecodeConfig.repeat_tau), None = off

    def __post_init__(self):
        from mars.runtime.backends import BACKENDS
        from mars.decoding.decoder import MAX_TREE_NODES, check_int

        # a tree method may name its own node budget ("verified_tree:4"), beside the shared `tree_nodes`
        bad = [m for m in self.methods if m not in METHODS and not (
            m.partition(":")[0] in TREES and m.partition(":")[2].isdigit())]
        if bad:
            raise ValueError(f"unknown methods {bad}; choose from {METHODS}")
        bad = [b for b in self.also_backends if b not in BACKENDS]
        if bad:
            raise ValueError(f"unknown backends {bad}; choose from {BACKENDS}")
        self.tree_nodes = tuple(check_int("tree nodes", n, 1, MAX_TREE_NODES) for n in self.tree_nodes)
        if not self.prompts:
            raise ValueError("no prompts to benchmark")


@dataclass
class Run:
    method: str
    tau: float | None
    batch_size: int
    prompts: int
    new_tokens: int
    passes: int
    tokens_per_pass: float
    wall_s: float
    tokens_per_s: float
    speedup_vs_ar: float | None = None
    exact_match_with_ar: float | None = None
    prefix_match_with_ar: float | None = None
    mean_nll_under_ar: float | None = None
    peak_rss_mb: float = 0.0
    input_per_pass: float | None = None  # forward-input positions per pass (the window width), core methods
    row_passes: list[int] = field(default_factory=list)  # per prompt: the passes its row took
    batch_seconds: list[float] = field(default_factory=list)  # per batch: its wall time (per prompt at batch 1)
    interrupted: bool = False  # the run stopped early: only the batches every method finished are counted
    outputs: list[list[int]] = field(default_factory=list, repr=False)

    @property
    def row_tokens_per_pass(self) -> list[float]:
        return [len(o) / max(1, f) for o, f in zip(self.outputs, self.row_passes)]


def read_prompts(path: str | Path, with_kinds: bool = False):
    """One prompt per line, or JSONL with a `prompt` field (and optionally a `kind`, for per-kind reports).

    Returns the prompts, or (prompts, kinds) with `with_kinds` (kind None where a line has none).
    """
    from mars.jsonl import read_jsonl

    rows = read_jsonl(path, plain=True)
    out = [r["prompt"] if isinstance(r, dict) else r for r in rows]
    kinds = [r.get("kind") if isinstance(r, dict) else None for r in rows]
    return (out, kinds) if with_kinds else out


def spread_indices(n: int, k: int | None) -> list[int]:
    """k indices evenly spaced through range(n) (all of them when k is None or >= n): a sample that keeps
    every kind of a file sorted by kind."""
    if k is None or k >= n:
        return list(range(n))
    return [i * n // k for i in range(k)]


def _strip(ids: list[int], eos: set[int], pad: int) -> list[int]:
    """transformers pads finished rows; keep ids up to and including the first EOS."""
    out = []
    for t in ids:
        out.append(t)
        if t in eos:
            break
    return out


class _ForwardCounter:
    """Counts model forward calls (passes), for methods whose passes we do not drive ourselves."""

    def __init__(self, model):
        self.n = 0
        self.handle = model.register_forward_pre_hook(self._hook)

    def _hook(self, *_):
        self.n += 1

    def close(self):
        self.handle.remove()


def _hf_generate(lm, batch: list[list[int]], max_new: int, lookup: int = 0):
    import torch

    tok, model = lm.tokenizer, lm.model
    pad = tok.pad_token_id if tok.pad_token_id is not None else lm.eos_token_ids[0]
    P = max(len(p) for p in batch)
    ids = torch.tensor([[pad] * (P - len(p)) + p for p in batch], device=model.device)
    mask = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in batch], device=model.device)
    kw = dict(max_new_tokens=max_new, do_sample=False, pad_token_id=pad)
    if lookup:
        kw["prompt_lookup_num_tokens"] = lookup
    counter = _ForwardCounter(model)
    try:
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=mask, **kw)
    finally:
        counter.close()
    eos = set(lm.eos_token_ids)
    outs = [_strip(row[P:].tolist(), eos, pad) for row in out]
    # per-row forwards: the counted passes at batch 1; in a batch every row takes one pass per token
    rows = [counter.n] if len(batch) == 1 else [len(o) for o in outs]
    return outs, rows, RunTotals(runs=len(outs), tokens=sum(len(o) for o in outs), passes=sum(rows))


def _run_on_the_core(lm, batch, mode, tau, block, cache_block, max_new, backend="auto", repeat_tau=DEFAULT_REPEAT_TAU,
                     runner=None):
    from mars.decoding.decoder import DecodeConfig, generate_ids

    mode, _, other = mode.partition("@")  # "mars@fast-int8": the same method on another backend
    backend = other or backend
    mode, _, nodes = mode.partition(":")  # "verified_tree:16": a tree of 16 nodes
    groups, drafts = VERIFIED.get(mode, ("all", "mars"))
    cfg = DecodeConfig(mode="verified" if mode in VERIFIED else mode, tau=1.0 if tau is None else tau,
                       block_size=block, cache_block=cache_block, max_new_tokens=max_new, backend=backend,
                       verify_groups=groups, drafts=drafts, tree_nodes=int(nodes or 0), repeat_tau=repeat_tau,
                       datastore=mode == "verified_tree_store")
    if cfg.datastore and getattr(lm, "datastore", None) is None:
        from mars.models.datastore import shipped_store

        lm.datastore = shipped_store()  # the table the decoder drafts from (None: unreadable, masks and text only)
    runs = generate_ids(lm, batch, cfg, backend=runner)
    return [r.token_ids for r in runs], [r.passes for r in runs], RunTotals.of(runs)


def _plan(cfg: BenchConfig):
    """(method, tau) pairs in run order: ar first, so every other run has its baseline."""
    plan = [("ar", None)]
    for m in cfg.methods:
        if m == "mars":
            plan += [("mars", t) for t in cfg.taus]
        elif m in TREES:
            plan += [(f"{m}:{n}", cfg.verify_tau) for n in cfg.tree_nodes]
        elif m.partition(":")[0] in TREES:
            plan.append((m, cfg.verify_tau))
        elif m in VERIFIED:
            plan.append((m, cfg.verify_tau))
        elif m != "ar":
            plan.append((m, None))
    core = [(m, t) for m, t in plan if m not in ("hf", "lookup", "llamacpp")]
    plan += [(f"{m}@{b}", t) for b in cfg.also_backends for m, t in core]
    return plan


def _drop(plan: list, key: tuple, err: Exception, status: dict | None, failed: dict):
    """Take a method that raised out of the run (AR, the baseline, cannot be dropped): its error is reported
    on stderr and in `status["failed"]`, and every other method goes on."""
    if key == ("ar", None):
        raise err
    import sys
    import traceback

    name = key[0] if key[1] is None else f"{key[0]} tau {key[1]}"
    failed[name] = f"{type(err).__name__}: {err}"
    print(f"error: method {name} failed and was dropped from this run: {failed[name]}", file=sys.stderr)
    traceback.print_exception(err, file=sys.stderr)
    plan.remove(key)


def _open_peer(lm, cfg: BenchConfig, ids: list[list[int]], status: dict | None):
    """The llamacpp method's LlamaCppPeer on this process's torch thread count (the core's), or None with its one
    skip line on stderr (and in `status["skipped"]`). Also checks, prompt by prompt, that llama-cpp-python's own
    chat template gives the bench's prompt ids (`status["llamacpp"]`)."""
    import sys

    import torch

    from mars.evaluation.llamacpp import METHOD, LlamaCppPeer, skip_reason

    why = skip_reason(lm)
    if why is not None:
        print(why, file=sys.stderr)
        if status is not None:
            status.setdefault("skipped", {})[METHOD] = why
        return None
    n_ctx = max(len(i) for i in ids) + cfg.max_new_tokens + 8
    try:
        peer = LlamaCppPeer(torch.get_num_threads(), n_ctx, lm.eos_token_ids)
        same = sum(peer.template_ids(p) == i for p, i in zip(cfg.prompts, ids))
    except Exception as e:  # noqa: BLE001 - a peer that cannot open its file costs its own row only
        failed = status.setdefault("failed", {}) if status is not None else {}
        failed[METHOD] = f"{type(e).__name__}: {e}"
        print(f"error: method {METHOD} failed and was dropped from this run: {failed[METHOD]}", file=sys.stderr)
        return None
    if status is not None:
        status["llamacpp"] = {"gguf": peer.path.name, "threads": peer.threads, "template_same_ids": same,
                              "prompts": len(ids)}
    if same < len(ids):
        print(f"warning: llamacpp: its own chat template gives other ids than ours on {len(ids) - same} of "
              f"{len(ids)} prompts; it is fed ours", file=sys.stderr)
    return peer


def run_bench(lm, cfg: BenchConfig, progress=None, status: dict | None = None, runner=None) -> list[Run]:
    """Time every (method, tau) on every batch of prompts.

    runner: what runs the model for the core's methods (decode_steps' `backend`); None: the backend each run
    names (cfg.backend, or the one after "@").

    Ctrl-C stops it early: it returns what every method finished side by side (whole batches), and fills
    `status` (when given) with {"interrupted": bool, "finished": {batch size: prompts done}}.

    A method that raises is dropped from the run (with its partial figures), named in `status["failed"]`
    and on stderr; the others go on. Methods are interleaved batch by batch (all methods on batch 1, then all on batch 2, ...), so a
    background load on the machine falls on all of them alike and the ratios stay fair.
    """
    from mars.decoding.decoder import encode_prompt
    from mars.evaluation.quality import mean_nll, prefix_match

    block = cfg.block_size or lm.default_block_size
    ids = [encode_prompt(lm.tokenizer, p) for p in cfg.prompts]
    runs: list[Run] = []
    failed: dict[str, str] = {}
    if status is not None:
        status.update(interrupted=False, finished={}, total=len(ids), failed=failed, skipped={})
    peer = _open_peer(lm, cfg, ids, status) if "llamacpp" in cfg.methods else None
    for bs in cfg.batch_sizes:
        batches = [ids[i:i + bs] for i in range(0, len(ids), bs)]
        # assisted decoding and llama-cpp-python's one sequence: batch 1 only
        plan = [(m, t) for m, t in _plan(cfg) if not (m in ("lookup", "llamacpp") and bs > 1)
                and not (m == "llamacpp" and peer is None)]

        def call(method, tau, batch):
            if method == "llamacpp":
                return peer.run(batch, cfg.max_new_tokens)
            if method in ("hf", "lookup"):
                return _hf_generate(lm, batch, cfg.max_new_tokens, cfg.lookup_tokens if method == "lookup" else 0)
            return _run_on_the_core(lm, batch, method, tau, block, cfg.cache_block, cfg.max_new_tokens, cfg.backend,
                                    cfg.repeat_tau, runner)

        # warm-up; off the CPU with the whole first batch: the static backend captures a CUDA graph per
        # (batch, width) on first use, which must not land inside the timed runs
        warm = batches[0] if next(lm.model.parameters()).device.type != "cpu" else batches[0][:1]
        for key in list(plan):
            try:
                call(*key, warm)
            except Exception as e:  # noqa: BLE001 - one broken method must not cost the others' figures
                _drop(plan, key, e, status, failed)
        outputs = {key: [] for key in plan}
        forwards = {key: [] for key in plan}
        wall = {key: 0.0 for key in plan}
        totals = {key: RunTotals() for key in plan}
        batch_wall = {key: [] for key in plan}
        interrupted = False
        try:
            for batch in batches:
                done = {}
                for key in list(plan):
                    t0 = time.perf_counter()
                    try:
                        done[key] = call(*key, batch), time.perf_counter() - t0
                    except Exception as e:  # noqa: BLE001 - dropped from every batch, so the rest stay side by side
                        _drop(plan, key, e, status, failed)
                        for done_key in (outputs, forwards, wall, totals, batch_wall):
                            done_key.pop(key, None)
                        continue
                    if progress:
                        progress(*key, bs)
                # counted only once every method has run this batch, so an interrupted run stays side by side
                for key, ((outs, rows, batch_totals), seconds) in done.items():
                    wall[key] += seconds
                    batch_wall[key].append(seconds)
                    outputs[key] += outs
                    forwards[key] += rows
                    totals[key] += batch_totals
        except KeyboardInterrupt:
            interrupted = True
        if status is not None:
            status["finished"][bs] = len(outputs[("ar", None)])
            status["interrupted"] = interrupted
        if not outputs[("ar", None)]:
            if interrupted and not runs:
                raise KeyboardInterrupt  # nothing finished at all
            break
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        ar = outputs[("ar", None)]
        n_done = len(ar)
        for key in plan:
            method, tau = key
            outs, t = outputs[key], totals[key]
            nll = [mean_nll(lm, p, o) for p, o in zip(ids, outs) if o]
            runs.append(Run(
                method, tau, bs, len(outs), t.tokens, t.passes, t.tokens_per_pass, wall[key],
                t.tokens / wall[key], speedup_vs_ar=wall[("ar", None)] / wall[key],
                exact_match_with_ar=sum(a == b for a, b in zip(ar, outs)) / n_done,
                prefix_match_with_ar=sum(prefix_match(a, b) for a, b in zip(ar, outs)) / n_done,
                mean_nll_under_ar=sum(nll) / max(1, len(nll)), peak_rss_mb=rss, outputs=outs,
                input_per_pass=t.input_per_pass,
                row_passes=forwards[key], batch_seconds=batch_wall[key], interrupted=interrupted,
            ))
        if interrupted:
            break
    return runs


def format_table(runs: list[Run]) -> str:
    head = f"{'method':<22}{'tau':>6}{'batch':>6}{'tokens':>8}{'passes':>7}{'tok/pass':>9}{'wall s':>9}{'tok/s':>8}" \
           f"{'vs ar':>7}{'exact':>7}{'prefix':>8}{'nll':>7}{'in/pass':>8}"
    lines = [head, "-" * len(head)]
    for r in runs:
        f = lambda v, fmt: (fmt % v) if v is not None else "-"  # noqa: E731
        lines.append(
            f"{r.method:<22}{f(r.tau, '%.2f'):>6}{r.batch_size:>6}{r.new_tokens:>8}{r.passes:>7}"
            f"{r.tokens_per_pass:>9.2f}{r.wall_s:>9.2f}{r.tokens_per_s:>8.1f}{f(r.speedup_vs_ar, '%.2fx'):>7}"
            f"{f(r.exact_match_with_ar, '%.2f'):>7}{f(r.prefix_match_with_ar, '%.2f'):>8}{f(r.mean_nll_under_ar, '%.3f'):>7}"
            f"{f(r.input_per_pass, '%.1f'):>8}"
        )
    return "\n".join(lines)


def peer_lines(runs: list[Run], backend: str = "auto") -> list[str]:
    """For each batch size where llamacpp ran: its tokens/s beside every core AR run's (ar on `backend`, the
    bench's, and ar@<other backend>), and the ratio of AR's to llama.cpp's (issue 41's goal: int8 core AR at least
    1.4x)."""
    lines = []
    for peer in (r for r in runs if r.method == "llamacpp"):
        for ar in (r for r in runs if r.method.partition("@")[0] == "ar" and r.batch_size == peer.batch_size):
            on = ar.method.partition("@")[2] or backend
            lines.append(f"llamacpp {peer.tokens_per_s:.1f} tokens/s, core AR on {on} {ar.tokens_per_s:.1f} "
                         f"tokens/s at batch {ar.batch_size}: core AR {ar.tokens_per_s / peer.tokens_per_s:.2f}x "
                         f"llama.cpp's tokens/s")
    return lines


def ms_per_pass(run: Run) -> float:
    """Wall milliseconds per forward pass (passes summed over rows, as `Run.passes`)."""
    return 1e3 * run.wall_s / max(1, run.passes)


def narrow_pass_warnings(runs: list[Run]) -> list[str]:
    """A warning line for each backend and batch size where core AR's ms per pass exceeds MARS tau 1.0's in
    this run: an AR pass feeds 1 input per row, a MARS pass 2 or more, so a 1-input pass that costs more means
    the backend's route for narrow passes is the slow one (issue 41: float32's were MKL's, now oneDNN's;
    benchmarks/pass_cost.py measures it by width). Both sides ran in this run, interleaved, so a background
    load falls on both alike; no margin is taken."""
    lines = []
    for ar in runs:
        method, at, backend = ar.method.partition("@")
        if method != "ar":
            continue
        mars = next((r for r in runs if r.method == "mars" + at + backend and r.tau == 1.0
                     and r.batch_size == ar.batch_size), None)
        if mars is None or ms_per_pass(ar) <= ms_per_pass(mars):
            continue
        where = f" on {backend}" if backend else ""
        lines.append(f"warning: core AR ran {ms_per_pass(ar):.1f} ms per pass, MARS tau 1.0 "
                     f"{ms_per_pass(mars):.1f} ms ({ms_per_pass(ar) / ms_per_pass(mars):.2f}x){where} at batch "
                     f"{ar.batch_size}: a 1-input pass costs more than a wider one, a slow route for narrow passes "
                     f"(python -m benchmarks.pass_cost)")
    return lines


def compare_rows(runs: list[Run], a: tuple[str, float | None], b: tuple[str, float | None],
                 kinds: list[str | None] | None = None, batch_size: int = 1) -> list[dict]:
    """Where method a wins and loses against method b, prompt by prompt (tokens per forward of each row).

    Returns one row per prompt kind (kind None: all prompts together when no kinds are known):
    {kind, prompts, a_wins, b_wins, ties, a_tokens_per_pass, b_tokens_per_pass} with the kind's mean tokens per pass.
    """
    pick = {(r.method, r.tau): r for r in runs if r.batch_size == batch_size}
    if a not in pick or b not in pick:
        return []
    ra, rb = pick[a].row_tokens_per_pass, pick[b].row_tokens_per_pass
    kinds = list(kinds or [])[: len(ra)] + [None] * max(0, len(ra) - len(kinds or []))
    rows = []
    for kind in sorted(set(kinds), key=lambda k: (k is None, k or "")):
        idx = [i for i, k in enumerate(kinds) if k == kind]
        xa, xb = [ra[i] for i in idx], [rb[i] for i in idx]
        rows.append({"kind": kind, "prompts": len(idx),
                     "a_wins": sum(x > y + 1e-9 for x, y in zip(xa, xb)),
                     "b_wins": sum(y > x + 1e-9 for x, y in zip(xa, xb)),
                     "ties": sum(abs(x - y) <= 1e-9 for x, y in zip(xa, xb)),
                     "a_tokens_per_pass": sum(xa) / len(xa), "b_tokens_per_pass": sum(xb) / len(xb)})
    return rows


def format_compare(rows: list[dict], a: str, b: str) -> str:
    head = f"{'kind':<14}{'prompts':>8}{a + ' wins':>14}{b + ' wins':>14}{'ties':>6}{a:>12}{b:>12}"
    lines = [f"tokens per forward, prompt by prompt ({a} against {b}):", head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['kind'] or 'all':<14}{r['prompts']:>8}{r['a_wins']:>14}{r['b_wins']:>14}{r['ties']:>6}"
                     f"{r['a_tokens_per_pass']:>12.2f}{r['b_tokens_per_pass']:>12.2f}")
    return "\n".join(lines)


def by_kind(runs: list[Run], kinds: list[str | None], batch_size: int = 1) -> list[dict]:
    """Per prompt kind and method (batch 1: one prompt per batch): tokens per forward and wall time against
    core AR on the same prompts. Returns rows {kind, method, tau, prompts, tokens_per_pass, wall_s, vs_ar}."""
    if batch_size != 1:
        raise ValueError("per-kind wall time needs one prompt per batch")
    runs = [r for r in runs if r.batch_size == 1]
    ar = next((r for r in runs if r.method == "ar"), None)
    if ar is None:
        return []
    rows = []
    for kind in sorted(set(kinds[: ar.prompts]), key=lambda k: (k is None, k or "")):
        idx = [i for i, k in enumerate(kinds[: ar.prompts]) if k == kind]
        ar_wall = sum(ar.batch_seconds[i] for i in idx)
        for r in runs:
            new = sum(len(r.outputs[i]) for i in idx)
            wall = sum(r.batch_seconds[i] for i in idx)
            rows.append({"kind": kind, "method": r.method, "tau": r.tau, "prompts": len(idx),
                         "tokens_per_pass": new / max(1, sum(r.row_passes[i] for i in idx)), "wall_s": wall,
                         "vs_ar": ar_wall / wall if wall else None})
    return rows


def format_by_kind(rows: list[dict]) -> str:
    """One line per kind: each method's tokens per forward and speed against core AR."""
    methods = list(dict.fromkeys((r["method"], r["tau"]) for r in rows))
    name = lambda m, t: m if t is None or m.startswith("verified") else f"{m}@{t:g}"  # noqa: E731
    head = f"{'kind':<14}{'n':>3}" + "".join(f"{name(m, t):>22}" for m, t in methods)
    lines = ["tokens per forward / speed vs core AR, by kind (batch 1):", head, "-" * len(head)]
    for kind in dict.fromkeys(r["kind"] for r in rows):
        mine = {(r["method"], r["tau"]): r for r in rows if r["kind"] == kind}
        n = next(iter(mine.values()))["prompts"]
        cells = "".join(f"{mine[k]['tokens_per_pass']:>14.2f} {mine[k]['vs_ar']:>6.2f}x" for k in methods)
        lines.append(f"{kind or 'all':<14}{n:>3}{cells}")
    return "\n".join(lines)


def to_json(lm, cfg: BenchConfig, runs: list[Run], kinds: list[str | None] | None = None) -> dict:
    import torch

    return {
        "model": lm.name,
        "adapter": lm.adapter,
        "block_size": cfg.block_size or lm.default_block_size,
        "machine": {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
                    "torch": torch.__version__, "device": str(lm.model.device), "dtype": str(lm.model.dtype),
                    "gpu": torch.cuda.get_device_name() if lm.model.device.type == "cuda" else None},
        "max_new_tokens": cfg.max_new_tokens,
        "backend": cfg.backend,
        "also_backends": list(cfg.also_backends),
        "repeat_tau": cfg.repeat_tau,
        "interrupted": any(r.interrupted for r in runs),
        "kinds": list(kinds) if kinds else None,
        "by_kind": by_kind(runs, kinds) if kinds and any(r.batch_size == 1 for r in runs) else None,
        "runs": [{**{k: v for k, v in asdict(r).items() if k != "outputs"},
                  "row_new_tokens": [len(o) for o in r.outputs]} for r in runs],
    }
