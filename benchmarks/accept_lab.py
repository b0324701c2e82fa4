"""Seconds the acceptance lab takes (mars.evaluation.acceptance_lab): the whole analysis (answers, drafts,
analysis), once a round, min and median over rounds. Then what packing answers into one forward buys: the
teacher-forced drafts of the same answers measured packed (up to --rows-per-forward mask rows a forward; the
lab's default and 1, one answer per forward), interleaved round by round in one process so a background load
falls on both alike.

    python -m benchmarks.accept_lab --threads 2 --set stories --rounds 3          # the issue's goal: 16 x 128
    python -m benchmarks.accept_lab --model DIR --adapter none --backend hf --max-new-tokens 8   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from benchmarks import machine_probe


def main(argv=None) -> int:
    from mars.decoding.decoder import encode_prompt
    from mars.evaluation import acceptance_lab as lab
    from mars.evaluation.prompt_sets import SETS
    from mars.models.loading import load
    from mars.runtime.backends import resolve_backend

    ap = argparse.ArgumentParser(prog="python -m benchmarks.accept_lab")
    ap.add_argument("--model", default=None)
    ap.add_argument("--adapter", default="auto")
    ap.add_argument("--set", default="stories", choices=list(SETS))
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--backend", default="auto-int8")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rows-per-forward", type=int, nargs="*", default=[lab.ROWS_PER_FORWARD, 1],
                    help="mask rows a forward, one timing per value (1: one answer per forward; none: skip this part)")
    ap.add_argument("--out", default=None, help="also write the numbers here (JSON)")
    ap.add_argument("--result", default=None, help="write the lab's own data here (JSON, as the tab's download)")
    machine_probe.add_flag(ap)
    args = ap.parse_args(argv)
    if args.rounds < 1:
        raise SystemExit("--rounds must be at least 1")
    torch.set_num_threads(args.threads)
    probes = {"before": machine_probe.reading()} if args.probe else {}
    load_before = os.getloadavg()
    lm = load(args.model, args.adapter)
    backend = resolve_backend(lm.model, args.backend)
    prompts = SETS[args.set]
    ids = [encode_prompt(lm.tokenizer, p) for p in prompts]
    cfg = lab.LabConfig(block_size=lm.default_block_size, max_new_tokens=args.max_new_tokens, taus=(), backend=backend)
    variants = lab.variants_of(lm, cfg)
    # one warm-up: the backend's one-off costs (the int8 copy of the matrices) are the app's start-up, not the lab's
    warm = lab.Answer("w", ids[0], ids[0][:4])
    list(lab.teacher_forced(lm, [warm], cfg.block_size, variants, backend=backend))
    stages = {}  # stage ("answers", "drafts", "analysis", and "whole") -> seconds per round
    for _ in range(args.rounds):
        t = time.perf_counter()
        *_, done = lab.run_lab(lm, prompts, ids, cfg)
        for stage, s in {**done.seconds, "whole": time.perf_counter() - t}.items():
            stages.setdefault(stage, []).append(s)
    if args.result:
        with open(args.result, "w") as f:
            json.dump(done.result, f, indent=1)
    answers = done.answers  # the lab's own greedy answers (ids and all) for the timed packing rounds
    tokens = sum(len(a.answer_ids) for a in answers)
    names = {rows: f"{rows} rows per forward" if rows > 1 else "one answer per forward" for rows in args.rows_per_forward}
    times = {name: [] for name in names.values()}
    forwards = {}
    for _ in range(args.rounds):
        for rows, name in names.items():
            t = time.perf_counter()
            *_, (n, total, _) = lab.teacher_forced(lm, answers, cfg.block_size, variants, backend=backend,
                                                   rows_per_forward=rows)
            times[name].append(time.perf_counter() - t)
            forwards[name] = total
    report = {
        "model": lm.name, "adapter": lm.adapter is not None, "variants": list(variants), "backend": backend,
        "threads": args.threads, "prompts": len(prompts), "answer_tokens": tokens,
        "lab": {stage: {"min_s": min(v), "median_s": statistics.median(v), "rounds": v} for stage, v in stages.items()},
        "drafts": {k: {"forwards": forwards[k], "min_s": min(v), "median_s": statistics.median(v), "rounds": v}
                   for k, v in times.items()},
        "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
    }
    if args.probe:
        probes["after"] = machine_probe.reading()
        report["machine_probe"] = probes
    print(json.dumps(report, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
