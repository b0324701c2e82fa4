"""Measure, pass by pass, how many drafts each source would get accepted: the data behind the verified
mode's "both" rule (mars.core.modes.prefer_lookup).

Runs the verified mode (mask drafts, a group per acceptance outcome, so every pass has mask drafts) on
held-out prompts that the bench's --spread sample does not use, and logs at every pass both candidates:
the mask drafts with their confidences, and the n-gram lookup drafts with their match length. The run's
output is exactly AR greedy, so afterwards each candidate's accepted length (its prefix that equals the
AR text) is known for every pass. Prints acceptance by match length and by mask-draft confidence, and
the tokens per pass of candidate rules on these passes (counterfactual per pass: the trajectory is the
mask-draft run's).

    python scripts/measure_drafts.py --limit 40 --max-new-tokens 48 --out /tmp/drafts.json
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import torch

import mars.core.decoding as decoding
from mars.evaluation.bench import read_prompts, spread_indices
from mars.core.decoding import DecodeConfig, encode_prompt, generate_ids
from mars.models.loading import load
from mars.core.lookup import lookup_drafts
from mars.core.lookup import EXPECTED_ACCEPTED, Lookup
from mars.core.modes import VerifiedMode, prefer_lookup


def matched(drafts: list[int], truth: list[int]) -> int:
    m = 0
    while m < len(drafts) and m < len(truth) and drafts[m] == truth[m]:
        m += 1
    return m


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", default="data/prompts/heldout.jsonl")
    ap.add_argument("--limit", type=int, default=40)
    ap.add_argument("--bench-spread", type=int, default=20, help="the bench's --limit: these prompts are left out")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--max-drafts", type=int, default=8, help="copies logged per pass (the rule copies 2n of them)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--from-log", default=None, help="analyse a log written by --out, without the model")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.from_log:
        with open(args.from_log) as f:
            return report(json.load(f))

    prompts, kinds = read_prompts(args.prompts, with_kinds=True)
    held = set(spread_indices(len(prompts), args.bench_spread))
    rest = [i for i in range(len(prompts)) if i not in held]
    pick = [rest[i] for i in spread_indices(len(rest), args.limit)]
    lm = load()
    log: list[dict] = []

    class Logging(VerifiedMode):
        def plan(self, row, cfg, tau):
            look = lookup_drafts(row.tokens, max_drafts=args.max_drafts, per_matched=args.max_drafts)
            log[-1]["passes"].append({"t": len(row.generated), "mars": list(row.drafts),
                                      "conf": [round(c, 4) for c in row.draft_conf],
                                      "lookup": look.drafts, "ngram": look.ngram})
            return super().plan(row, cfg, tau)

    decoding.make_mode = lambda cfg: Logging("all", "mars")
    for i in pick:
        ids = encode_prompt(lm.tokenizer, prompts[i])
        log.append({"kind": kinds[i], "passes": []})
        res = generate_ids(lm, [ids], DecodeConfig(mode="verified", tau=0.0, max_new_tokens=args.max_new_tokens))[0]
        out = res.token_ids
        for p in log[-1]["passes"]:
            truth = out[p["t"]:]
            p["mars_ok"] = matched(p["mars"], truth)
            p["lookup_ok"] = matched(p["lookup"], truth)
        print(kinds[i], len(out), res.passes, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(log, f)
    report(log)


def report(log: list[dict]):
    passes = [p for e in log for p in e["passes"]]
    print(f"\n{len(passes)} passes over {len(log)} prompts")
    by_n = defaultdict(list)
    for p in passes:
        by_n[p["ngram"]].append(p["lookup_ok"])
    print("lookup: by match length n: passes, mean accepted of all copies logged, share of passes whose k-th"
          " copy is accepted (k = 1..), mean accepted of the first 2n copies (the rule's table)")
    for n in sorted(by_n):
        v = by_n[n]
        shares = " ".join(f"{sum(x >= k for x in v) / len(v):.2f}" for k in range(1, 9))
        capped = sum(min(x, 2 * n) for x in v) / len(v)
        print(f"  n={n}: {len(v):5d}  {sum(v) / len(v):.3f}  [{shares}]  {capped:.3f}")
    print("mask drafts: accepted vs expected (sum of cumulative products of confidences), by expected bin")
    bins = defaultdict(list)
    for p in passes:
        e, run = 0.0, 1.0
        for c in p["conf"]:
            run *= c
            e += run
        p["expected_mars"] = e
        bins[min(int(e * 4), 12)].append((e, p["mars_ok"]))
    for b in sorted(bins):
        v = bins[b]
        print(f"  E in [{b / 4:.2f},{(b + 1) / 4:.2f}): {len(v):5d}  expected {sum(x for x, _ in v) / len(v):.3f}"
              f"  accepted {sum(y for _, y in v) / len(v):.3f}")
    by_n_e = defaultdict(lambda: [0, 0, 0])  # (n, expected-mars bin) -> count, lookup ok, mars ok
    for p in passes:
        k = (p["ngram"], min(int(p["expected_mars"] * 2), 4))
        by_n_e[k][0] += 1
        by_n_e[k][1] += p["lookup_ok"]
        by_n_e[k][2] += p["mars_ok"]
    print("by (match length, expected-mars bin of 0.5): passes, lookup accepted, mars accepted")
    for k in sorted(by_n_e):
        c, lo, ma = by_n_e[k]
        print(f"  n={k[0]} E~{k[1] / 2:.1f}: {c:5d}  {lo / c:.3f}  {ma / c:.3f}")

    def copied(p):  # what the decoder sends: 2n copies, and how many of them are accepted
        return min(p["lookup_ok"], 2 * p["ngram"])

    def score(rule, pp=passes):
        return 1 + sum(copied(p) if rule(p) else p["mars_ok"] for p in pp) / max(1, len(pp))

    def shipped(p):
        return prefer_lookup(Lookup(p["lookup"][: 2 * p["ngram"]], p["ngram"]), p["conf"])

    rules = {
        "mars only": lambda p: False,
        "lookup only": lambda p: True,
        "oracle": lambda p: copied(p) > p["mars_ok"],
        f"shipped: prefer_lookup {EXPECTED_ACCEPTED}": shipped,
    }
    for n_min in (1, 2, 3):
        rules[f"lookup if n >= {n_min}"] = lambda p, n_min=n_min: p["ngram"] >= n_min
        for e_max in (0.5, 1.0, 1.5, 2.0):
            rules[f"lookup if n >= {n_min} and E_mars < {e_max}"] = (
                lambda p, n_min=n_min, e_max=e_max: p["ngram"] >= n_min and p["expected_mars"] < e_max)
    print("accepted tokens per pass under each rule (same passes):")
    for name, rule in rules.items():
        print(f"  {name:<36}{score(rule):.3f}")
    print("by kind: passes, mars only, lookup only, shipped rule, oracle")
    for kind in sorted({e["kind"] for e in log}):
        pp = [p for e in log if e["kind"] == kind for p in e["passes"]]
        print(f"  {kind:<14}{len(pp):5d}" + "".join(f"{score(rules[r], pp):8.3f}" for r in
                                                     ("mars only", "lookup only", list(rules)[3], "oracle")))


if __name__ == "__main__":
    main()
