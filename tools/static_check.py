"""One short device check of the static backend (mars/runtime/static.py): pass cost by width, decoding speed
against core AR, and how often the outputs agree, printed and written as JSON.

    python -m tools.static_check --device cuda --dtype bfloat16 --out static_check.json    # the GPU check
    python -m tools.static_check --device cpu --limit 2 --max-new-tokens 8 --rounds 2      # a smoke test

What it measures (issue 22's goals, batch 1 unless said):
  pass_ms     ms per pass of W inputs against a cached prefix, static vs hf (pass_cost.py's method):
              is a MARS pass of up to 2B-1 inputs at most 1.1x an AR pass?
  decode      tokens/s of core AR, MARS tau 0.9 and verified (both draft sources) at batch 1 and 8 on the
              static backend, each method's ratio to core AR, interleaved prompt by prompt, after a warm-up
              that captures the graphs
  agreement   share of prompts whose text equals core AR on the hf backend (bf16: wide and 1-wide passes
              use different kernels, so near-ties may flip; in float32 every figure should be 1.0)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def _sync(device: str):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def decode_speed(lm, ids, batch: int, max_new: int, device: str) -> dict:
    from mars.decoding.decoder import DecodeConfig, generate_ids

    methods = {"ar": dict(mode="ar"), "mars_0.9": dict(mode="mars", tau=0.9),
               "verified_both": dict(mode="verified", tau=0.0, drafts="both")}
    batches = [ids[i:i + batch] for i in range(0, len(ids), batch)]
    for kw in methods.values():  # warm-up: every graph the timed runs use is captured here
        generate_ids(lm, batches[0], DecodeConfig(**kw, max_new_tokens=max_new, backend="static"))
    out = {m: {"seconds": 0.0, "tokens": 0, "passes": 0, "texts": []} for m in methods}
    for b in batches:
        for m, kw in methods.items():
            _sync(device)
            t0 = time.perf_counter()
            runs = generate_ids(lm, b, DecodeConfig(**kw, max_new_tokens=max_new, backend="static"))
            _sync(device)
            out[m]["seconds"] += time.perf_counter() - t0
            out[m]["tokens"] += sum(len(r.token_ids) for r in runs)
            out[m]["passes"] += sum(r.passes for r in runs)
            out[m]["texts"] += [r.token_ids for r in runs]
    ar = out["ar"]
    for m, r in out.items():
        r["tokens_per_s"] = r["tokens"] / r["seconds"]
        r["tokens_per_pass"] = r["tokens"] / max(1, r["passes"])
        r["vs_core_ar"] = r["tokens_per_s"] / ar["tokens_per_s"]
        r["same_as_static_ar"] = sum(a == t for a, t in zip(ar["texts"], r["texts"])) / len(ids)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--adapter", default="auto")
    ap.add_argument("--prompts", default=str(ROOT / "data/prompts/heldout.jsonl"))
    ap.add_argument("--limit", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--widths", type=int, nargs="+", default=[1, 2, 4, 5, 7, 8])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    from mars.decoding.decoder import DecodeConfig, encode_prompt, generate_ids
    from mars.evaluation.bench import read_prompts, spread_indices
    from mars.models.loading import load
    from benchmarks.pass_cost import measure

    lm = load(adapter=args.adapter, dtype=args.dtype, device=args.device)
    prompts = read_prompts(args.prompts)
    prompts = [prompts[i] for i in spread_indices(len(prompts), args.limit)]
    ids = [encode_prompt(lm.tokenizer, p) for p in prompts]
    result = {"device": args.device, "dtype": args.dtype, "adapter": lm.adapter, "prompts": len(ids),
              "max_new_tokens": args.max_new_tokens}
    if args.device.startswith("cuda"):
        result["gpu"] = torch.cuda.get_device_name()

    # 1. pass cost by width (mask inputs after the first, as a MARS pass; the gated adapter acts there)
    cost = measure(lm.model, ["static", "hf"], args.widths, args.rounds, 128, mask_id=lm.mask_token_id)
    result["pass_ms"] = cost["median"]
    # 2. decoding speed, static backend
    result["decode"] = {}
    for bs in args.batches:
        speed = decode_speed(lm, ids, bs, args.max_new_tokens, args.device)
        result["decode"][f"batch_{bs}"] = {m: {k: v for k, v in r.items() if k != "texts"} for m, r in speed.items()}
    # 3. agreement with core AR on transformers' forward (hf), batch 1
    ref = [generate_ids(lm, [p], DecodeConfig(mode="ar", max_new_tokens=args.max_new_tokens, backend="hf"))[0].token_ids
           for p in ids]
    agree = {}
    for name, kw in {"static_ar": dict(mode="ar"), "static_verified_both": dict(mode="verified", tau=0.0, drafts="both"),
                     "static_mars_tau1": dict(mode="mars", tau=1.0)}.items():
        got = [generate_ids(lm, [p], DecodeConfig(**kw, max_new_tokens=args.max_new_tokens, backend="static"))[0].token_ids
               for p in ids]
        agree[name] = sum(a == b for a, b in zip(ref, got)) / len(ids)
    result["agreement_with_hf_ar"] = agree

    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
