"""Which block size should the lossless mode use here? Verified (both draft sources) at several B against AR.

On a GPU a pass of 1 or 8 inputs costs the same, so more masks are free drafts. On two CPU cores every input
makes the pass dearer, and the later masks' drafts are rarely accepted: this measures the trade on the held-out
prompts, every setting run on a prompt before the next prompt (round by round), so a change in the machine's
load falls on all of them. Prints tokens per pass, inputs per pass, ms per pass, speed against AR, and how many
drafts were sent and accepted per pass. The app's CPU default for verified mode (mars.app.inputs.mode_block)
comes from this.

    python -m benchmarks.verified_blocks --limit 20 --max-new-tokens 48 --rounds 2            # B 2, 3, 4, int8
    python -m benchmarks.verified_blocks --limit 3 --max-new-tokens 64 --blocks 2 4 --taus 0 0.2
    python -m benchmarks.verified_blocks --limit 20 --blocks 2 4 --tree-nodes 0 4 6 8   # chains and draft trees
    python -m benchmarks.verified_blocks --limit 10 --max-new-tokens 64 --blocks 2 --tree-nodes 0 2 3 4 --tree-groups 1 2 3
"""

from __future__ import annotations

import argparse
import collections

import torch

from mars.decoding.decoder import DecodeConfig, encode_prompt, generate_ids
from mars.evaluation.bench import read_prompts, spread_indices
from mars.models.loading import load


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", default="data/prompts/heldout.jsonl")
    ap.add_argument("--limit", type=int, default=20, help="prompts, spread through the file")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--blocks", type=int, nargs="+", default=[2, 3, 4])
    ap.add_argument("--taus", type=float, nargs="+", default=[0.0])
    ap.add_argument("--drafts", default="both", choices=["mars", "lookup", "both"])
    ap.add_argument("--backend", default="fast-int8")
    ap.add_argument("--tree-nodes", type=int, nargs="+", default=[0],
                    help="0: the chain; N > 0: a draft tree of N nodes (mars.decoding.tree), each at every B and tau")
    ap.add_argument("--tree-groups", type=int, nargs="+", default=[1],
                    help="mask groups a tree carries (DecodeConfig.tree_groups), each at every tree size")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default=None, help="Hub id or folder (default: the embedded SmolLM2-135M-Instruct)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    lm = load(args.model)
    prompts = read_prompts(args.prompts)
    ids = [encode_prompt(lm.tokenizer, prompts[i]) for i in spread_indices(len(prompts), args.limit)]
    base = dict(max_new_tokens=args.max_new_tokens, backend=args.backend)
    configs = {"ar": DecodeConfig(mode="ar", tau=1.0, block_size=1, **base)}
    for B in args.blocks:
        for tau in args.taus:
            for n in args.tree_nodes:
                for g in (args.tree_groups if n else [1]):
                    tree = f" tree {n}" + (f" g {g}" if g != 1 else "") if n else ""
                    name = f"verified B {B} tau {tau:g}{tree}"
                    configs[name] = DecodeConfig(mode="verified", tau=tau, block_size=B, drafts=args.drafts,
                                                 verify_groups="last", tree_nodes=n, tree_groups=g, **base)
    generate_ids(lm, [ids[0]], configs["ar"])  # warm-up
    tot = {k: collections.Counter() for k in configs}
    sent = {k: collections.Counter() for k in configs}
    accepted = {k: collections.Counter() for k in configs}
    for _ in range(args.rounds):
        for x in ids:
            for name, cfg in configs.items():
                run = generate_ids(lm, [x], cfg)[0]
                tot[name].update(tokens=run.tokens, passes=run.passes, seconds=run.decode_seconds)
                for step in run.steps:
                    tot[name]["inputs"] += step.input_len
                    sent[name][step.drafts_sent] += 1
                    accepted[name][len(step.token_ids) - 1] += 1
    ar = tot["ar"]["tokens"] / tot["ar"]["seconds"]
    print(f"{len(ids)} prompts x {args.rounds} round(s), {args.max_new_tokens} new tokens, {args.backend}, "
          f"{args.threads} threads (inputs per pass include the prompt's pass)")
    print(f"{'setting':<31} {'tok/pass':>8} {'inputs':>7} {'ms/pass':>8} {'tok/s':>7} {'vs AR':>6}  drafts sent: passes | accepted: passes")
    for name, t in tot.items():
        speed = t["tokens"] / t["seconds"]
        print(f"{name:<31} {t['tokens'] / t['passes']:8.3f} {t['inputs'] / t['passes']:7.2f} "
              f"{1000 * t['seconds'] / t['passes']:8.1f} {speed:7.1f} {speed / ar:5.2f}x  "
              f"{dict(sorted(sent[name].items()))} | {dict(sorted(accepted[name].items()))}")


if __name__ == "__main__":
    main()
