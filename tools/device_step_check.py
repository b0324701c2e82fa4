"""One short device check of the device step (mars/decoding/device_step.py, backend static-device, issue 42):
is a step captured and replayed as one CUDA graph the same as the eager step, and how fast is each mode
against core AR and against the host loop, side by side in one run. Printed and written as JSON.

    python -m tools.device_step_check --device cuda --dtype bfloat16 --out device_step.json   # the GPU check
    python -m tools.device_step_check --device cpu --model DIR --adapter none --limit 2 --max-new-tokens 8 \\
        --batches 1 --methods ar mars_0.9 --steps-per-read 4                                   # a smoke test

For each batch size and method, interleaved batch by batch after a warm-up that captures every graph:
  host     the host loop on the static backend (today's path: a device read every pass)
  device   the device step: k steps replayed per read (--steps-per-read, several values to compare)
tokens/s, tokens/pass, the ratio to core AR on the host loop, and whether the device step's text equals the
host loop's in the same mode (bfloat16: the step's attention runs over per-row columns, so near-ties may
flip; float32 should agree everywhere). `graph_equals_eager`: per method at batch 1, the device step with its
graphs against the same step run eagerly (graphs off): the capture's own check, 1.0 expected on any dtype.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
METHODS = {"ar": dict(mode="ar"), "mars_0.9": dict(mode="mars", tau=0.9), "mars_0.7": dict(mode="mars", tau=0.7),
           "verified": dict(mode="verified", tau=0.0), "verified_last": dict(mode="verified", tau=0.0, verify_groups="last"),
           "tree_mars_16": dict(mode="verified", tau=0.0, tree_nodes=16),
           "tree_mars_64": dict(mode="verified", tau=0.0, tree_nodes=64)}


def _sync(device: str):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _eager_runner(model, cfg, batch, capacity, scratch):
    from mars.runtime.step_runner import StepRunner

    runner = StepRunner(model, batch, capacity, scratch)
    runner.graphs_on = runner.asynchronous = False
    return runner


def speed(lm, ids, batch: int, methods: list[str], ks: list[int], max_new: int, device: str) -> dict:
    from mars.decoding.decoder import DecodeConfig, generate_ids

    runs = {}
    for m in methods:
        runs[f"{m}|host"] = DecodeConfig(**METHODS[m], max_new_tokens=max_new, backend="static")
        for k in ks:
            runs[f"{m}|device k{k}"] = DecodeConfig(**METHODS[m], max_new_tokens=max_new, backend="static-device",
                                                    steps_per_read=k)
    batches = [ids[i:i + batch] for i in range(0, len(ids), batch)]
    for cfg in runs.values():  # warm-up: every graph the timed runs use is captured here
        generate_ids(lm, batches[0], cfg)
    out = {name: {"seconds": 0.0, "tokens": 0, "passes": 0, "texts": []} for name in runs}
    for b in batches:
        for name, cfg in runs.items():
            _sync(device)
            t0 = time.perf_counter()
            got = generate_ids(lm, b, cfg)
            _sync(device)
            r = out[name]
            r["seconds"] += time.perf_counter() - t0
            r["tokens"] += sum(len(x.token_ids) for x in got)
            r["passes"] += sum(x.passes for x in got)
            r["texts"] += [x.token_ids for x in got]
    base = out[f"{methods[0]}|host"] if methods[0] == "ar" else None
    for name, r in out.items():
        r["tokens_per_s"] = r["tokens"] / r["seconds"]
        r["tokens_per_pass"] = r["tokens"] / max(1, r["passes"])
        if base is not None:
            r["vs_core_ar"] = r["tokens_per_s"] / base["tokens_per_s"]
        host = out[name.split("|")[0] + "|host"]
        r["same_text_as_host_loop"] = sum(a == t for a, t in zip(host["texts"], r["texts"])) / len(ids)
    return out


def graph_equals_eager(lm, ids, methods: list[str], max_new: int) -> dict:
    from mars.decoding.decoder import DecodeConfig, generate_ids

    out = {}
    for m in methods:
        cfg = DecodeConfig(**METHODS[m], max_new_tokens=max_new, backend="static-device")
        same = 0
        for p in ids:
            same += generate_ids(lm, [p], cfg)[0].token_ids == generate_ids(lm, [p], cfg, backend=_eager_runner)[0].token_ids
        out[m] = same / len(ids)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--model", default=None)
    ap.add_argument("--adapter", default="auto")
    ap.add_argument("--prompts", default=str(ROOT / "data/prompts/heldout.jsonl"))
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--steps-per-read", type=int, nargs="+", default=[4], help="k: one or more, side by side")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    methods = ["ar"] + [m for m in args.methods if m != "ar"]  # core AR first: every ratio's baseline

    from mars.decoding.decoder import encode_prompt
    from mars.evaluation.bench import read_prompts, spread_indices
    from mars.models.loading import load

    lm = load(model=args.model, adapter=args.adapter, dtype=args.dtype, device=args.device)
    prompts = read_prompts(args.prompts)
    prompts = [prompts[i] for i in spread_indices(len(prompts), args.limit)]
    ids = [encode_prompt(lm.tokenizer, p) for p in prompts]
    result = {"device": args.device, "dtype": args.dtype, "prompts": len(ids), "max_new_tokens": args.max_new_tokens}
    if args.device.startswith("cuda"):
        result["gpu"] = torch.cuda.get_device_name()
    result["graph_equals_eager"] = graph_equals_eager(lm, ids, methods, args.max_new_tokens)
    result["decode"] = {}
    print(f"{'method':<16}{'batch':>6} {'path':<12}{'tok/s':>9}{'tok/pass':>9}{'vs AR':>7}{'same text':>10}")
    for bs in args.batches:
        got = speed(lm, ids, bs, methods, args.steps_per_read, args.max_new_tokens, args.device)
        result["decode"][f"batch_{bs}"] = {n: {k: v for k, v in r.items() if k != "texts"} for n, r in got.items()}
        for name, r in got.items():
            m, path = name.split("|")
            print(f"{m:<16}{bs:>6} {path:<12}{r['tokens_per_s']:9.1f}{r['tokens_per_pass']:9.2f}"
                  f"{r.get('vs_core_ar', 0.0):6.2f}x{r['same_text_as_host_loop']:10.2f}")
    print("graph == eager (batch 1, share of prompts):", result["graph_equals_eager"])
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
