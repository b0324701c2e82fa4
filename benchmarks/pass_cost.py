"""Cost of one forward pass against the number of inputs in it, per backend: is a MARS pass cheap?

A MARS pass at block size B feeds the accepted tokens plus B-1 masks, so it carries 2 to 2B-1 inputs where
an AR pass carries 1. MARS wins wall-clock only if it accepts more tokens per pass than a W-input pass
costs relative to a 1-input pass. This prints that cost ratio, by pass width, for each backend.

Each pass runs against a cached prefix of --prompt-len tokens, reads the logits of every input (as MARS
does), then drops its KV. Backends and widths are interleaved round by round in one process, so a
background load on the machine falls on all of them alike; the median and the minimum over rounds are
reported. `fast:<layout>` runs the fast path with one matrix layout (mars.runtime.fastpath.LAYOUTS): `linear`
(the model's own matrices, MKL), `packed` (oneDNN-packed copies), `auto` (packed where oneDNN runs, else linear).

    python -m benchmarks.pass_cost --threads 1
    python -m benchmarks.pass_cost --backends hf fast fast:linear fast:packed fast-bf16 floor --rounds 20
    python -m benchmarks.pass_cost --backends fast --adapter runs/compare/gated --masks --widths 1 5   # a gated adapter's cost
    python -m benchmarks.pass_cost --threads 2 --backends fast fast-int8 floor floor-int8 --widths 1 2 5 8
    python -m benchmarks.pass_cost --backends fast static --widths 1 4 7 8   # the fixed-shape path (mars.runtime.static)
    python -m benchmarks.pass_cost --threads 2 --backends fast fast-int8-ops fast-int8 --widths 1 2 4 7   # the C layers
    python -m benchmarks.pass_cost --threads 2 --backends fast-int8 --widths 1 5 9 --batch 4   # 4 rows a pass
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from benchmarks import machine_probe
from mars.runtime.backends import WEIGHT_DTYPES, FastBackend, HFBackend
from mars.runtime.fastpath import fast_model


class Floor:
    """Only the pass's matrix products, run by the fast path's own kernels (the packed fused copies), LM head
    included: the time to stream the weights once, the floor under any exact float32 pass of this width. The gap between `fast` and this row is its overhead."""

    def __init__(self, model, weight_dtype: torch.dtype | None = None):
        from mars.runtime.fastpath import FastLM

        fast = FastLM(model, weight_dtype)
        self.mats = [m for layer in fast.layers for m in (layer.qkv, layer.o, layer.gate_up, layer.down)]
        self.mats.append(fast.head)
        self.hidden = model.config.hidden_size
        self.inter = model.config.intermediate_size

    def forward(self, ids, pos, allowed, keep):
        W = ids.shape[1]
        h, i = torch.randn(1, W, self.hidden), torch.randn(1, W, self.inter)
        with torch.inference_mode():
            for k, mat in enumerate(self.mats):
                mat(i if k % 4 == 3 and k < len(self.mats) - 1 else h)  # down_proj reads the MLP width

    def truncate(self, n):
        pass


def make(model, name: str, capacity: int, batch: int = 1):
    """'hf', 'floor', 'floor-int8' (int8 matrices' products only), 'fast', 'fast-bf16', 'fast-int8', 'static',
    'fast-int8-ops' (int8 without the C layer loop: the per-layer tensor ops and SDPA), or 'fast:<layout>' /
    'fast-bf16:<layout>' to compare matrix layouts."""
    if name == "hf":
        return HFBackend(model)
    if name == "static":
        from mars.runtime.static import StaticBackend

        return StaticBackend(model, batch, capacity)
    if name in ("floor", "floor-int8"):
        return Floor(model, torch.int8 if name == "floor-int8" else None)
    if name == "fast-int8-ops":
        return FastBackend(fast_model(model, torch.int8, c_layers=False), batch, capacity)
    base, _, layout = name.partition(":")
    return FastBackend(fast_model(model, WEIGHT_DTYPES.get(base), layout or "auto"), batch, capacity)


def measure(model, backends: list[str], widths: list[int], rounds: int, prompt_len: int, seed: int = 0,
            mask_id: int | None = None, batch: int = 1, clock=time.perf_counter) -> dict:
    """ms per pass for every backend and width: {"median": {backend: {W: ms}}, "min": ...}.

    `model` may be a dict {suffix: model} (e.g. the bare model and one with an adapter): every backend then
    runs on each, named backend + suffix. `mask_id`: every window input after the first is the mask token,
    as in a MARS pass (a gated adapter acts at those rows only). `batch`: each pass feeds that many rows of W
    inputs (every row its own prompt), as a batched decode does. `clock`: time.perf_counter (wall), or
    time.process_time (the process's CPU seconds: on a machine other processes load, with one thread)."""
    models = model if isinstance(model, dict) else {"": model}
    g = torch.Generator().manual_seed(seed)
    vocab = next(iter(models.values())).config.vocab_size
    device = next(next(iter(models.values())).parameters()).device
    prompt = torch.randint(100, vocab, (batch, prompt_len), generator=g).to(device)
    runs = {}
    for suffix, m in models.items():
        for name in backends:
            be = make(m, name, prompt_len + max(widths) + 1, batch)
            causal = torch.tril(torch.ones(prompt_len, prompt_len, dtype=torch.bool, device=device))[None]
            be.forward(prompt, torch.arange(prompt_len, device=device).expand(batch, -1), causal.expand(batch, -1, -1),
                       [prompt_len - 1])
            runs[name + suffix] = be
    backends = list(runs)
    inputs = {}
    for W in widths:
        ids = torch.randint(100, vocab, (batch, W), generator=g)
        if mask_id is not None:
            ids[:, 1:] = mask_id
        pos = torch.arange(prompt_len, prompt_len + W).expand(batch, -1)
        allowed = torch.ones(batch, W, prompt_len + W, dtype=torch.bool)
        allowed[:, :, prompt_len:] = torch.tril(torch.ones(W, W, dtype=torch.bool))
        ids, pos, allowed = ids.to(device), pos.to(device), allowed.to(device)
        inputs[W] = (ids, pos, allowed, list(range(W)))
    times = {(n, W): [] for n in backends for W in widths}
    for r in range(rounds + 1):  # round 0 warms up every kernel
        for W in widths:
            for name, be in runs.items():
                t0 = clock()
                out = be.forward(*inputs[W])
                if out is not None and out.is_cuda:  # a GPU runs ahead of the host: time the pass, not its launch
                    torch.cuda.synchronize()
                dt = clock() - t0
                be.truncate(prompt_len)
                if r:
                    times[(name, W)].append(dt)
    return {stat: {name: {W: 1e3 * fn(times[(name, W)]) for W in widths} for name in backends}
            for stat, fn in (("median", statistics.median), ("min", min))}


# A narrower pass may cost up to this times a wider one before it counts as a slow route. The worst
# narrow/wider ratio (min of 10 rounds, 2 threads, widths 1 2 5 9, default model) of the fixed code: 0.75-1.01
# over 12 tables on a quiet 2-core machine, 0.92-1.21 over 8 under another process's full load (1.15 and 1.21
# where a load spike hit); the slow route of issue 41 (float32's 2-input pass on MKL): 1.57-1.86 in every
# table, quiet or loaded.
MARGIN = 1.3


def costlier_than_wider(row: dict[int, float], margin: float = MARGIN) -> list[tuple[int, int, float]]:
    """(W, wider W', cost ratio) wherever a W-input pass costs more than `margin` times a wider one's: a pass
    reads the same weights whatever its width, so a narrower one costing more is a slow route for its width
    (issue 41: float32's 1- and 2-input passes on MKL)."""
    ws = sorted(row)
    return [(w, v, row[w] / row[v]) for i, w in enumerate(ws) for v in ws[i + 1:] if row[w] > margin * row[v]]


def format_table(result: dict, widths: list[int]) -> str:
    head = f"{'backend':<24}" + "".join(f"{'W=' + str(W):>16}" for W in widths)
    lines = [head, "-" * len(head)]
    for name, row in result.items():
        base = row[widths[0]]
        lines.append(f"{name:<24}" + "".join(f"{row[W]:8.1f}ms {row[W] / base:4.2f}x" for W in widths))
    ref = result.get("hf")
    if ref:
        lines.append("")
        lines.append("hf time / backend time, same width:")
        for name, row in result.items():
            if name != "hf":
                lines.append(f"{name:<24}" + "".join(f"{ref[W] / row[W]:15.2f}x" for W in widths))
    with_adapter = [n for n in result if "+adapter" in n]
    if with_adapter:
        lines += ["", "with the adapter / bare, same backend and width:"]
        for name in with_adapter:
            bare = result[name.split("+adapter")[0]]
            lines.append(f"{name:<24}" + "".join(f"{result[name][W] / bare[W]:15.2f}x" for W in widths))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="Hub id or folder (default: the embedded SmolLM2-135M-Instruct)")
    ap.add_argument("--dtype", default=None, help="default: float32 on the CPU, bfloat16 on CUDA")
    ap.add_argument("--backends", nargs="+", default=["hf", "fast", "fast-bf16"])
    ap.add_argument("--widths", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu", help="cpu, cuda or auto (on a GPU: --backends static fast hf)")
    ap.add_argument("--adapter", default=None,
                    help="also run every backend on the model with this adapter (merged, or gated: kept apart), "
                         "named <backend>+adapter, interleaved with the bare model's")
    ap.add_argument("--masks", action="store_true",
                    help="window inputs after the first are the mask token, as in a MARS pass")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="cpu: the process's CPU seconds, not wall-clock: on a machine that other processes load "
                         "(2 threads' OpenMP waits then cost whole time slices), with --threads 1")
    ap.add_argument("--batch", type=int, default=1, help="rows a pass feeds, each W inputs after its own prompt")
    ap.add_argument("--out", default=None, help="also write the table as JSON here")
    machine_probe.add_flag(ap)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    probes = {"before": machine_probe.reading()} if args.probe else {}
    from mars.models.loading import load

    lm = load(args.model, adapter="none", dtype=args.dtype, device=args.device)
    models = {"": lm.model}
    if args.adapter:
        with_adapter = load(args.model, adapter=args.adapter, dtype=args.dtype, device=args.device)
        models["+adapter" + (" (gated)" if with_adapter.gated else "")] = with_adapter.model
    result = measure(models, args.backends, args.widths, args.rounds, args.prompt_len,
                     mask_id=lm.mask_token_id if args.masks else None, batch=args.batch,
                     clock=time.process_time if args.clock == "cpu" else time.perf_counter)
    if args.probe:
        probes["after"] = machine_probe.reading()
        for when, r in probes.items():
            print(f"machine {when}: {machine_probe.reading_line(r)}")
    for stat in ("median", "min"):
        print(f"\nms per pass ({stat} of {args.rounds} rounds) and ratio to the {args.widths[0]}-input pass; "
              f"{args.threads} thread(s), cached prefix {args.prompt_len}, batch {args.batch}, {args.clock} clock")
        print(format_table(result[stat], args.widths))
    for name, row in result["min"].items():
        for w, v, ratio in costlier_than_wider(row):
            print(f"warning: {name}: a {w}-input pass costs {ratio:.2f}x a {v}-input one (min of rounds): a slow "
                  f"route for {w} inputs")
    if args.out:
        Path(args.out).write_text(json.dumps({"threads": args.threads, "prompt_len": args.prompt_len, "batch": args.batch,
                                              "ms_per_pass": result, "machine_probe": probes}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
