"""The app's defaults chosen by measurement: each candidate setting (mode, B, tree nodes, mask groups) run the way
the app runs it, against core AR, prompt by prompt in one process.

Each candidate's DecodeConfig is built by the app's own code (mars.app.inputs.make_config, then fit_to_model with
this machine's pass costs, measured as the app measures them at start-up, and the datastore as the app loads it),
so a tree is cut by the measured costs exactly as on the page. For every prompt every candidate runs once, in an
order rotated prompt by prompt, so a change in the machine's load falls on all alike. Prints tokens/s, tokens per
pass, the ratio to AR over the same prompts (total tokens / total seconds), and for the lossless candidates
whether their text equals AR's on every prompt.

    python -m benchmarks.app_defaults --limit 20 --max-new-tokens 96 --threads 2 --out runs/app_defaults.json
    python -m benchmarks.app_defaults --limit 2 --max-new-tokens 8 --candidates ar verified:2:4 mars:4:0.9   # smoke

A candidate is MODE:B[:TREE_NODES or TAU][:GROUPS]: `verified:2:4` (verified, B 2, a tree of up to 4 nodes),
`verified:3:0` (the chain), `verified:2:4:2` (two mask groups on the tree), `mars:4:0.9` (MARS, B 4, tau 0.9).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace

import torch

DEFAULT_CANDIDATES = ("verified:2:0", "verified:2:2", "verified:2:4", "verified:2:6", "verified:2:8",
                      "verified:3:0", "verified:3:4", "verified:4:4", "verified:2:4:2",
                      "mars:2:0.9", "mars:4:0.9")


def parse_candidate(spec: str) -> dict:
    """'verified:2:4[:G]' / 'mars:4:0.9' / 'ar' -> make_config's keywords (+ tree_groups)."""
    parts = spec.split(":")
    mode = parts[0]
    if mode == "ar":
        return {"mode": "ar", "tau": 1.0, "block_size": 1, "tree_nodes": 0, "tree_groups": None}
    if mode not in ("verified", "mars") or len(parts) < 2:
        raise SystemExit(f"{spec!r}: a candidate is ar, verified:B[:NODES[:GROUPS]] or mars:B[:TAU]")
    block = int(parts[1])
    if mode == "mars":
        return {"mode": "mars", "tau": float(parts[2]) if len(parts) > 2 else 0.9, "block_size": block,
                "tree_nodes": 0, "tree_groups": None}
    return {"mode": "verified", "tau": 0.0, "block_size": block, "tree_nodes": int(parts[2]) if len(parts) > 2 else 0,
            "tree_groups": int(parts[3]) if len(parts) > 3 else None}


def app_config(lm, spec: str, max_new: int, backend: str):
    """The DecodeConfig the app would run for this candidate (make_config + fit_to_model, its pass costs)."""
    from mars.app.inputs import fit_to_model, make_config

    kw = parse_candidate(spec)
    groups = kw.pop("tree_groups")
    cfg = make_config(kw["mode"], kw["tau"], kw["block_size"], max_new, backend=backend, tree_nodes=kw["tree_nodes"])
    if groups is not None:
        cfg = replace(cfg, tree_groups=groups)
    cfg, _ = fit_to_model(lm, cfg)
    return cfg


def main(argv=None) -> int:
    from mars.app.inputs import app_datastore, app_pass_costs
    from mars.decoding.decoder import encode_prompt, generate_ids
    from mars.evaluation.bench import read_prompts, spread_indices
    from mars.models.loading import load
    from mars.runtime.backends import resolve_backend

    ap = argparse.ArgumentParser(prog="python -m benchmarks.app_defaults", description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", default="data/prompts/heldout.jsonl")
    ap.add_argument("--limit", type=int, default=20, help="prompts, spread through the file")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--backend", default="auto-int8")
    ap.add_argument("--model", default=None)
    ap.add_argument("--adapter", default="auto")
    ap.add_argument("--candidates", nargs="+", default=list(DEFAULT_CANDIDATES))
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    lm = load(args.model, args.adapter)
    backend = resolve_backend(lm.model, args.backend)
    lm.pass_costs = {}
    costs = app_pass_costs(lm, backend)  # as the app's start-up: the tree's cut reads them
    app_datastore(lm)
    prompts = read_prompts(args.prompts)
    prompts = [prompts[i] for i in spread_indices(len(prompts), args.limit)]
    ids = [encode_prompt(lm.tokenizer, p) for p in prompts]
    names = ["ar"] + [c for c in args.candidates if c != "ar"]
    cfgs = {c: app_config(lm, c, args.max_new_tokens, backend) for c in names}
    for c in names:  # warm-up: every setting once on the first prompt (kernels, tree shapes, caches)
        generate_ids(lm, [ids[0]], replace(cfgs[c], max_new_tokens=min(8, args.max_new_tokens)))
    tot = {c: {"seconds": 0.0, "tokens": 0, "passes": 0, "texts": []} for c in names}
    for i, p in enumerate(ids):
        k = i % len(names)
        for c in names[k:] + names[:k]:
            t = time.perf_counter()
            run = generate_ids(lm, [p], cfgs[c])[0]
            tot[c]["seconds"] += time.perf_counter() - t
            tot[c]["tokens"] += len(run.token_ids)
            tot[c]["passes"] += run.passes
            tot[c]["texts"].append(list(run.token_ids))
    ar = tot["ar"]
    ar_speed = ar["tokens"] / ar["seconds"]
    rows = []
    for c in names:
        t = tot[c]
        speed = t["tokens"] / t["seconds"]
        lossless = cfgs[c].mode in ("ar", "verified")
        rows.append({"candidate": c, "tokens_per_s": speed, "tokens_per_pass": t["tokens"] / max(1, t["passes"]),
                     "vs_ar": speed / ar_speed, "tokens": t["tokens"], "seconds": t["seconds"],
                     "tree_nodes": cfgs[c].tree_nodes, "tree_groups": cfgs[c].tree_groups,
                     "cut_by_costs": cfgs[c].pass_costs is not None,
                     "equals_ar": (sum(a == b for a, b in zip(t["texts"], ar["texts"])) if lossless else None)})
    print(f"{len(ids)} prompts x {args.max_new_tokens} tokens, {backend}, {args.threads} threads, "
          f"pass costs {[round(x, 2) for x in costs.by_width] if costs else None}, group {costs.group if costs else None}")
    print(f"{'candidate':<16}{'tokens/s':>10}{'tok/pass':>10}{'vs AR':>8}{'= AR':>7}")
    for r in sorted(rows, key=lambda r: -r["vs_ar"]):
        eq = "" if r["equals_ar"] is None else f"{r['equals_ar']}/{len(ids)}"
        print(f"{r['candidate']:<16}{r['tokens_per_s']:10.1f}{r['tokens_per_pass']:10.2f}{r['vs_ar']:7.2f}x{eq:>7}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"prompts": len(ids), "max_new_tokens": args.max_new_tokens, "backend": backend,
                       "threads": args.threads, "pass_costs": list(costs.by_width) if costs else None,
                       "group_cost": costs.group if costs else None, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
