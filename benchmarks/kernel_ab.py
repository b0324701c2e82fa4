"""The int8 C kernels of two commits, side by side in one process, on the real pass of the default model.

Builds the kernels' C sources (mars/runtime/csrc/) as they are at each git revision (plus optional -D flags), loads each
library, and times the default model's (or --model's) int8 pass (the C layer loop and the LM head) with each in turn, width
by width and round by round, so that a change in the machine's load falls on all. Inputs after the first are
the mask token (the gated adapter's rows), or real tokens with `--bare`. Prints the median ms per pass and its
ratio to the first variant's 1-input pass.

    python -m benchmarks.kernel_ab HEAD~1 HEAD                  # did the last commit make a pass cheaper?
    python -m benchmarks.kernel_ab HEAD HEAD:-DSOME_FLAG --bare  # a compile-time variant
    python -m benchmarks.kernel_ab HEAD --stages --widths 1 7     # where a pass's time goes, per step

`--stages` builds every variant with -DMARS_STAGES (timers around each step of the C layer loop; they cost
~0.1 ms a pass) and prints each step's mean microseconds per pass; "rest" is the pass outside the loop (the
embedding, the LM head and its scoring, the Python around them).
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
CSRC = "mars/runtime/csrc"  # the kernels' sources, relative to the repository root
STAGES = ("norm1", "qkv", "attention", "quant o", "o", "norm2", "gate_up", "silu", "down",  # mars_layers' steps
          "(A wait)", "(products)", "(lora B)", "(lora A)")  # inside the products (AMX), thread 0: part of the steps above


def source_at(rev: str, folder: Path) -> Path:
    """The C sources (mars/runtime/csrc/) as of git revision `rev`, written into `folder`; returns it. Revisions
    before the sources were files (the C in Python strings) are refused."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)

    listed = git("ls-tree", "--name-only", f"{rev}:{CSRC}")
    if listed.returncode != 0 or "mars_kernels.h" not in listed.stdout.split():
        raise SystemExit(f"{rev}: no {CSRC}/mars_kernels.h at this revision (before the C became files in "
                         f"{CSRC}/, or not a revision): kernel_ab builds revisions from then on")
    folder.mkdir(parents=True)
    for name in listed.stdout.split():
        shown = git("show", f"{rev}:{CSRC}/{name}")
        if shown.returncode != 0:
            raise SystemExit(f"{rev}: git show {CSRC}/{name} failed: {shown.stderr.strip()}")
        (folder / name).write_text(shown.stdout)
    return folder


def build(variant: str, folder: Path, i: int):
    """'REV' or 'REV:-DFLAG -DOTHER' -> the loaded library, built with the kernels' own build (flags, cache key)
    and declared from the header of the same revision."""
    import mars.runtime.kernels as ck
    from mars.runtime.c_header import parse

    rev, _, flags = variant.partition(":")
    src = source_at(rev, folder / f"v{i}")
    got = ck.build(src, out_dir=src, extra_flags=flags.split(), header=parse((src / "mars_kernels.h").read_text()))
    if got.lib is None:
        raise SystemExit(f"{variant}: {got.why}")
    return got.lib


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("variants", nargs="+", help="git revisions, each optionally with :<compiler flags>")
    ap.add_argument("--widths", type=int, nargs="+", default=[1, 2, 3, 4, 6])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bare", action="store_true", help="real tokens only: no gated adapter rows")
    ap.add_argument("--stages", action="store_true", help="time each step of the C layer loop (see above)")
    ap.add_argument("--model", default=None, help="Hub id or folder (default: the embedded SmolLM2-135M-Instruct)")
    args = ap.parse_args(argv)
    if args.stages:
        args.variants = [v if ":" in v else v + ":" for v in args.variants]
        args.variants = [v + " -DMARS_STAGES" for v in args.variants]
    torch.set_num_threads(args.threads)
    from mars.runtime.backends import FastBackend
    from mars.runtime.fastpath import fast_model
    from mars.models.loading import load

    folder = Path(tempfile.mkdtemp(prefix="kernel-ab-"))
    libs = {v: build(v, folder, i) for i, v in enumerate(args.variants)}
    lm = load(args.model, adapter="none" if args.bare else "auto")
    vocab = lm.model.config.vocab_size
    be = FastBackend(fast_model(lm.model, torch.int8), 1, args.prompt_len + max(args.widths) + 1)
    if be.lm.c_layers is None:
        raise SystemExit("the C layer loop does not run here (no C compiler, or MARS_C_LAYERS=0)")
    P = args.prompt_len
    g = torch.Generator().manual_seed(0)
    be.forward(torch.randint(100, vocab, (1, P), generator=g), torch.arange(P)[None],
               torch.tril(torch.ones(P, P, dtype=torch.bool))[None], [P - 1])
    times = {(v, W): [] for v in libs for W in args.widths}
    stages = {(v, W): [0.0] * len(STAGES) for v in libs for W in args.widths}
    buf = (ctypes.c_double * len(STAGES))()
    for r in range(args.rounds + 1):  # round 0 warms up
        for W in args.widths:
            ids = torch.randint(100, vocab, (1, W), generator=g)
            if not args.bare:
                ids[0, 1:] = lm.mask_token_id
            pos = torch.arange(P, P + W)[None]
            allowed = torch.ones(1, W, P + W, dtype=torch.bool)
            allowed[0, :, P:] = torch.tril(torch.ones(W, W, dtype=torch.bool))
            for v in (args.variants if r % 2 else args.variants[::-1]):  # alternate who goes first
                be.lm.c_layers.lib = be.lm.head._lib = libs[v]
                t0 = time.perf_counter()
                be.forward(ids, pos, allowed, list(range(W)))
                dt = time.perf_counter() - t0
                be.truncate(P)
                got = libs[v].mars_stages(buf) if args.stages else 0
                if r:
                    times[(v, W)].append(dt)
                    for i in range(got):
                        stages[(v, W)][i] += buf[i] / args.rounds
    base = statistics.median(times[(args.variants[0], args.widths[0])])
    print(f"ms per pass (median of {args.rounds}), {'bare' if args.bare else 'inputs after the first are masks'}, "
          f"{args.threads} threads, {P} cached tokens; ratio to the first variant's W={args.widths[0]}")
    for v in args.variants:
        cells = [f"W{W} {1e3 * statistics.median(times[(v, W)]):5.2f} ({statistics.median(times[(v, W)]) / base:.2f})"
                 for W in args.widths]
        print(f"{v:<28}" + "  ".join(cells))
    if args.stages:
        print("\nmicroseconds per pass by step (mean), per variant and width:")
        print(f"{'step':<12}" + "".join(f"{v.split(':')[0] + ' W' + str(W):>14}" for v in libs for W in args.widths))
        for i, name in enumerate(STAGES + ("rest",)):
            cells = []
            for v in libs:
                for W in args.widths:
                    row = stages[(v, W)]
                    us = 1e6 * (statistics.mean(times[(v, W)]) - sum(row[:9]) if i == len(STAGES) else row[i])
                    cells.append(f"{us:14.0f}")
            print(f"{name:<12}" + "".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
