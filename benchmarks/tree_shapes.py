"""Lossless draft trees of several shapes against core AR, side by side in one process, on the int8 backend.

A shape is B/N[/tau][s][c]: block size B (B-1 masks per group), a tree of up to N draft nodes (0: one chain)
with one mask group, both draft sources, the verified mode's tau (drafts below it are not sent; default 0),
with "s" the datastore's chains (mars.decoding.datastore), with "c" only the nodes that pay for their inputs at
this machine's pass costs (measured once here, mars.decoding.costs; DecodeConfig.pass_costs), with "g" as "c" and
the mask group too only while its drafts pay for it (DecodeConfig.group_cost).
Every shape runs on each prompt before the next prompt, round by round, so a change in the machine's load
falls on all alike. Prints tokens/s, ms per pass, tokens per pass and the speed against AR's.

    python -m benchmarks.tree_shapes 2/4 2/6 3/4 3/6 2/4/0.1 --prompts 0 3 7 11 15 19 23 27
    python -m benchmarks.tree_shapes 2/2s 2/4s 2/4sc 2/4sg 1/4sc --rounds 2
"""

from __future__ import annotations

import argparse
import time

import torch


def config(spec: str, max_new: int, backend: str, costs=None):
    from mars.decoding.decoder import DecodeConfig

    if spec == "ar":
        return DecodeConfig(mode="ar", tau=1.0, block_size=1, max_new_tokens=max_new, backend=backend)
    group = spec.endswith("g")  # "2/8sg": nodes and the mask group by their worth (mars.decoding.tree.TreeMode._cut)
    cut = group or spec.endswith("c")  # "2/8sc": only the nodes that pay for their inputs (mars.decoding.tree.best_cut)
    spec = spec.removesuffix("c").removesuffix("g")
    store = spec.endswith("s")  # "2/4s": with the datastore's chains (mars.decoding.datastore)
    block, nodes, *tau = spec.removesuffix("s").split("/")
    return DecodeConfig(mode="verified", tau=float(tau[0]) if tau else 0.0, block_size=int(block),
                        max_new_tokens=max_new, backend=backend, verify_groups="last", drafts="both",
                        tree_nodes=int(nodes), datastore=store, pass_costs=costs.by_width if cut else None,
                        group_cost=costs.group if group else None)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("shapes", nargs="+", help="B/N, B/N/tau, B/N[/tau]s")
    ap.add_argument("--prompts", type=int, nargs="+", default=[0, 3, 7, 11, 15, 19, 23, 27],
                    help="indices into --prompt-file")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--backend", default="fast-int8")
    ap.add_argument("--model", default=None, help="Hub id or folder (default: the embedded SmolLM2-135M-Instruct)")
    ap.add_argument("--prompt-file", default="data/prompts/heldout.jsonl")
    args = ap.parse_args(argv)

    from mars.decoding.decoder import encode_prompt, generate_ids
    from mars.evaluation.bench import read_prompts
    from mars.models.loading import load

    torch.set_num_threads(args.threads)
    lm = load(args.model)
    texts = read_prompts(args.prompt_file)
    ids = [encode_prompt(lm.tokenizer, texts[i]) for i in args.prompts]
    costs = None
    if any(spec.endswith(("c", "g")) for spec in args.shapes):
        from mars.decoding.costs import measure_pass_costs

        measure_pass_costs(lm, args.backend)  # warm-up
        costs = measure_pass_costs(lm, args.backend)  # past its 8 inputs, tree.pass_cost extends the line
        print("pass costs by inputs:", " ".join(f"{c:.2f}" for c in costs.by_width), f"mask inputs +{costs.group:.2f}")
    cfgs = {spec: config(spec, args.max_new_tokens, args.backend, costs) for spec in ["ar", *args.shapes]}
    for cfg in cfgs.values():  # warm-up: the backend's matrices, the kernels
        generate_ids(lm, [ids[0]], cfg)
    totals = {spec: [0.0, 0, 0] for spec in cfgs}  # seconds, passes, tokens
    for _ in range(args.rounds):
        for p in ids:
            for spec, cfg in cfgs.items():
                t = time.perf_counter()
                run = generate_ids(lm, [p], cfg)[0]
                tot = totals[spec]
                tot[0] += time.perf_counter() - t
                tot[1] += run.passes
                tot[2] += len(run.token_ids)
    s0, _, n0 = totals["ar"]
    print(f"{len(ids)} prompts x {args.rounds} rounds, {args.max_new_tokens} new tokens, {args.backend}, "
          f"{args.threads} threads")
    for spec, (s, passes, n) in totals.items():
        print(f"{spec:10s} {n / s:7.1f} tokens/s {1e3 * s / passes:6.2f} ms/pass {n / passes:5.2f} tokens/pass "
              f"{(n / s) / (n0 / s0):6.3f}x AR")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
