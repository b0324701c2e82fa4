"""Did a change keep the decoder's behaviour? Token ids and pass counts of every core method, per backend.

A refactor that claims "behaviour unchanged" runs this before and after, on the same prompts and settings, and
compares: every method's token ids and each prompt's pass count must be identical (timing is not compared).
The methods are the bench's (mars.evaluation.bench): ar, mars at each tau, verified_both, the tree of 4 and the
datastore tree, on every backend named (float32 fast, int8, and the static path run on the CPU).

    python -m benchmarks.same_records --out /tmp/before.json          # at the old commit
    python -m benchmarks.same_records --out /tmp/after.json           # at the new one
    python -m benchmarks.same_records --compare /tmp/before.json /tmp/after.json
"""

from __future__ import annotations

import argparse
import json
import sys

METHODS = ("ar", "mars", "verified_both", "verified_tree_last:4", "verified_tree_store:4")


def record(args) -> list[dict]:
    import torch

    from mars.evaluation.bench import BenchConfig, read_prompts, run_bench, spread_indices
    from mars.models.loading import load

    torch.set_num_threads(args.threads)
    prompts = read_prompts(args.prompts)
    prompts = [prompts[i] for i in spread_indices(len(prompts), args.limit)]
    lm = load(args.model, "auto", None, None, False, "cpu")
    backends = args.backends
    cfg = BenchConfig(prompts=prompts, methods=METHODS, taus=tuple(args.taus), max_new_tokens=args.max_new_tokens,
                      backend=backends[0], also_backends=tuple(backends[1:]))
    return [{"method": r.method, "tau": r.tau, "outputs": r.outputs, "row_passes": r.row_passes}
            for r in run_bench(lm, cfg)]


def compare(before: list[dict], after: list[dict]) -> tuple[bool, list[str]]:
    """(all identical, one line per run)."""
    lines, ok = [], len(before) == len(after)
    if not ok:
        lines.append(f"{len(before)} runs before, {len(after)} after")
    for a, b in zip(before, after):
        same = (a["method"], a["tau"], a["outputs"], a["row_passes"]) == (b["method"], b["tau"], b["outputs"],
                                                                          b["row_passes"])
        ok &= same
        lines.append(f'{a["method"]:32s} tau {a["tau"]!s:5s} {sum(map(len, a["outputs"])):5d} tokens '
                     f'{sum(a["row_passes"]):5d} passes  {"identical" if same else "DIFFERENT"}')
    return ok, lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write this commit's records here (JSON)")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="compare two record files")
    ap.add_argument("--prompts", default="data/prompts/heldout.jsonl")
    ap.add_argument("--limit", type=int, default=6, help="prompts, spread through the file")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--taus", type=float, nargs="+", default=[0.9, 0.7], help="the mars method's taus")
    ap.add_argument("--backends", nargs="+", default=["fast", "fast-int8", "static"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default=None, help="Hub id or folder (default: the embedded SmolLM2-135M-Instruct)")
    args = ap.parse_args(argv)
    if args.compare:
        before, after = (json.load(open(p)) for p in args.compare)
        ok, lines = compare(before, after)
        print("\n".join(lines))
        print("all identical" if ok else "some runs differ")
        return 0 if ok else 1
    if not args.out:
        ap.error("give --out FILE (record) or --compare BEFORE AFTER")
    runs = record(args)
    with open(args.out, "w") as f:
        json.dump(runs, f)
    print(f"wrote {len(runs)} runs to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
