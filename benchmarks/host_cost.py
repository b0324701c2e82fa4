"""Host time per decoding step, per mode: the decoder's own work with a forward pass that costs ~nothing.

On a GPU a pass costs about the same at any width (2.1-2.6 ms on an H200, docs/gpu.md), so what a MARS,
verified or tree step adds over an AR step is host work: windows, masks, positions, acceptance, records,
tree growth. This measures exactly that on the CPU: the model is replaced by a stub whose forward gathers
precomputed logits (a few microseconds), so wall time / passes is the decoder's host time per step.

The stub is a "model" with a hidden text per row: a real input at position p predicts that text's token
p+1 (confidently), a mask at position p predicts it too, but only some of the time and with a varying
confidence (otherwise a random token): drafts are sometimes right, sometimes wrong, as with a trained
adapter. The text repeats phrases, so n-gram lookup finds copies. Vocabulary: the tests' tiny tokenizer.

Backends: `stub` (the decoder alone), `static` (the same stub behind mars.runtime.static.StaticBackend's
host side: padding, the full-width mask, the gather of the kept logits; its model call replaced) and `device`
(the device step, mars.decoding.device_step, backend "static-device", over the same stub: `StubStepRunner`).
For the device step, "host us" leaves out the step's own tensor ops (on a GPU one graph replay per step, on
the CPU run eagerly): what remains is the host's work per step, the read every k steps included. Every row
also counts device-to-host reads per step (`HostReads`); the host loop reads the device several times a pass.

    python -m benchmarks.host_cost                    # this tree, every mode, batch 1 and 8
    python -m benchmarks.host_cost --compare /tmp/old  # old tree vs this one, interleaved
    python -m benchmarks.host_cost --modes tree:32 --batches 1 --profile   # where the time goes

--compare runs this script on each tree in turn (a fresh process, PYTHONPATH set to the tree, then this
one's for `tests.tiny` and this file's package), round by round, and prints ms per step side by side with the ratio old / new (median over rounds).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
import weakref
import zlib
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# name -> DecodeConfig fields, as the benchmark runs them (mars.evaluation.bench: VERIFIED, verify_tau 0)
MODES = {
    "ar": dict(mode="ar", tau=1.0),
    "mars:0.9": dict(mode="mars", tau=0.9),
    "mars:0.7": dict(mode="mars", tau=0.7),
    "verified": dict(mode="verified", tau=0.0, verify_groups="all", drafts="mars"),
    "verified_last": dict(mode="verified", tau=0.0, verify_groups="last", drafts="mars"),
    "verified_both": dict(mode="verified", tau=0.0, verify_groups="last", drafts="both"),
    "tree:16": dict(mode="verified", tau=0.0, verify_groups="all", drafts="both", tree_nodes=16),
    "tree:32": dict(mode="verified", tau=0.0, verify_groups="all", drafts="both", tree_nodes=32),
    # the device step's trees (mars.decoding.static_tree): mask drafts only (lookup runs on the host)
    "tree_mars:16": dict(mode="verified", tau=0.0, verify_groups="all", drafts="mars", tree_nodes=16),
    "tree_mars:64": dict(mode="verified", tau=0.0, verify_groups="all", drafts="mars", tree_nodes=64),
}
BACKENDS = ("stub", "static", "device")  # the host loop on the stub, on StaticBackend's host side; the device step
MAX_POS = 512


class StubLM:
    """Precomputed logits per (row, position), for real inputs and for masks: (rows, MAX_POS, V) each."""

    def __init__(self, vocab: int, mask_id: int, rows: int, seed: int = 0, first_word: int = 5):
        g = torch.Generator().manual_seed(seed)
        words = torch.arange(first_word, vocab)  # no special token (no EOS: every run goes to its length)
        phrases = [words[torch.randint(len(words), (int(n),), generator=g)]
                   for n in torch.randint(2, 6, (12,), generator=g)]
        texts = []
        for _ in range(rows):  # each row's hidden text: phrases, and now and then a random word
            parts, n = [], 0
            while n < MAX_POS + 1:
                if torch.rand((), generator=g) < 0.3:
                    parts.append(words[torch.randint(len(words), (1,), generator=g)])
                else:
                    parts.append(phrases[int(torch.randint(len(phrases), (), generator=g))])
                n += len(parts[-1])
            texts.append(torch.cat(parts)[: MAX_POS + 1])
        self.texts = torch.stack(texts)  # (rows, MAX_POS + 1)
        nxt = self.texts[:, 1:]  # (rows, MAX_POS): the token after each position
        noise = torch.randn(rows, MAX_POS, vocab, generator=g)
        self.real = noise.clone()
        self.real.scatter_(-1, nxt[..., None], 12.0)  # AR: confident and right
        self.mask = noise * 1.5
        right = torch.rand(rows, MAX_POS, generator=g) < 0.6
        guess = torch.where(right, nxt, torch.randint(first_word, vocab, (rows, MAX_POS), generator=g))
        self.mask.scatter_(-1, guess[..., None], (4.0 + 8.0 * torch.rand(rows, MAX_POS, 1, generator=g)))
        self.mask_id = mask_id

    def logits(self, rows: list[int], ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """(b, W, V) for the given original rows' inputs."""
        r = torch.tensor(rows)[:, None].expand_as(positions)
        p = positions.clamp(0, MAX_POS - 1)
        return torch.where((ids == self.mask_id)[..., None], self.mask[r, p], self.real[r, p])


class StubBackend:
    """The decoder's backend interface (mars.runtime.backends) over StubLM: forward costs a gather."""

    def __init__(self, stub: StubLM, batch: int):
        self.stub, self.rows, self.length = stub, list(range(batch)), 0

    def forward(self, ids, positions, allowed, keep):
        self.length += ids.shape[1]
        return _mark(self.stub.logits(self.rows, ids, positions))[:, keep]

    def truncate(self, n):
        self.length = n

    def select(self, rows):
        self.rows = [self.rows[i] for i in rows]


def static_stub_backend(stub: StubLM, batch: int, capacity: int):
    """mars.runtime.static.StaticBackend with its model call replaced by the stub: its host side, as it runs."""
    from mars.runtime import static

    class FakeState:
        def __init__(self, b, cap):
            self.batch, self.capacity, self.length, self.graphs = b, cap, 0, {}
            self.k = self.v = torch.zeros(1, b, 1, cap + static.WIDTHS[-1], 1)

        @property
        def columns(self):
            return self.k.shape[3]

    class FakeSLM:
        device = torch.device("cpu")
        graphs_on = False
        max_positions = MAX_POS
        mask_token_id = stub.mask_id

        def __init__(self):
            self.shapes = set()

        def acquire(self, b, cap):
            return FakeState(b, cap)

        def release(self, state):
            pass

        def run(self, state, ids, pos, allowed, cols, gated):
            b = len(be.rows_of)
            out = torch.zeros(ids.shape + (stub.real.shape[-1],))
            out[:b] = stub.logits(be.rows_of, ids[:b], pos[:b])
            return _mark(out)

    be = static.StaticBackend.__new__(static.StaticBackend)
    import weakref

    be.slm = FakeSLM()
    be.state = be.slm.acquire(static.bucket(batch, static.BATCHES) or batch, static.round_capacity(capacity))
    be.rows = batch
    be.rows_of = list(range(batch))
    be._finalizer = weakref.finalize(be, lambda: None)
    be.pad_id = 0
    plain_select = static.StaticBackend.select

    def select(rows):
        be.rows_of = [be.rows_of[i] for i in rows]
        plain_select(be, rows)

    be.select = select
    return be


class StubStepRunner:
    """The device step's runner (mars.runtime.step_runner.StepRunner's verbs) over StubLM: its pass is the stub's
    gather, so a step's time is the device step's own tensor ops (each a kernel launch on a GPU run eagerly,
    none beyond one replay when captured). `in_step` adds up the seconds spent inside the steps: the rest of
    a run's time is the host loop around them."""

    def __init__(self, stub: StubLM, batch: int):
        from mars.runtime.static import BATCHES, bucket

        self.stub, self.device = stub, torch.device("cpu")
        self.batch = bucket(batch, BATCHES) or batch
        self.rows = [min(i, stub.real.shape[0] - 1) for i in range(self.batch)]  # padding rows: any stub row
        self.in_step = 0.0
        self.steps = 0

    def forward(self, ids, positions, allowed, cols, gated):
        return _mark(self.stub.logits(self.rows, ids, positions))

    def run(self, key, step):
        t0 = time.perf_counter()
        step()
        self.in_step += time.perf_counter() - t0
        self.steps += 1


class HostReads:
    """Counts device-to-host reads: the tensor operations whose result the host must wait for. On a GPU each
    waits for the device to finish everything queued before it; on the CPU they are counted all the same.

    Counted: `.tolist()` and `.numpy()` (patched: they bypass the dispatcher), and every op that makes a Python
    number of a tensor (`aten._local_scalar_dense`: .item(), bool(), int(), float(), indexing a list with a
    tensor) or whose output shape depends on the values (nonzero, masked_select, unique, indexing by a bool
    mask): a GPU must finish them before the host can go on."""

    SYNCING = ("aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten._unique",
               "aten.unique", "aten.repeat_interleave.Tensor")

    def __init__(self):
        self.n = 0
        self.where: dict[str, int] = {}

    def _count(self, what: str):
        self.n += 1
        self.where[what] = self.where.get(what, 0) + 1

    def __enter__(self):
        counter = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                name = str(func)
                if name.startswith(HostReads.SYNCING) or (
                        name.startswith("aten.index.Tensor")
                        and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] or ()) if i is not None)):
                    counter._count(name)
                return func(*args, **(kwargs or {}))

        self._plain = torch.Tensor.tolist, torch.Tensor.numpy

        def tolist(t, *a, **k):
            counter._count("tolist")
            return self._plain[0](t, *a, **k)

        def numpy(t, *a, **k):
            counter._count("numpy")
            return self._plain[1](t, *a, **k)

        torch.Tensor.tolist, torch.Tensor.numpy = tolist, numpy
        self._mode = Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)
        torch.Tensor.tolist, torch.Tensor.numpy = self._plain
        return False


def prompts_for(batch: int, vocab: int, seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(5, vocab, (int(n),), generator=g).tolist()
            for n in torch.randint(20, 40, (batch,), generator=g)]


class OpCounter(TorchDispatchMode):
    """Counts the tensor operations run: all of them (`n`), and those on the logits or on anything computed
    from them (`on_logits`): where the logits live on a GPU, each of those is a kernel launch, the host's
    cost of scoring and accepting there. The stub marks the logits it returns (`OpCounter.mark`)."""

    active: "OpCounter | None" = None

    def __init__(self):
        super().__init__()
        self.n = self.on_logits = 0
        self.marked: dict[int, weakref.ref] = {}

    def mark(self, t: torch.Tensor):
        key = id(t)
        self.marked[key] = weakref.ref(t, lambda _, k=key: self.marked.pop(k, None))

    def _is_marked(self, x) -> bool:
        ref = self.marked.get(id(x))
        return ref is not None and ref() is x

    def __enter__(self):
        OpCounter.active = self
        return super().__enter__()

    def __exit__(self, *exc):
        OpCounter.active = None
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        out = func(*args, **(kwargs or {}))
        flat = [*args, *(kwargs or {}).values()]
        flat += [y for x in flat if isinstance(x, (list, tuple)) for y in x]
        if any(isinstance(x, torch.Tensor) and self._is_marked(x) for x in flat):
            self.on_logits += 1
            for y in (out if isinstance(out, (list, tuple)) else [out]):
                if isinstance(y, torch.Tensor):
                    self.mark(y)
        return out


def _mark(t: torch.Tensor) -> torch.Tensor:
    if OpCounter.active is not None:
        OpCounter.active.mark(t)
    return t


def run_once(lm, stub, backend: str, mode: str, batch: int, max_new: int, block: int, count_ops: bool = False,
             count_reads: bool = False, steps_per_read: int = 4):
    """(ms per step, passes, tensor ops per step or None, the records, extras) of one decode with a stub forward.
    The stub's own forward is counted too (a gather: a handful of ops per pass). extras: `reads` (device reads
    per step, with count_reads) and, for the device step, `step_ms` (ms per step inside the steps)."""
    from mars.decoding.decoder import DecodeConfig, generate_ids

    runners = []

    def make(model, cfg, b, capacity, scratch=None):  # the decoder's backend: the stub
        if backend == "device":
            runners.append(StubStepRunner(stub, b))
            return runners[-1]
        return StubBackend(stub, b) if backend == "stub" else static_stub_backend(stub, b, capacity)

    fields = dict(MODES[mode], backend="static-device", steps_per_read=steps_per_read) if backend == "device" \
        else MODES[mode]
    cfg = DecodeConfig(block_size=block, max_new_tokens=max_new, **fields)
    prompts = prompts_for(batch, len(lm.tokenizer))
    from mars.decoding import masks

    for name in dir(masks):  # a cold start: no shape kept from an earlier run of the same prompts
        if hasattr(getattr(masks, name), "cache_clear"):
            getattr(masks, name).cache_clear()
    counter = OpCounter() if count_ops else contextlib.nullcontext()
    reads = HostReads() if count_reads else contextlib.nullcontext()
    t0 = time.perf_counter()
    with counter, reads:
        runs = generate_ids(lm, prompts, cfg, backend=make)
    dt = time.perf_counter() - t0
    passes = len({s.pass_index for r in runs for s in r.steps})
    # what must not change: every record's fields but its wall time
    records = [[{k: v for k, v in s.to_dict().items() if k != "seconds"} for s in r.steps] for r in runs]
    ops = (counter.n / passes, counter.on_logits / passes) if count_ops else None
    extras = {}
    if count_reads:
        extras["reads"] = reads.n / passes
    if runners:
        extras["step_ms"] = 1e3 * runners[0].in_step / passes
        extras["steps_run"] = runners[0].steps  # the last read's k steps may run past the end
    return 1e3 * dt / passes, passes, ops, records, extras


def supports(backend: str, mode: str) -> bool:
    """The device step runs greedy ar, mars and verified with mask drafts (mars.decoding.device_loop), in a
    tree that has it (--compare against an older one: its rows are left out)."""
    if backend != "device":
        return True
    import importlib.util

    return importlib.util.find_spec("mars.decoding.device_loop") is not None and \
        MODES[mode].get("drafts", "mars") == "mars"


def worker(args) -> dict:
    from tests.tiny import make_loaded

    import mars

    torch.set_num_threads(1)
    lm = make_loaded()
    stub = StubLM(len(lm.tokenizer), lm.mask_token_id, max(8, *args.batches))
    out = {"tree": str(Path(mars.__file__).parent.parent)}  # the tree the decoder was imported from
    for batch in args.batches:
        for mode in args.modes:
            for backend in args.backends:
                if not supports(backend, mode):
                    continue
                run_once(lm, stub, backend, mode, batch, 16, args.block)  # warm-up
                times, step_ms = [], []
                for _ in range(args.repeats):
                    ms, passes, _, ids, extras = run_once(lm, stub, backend, mode, batch, args.max_new, args.block)
                    times.append(ms)
                    step_ms.append(extras.get("step_ms", 0.0))
                ops = run_once(lm, stub, backend, mode, batch, args.max_new, args.block, count_ops=True)[2]
                reads = run_once(lm, stub, backend, mode, batch, args.max_new, args.block, count_reads=True)[4]["reads"]
                best = min(range(len(times)), key=times.__getitem__)
                out[f"{mode}|{batch}|{backend}"] = dict(ms=times[best], step_ms=step_ms[best], passes=passes,
                                                        ops=ops[0], dev=ops[1], reads=reads,
                                                        digest=zlib.crc32(json.dumps(ids).encode()))
    return out


def profile(args):
    import cProfile
    import pstats

    from tests.tiny import make_loaded

    torch.set_num_threads(1)
    lm = make_loaded()
    stub = StubLM(len(lm.tokenizer), lm.mask_token_id, max(args.batches))
    pr = cProfile.Profile()
    pr.enable()
    for batch in args.batches:
        for mode in args.modes:
            for backend in args.backends:
                if supports(backend, mode):
                    run_once(lm, stub, backend, mode, batch, args.max_new, args.block)
    pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(args.top)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=list(BACKENDS))
    ap.add_argument("--max-new", type=int, default=96)
    ap.add_argument("--block", type=int, default=4, help="block size (the shipped adapter's: 4)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per cell in a process; the fastest counts")
    ap.add_argument("--rounds", type=int, default=3, help="--compare: processes per tree, alternating")
    ap.add_argument("--compare", default=None, help="another tree (e.g. a git worktree of an old commit)")
    ap.add_argument("--profile", action="store_true", help="cProfile the runs instead of timing them")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--json", action="store_true", help="(internal) print the worker's result as JSON")
    args = ap.parse_args(argv)
    if args.profile:
        profile(args)
        return 0
    if args.json:
        print(json.dumps(worker(args)))
        return 0
    here = Path(__file__).resolve().parent.parent
    trees = {"old": Path(args.compare).resolve(), "new": here} if args.compare else {"this": here}
    passthrough = [a for a in (argv if argv is not None else sys.argv[1:])]
    if "--compare" in passthrough:
        i = passthrough.index("--compare")
        del passthrough[i:i + 2]
    results = {name: [] for name in trees}
    for _ in range(args.rounds if args.compare else 1):
        for name, tree in trees.items():
            # by file, not -m: the caller's folder must not come before `tree` on the path; `mars` from `tree`
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), str(here)]))
            proc = subprocess.run([sys.executable, __file__, *passthrough, "--json"], env=env,
                                  capture_output=True, text=True, check=True)
            results[name].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    for name, tree in trees.items():
        assert all(r.pop("tree") == str(tree) for r in results[name]), f"{name}: mars imported from another tree"
    keys = [k for k in results[next(iter(trees))][0] if all(k in results[n][0] for n in trees)]
    print(f"host ms per decoding step (passes), stub forward, 1 thread, {args.max_new} new tokens, block {args.block}"
          + (f"; median over {args.rounds} alternating processes per tree" if args.compare else ""))
    print("  ops: tensor ops per step (each a kernel launch on a GPU run eagerly); logit-ops: those on the logits;"
          " host us: per step, outside the device step's own tensor ops (the host loop: all of it);"
          " reads: device-to-host reads per step (HostReads)")
    head = f"{'mode':<15}{'batch':>6} {'backend':<8}" + "".join(
        f"{n + ' ms (passes) ops logit-ops host-us reads':>50}" for n in trees)
    print(head + ("   old/new  same records" if args.compare else ""))
    for k in keys:
        mode, batch, backend = k.split("|")
        cells = {n: statistics.median(r[k]["ms"] for r in results[n]) for n in trees}
        host = {n: 1e3 * statistics.median(r[k]["ms"] - r[k].get("step_ms", 0.0) for r in results[n]) for n in trees}
        line = f"{mode:<15}{batch:>6} {backend:<8}" + "".join(
            f"{cells[n]:15.3f} ({results[n][0][k]['passes']:>4}) {results[n][0][k]['ops']:5.0f} "
            f"{results[n][0][k]['dev']:5.1f} {host[n]:8.0f} {results[n][0][k].get('reads', 0.0):5.2f}"
            for n in trees)
        if args.compare:
            same = results["old"][0][k]["digest"] == results["new"][0][k]["digest"]
            line += f"   {cells['old'] / cells['new']:6.2f}x  {'yes' if same else 'NO'}"
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
